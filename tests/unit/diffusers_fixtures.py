"""Tiny random-weight diffusers video pipelines, built offline from configs in code.

Deterministic: every builder seeds torch before creating each module, so two calls give
bit-identical weights. float32, eval mode, CPU; a full run takes well under a second.
The component configs follow diffusers' own fast tests (``get_dummy_components`` in
tests/pipelines/{wan,ltx,cogvideo}), with a character-level tokenizer made with
``tokenizers`` instead of ``hf-internal-testing/tiny-random-t5`` (nothing is downloaded).

Use ``max_sequence_length=TINY_SEQ_LEN`` with the adapters and in ``pipe(...)`` calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    AutoencoderKLLTXVideo,
    AutoencoderKLWan,
    CogVideoXDDIMScheduler,
    CogVideoXDPMScheduler,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
    FlowMatchEulerDiscreteScheduler,
    LTXPipeline,
    LTXVideoTransformer3DModel,
    UniPCMultistepScheduler,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import (
    PreTrainedTokenizerFast,
    T5Config,
    T5EncoderModel,
    UMT5Config,
    UMT5EncoderModel,
)

from workers.pipelines.diffusers.shared.random_parts import TINY_UMT5, character_tokenizer

TINY_SEQ_LEN = 16  # text tokens (characters + </s>) the tiny pipelines are run with
TEXT_DIM = 32  # d_model of the tiny text encoders (TINY_UMT5's)
# A video request's fields the tiny pipelines' tests share (with their family's ``fps``
# and ``num_inference_steps``): 9 frames of 32x32, CFG 4 against a negative prompt.
TINY_VIDEO: dict[str, Any] = {
    "prompt": "red ball", "negative_prompt": "blurry", "width": 32, "height": 32,
    "num_frames": 9, "seed": 7, "guidance_scale": 4.0,
}


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level T5-style tokenizer of the random-weights loading modes
    (``random_parts.character_tokenizer``): one token per character, ``</s>`` appended,
    ``<pad>`` = 0. Vocabulary: 3 + 68."""
    return character_tokenizer()


def _t5_kwargs() -> dict[str, Any]:
    return {
        **TINY_UMT5, "dropout_rate": 0.0, "pad_token_id": 0, "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }


def tiny_t5() -> T5EncoderModel:
    torch.manual_seed(0)
    return T5EncoderModel(T5Config(**_t5_kwargs())).eval()


def tiny_umt5() -> UMT5EncoderModel:
    torch.manual_seed(0)
    return UMT5EncoderModel(UMT5Config(**_t5_kwargs())).eval()


def _tiny_wan_transformer(seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()


def tiny_wan_pipeline(*, two_stage: bool = False, boundary_ratio: float = 0.875) -> WanPipeline:
    """Wan 2.1 T2V (or, with ``two_stage``, a Wan 2.2 A14B-style pipeline with
    ``transformer_2`` and ``boundary_ratio``); UniPC flow scheduler as the real models.
    VAE: 8x spatial / 4x temporal, z_dim 16. Sizes: multiples of 16."""
    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
        num_train_timesteps=1000,
    )
    return WanPipeline(
        tokenizer=tiny_tokenizer(), text_encoder=tiny_umt5(), vae=vae, scheduler=scheduler,
        transformer=_tiny_wan_transformer(0),
        transformer_2=_tiny_wan_transformer(1) if two_stage else None,
        boundary_ratio=boundary_ratio if two_stage else None,
    )


def tiny_wan_entry(name: str, path: Path, top: str = "") -> str:
    """A model-registry entry (TOML) serving the tiny Wan saved at ``path`` (saved there
    first unless it already is), float32, at ``TINY_SEQ_LEN``; ``top``: more top-level
    keys of the entry (``devices = 2`` …)."""
    if not (path / "model_index.json").exists():
        tiny_wan_pipeline().save_pretrained(path)
    return (
        f'[[model]]\nname = "{name}"\nadapter = "diffusers.wan"\npath = "{path}"\n'
        f'dtype = "float32"\n{top}[model.adapter_options]\n'
        f"max_sequence_length = {TINY_SEQ_LEN}\n"
    )


def tiny_ltx_pipeline(*, timestep_conditioning: bool = True) -> LTXPipeline:
    """LTX-Video with a timestep-conditioned VAE (as later LTX-Video releases, so
    ``decode_timestep`` / ``decode_noise_scale`` matter). VAE: 4x spatial / 4x temporal,
    8 latent channels.
    Sizes: multiples of 32 (the pipeline's check); frames 4k+1."""
    torch.manual_seed(0)
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4,
        attention_head_dim=8, cross_attention_dim=32, num_layers=1, caption_channels=TEXT_DIM,
    ).eval()
    torch.manual_seed(0)
    vae = AutoencoderKLLTXVideo(
        latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1),
        patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False,
        timestep_conditioning=timestep_conditioning,
    ).eval()
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
        base_image_seq_len=1024, max_image_seq_len=4096,
    )
    return LTXPipeline(
        scheduler=scheduler, vae=vae, text_encoder=tiny_t5(), tokenizer=tiny_tokenizer(),
        transformer=transformer,
    )


def tiny_cogvideox_pipeline(
    *, dpm: bool = True, patch_size_t: int | None = None
) -> CogVideoXPipeline:
    """CogVideoX-5b style (rotary embeddings; DPM scheduler unless ``dpm=False``), or with
    ``patch_size_t=2`` the CogVideoX 1.5 layout (latent frame padding). VAE: 8x spatial /
    4x temporal, 4 latent channels. Sizes: multiples of 16; frames 4k+1."""
    torch.manual_seed(0)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        time_embed_dim=2, text_embed_dim=TEXT_DIM, num_layers=1, sample_width=4,
        sample_height=4, sample_frames=9, patch_size=2, patch_size_t=patch_size_t,
        temporal_compression_ratio=4, max_text_seq_length=TINY_SEQ_LEN,
        use_rotary_positional_embeddings=True, use_learned_positional_embeddings=False,
    ).eval()
    torch.manual_seed(0)
    vae = AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3,
        down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1,
        norm_num_groups=2, temporal_compression_ratio=4,
    ).eval()
    sched_kwargs: dict[str, Any] = {
        "timestep_spacing": "trailing", "prediction_type": "v_prediction",
        "rescale_betas_zero_snr": True, "clip_sample": False, "set_alpha_to_one": True,
        "snr_shift_scale": 1.0,
    }
    scheduler = (CogVideoXDPMScheduler if dpm else CogVideoXDDIMScheduler)(**sched_kwargs)
    return CogVideoXPipeline(
        tokenizer=tiny_tokenizer(), text_encoder=tiny_t5(), vae=vae, transformer=transformer,
        scheduler=scheduler,
    )
