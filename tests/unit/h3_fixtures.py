"""A tiny MiniMax-H3 modular pipeline with seeded random weights, built offline.

Every component is the real diffusers / transformers class at a toy size: a Qwen3-VL
conditioner with 51 decoder layers (H3 reads ``hidden_states[50]``) 32 wide, a
character-level ``Qwen2Tokenizer``, the two-block transformer, both VAEs and both
schedulers. The processor has no video processor: transformers' Qwen3-VL video processor
needs torchvision, which the CPU wheel of torch here cannot import, so ``ref2va`` with a
video reference is not exercised on this machine.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderKLMiniMaxH3,
    AutoencoderKLMiniMaxH3Audio,
    MiniMaxH3Scheduler,
    MiniMaxH3Transformer3DModel,
)
from diffusers.modular_pipelines import MiniMaxH3Blocks
from safetensors.torch import save_file
from transformers import (
    Qwen2Tokenizer,
    Qwen2VLImageProcessor,
    Qwen3VLForConditionalGeneration,
)

from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.minimax_h3.processor import ImageOnlyProcessor
from workers.pipelines.diffusers.minimax_h3.random_weights import (
    TOY_CONFIG,
    character_tokenizer,
    text_encoder_config,
)

WIDTH = HIDDEN = 32


def tiny_tokenizer() -> Qwen2Tokenizer:
    """The character-level tokenizer of the random-weights loading mode."""
    return character_tokenizer()


# The tiny conditioner's vision tower (two blocks, 4-pixel patches merged 2x2).
VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": HIDDEN,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "deepstack_visual_indexes": [0, 1],
    "num_position_embeddings": 64,
}


def tiny_text_encoder(tok: Qwen2Tokenizer) -> Qwen3VLForConditionalGeneration:
    """The random-weights mode's conditioner at the toy width, all 51 layers deep (H3
    reads ``hidden_states[50]``)."""
    config = text_encoder_config(tok, 50, TOY_CONFIG["text_encoder"], VISION)
    return Qwen3VLForConditionalGeneration(config).eval()


def tiny_h3_components(seed: int = 0, tiled: bool = False) -> dict[str, Any]:
    """The components of a MiniMax-H3 modular pipeline (both partitions), seeded. The
    video VAE tiles only if ``tiled``: its 256-pixel tiles would pad a 64x64 frame to 16
    times its area (4x the time of every test that encodes a keyframe or a reference),
    and the differential tests compare two paths through the same VAE either way. A
    worker loading the saved pipeline tiles, as diffusers' H3 VAE does by default."""
    torch.manual_seed(seed)
    tok = tiny_tokenizer()
    image_processor = Qwen2VLImageProcessor(
        patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=16 * 16, max_pixels=64 * 64
    )
    processor = ImageOnlyProcessor(image_processor=image_processor, tokenizer=tok)

    def transformer() -> MiniMaxH3Transformer3DModel:
        return _eval(MiniMaxH3Transformer3DModel(**TOY_CONFIG["transformer"]))

    return {
        "text_encoder": tiny_text_encoder(tok),
        "tokenizer": tok,
        "processor": processor,
        "transformer": transformer(),
        "transformer_ref": transformer(),
        "vae": _video_vae(tiled),
        "audio_vae": _eval(AutoencoderKLMiniMaxH3Audio(**TOY_CONFIG["audio_vae"])),
        "scheduler": MiniMaxH3Scheduler(shift=12.0),
        "audio_scheduler": MiniMaxH3Scheduler(shift=3.0),
    }


def _eval(module: Any) -> Any:
    """``module.eval()``: typed Any, as mypy reads diffusers' model and block classes as
    their dummy objects (benchmarks/jobs/h3_references.py builds this model)."""
    return module.eval()


def _video_vae(tiled: bool) -> AutoencoderKLMiniMaxH3:
    vae = _eval(AutoencoderKLMiniMaxH3(**TOY_CONFIG["vae"]))
    if not tiled:
        vae.disable_tiling()
    return vae


# The released checkpoint's canvas short edge and the short edge it encodes an image
# reference at (diffusers' ``reference_image_short_edge``: upscaled, no area cap).
RELEASED_CANVAS, RELEASED_REFERENCE = 768, 2048


def reference_short_edge(canvas_short_edge: int) -> int:
    """An image reference's short edge for a canvas of ``canvas_short_edge``: the released
    checkpoint's proportion (2048 : 768), rounded to the canvas multiple (32)."""
    return max(32, round(canvas_short_edge * RELEASED_REFERENCE / RELEASED_CANVAS / 32) * 32)


def tiny_h3_pipe(seed: int = 0, tiled: bool = False, **config: Any) -> Any:
    """A ``MiniMaxH3ModularPipeline`` over :func:`tiny_h3_components`. ``config`` sets the
    blocks' configs (``canvas_short_edge``, ``canvas_max_pixels``,
    ``reference_image_short_edge``). A tiny canvas encodes its image references in the
    released proportion (:func:`reference_short_edge`: 160 for a 64-pixel canvas), not at
    the released 2048: 1,024 times a 64x64 canvas's pixels, which made a ref2va prepare
    13.7 s a 1024x1024 reference where a whole t2va job takes 0.2 s (issue 45 item 4;
    docs/PERFORMANCE.md)."""
    blocks: Any = MiniMaxH3Blocks()
    pipe = blocks.init_pipeline()
    pipe.update_components(**tiny_h3_components(seed, tiled))
    if "canvas_short_edge" in config:
        edge = reference_short_edge(config["canvas_short_edge"])
        config.setdefault("reference_image_short_edge", edge)
    if config:
        pipe.register_to_config(**config)
    return pipe


def tiny_h3_lora(path: Path, seed: int = 1) -> str:
    """A rank-2 LoRA on the tiny transformer's attention projections, saved as diffusers
    saves one (``transformer.``-prefixed keys); its sha256."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    torch.manual_seed(seed)
    transformer = tiny_h3_components(seed)["transformer"]
    transformer.add_adapter(
        LoraConfig(
            r=2, lora_alpha=2, target_modules=["to_q", "to_k", "to_v"], init_lora_weights=False
        )
    )
    state = get_peft_model_state_dict(transformer)
    save_file({f"transformer.{k}": v.contiguous() for k, v in state.items()}, str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def h3_request(**kw: Any) -> GenerationRequest:
    """A 64x64 request of 124 frames (17 * 7 + 5: 5.17 s at 24 fps, the shortest H3
    makes), 3 sigma points, seed 42; ``kw`` overrides."""
    base: dict[str, Any] = {
        "prompt": "a red ball",
        "width": 64,
        "height": 64,
        "num_frames": 124,
        "fps": 24.0,
        "num_inference_steps": 3,
        "seed": 42,
    }
    return GenerationRequest.video(**{**base, **kw})
