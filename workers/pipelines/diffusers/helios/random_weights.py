"""Helios-Distilled with seeded random weights, built from its configs on the device: the
benchmark-only loading mode of a ``diffusers.helios`` registry entry with
``weights = "random"`` (``minimax_h3/random_weights.py`` is MiniMax-H3's).

The lent H200 could hold a saved Helios-Distilled (the 14 B transformer is 28 GB in bf16,
the UMT5-XXL text encoder 11 GB), but writing it and reading it back into every worker
process would spend minutes of a session's 30 of device time; allocated on the device in
the entry's dtype and initialised there from a fixed seed, the parts take seconds.
Everything else goes through the real registry, loader and worker. A worker refuses such
an entry unless ``OMNIQ_WORKER__RANDOM_WEIGHTS`` is on
(:class:`~workers.pipelines.registry.PipelineRegistry`): a deployment must never serve
noise by mistake.

What is Helios-Distilled's, as far as configs go:

* ``HeliosPyramidPipeline`` with ``is_distilled=True`` and ``is_cfg_zero_star=False`` (the
  checkpoint's ``model_index.json``);
* the transformer: ``HeliosTransformer3DModel``'s default config, the 14 B model (40
  blocks of 40 heads x 128, FFN 13824, text width 4096, the multi-term memory patches);
* the text encoder: ``UMT5EncoderModel`` with umt5-xxl's published config (24 layers,
  width 4096, 64 heads, FFN 10240, 256,384-row vocabulary), full depth;
* the VAE: ``AutoencoderKLWan``'s default config (Wan 2.1's: z 16, 8x spatial, 4x
  temporal);
* the scheduler: ``HeliosDMDScheduler`` with 3 stages and resolution-dependent shifting,
  diffusers' defaults otherwise (``gamma`` 1/3 included).

What differs, and is reported with every figure made with it:

* the weights are random: the video is noise, the cost is the shapes';
* the tokenizer is character-level (``random_parts.character_tokenizer``; no
  sentencepiece model offline): a prompt is as many tokens as it has characters, padded to
  ``max_sequence_length`` (512) as the real one pads, so the text encoder's cost is the
  same;
* the VAE is in the entry's dtype (the published example loads it in float32; the
  adapter loads every part of a checkpoint in the entry's dtype too); the transformer's
  norms, time embedder and modulation tables are float32, as ``from_pretrained`` keeps
  them (:func:`keep_in_float32`);
* where the checkpoint's own ``config.json`` files were not read here, diffusers'
  defaults stand in: the transformer's ``is_amplify_history`` (off), the scheduler's
  ``shift`` and ``time_shift_type``.

Block noise: each pyramid stage after the first draws noise through the Cholesky factor
of a 4x4 covariance that is singular at ``gamma`` 1/3 but for a 1e-8 ridge float32
rounds away. CUDA's factorisation has been seen to accept it, CPU LAPACK refuses it;
:func:`random_pipeline` checks on the device first and names the override
(``random_config.scheduler.gamma``) instead of failing a session's second stage.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from diffusers import AutoencoderKLWan, HeliosPyramidPipeline, HeliosTransformer3DModel
from diffusers.schedulers import HeliosDMDScheduler
from transformers import UMT5Config, UMT5EncoderModel

from workers.pipelines.diffusers.shared.loading import allocated_on
from workers.pipelines.diffusers.shared.random_parts import (
    TINY_UMT5,
    UMT5_XXL,
    character_tokenizer,
    checked_config,
)

# The parts whose configs ``random_config`` may override (a smaller variant; CPU tests).
PARTS = ("transformer", "text_encoder", "vae", "scheduler")

# A tiny Helios-Distilled as ``random_config``: the sizes of tests/unit/helios_fixtures.py
# (two 24-wide blocks, a 32-wide two-layer UMT5, a 3-channel VAE). ``gamma`` 0.2: CPU
# LAPACK refuses the block noise's covariance at 1/3 (module docstring).
TINY_CONFIG: dict[str, dict[str, Any]] = {
    "transformer": {
        "num_attention_heads": 2,
        "attention_head_dim": 12,
        "text_dim": 32,
        "ffn_dim": 32,
        "num_layers": 2,
        "rope_dim": [4, 4, 4],
    },
    "text_encoder": TINY_UMT5,
    "vae": {
        "base_dim": 3,
        "dim_mult": [1, 1, 1, 1],
        "num_res_blocks": 1,
        "temperal_downsample": [False, True, True],
    },
    "scheduler": {"gamma": 0.2},
}


def check_block_noise(device: torch.device, gamma: float, patch: tuple[int, ...]) -> None:
    """Raise unless ``device`` factorises the pyramid's block-noise covariance at
    ``gamma`` as ``HeliosPyramidPipeline.sample_block_noise`` builds it."""
    block = patch[-2] * patch[-1]
    eye = torch.eye(block, device=device)
    cov = eye * (1 + gamma) - torch.ones(block, block, device=device) * gamma + eye * 1e-8
    _, info = torch.linalg.cholesky_ex(cov.float())
    if int(info.item()) != 0:
        raise ValueError(
            f"{device.type} cannot factorise Helios's block-noise covariance at gamma "
            f"{gamma:g} (singular at 1/3 in float32): set random_config.scheduler.gamma, "
            "e.g. 0.2"
        )


def keep_in_float32(model: Any) -> None:
    """The parameters diffusers' ``from_pretrained`` loads in float32 whatever the dtype
    asked (the class's ``_keep_in_fp32_modules``, matched against each part of a
    parameter's name), as a checkpoint of the entry's dtype would hold them."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, param in model.named_parameters():
        if keep & set(name.split(".")):
            param.data = param.data.float()


def random_pipeline(
    device: str | torch.device,
    dtype: torch.dtype,
    *,
    seed: int = 42,
    config: dict[str, dict[str, Any]] | None = None,
    max_sequence_length: int = 512,
    transformer_on_host: bool = False,
) -> HeliosPyramidPipeline:
    """Helios-Distilled from its configs with seeded random weights, on ``device`` in
    ``dtype``. ``config`` overrides the config of each part named in :data:`PARTS`.
    ``transformer_on_host``: the transformer is built on the CPU instead, as a checkpoint
    loads, for a memory plan to place it (FP8: layer by layer): the device never holds its
    loaded-dtype copy (27 GiB in bf16), so two FP8 workers can load on one 80 GB GPU at
    once; its init runs on one CPU core (a minute or so), its weights are the CPU
    generator's."""
    config = checked_config(config, PARTS)
    device = torch.device(device)
    with warnings.catch_warnings():
        # HeliosDMDScheduler.__init__ passes torch tensors to np.linspace (diffusers 0.42).
        warnings.filterwarnings("ignore", "__array_wrap__", DeprecationWarning)
        scheduler: Any = HeliosDMDScheduler(
            **{"stages": 3, "use_dynamic_shifting": True, **config.get("scheduler", {})}
        )
    transformer_config = config.get("transformer", {})
    patch = tuple(transformer_config.get("patch_size", (1, 2, 2)))
    check_block_noise(device, float(scheduler.config.gamma), patch)
    torch.manual_seed(seed)
    with allocated_on(torch.device("cpu") if transformer_on_host else device, dtype):
        transformer: Any = HeliosTransformer3DModel(**transformer_config)
    with allocated_on(device, dtype):
        text_encoder: Any = UMT5EncoderModel(
            UMT5Config(**{**UMT5_XXL, **config.get("text_encoder", {})})
        )
        vae: Any = AutoencoderKLWan(**config.get("vae", {}))
    keep_in_float32(transformer)
    for module in (transformer, text_encoder, vae):
        module.eval()
    return HeliosPyramidPipeline(
        tokenizer=character_tokenizer(max_sequence_length),
        text_encoder=text_encoder,
        vae=vae,
        scheduler=scheduler,
        transformer=transformer,
        is_cfg_zero_star=False,
        is_distilled=True,
    )
