"""Tiny random-weight ``WanImageToVideoPipeline``s, built offline from configs in code
(the component configs of diffusers' own fast tests, tests/pipelines/wan), deterministic
per call, float32, CPU. Each stands for one released checkpoint layout:

* ``"2.1"``: Wan 2.1 I2V, a CLIP image encoder beside a 36-channel transformer;
* ``"flf2v"``: Wan 2.1 FLF2V, the same with ``pos_embed_seq_len`` (two frames' features:
  it serves flf2v only);
* ``"2.2"``: Wan 2.2 I2V A14B, two 36-channel transformers, ``boundary_ratio``, no encoder;
* ``"ti2v"``: Wan 2.2 TI2V-5B, one 16-channel transformer, ``expand_timesteps``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from diffusers import (
    AutoencoderKLWan,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanTransformer3DModel,
)
from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

from tests.unit.diffusers_fixtures import TEXT_DIM, TINY_SEQ_LEN, tiny_tokenizer, tiny_umt5

Layout = Literal["2.1", "flf2v", "2.2", "ti2v"]
CLIP_SIZE = 4  # the tiny encoder's image side: 16 patches + CLS = 17 tokens
# The workflows each layout serves (its registry entry's spec.workflows).
WORKFLOWS: dict[Layout, list[str]] = {
    "2.1": ["i2v"],
    "flf2v": ["flf2v"],
    "2.2": ["i2v", "flf2v"],
    "ti2v": ["t2v", "i2v"],
}


def _transformer(seed: int, in_channels: int, **kw: object) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
        in_channels=in_channels, out_channels=16, text_dim=TEXT_DIM, freq_dim=256,
        ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32, **kw,
    ).eval()  # fmt: skip


def _clip() -> tuple[CLIPVisionModel, CLIPImageProcessor]:
    torch.manual_seed(0)
    config = CLIPVisionConfig(
        hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2,
        image_size=CLIP_SIZE, intermediate_size=16, patch_size=1,
    )  # fmt: skip
    return CLIPVisionModel(config).eval(), CLIPImageProcessor(crop_size=CLIP_SIZE, size=CLIP_SIZE)


def tiny_wan_i2v_pipeline(layout: Layout = "2.1") -> Any:
    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()  # fmt: skip
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
        num_train_timesteps=1000,
    )  # fmt: skip
    encoder = processor = transformer_2 = None
    boundary_ratio = None
    if layout in ("2.1", "flf2v"):
        encoder, processor = _clip()
        tokens = CLIP_SIZE * CLIP_SIZE + 1
        pos = {"pos_embed_seq_len": 2 * tokens} if layout == "flf2v" else {}
        transformer = _transformer(0, 36, image_dim=4, **pos)
    elif layout == "2.2":
        transformer, transformer_2 = _transformer(0, 36), _transformer(1, 36)
        boundary_ratio = 0.875
    else:
        transformer = _transformer(0, 16)
    return WanImageToVideoPipeline(
        tokenizer=tiny_tokenizer(), text_encoder=tiny_umt5(), vae=vae, scheduler=scheduler,
        image_processor=processor, image_encoder=encoder, transformer=transformer,
        transformer_2=transformer_2, boundary_ratio=boundary_ratio,
        expand_timesteps=layout == "ti2v",
    )  # fmt: skip


def tiny_wan_i2v_entry(name: str, path: Path, layout: Layout = "2.2") -> str:
    """A registry entry (TOML) serving the tiny ``layout`` pipeline saved at ``path``
    (saved there first unless it already is), float32, at ``TINY_SEQ_LEN``."""
    if not (path / "model_index.json").exists():
        tiny_wan_i2v_pipeline(layout).save_pretrained(path)
    workflows = ", ".join(f'"{w}"' for w in WORKFLOWS[layout])
    return (
        f'[[model]]\nname = "{name}"\nadapter = "diffusers.wan"\npath = "{path}"\n'
        f'dtype = "float32"\n[model.spec]\nworkflows = [{workflows}]\n'
        f"[model.adapter_options]\nmax_sequence_length = {TINY_SEQ_LEN}\n"
    )
