"""Builders the unit and the integration tests share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.job_specs import VideoSpec
from models.session_bus import WorldSessionConfig


def video_spec(**overrides: Any) -> VideoSpec:
    """A valid video job spec, small (64x48, 8 frames at 16 fps, 2 steps, seed 1), with
    ``overrides`` in place of its fields."""
    fields: dict[str, Any] = {
        "model": "reference/video",
        "prompt": "p",
        "seed": 1,
        "num_inference_steps": 2,
        "width": 64,
        "height": 48,
        "fps": 16.0,
        "num_frames": 8,
    }
    return VideoSpec(**fields | overrides)


def world_session_config(**overrides: Any) -> WorldSessionConfig:
    """A valid world session config as the API places it, small (64x48, 33 frames at
    8 fps, seed 1, the reference world model), with ``overrides`` in place of its fields."""
    fields: dict[str, Any] = {
        "model": "reference/world",
        "owner": "local",
        "prompt": "p",
        "width": 64,
        "height": 48,
        "num_frames": 33,
        "fps": 8.0,
        "seed": 1,
    }
    return WorldSessionConfig(**fields | overrides)


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every absolute import in the module at ``path``,
    wherever it stands (a function body too)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found
