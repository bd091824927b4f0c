"""A tiny random-weight ``LongCatAudioDiTPipeline``, built offline from configs in code.

The sizes are ``longcat_random.TINY_CONFIG`` (a 2-block 32-wide DiT, a 2-layer 32-wide
UMT5, an 8-channel VAE of 256 samples a latent frame at 8 kHz) with the character-level tokenizer;
float32, eval mode, CPU. A fresh ``LongCatAudioDiTTransformer`` zero-initialises its
output layers (its prediction is then 0 whatever the input), so the fixture refills every
transformer weight from a seeded normal: the steps, the guidance and the text then change
the audio. Deterministic: two calls give bit-identical weights.
"""

from __future__ import annotations

import torch
from diffusers import LongCatAudioDiTPipeline

from workers.pipelines.diffusers.longcat_audio.random_weights import TINY_CONFIG, random_pipeline


def tiny_longcat_pipeline(seed: int = 0) -> LongCatAudioDiTPipeline:
    """The tiny pipeline, every transformer weight drawn from N(0, 0.2²)."""
    pipe = random_pipeline("cpu", torch.float32, seed=seed, config=TINY_CONFIG)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in pipe.transformer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return pipe
