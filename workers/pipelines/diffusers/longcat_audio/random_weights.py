"""LongCat-AudioDiT-1B with seeded random weights, built from its configs on the device: the
benchmark-only loading mode of a ``diffusers.longcat_audio`` registry entry with
``weights = "random"`` (``minimax_h3/random_weights.py`` and ``helios/random_weights.py`` are the
others').

The lent H200 has no copy of the checkpoint and no way to fetch one; built on the device
in the entry's dtype from a fixed seed, the parts take seconds. Everything else goes
through the real registry, loader and worker. A worker refuses such an entry unless
``OMNIQ_WORKER__RANDOM_WEIGHTS`` is on (:class:`~workers.pipelines.registry.
PipelineRegistry`): a deployment must never serve noise by mistake.

What is LongCat-AudioDiT-1B's, as far as configs go:

* the transformer: ``LongCatAudioDiTTransformer``'s default config (24 blocks of width
  1536, 24 heads, text width 768, latent width 64, global AdaLN, text ConvNeXt, latent
  condition), the 1B model;
* the text encoder: ``UMT5EncoderModel`` with umt5-base's published config (12 layers,
  width 768, 12 heads, gated-GELU FFN 2048, 256,384-row vocabulary);
* the VAE: ``LongCatAudioDiTVae`` with the released model's strides ``[2, 4, 4, 8, 8]``
  (2048 samples a latent frame at 24 kHz), channels 128, ``c_mults [1, 2, 4, 8, 16]``,
  snake activations (diffusers' default strides would make a 32x VAE);
* the scheduler: the pipeline's own default, ``FlowMatchEulerDiscreteScheduler(shift=1.0,
  invert_sigmas=True)``.

What differs, and is reported with every figure made with it:

* the weights are random: the audio is noise, the cost is the shapes'. The transformer's
  output layers keep their zero init (as a fresh ``LongCatAudioDiTTransformer`` has them),
  which changes no kernel's cost;
* the tokenizer is character-level (``random_parts.character_tokenizer``; no
  sentencepiece model offline) and pads to the longest prompt as the real one does, so a
  prompt is as many tokens as it has characters: more than umt5's sentencepiece makes
  (about 4 characters a token in English), so the text encoder and cross-attention cost
  more here, not less;
* the VAE is in the entry's dtype (the reference code decodes in float16).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    LongCatAudioDiTPipeline,
    LongCatAudioDiTTransformer,
    LongCatAudioDiTVae,
)
from transformers import UMT5Config, UMT5EncoderModel

from workers.pipelines.diffusers.shared.loading import allocated_on
from workers.pipelines.diffusers.shared.random_parts import (
    TINY_UMT5,
    UMT5_BASE,
    character_tokenizer,
    checked_config,
)

# The parts whose configs ``random_config`` may override (a smaller variant; CPU tests).
PARTS = ("transformer", "text_encoder", "vae")

# The released model's VAE (diffusers' class defaults but for the strides).
VAE: dict[str, Any] = {
    "channels": 128,
    "c_mults": [1, 2, 4, 8, 16],
    "strides": [2, 4, 4, 8, 8],
    "latent_dim": 64,
    "encoder_latent_dim": 128,
    "use_snake": True,
    "downsampling_ratio": 2048,
    "sample_rate": 24000,
}

# A toy LongCat as ``random_config`` (the benchmark's ``--tiny`` CPU check): the sizes of
# tests/unit/longcat_fixtures.py; 8 kHz, so a second of speech is 31 latent frames.
TINY_CONFIG: dict[str, dict[str, Any]] = {
    "transformer": {
        "dit_dim": 32,
        "dit_depth": 2,
        "dit_heads": 4,
        "dit_text_dim": 32,
        "latent_dim": 8,
    },
    "text_encoder": TINY_UMT5,
    "vae": {
        "channels": 8,
        "c_mults": [1, 2],
        "strides": [16, 16],
        "latent_dim": 8,
        "encoder_latent_dim": 16,
        "downsampling_ratio": 256,
        "sample_rate": 8000,
    },
}


def random_pipeline(
    device: str | torch.device,
    dtype: torch.dtype,
    *,
    seed: int = 42,
    config: dict[str, dict[str, Any]] | None = None,
) -> LongCatAudioDiTPipeline:
    """LongCat-AudioDiT-1B from its configs with seeded random weights, on ``device`` in
    ``dtype``. ``config`` overrides the config of each part named in :data:`PARTS`."""
    config = checked_config(config, PARTS)
    torch.manual_seed(seed)
    with allocated_on(torch.device(device), dtype):
        transformer: Any = LongCatAudioDiTTransformer(**config.get("transformer", {}))
        text_encoder: Any = UMT5EncoderModel(
            UMT5Config(**{**UMT5_BASE, **config.get("text_encoder", {})})
        )
        vae: Any = LongCatAudioDiTVae(**{**VAE, **config.get("vae", {})})
    for module in (transformer, text_encoder, vae):
        module.eval()
    return LongCatAudioDiTPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=character_tokenizer(),
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0, invert_sigmas=True),
    )
