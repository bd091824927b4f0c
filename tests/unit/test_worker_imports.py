"""Workers install apart (DESIGN.md, "Tiers install apart"): the worker image has the
``worker`` and ``diffusers`` extras only, so nothing under ``workers/`` may import ``cli``
(whose embedded services need the ``embedded`` extra) or ``api`` (the ``api`` extra).
``tests/integration/test_worker_tier.py`` runs a worker from such an install."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_no_worker_module_imports_cli_or_api() -> None:
    modules = sorted((REPO / "workers").rglob("*.py"))
    assert REPO / "workers" / "group.py" in modules
    offending = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in modules
        for line, name in _imports(path)
        if name in ("cli", "api")
    ]
    assert offending == []
