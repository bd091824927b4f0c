"""What the benchmark scripts share: their argument parser, percentile summaries and an
embedded stack.

Scripts put the repository root on ``sys.path`` and ``from benchmarks.common import …``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.processes import free_port

ROOT = Path(__file__).resolve().parents[1]


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's argument parser: its docstring is the ``--help`` text, kept as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)


def emit(report: dict[str, Any], out: Path | None) -> None:
    """Print a script's JSON report, and write it to ``out`` too when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float], digits: int = 1) -> dict[str, float] | None:
    """n, mean, p50, p95, p99, max; None when there is nothing to summarize."""
    if not values:
        return None
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), digits),
        "p50": round(pct(values, 0.5), digits),
        "p95": round(pct(values, 0.95), digits),
        "p99": round(pct(values, 0.99), digits),
        "max": round(max(values), digits),
    }


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


def machine() -> str:
    """What ran the benchmark, for its report."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def valkey_url(data_dir: Path) -> str:
    """The embedded Valkey of an ``omniqueue up`` started in ``data_dir``."""
    conf = (data_dir / "valkey" / "valkey.conf").read_text().split("\n")
    port = next(ln.split()[1] for ln in conf if ln.startswith("port "))
    return f"redis://127.0.0.1:{port}/0"
