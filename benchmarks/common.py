"""What the benchmark scripts share: their argument parser, percentile summaries, the
machine they ran on, the JSON at the end. (``omniqueue up`` as a child process, which the
browser tests use too, is ``tests/embedded_up.py``.)"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def repo_path(path: Path) -> str:
    """``path`` as a report records it: relative to the repository when inside it (a report
    names no folder of the machine that ran it), else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def command_line() -> str:
    """The command line that ran the script, for its report (the script repository-relative:
    ``python -m`` puts its absolute path in ``sys.argv[0]``)."""
    return " ".join([repo_path(Path(sys.argv[0])), *sys.argv[1:]])


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


def machine() -> str:
    """What ran the benchmark, for its report."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def valkey_url(data_dir: Path) -> str:
    """The embedded Valkey of an ``omniqueue up`` started in ``data_dir``."""
    conf = (data_dir / "valkey" / "valkey.conf").read_text().split("\n")
    port = next(ln.split()[1] for ln in conf if ln.startswith("port "))
    return f"redis://127.0.0.1:{port}/0"
