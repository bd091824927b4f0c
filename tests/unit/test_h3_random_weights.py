"""The benchmark-only loading mode (``weights = "random"``, workers/pipelines/diffusers/
h3_random.py) through the real registry: refused unless the worker setting allows it, and
when allowed, a MiniMax-H3 built from configs on the device, seeded, that runs a job."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from models.catalog import CatalogError, parse_registry
from storage.settings import Settings
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.h3_random import random_pipeline
from workers.pipelines.registry import PipelineRegistry

NAME = "MiniMaxAI/MiniMax-H3"
# The toy sizes of tests/unit/h3_fixtures.py, as ``random_config`` overrides.
REGISTRY = f"""
[[model]]
name = "{NAME}"
adapter = "diffusers.minimax_h3"
weights = "random"
dtype = "float32"
[model.adapter_options]
random_text_layers = 2
[model.adapter_options.random_config.transformer]
num_attention_heads = 2
attention_head_dim = 16
hidden_size = 32
num_layers = 2
num_refiner_layers = 1
ffn_dim = 64
in_channels = 8
audio_in_channels = 8
text_dim = 32
freq_dim = 32
time_embed_hidden_dim = 32
time_embed_dim = 16
rope_freq_dim = 2
[model.adapter_options.random_config.text_encoder]
hidden_size = 32
intermediate_size = 64
num_attention_heads = 2
num_key_value_heads = 1
head_dim = 16
rope_scaling = {{ rope_type = "default", mrope_section = [2, 3, 3] }}
max_position_embeddings = 4096
[model.adapter_options.random_config.vision]
depth = 1
hidden_size = 32
intermediate_size = 64
num_heads = 2
out_hidden_size = 32
patch_size = 4
deepstack_visual_indexes = [0]
num_position_embeddings = 64
[model.adapter_options.random_config.vae]
latent_channels = 8
block_out_channels = [8, 8, 8, 8, 8, 8]
layers_per_block = 1
norm_num_groups = 4
decoder_num_layers = 1
decoder_num_attention_heads = 2
decoder_attention_head_dim = 8
latents_mean = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
latents_std = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
[model.adapter_options.random_config.audio_vae]
encoder_dim = 4
latent_dim = 16
latent_channels = 8
num_attention_heads = 2
decoder_dim = 128
resblock_kernel_sizes = [3]
resblock_dilation_sizes = [[1]]
latents_mean = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
latents_std = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
[model.spec]
canvas_short_edge = 64
canvas_max_pixels = 8192
"""


def _request() -> GenerationRequest:
    return GenerationRequest.video(
        prompt="a red ball",
        width=64,
        height=64,
        num_frames=124,
        fps=24.0,
        num_inference_steps=3,
        seed=42,
    )


def _job(registry: PipelineRegistry) -> Any:
    pipe = registry.job(NAME)
    state = pipe.prepare(_request())
    try:
        while not state.done:
            pipe.step(state)
        return pipe.decode(state)
    finally:
        pipe.end()


def test_a_random_weights_entry_is_refused_unless_the_worker_allows_it() -> None:
    assert Settings().worker.random_weights is False
    registry = PipelineRegistry(parse_registry(REGISTRY), "cpu")
    with pytest.raises(CatalogError, match="OMNIQ_WORKER__RANDOM_WEIGHTS"):
        registry.job(NAME)
    assert registry._loaded == {}


def test_an_allowed_random_entry_builds_seeded_weights_and_runs_a_job() -> None:
    first = _job(PipelineRegistry(parse_registry(REGISTRY), "cpu", random_weights=True))
    assert first.frames.shape == (124, 64, 64, 3) and first.frames.dtype == np.uint8
    assert first.audio is not None and first.audio.ndim == 2 and 2 in first.audio.shape
    # The same seed on another worker: the same weights, so the same frames.
    again = _job(PipelineRegistry(parse_registry(REGISTRY), "cpu", random_weights=True))
    np.testing.assert_array_equal(first.frames, again.frames)


def test_a_family_without_the_mode_and_an_unknown_part_are_refused() -> None:
    wan = REGISTRY.split("[model.adapter_options]")[0].replace("minimax_h3", "wan")
    registry = PipelineRegistry(parse_registry(wan), "cpu", random_weights=True)
    with pytest.raises(ValueError, match="no random-weights loading mode"):
        registry.job(NAME)
    with pytest.raises(ValueError, match="random_config: no part unet"):
        random_pipeline("cpu", torch.float32, config={"unet": {}})
    with pytest.raises(ValueError, match="random_text_layers must be at least 1"):
        random_pipeline("cpu", torch.float32, text_layers=0)
