"""The rules of docs/architecture.md that a machine can check, read off the source with
``ast`` (``tests/import_graph.py``; nothing is imported): which folder may import which, no
import circle (imports under ``TYPE_CHECKING`` and inside functions count), and the size
of modules and functions."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import import_graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("models", "storage", "realtime", "api", "workers", "cli", "migrations")

# Who may import whom: the tiers, then the layers inside workers/ (a folder may always
# import itself). docs/architecture.md draws the same table.
MAY_IMPORT: dict[str, set[str]] = {
    "models": set(),
    "storage": {"models"},
    "realtime": {"models", "storage"},
    "api": {"models", "storage", "realtime"},
    "migrations": {"models", "storage"},
    "workers.common": {"models", "storage"},
    "workers.media": {"models", "storage", "workers.common"},
    "workers.pipelines": {"models", "storage", "workers.common", "workers.media"},
    "workers.jobs": {"models", "storage", "workers.common", "workers.media", "workers.pipelines"},
    "workers.sessions": {
        "models",
        "storage",
        "workers.common",
        "workers.media",
        "workers.pipelines",
    },
    "workers.services": {"models", "storage", "workers.common", "workers.jobs"},
    "workers.runtime": {
        "models",
        "storage",
        "workers.common",
        "workers.media",
        "workers.pipelines",
        "workers.jobs",
        "workers.sessions",
        "workers.services",
    },
}
MAY_IMPORT["cli"] = set(MAY_IMPORT) | {"workers"}  # the command line starts everything
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100


MODULES = import_graph.modules(ROOT, PACKAGES)


def _area(module: str) -> str:
    """The row of :data:`MAY_IMPORT` a module belongs to."""
    top, _, rest = module.partition(".")
    if top == "workers":
        sub = rest.partition(".")[0]
        return f"workers.{sub}" if f"workers.{sub}" in MAY_IMPORT else "workers"
    return top


def test_every_import_goes_down_the_layers() -> None:
    upward = []
    for module, targets in import_graph.graph(MODULES).items():
        area = _area(module)
        if area == "workers":  # workers/__init__.py
            continue
        for target in targets:
            other = _area(target)
            if other != area and other not in MAY_IMPORT[area]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_no_import_circle() -> None:
    assert import_graph.cycles(import_graph.graph(MODULES)) == []


def test_modules_and_functions_stay_small() -> None:
    too_long = []
    for module, path in MODULES.items():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{module}: {len(source.splitlines())} lines")
        too_long += [
            f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
        ]
    assert too_long == []
