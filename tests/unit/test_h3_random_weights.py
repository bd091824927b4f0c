"""The benchmark-only loading mode (``weights = "random"``, workers/pipelines/diffusers/
minimax_h3/random_weights.py) through the real registry: refused unless the worker setting allows
it, and when allowed, a MiniMax-H3 built from configs on the device, seeded, that runs a job."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from models.registry import parse_registry
from tests.unit.h3_fixtures import h3_request
from tests.unit.job_steps import run_job
from tests.unit.random_weights import assert_refused_by_default, random_registry
from workers.pipelines.diffusers.minimax_h3.random_weights import TOY_CONFIG, random_pipeline
from workers.pipelines.registry import PipelineRegistry

NAME = "MiniMaxAI/MiniMax-H3"
REGISTRY = f"""
[[model]]
name = "{NAME}"
adapter = "diffusers.minimax_h3"
weights = "random"
dtype = "float32"
[model.spec]
canvas_short_edge = 64
canvas_max_pixels = 8192
"""


def _registry(**kw: Any) -> PipelineRegistry:
    """The entry at the toy sizes (``random_config``), its text read after layer 2."""
    options = {"random_text_layers": 2, "random_config": TOY_CONFIG}
    return random_registry(REGISTRY, options, **kw)


def _job(registry: PipelineRegistry) -> Any:
    return run_job(registry.job(NAME), h3_request())


def test_a_random_weights_entry_is_refused_unless_the_worker_allows_it() -> None:
    registry = _registry()
    assert_refused_by_default(registry, lambda: registry.job(NAME))


def test_an_allowed_random_entry_builds_seeded_weights_and_runs_a_job() -> None:
    first = _job(_registry(random_weights=True))
    assert first.frames.shape == (124, 64, 64, 3) and first.frames.dtype == np.uint8
    assert first.audio is not None and first.audio.ndim == 2 and 2 in first.audio.shape
    # The same seed on another worker: the same weights, so the same frames.
    again = _job(_registry(random_weights=True))
    np.testing.assert_array_equal(first.frames, again.frames)


def test_a_family_without_the_mode_and_an_unknown_part_are_refused() -> None:
    wan = parse_registry(REGISTRY.replace("minimax_h3", "wan"))
    registry = PipelineRegistry(wan, "cpu", random_weights=True)
    with pytest.raises(ValueError, match="no random-weights loading mode"):
        registry.job(NAME)
    with pytest.raises(ValueError, match="random_config: no part unet"):
        random_pipeline("cpu", torch.float32, config={"unet": {}})
    with pytest.raises(ValueError, match="random_text_layers must be at least 1"):
        random_pipeline("cpu", torch.float32, text_layers=0)
