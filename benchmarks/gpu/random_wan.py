"""A Wan2.1-T2V-1.3B-architecture pipeline with random weights, built in code (no download):
what every GPU benchmark runs.

What is real and what is not: the transformer has the Wan2.1-T2V-1.3B config (30 layers,
dim 1536) and the VAE is Wan's, both with random weights; the text encoder is a 2-layer
UMT5 with the real 4096 width and a word-level tokenizer over the prompt's words.
"""

from __future__ import annotations

from typing import Any

import torch


def build_pipeline(device: str, num_layers: int = 30) -> Any:
    """The Wan2.1-T2V-1.3B architecture (``num_layers`` of its 30 blocks) with random
    weights; the module docstring says what is real."""
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    dtype = torch.bfloat16
    # Typed by what they are at runtime: to mypy, diffusers' top-level classes are the
    # placeholders it defines for installs without torch (no ``to``), hence Any; and
    # transformers types ``PreTrainedModel.to`` as taking the model as its first argument,
    # hence nn.Module. Module.to casts in place and returns the module.
    with torch.device(device):
        transformer: Any = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=12,
            attention_head_dim=128,
            in_channels=16,
            out_channels=16,
            text_dim=4096,
            freq_dim=256,
            ffn_dim=8960,
            num_layers=num_layers,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
            rope_max_seq_len=1024,
        )
        transformer = transformer.to(dtype)
        vae: Any = AutoencoderKLWan()
        vae = vae.to(torch.float32)
        # UMT5's defaults (d_kv 64, d_ff 1024, 32 relative-attention buckets), at the real
        # 4096 width with 2 layers and a small vocabulary.
        text_encoder: torch.nn.Module = UMT5EncoderModel(
            UMT5Config(d_model=4096, num_layers=2, num_heads=16, vocab_size=4096)
        )
        text_encoder = text_encoder.to(dtype)
    words = ["a", "red", "ball", "bouncing", "over", "blue", "ocean", "at", "sunset"]
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        num_train_timesteps=1000,
        flow_shift=3.0,
    )
    pipe: Any = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=scheduler,
    )
    return pipe.to(device)
