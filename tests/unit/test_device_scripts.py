"""The device scripts (benchmarks/device/*.sh) run on any GPU host: each says at its start
which GPU it runs on and fails fast, one line on stderr and exit status 2, where there is no
GPU or no wheelhouse (issue 43 item 6); their headers tell how to run them there, not how a
particular remote-execution tool calls them, and the evidence they leave names no folder of
the machine that ran it (issue 45 item 9). The scripts run here from a copy of
benchmarks/device/ with stand-ins for nvidia-smi and python3: no GPU, no wheelhouse, no
install."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "benchmarks" / "device"
SOURCED = {"bench.sh", "venv.sh", "preflight.sh"}  # libraries the scripts source
CPU_ONLY = {"realtime_audio.sh", "h3_video_test.sh"}  # a GPU is printed, not required
SCRIPTS = sorted(p.name for p in DEVICE.glob("*.sh") if p.name not in SOURCED)
FIRST_ARGS = {"world.sh": ["--raw"]}  # its parts; no part is a usage error


def code(path: Path) -> str:
    return "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#"))


def header(path: Path) -> str:
    return "\n".join(ln for ln in path.read_text().splitlines() if ln.startswith("#"))


def test_every_script_starts_with_the_preflight() -> None:
    for name in SCRIPTS:
        text = code(DEVICE / name)
        assert "set -euo pipefail" in text, name
        assert "source benchmarks/device/preflight.sh" in text, name
        call = "gpu_check --optional" if name in CPU_ONLY else "gpu_check(?! --optional)"
        assert re.search(rf"(^\s*|\)\s*|\$\()({call})(\s|\)|;|$)", text, flags=re.M), name


def test_headers_say_how_to_run_them_on_any_gpu_host() -> None:
    tool = re.compile(r"carry|run\(command|lent|device tool|kind nvidia|timeout_s=", re.I)
    for path in sorted(DEVICE.glob("*.sh")):
        assert not tool.search(header(path)), path.name
        if path.name not in SOURCED:
            assert f"bash benchmarks/device/{path.name}" in header(path), path.name
    assert absolute_paths((DEVICE / "wheelhouse.py").read_text()) == []


@pytest.fixture
def host(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the scripts (no .wheelhouse beside them) and an environment whose
    nvidia-smi and python3 see no GPU."""
    repo = tmp_path / "repo"
    shutil.copytree(DEVICE, repo / "benchmarks" / "device")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nvidia-smi", "python3"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 9\n")
        (bin_dir / tool).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": str(bin_dir / "python3"),
        "VENV": str(tmp_path / "venv"),
        "OUT": str(tmp_path / "out"),
    }
    env.pop("WHEELHOUSE", None)
    return repo, env


def run(repo: Path, env: dict[str, str], name: str) -> subprocess.CompletedProcess[str]:
    argv = ["bash", str(repo / "benchmarks" / "device" / name), *FIRST_ARGS.get(name, [])]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", sorted(set(SCRIPTS) - CPU_ONLY))
def test_no_gpu_is_one_line_and_exit_2(host: tuple[Path, dict[str, str]], name: str) -> None:
    done = run(*host, name)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"{name}: no GPU on this host (nvidia-smi and torch.cuda see none)"
    ]


@pytest.mark.parametrize("name", sorted(set(SCRIPTS) - {"h3_video_test.sh", "gpu_multi.sh"}))
def test_no_wheelhouse_is_one_line_and_exit_2(host: tuple[Path, dict[str, str]], name: str) -> None:
    repo, env = host
    smi = Path(env["PATH"].split(":")[0]) / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "0, NVIDIA H100 80GB HBM3, 81559 MiB"\n')
    done = run(repo, env, name)
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines()[0] in ("gpu: 0, NVIDIA H100 80GB HBM3, 81559 MiB", "gpu: none")
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{name}: missing .wheelhouse/"), line
    assert "python -m benchmarks.device.wheelhouse" in line


# An absolute filesystem path in text: a machine's folder, which the repository must not
# name (the API's own paths, /v1/…, are routes, not folders).
_ABSOLUTE = re.compile(r"(?<![\w.:/])/(?!v1/)[A-Za-z0-9_.-]+/[^\s\"'`),]*")


def absolute_paths(text: str) -> list[str]:
    return _ABSOLUTE.findall(text)


def test_the_path_check_finds_a_machines_folder() -> None:
    assert absolute_paths('{"out": "/srv/x/run.json", "url": "/v1/videos"}') == ["/srv/x/run.json"]
    assert absolute_paths("--png docs/images/a.png https://host/a/b") == []


def test_evidence_names_no_folder_of_the_machine_that_ran_it() -> None:
    found = [
        f"{path.name}: {p}"
        for path in sorted((ROOT / "docs" / "evidence").glob("*.json"))
        for p in absolute_paths(path.read_text())
    ]
    assert found == []
