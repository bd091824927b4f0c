"""Builders the unit and the integration tests share."""

from __future__ import annotations

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
