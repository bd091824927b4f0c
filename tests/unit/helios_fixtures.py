"""A tiny, seeded Helios (``diffusers.HeliosPipeline``) built offline for the Helios world
adapter's tests: the tiny Wan VAE and UMT5 text encoder of ``diffusers_fixtures.py`` with
a two-block ``HeliosTransformer3DModel``, float32, nothing downloaded.

Sizes: multiples of 64 (the long history is patched 4x(1, 2, 2) over an 8x VAE)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from diffusers import (
    AutoencoderKLWan,
    HeliosPipeline,
    HeliosPyramidPipeline,
    HeliosTransformer3DModel,
)
from diffusers.schedulers import HeliosDMDScheduler, HeliosScheduler

from tests.unit.diffusers_fixtures import TEXT_DIM, TINY_SEQ_LEN, tiny_tokenizer, tiny_umt5

SEQ_LEN = TINY_SEQ_LEN  # text tokens the tiny pipeline is run with
SIZE = 64  # height and width of the test videos
# A ``/v1/realtime/video`` session.start of the tiny Helios served as "Helios/tiny" (the
# integration tests' registry entry): 64x64 at 24 fps, seed 3, 2 steps a chunk; the
# tests add its ``num_frames``.
SESSION_START: dict[str, Any] = {
    "type": "session.start",
    "model": "Helios/tiny",
    "prompt": "a red ball at sunset",
    "width": SIZE,
    "height": SIZE,
    "fps": 24,
    "seed": 3,
    "num_inference_steps": 2,
}


def tiny_helios_transformer(seed: int = 0) -> HeliosTransformer3DModel:
    torch.manual_seed(seed)
    return HeliosTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=TEXT_DIM,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        rope_dim=(4, 4, 4),
    ).eval()


def _tiny_vae() -> AutoencoderKLWan:
    """The pipelines' VAE, seeded first (as each pipeline's components were built)."""
    torch.manual_seed(0)
    return AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()


def _components(scheduler: Callable[[], HeliosScheduler | HeliosDMDScheduler]) -> dict[str, Any]:
    """A tiny pipeline's modules, built (and seeded) in the order they always were."""
    vae = _tiny_vae()
    with warnings.catch_warnings():
        # HeliosScheduler.__init__ passes torch tensors to np.linspace (diffusers 0.42).
        warnings.filterwarnings("ignore", "__array_wrap__", DeprecationWarning)
        made = scheduler()
    return {
        "tokenizer": tiny_tokenizer(),
        "text_encoder": tiny_umt5(),
        "vae": vae,
        "scheduler": made,
        "transformer": tiny_helios_transformer(),
    }


def tiny_helios_pipeline() -> HeliosPipeline:
    """Helios-Base's shape in miniature: UniPC ``HeliosScheduler`` with one stage and
    resolution-dependent shifting (as the published scheduler config)."""
    return HeliosPipeline(
        **_components(lambda: HeliosScheduler(stages=1, use_dynamic_shifting=True, shift=1.0))
    )


def tiny_helios_pyramid_pipeline(*, distilled: bool) -> HeliosPyramidPipeline:
    """Helios-Mid's shape (``distilled=False``: three-stage UniPC ``HeliosScheduler``)
    or Helios-Distilled's (``HeliosDMDScheduler``, DMD steps) in miniature. Without
    CFG-Zero*: diffusers 0.42's own pyramid loop fails with it (``.view`` of the
    transformer's non-contiguous output).
    ``gamma`` 0.2: at the default 1/3 the block-noise covariance of a 2x2 patch is
    singular, and its Cholesky factorisation fails on CPU float32."""
    kind = HeliosDMDScheduler if distilled else HeliosScheduler
    return HeliosPyramidPipeline(
        **_components(lambda: kind(stages=3, use_dynamic_shifting=True, shift=1.0, gamma=0.2)),
        is_distilled=distilled,
    )


def first_chunk_stepped(adapter: Any, *, seed: int, steps_per_chunk: int) -> Any:
    """A session of ``adapter`` (a loaded Helios world adapter) on "a red ball", SIZE
    square, 66 frames at 24 fps, its first chunk's steps all run and not yet decoded."""
    from workers.pipelines.base import WorldConfig

    config = WorldConfig(
        prompt="a red ball", width=SIZE, height=SIZE, num_frames=66, fps=24.0, seed=seed,
        steps_per_chunk=steps_per_chunk,
    )  # fmt: skip
    state = adapter.start(config)
    while not adapter.chunk_done(state):
        adapter.step(state)
    return state
