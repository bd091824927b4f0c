"""``omniqueue up`` as a child process on a free port: started until it says it is up,
stopped with SIGINT. The browser tests and the benchmarks share it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from workers.runtime.processes import free_port

ROOT = Path(__file__).resolve().parents[1]


def start_up(
    data_dir: Path,
    *,
    env: dict[str, str],
    args: Sequence[str] = (),
    log: Path | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """``omniqueue up`` on a free port in ``data_dir`` with ``env`` added; (process, URL)
    once it says it is up. Stop it with SIGINT."""
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "up",
            "--port",
            str(free_port()),
            "--data-dir",
            str(data_dir),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if log is None else log.open("ab"),
        env={**os.environ, **env},
        cwd=ROOT,
    )
    assert up.stdout is not None
    line = up.stdout.readline().decode()
    if "up: " not in line:
        up.send_signal(signal.SIGINT)
        up.wait(60)
        raise SystemExit(f"omniqueue up did not start: {line!r}")
    return up, line.split("up: ", 1)[1].split()[0]


def stop_up(up: subprocess.Popen[bytes], data_dir: Path, timeout: float = 60) -> None:
    """SIGINT an ``omniqueue up`` from :func:`start_up`, wait for it, remove its data."""
    up.send_signal(signal.SIGINT)
    try:
        up.wait(timeout)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
