"""Helios-Distilled's benchmark-only loading mode (``weights = "random"``,
workers/pipelines/diffusers/helios/random_weights.py) through the real registry: refused unless
the worker setting allows it; allowed, a seeded distilled pyramid pipeline built on the
device (here the tiny sizes of ``helios_fixtures.py``, CPU, float32) whose session chunk
is diffusers' own ``HeliosPyramidPipeline`` call on it; and the default configs are the
14 B model with umt5-xxl (counted on the meta device, nothing allocated)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import HeliosPyramidPipeline, HeliosTransformer3DModel
from transformers import UMT5Config, UMT5EncoderModel

from tests.unit.random_weights import assert_refused_by_default, random_registry
from workers.pipelines.base import WorldConfig
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.helios.random_weights import (
    TINY_CONFIG,
    check_block_noise,
    random_pipeline,
)
from workers.pipelines.diffusers.shared.common import to_uint8
from workers.pipelines.diffusers.shared.random_parts import UMT5_XXL
from workers.pipelines.registry import PipelineRegistry

NAME = "BestWishYsh/Helios-Distilled"
SEQ_LEN = 16
REGISTRY = f"""
[[model]]
name = "{NAME}"
adapter = "diffusers.helios"
weights = "random"
dtype = "float32"
[model.spec]
default_size = [64, 64]
default_steps = 3
"""
PROMPT = "a red ball at sunset"


def _registry(**kw: Any) -> PipelineRegistry:
    options = {"random_config": TINY_CONFIG, "max_sequence_length": SEQ_LEN}
    return random_registry(REGISTRY, options, **kw)


def _chunk(adapter: Any) -> np.ndarray:
    """The first chunk of a Distilled session: 3 steps (pyramid [1, 1, 1]), no CFG."""
    config = WorldConfig(
        prompt=PROMPT, width=64, height=64, num_frames=33, fps=24.0, seed=5,
        steps_per_chunk=3, extra={"guidance_scale": 1.0},
    )  # fmt: skip
    state = adapter.start(config)
    while not adapter.chunk_done(state):
        adapter.step(state)
    frames: np.ndarray = adapter.take_chunk(state)
    return frames


def test_a_random_helios_entry_is_refused_unless_the_worker_allows_it() -> None:
    registry = _registry()
    assert_refused_by_default(registry, lambda: registry.world(NAME))


def test_an_allowed_entry_builds_a_seeded_distilled_pipeline_that_runs_a_session() -> None:
    adapter = _registry(random_weights=True).world(NAME)
    assert isinstance(adapter, HeliosWorldAdapter)
    assert isinstance(adapter.pipe, HeliosPyramidPipeline)
    pipe: Any = adapter.pipe
    assert pipe.config.is_distilled and not pipe.config.is_cfg_zero_star
    assert type(pipe.scheduler).__name__ == "HeliosDMDScheduler"
    assert pipe.scheduler.config.stages == 3
    frames = _chunk(adapter)
    assert frames.shape == (33, 64, 64, 3) and frames.dtype == np.uint8
    # The same seed on another worker: the same weights, so the same frames.
    np.testing.assert_array_equal(frames, _chunk(_registry(random_weights=True).world(NAME)))
    # And the session's chunk is diffusers' own call on the pipeline the mode built.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "__array_wrap__", DeprecationWarning)
        out = pipe(
            PROMPT, height=64, width=64, num_frames=33, guidance_scale=1.0,
            pyramid_num_inference_steps_list=[1, 1, 1], max_sequence_length=SEQ_LEN,
            generator=torch.Generator().manual_seed(5), output_type="np",
        )  # fmt: skip
    np.testing.assert_array_equal(frames, to_uint8(out.frames[0]))


def test_the_default_configs_are_the_14b_transformer_and_umt5_xxl() -> None:
    with torch.device("meta"):
        transformer: Any = HeliosTransformer3DModel()
        text_encoder = UMT5EncoderModel(UMT5Config(**UMT5_XXL))
    billions = sum(p.numel() for p in transformer.parameters()) / 1e9
    assert 13.5 < billions < 15.0, billions
    assert len(transformer.blocks) == 40
    billions = sum(p.numel() for p in text_encoder.parameters()) / 1e9
    assert 5.0 < billions < 6.5, billions


def test_a_bfloat16_build_keeps_what_from_pretrained_keeps_in_float32() -> None:
    pipe: Any = random_pipeline("cpu", torch.bfloat16, config=TINY_CONFIG)
    block = pipe.transformer.blocks[0]
    assert block.scale_shift_table.dtype == torch.float32
    assert block.attn1.to_q.weight.dtype == torch.bfloat16
    assert pipe.text_encoder.dtype == pipe.vae.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32  # restored after the build


def test_the_block_noise_is_checked_and_unknown_parts_are_refused() -> None:
    # At 1/3 the covariance is singular (whether float32 LAPACK notices depends on its
    # rounding); at 1/2 it has a negative eigenvalue, 1 - 3 * 0.5, on every machine.
    with pytest.raises(ValueError, match=r"set random_config\.scheduler\.gamma"):
        check_block_noise(torch.device("cpu"), 0.5, (1, 2, 2))
    check_block_noise(torch.device("cpu"), 0.2, (1, 2, 2))
    with pytest.raises(ValueError, match="random_config: no part unet"):
        random_pipeline("cpu", torch.float32, config={"unet": {}})


def test_the_transformer_can_be_built_on_the_host_for_the_memory_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``random_transformer_on_host`` (issue 44: two FP8 Helios workers loading on one
    80 GB GPU at once): the transformer is built on the CPU, as a checkpoint loads, the
    rest on the device (the meta device stands in for a GPU here), for the memory plan to
    place; through the registry it is the same pipeline, seed for seed, on a CPU worker."""
    from workers.pipelines.diffusers.helios import random_weights

    monkeypatch.setattr(random_weights, "check_block_noise", lambda *args: None)
    pipe: Any = random_pipeline(
        "meta", torch.bfloat16, config=TINY_CONFIG, transformer_on_host=True
    )
    assert {p.device.type for p in pipe.transformer.parameters()} == {"cpu"}
    assert {p.device.type for p in pipe.text_encoder.parameters()} == {"meta"}
    assert {p.device.type for p in pipe.vae.parameters()} == {"meta"}
    monkeypatch.undo()
    options = {"random_config": TINY_CONFIG, "max_sequence_length": SEQ_LEN}
    on_host = random_registry(
        REGISTRY, {**options, "random_transformer_on_host": True}, random_weights=True
    ).world(NAME)
    assert isinstance(on_host, HeliosWorldAdapter) and on_host.random_transformer_on_host
    np.testing.assert_array_equal(
        _chunk(on_host), _chunk(_registry(random_weights=True).world(NAME))
    )
