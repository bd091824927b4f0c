"""Tiny random-weight ``CogVideoXImageToVideoPipeline``s, built offline from configs in
code (the component configs of diffusers' own fast tests, tests/pipelines/cogvideo, and
of tests/unit/diffusers_fixtures.py's text-to-video pipeline), deterministic per call,
float32, CPU. Each stands for one released checkpoint layout:

* ``"1.0"``: CogVideoX-5b-I2V: the image's latents concatenated on the channels (an
  8-channel transformer over a 4-channel VAE), rotary and learned positional embeddings
  (so it runs at its sample size only: 32x32 here);
* ``"1.5"``: CogVideoX 1.5 5B I2V: the same with ``patch_size_t=2`` (latent frames padded
  to an even count), the ``ofs`` embedding, no learned positional embeddings, and a VAE
  with ``invert_scale_latents``.

Sizes: 32x32 (the VAE is 8x spatial, 4x temporal); frames 4k + 1.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    CogVideoXDDIMScheduler,
    CogVideoXDPMScheduler,
    CogVideoXImageToVideoPipeline,
    CogVideoXTransformer3DModel,
)

from tests.unit.diffusers_fixtures import TEXT_DIM, TINY_SEQ_LEN, tiny_t5, tiny_tokenizer

Layout = Literal["1.0", "1.5"]


def tiny_cogvideox_i2v_pipeline(
    layout: Layout = "1.0", *, dpm: bool = True, num_layers: int = 1
) -> Any:
    """The ``layout`` pipeline (DPM scheduler unless ``dpm=False``)."""
    v15 = layout == "1.5"
    torch.manual_seed(0)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=8, out_channels=4,
        time_embed_dim=2, ofs_embed_dim=2 if v15 else None, text_embed_dim=TEXT_DIM,
        num_layers=num_layers, sample_width=4, sample_height=4, sample_frames=9, patch_size=2,
        patch_size_t=2 if v15 else None, temporal_compression_ratio=4,
        max_text_seq_length=TINY_SEQ_LEN, use_rotary_positional_embeddings=True,
        use_learned_positional_embeddings=not v15,
    ).eval()  # fmt: skip
    torch.manual_seed(0)
    vae = AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3,
        down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1,
        norm_num_groups=2, temporal_compression_ratio=4, invert_scale_latents=v15,
    ).eval()  # fmt: skip
    sched_kwargs: dict[str, Any] = {
        "timestep_spacing": "trailing", "prediction_type": "v_prediction",
        "rescale_betas_zero_snr": True, "clip_sample": False, "set_alpha_to_one": True,
        "snr_shift_scale": 1.0,
    }  # fmt: skip
    scheduler = (CogVideoXDPMScheduler if dpm else CogVideoXDDIMScheduler)(**sched_kwargs)
    return CogVideoXImageToVideoPipeline(
        tokenizer=tiny_tokenizer(), text_encoder=tiny_t5(), vae=vae, transformer=transformer,
        scheduler=scheduler,
    )  # fmt: skip
