"""MiniMax-H3 with seeded random weights, built from its default configs on the device:
the benchmark-only loading mode of a registry entry with ``weights = "random"``.

The lent H200's 64 GiB disk cannot hold a saved copy of the 33.1 B transformer (62 GB in
bf16) next to the wheelhouse, and the host's 128 GiB cannot hold an fp32 copy of it, so
the parts are allocated on the device, in the entry's dtype, and initialised there from
a fixed seed. Everything else goes through the real registry, loader and worker. A worker
refuses such an entry unless ``OMNIQ_WORKER__RANDOM_WEIGHTS`` is on
(:class:`~workers.pipelines.registry.PipelineRegistry`): a deployment must never serve
noise by mistake.

What differs from the checkpoint, and is reported with every figure made with it:

* the Qwen3-VL text encoder keeps its width (5120) but not its depth: ``text_layers`` + 1
  decoder layers, H3's conditioning read after layer ``text_layers`` instead of 50 (it
  runs once per job, before the first step);
* the tokenizer is character-level (:func:`character_tokenizer`): a prompt is as many
  text rows as it has characters;
* no vision tower beyond one block, and no video processor (images only).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLMiniMaxH3,
    AutoencoderKLMiniMaxH3Audio,
    MiniMaxH3Scheduler,
    MiniMaxH3Transformer3DModel,
)
from diffusers.modular_pipelines import MiniMaxH3Blocks
from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ModularPipeline
from transformers import (
    Qwen2Tokenizer,
    Qwen2VLImageProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from workers.pipelines.diffusers.minimax_h3.processor import ImageOnlyProcessor
from workers.pipelines.diffusers.shared.loading import allocated_on
from workers.pipelines.diffusers.shared.random_parts import checked_config

# The special tokens H3's blocks look up by name.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def character_tokenizer() -> Qwen2Tokenizer:
    """A ``Qwen2Tokenizer`` with one token per printable ASCII character and H3's special
    tokens (no merges): built offline, with no hub download."""
    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    vocab["Ġ"] = len(vocab)
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,  # type: ignore[arg-type]
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    return tok


class ShallowTextPipeline(MiniMaxH3ModularPipeline):
    """H3's modular pipeline whose conditioning is read after ``text_layers`` layers of
    the text encoder (the checkpoint's 50 need a 64-layer encoder)."""

    def __init__(self, *args: Any, text_layers: int = 50, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._text_layers = text_layers

    @property
    def text_encoder_layer(self) -> int:
        return self._text_layers


# The parts whose configs ``random_config`` may override (a smaller variant; CPU tests).
PARTS = ("transformer", "text_encoder", "vision", "vae", "audio_vae", "image_processor")

# A toy H3 (32 wide, two blocks) as ``random_config``: the benchmarks' CPU checks.
TOY_CONFIG: dict[str, dict[str, Any]] = {
    "transformer": {
        "num_attention_heads": 2,
        "attention_head_dim": 16,
        "hidden_size": 32,
        "num_layers": 2,
        "num_refiner_layers": 1,
        "ffn_dim": 64,
        "in_channels": 8,
        "audio_in_channels": 8,
        "text_dim": 32,
        "freq_dim": 32,
        "time_embed_hidden_dim": 32,
        "time_embed_dim": 16,
        "rope_freq_dim": 2,
    },
    "text_encoder": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]},
        "max_position_embeddings": 4096,
    },
    "vision": {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 32,
        "patch_size": 4,
        "deepstack_visual_indexes": [0],
        "num_position_embeddings": 64,
    },
    "vae": {
        "latent_channels": 8,
        "block_out_channels": [8, 8, 8, 8, 8, 8],
        "layers_per_block": 1,
        "norm_num_groups": 4,
        "decoder_num_layers": 1,
        "decoder_num_attention_heads": 2,
        "decoder_attention_head_dim": 8,
        "latents_mean": [0.0] * 8,
        "latents_std": [1.0] * 8,
    },
    "audio_vae": {
        "encoder_dim": 4,
        "latent_dim": 16,
        "latent_channels": 8,
        "num_attention_heads": 2,
        "decoder_dim": 128,
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1]],
        "latents_mean": [0.0] * 8,
        "latents_std": [1.0] * 8,
    },
}


def text_encoder_config(
    tok: Qwen2Tokenizer,
    text_layers: int,
    text: dict[str, Any] | None = None,
    vision: dict[str, Any] | None = None,
) -> Qwen3VLConfig:
    """H3's Qwen3-VL conditioner at full width (or ``text``'s), ``text_layers`` + 1 layers
    deep (diffusers wants one past the layer it reads)."""

    def ids(token: str) -> int:
        found = tok.convert_tokens_to_ids(token)
        assert isinstance(found, int)
        return found

    return Qwen3VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 5120,
            "intermediate_size": 25600,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20]},
            **(text or {}),
            "num_hidden_layers": text_layers + 1,
        },
        vision_config={"depth": 1, "out_hidden_size": 5120, **(vision or {})},
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )


def random_pipeline(
    device: str | torch.device,
    dtype: torch.dtype,
    *,
    partition: str = "transformer",
    seed: int = 42,
    text_layers: int = 4,
    config: dict[str, dict[str, Any]] | None = None,
) -> ShallowTextPipeline:
    """The H3 pipeline from default configs with seeded random weights, on ``device``:
    the transformer as ``partition`` (``transformer`` or ``transformer_ref``). ``config``
    overrides the default config of each part named in :data:`PARTS`."""
    if text_layers < 1:
        raise ValueError(f"random_text_layers must be at least 1, got {text_layers}")
    config = checked_config(config, PARTS)
    tok = character_tokenizer()
    text = text_encoder_config(tok, text_layers, config.get("text_encoder"), config.get("vision"))
    audio = {"latents_mean": [0.0] * 32, "latents_std": [1.0] * 32, **config.get("audio_vae", {})}
    torch.manual_seed(seed)
    with allocated_on(torch.device(device), dtype):
        parts: dict[str, Any] = {
            partition: MiniMaxH3Transformer3DModel(**config.get("transformer", {})),
            "text_encoder": Qwen3VLForConditionalGeneration(text),
            "vae": AutoencoderKLMiniMaxH3(**config.get("vae", {})),
            "audio_vae": AutoencoderKLMiniMaxH3Audio(**audio),
        }
    for module in parts.values():
        module.eval()
    parts |= {
        "tokenizer": tok,
        "processor": ImageOnlyProcessor(
            image_processor=Qwen2VLImageProcessor(**config.get("image_processor", {})),
            tokenizer=tok,
        ),
        "scheduler": MiniMaxH3Scheduler(shift=12.0),
        "audio_scheduler": MiniMaxH3Scheduler(shift=3.0),
    }
    pipe: Any = ShallowTextPipeline(blocks=MiniMaxH3Blocks(), text_layers=text_layers)
    pipe.update_components(**parts)
    return pipe
