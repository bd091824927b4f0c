"""``realtime/`` holds the sans-I/O protocol state machines, their state and their pure
helpers (STYLE rule 4, as the ``websockets`` core): no event loop, web framework or Redis
client, not even in a function body. Their asyncio shells live in ``api/realtime/``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import imported_packages

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {"asyncio", "fastapi", "starlette", "redis", "anyio"}


def test_no_realtime_module_imports_io() -> None:
    modules = sorted((REPO / "realtime").rglob("*.py"))
    assert len(modules) > 10  # the protocols are there, not moved away with their shells
    offending = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in modules
        for line, name in imported_packages(path)
        if name in FORBIDDEN
    ]
    assert offending == []


def test_importing_realtime_loads_no_io_package() -> None:
    """Nor through what it imports (``storage``, say, would bring ``redis``): a fresh
    interpreter that imports every module of ``realtime/`` has none of them loaded."""
    probe = (
        "import importlib, json, pkgutil, sys, realtime\n"
        "names = [m.name for m in pkgutil.walk_packages(realtime.__path__, 'realtime.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(json.dumps([names, sorted({m.split('.')[0] for m in sys.modules})]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "realtime.audio_protocol" in names and "realtime.video_protocol" in names
    assert sorted(FORBIDDEN & set(loaded)) == []
