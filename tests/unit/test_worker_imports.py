"""Workers install apart (docs/architecture.md, rule 1): the worker image has the
``worker`` and ``diffusers`` extras only, so nothing under ``workers/`` may import ``cli``
(whose embedded services need the ``embedded`` extra) or ``api`` (the ``api`` extra).
``tests/integration/test_worker_tier.py`` runs a worker from such an install."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import imported_packages

REPO = Path(__file__).resolve().parents[2]


def test_no_worker_module_imports_cli_or_api() -> None:
    modules = sorted((REPO / "workers").rglob("*.py"))
    assert REPO / "workers" / "runtime" / "group.py" in modules
    offending = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in modules
        for line, name in imported_packages(path)
        if name in ("cli", "api")
    ]
    assert offending == []
