"""What every test process, and every process a test starts, shares.

One intra-op thread for torch, OpenMP and the BLAS libraries. The suite runs in two
xdist workers on two cores, and its stacks start API and worker subprocesses beside
them; with a thread pool of one thread per core in each process, the threads spin-wait on
each other (a Helios test took 20-31 s so, 1 s on one thread), and the tensors of the
tiny test pipelines are too small to gain from more threads anyway. Set here, before
torch is imported, in the environment so that subprocesses inherit it; a value set
outside wins.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")


# ---- the order of the modules under xdist ---------------------------------------------
#
# With ``--dist loadfile`` each module runs whole in one process, and a process takes the
# next module in the order of the collection (``--no-loadscope-reorder`` in pyproject.toml:
# xdist's own order, by number of tests, put the few-test modules that start whole stacks,
# the slowest, last, so one process ran them while the other had nothing left). Here the
# collection is ordered longest module first by the seconds a clean-clone run measured
# (``tests/module_durations.json``), so what is left at the end is short and the two
# processes end together. A module the file does not know yet goes first. Refresh it with
# ``--module-durations=tests/module_durations.json`` on the README's test command.

MODULE_DURATIONS = Path(__file__).with_name("module_durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--module-durations",
        metavar="PATH",
        help="write each module's seconds (setup, call and teardown of its tests) to this "
        "JSON file, merged into what it holds (the file that orders modules under xdist)",
    )


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: the usual order
        return
    seconds: dict[str, float] = (
        json.loads(MODULE_DURATIONS.read_text()) if MODULE_DURATIONS.exists() else {}
    )
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(_module(item.nodeid), i)
    items.sort(
        key=lambda item: (-seconds.get(_module(item.nodeid), math.inf), first[_module(item.nodeid)])
    )


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller (or the one process)
        module = _module(report.nodeid)
        _measured[module] = _measured.get(module, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("module_durations")
    if not path or "PYTEST_XDIST_WORKER" in os.environ or not _measured:
        return
    out = Path(path)
    known: dict[str, float] = json.loads(out.read_text()) if out.exists() else {}
    known.update({module: round(s, 1) for module, s in _measured.items()})
    out.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
