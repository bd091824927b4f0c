"""What the random-weights loading modes share (``minimax_h3/random_weights.py``,
``helios/random_weights.py``, ``longcat_audio/random_weights.py``): the check of a
``random_config``'s part names, the character-level T5 tokenizer of the UMT5 text encoders
(Helios's, LongCat's; H3's Qwen3-VL has its own), umt5's published configs, and the tiny UMT5 of
the CPU tests and ``--tiny`` checks."""

from __future__ import annotations

import string
from typing import Any

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

# What umt5-base and umt5-xxl's published configs share (the 256,384-row vocabulary).
_UMT5: dict[str, Any] = {
    "vocab_size": 256384,
    "d_kv": 64,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "layer_norm_epsilon": 1e-6,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}
# umt5-xxl (Wan's and Helios's text encoder) and umt5-base (LongCat-AudioDiT's).
UMT5_XXL: dict[str, Any] = {
    **_UMT5,
    "d_model": 4096,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
}
UMT5_BASE: dict[str, Any] = {
    **_UMT5,
    "d_model": 768,
    "d_ff": 2048,
    "num_layers": 12,
    "num_heads": 12,
}

# A two-layer 32-wide UMT5 over the character tokenizer's 71 ids (a ``random_config``'s
# ``text_encoder``; tests/unit/diffusers_fixtures.py's tiny text encoders have its sizes).
TINY_UMT5: dict[str, Any] = {
    "vocab_size": 128,
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 37,
    "num_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
}

_SPECIALS = ["<pad>", "</s>", "<unk>"]  # T5's ids 0, 1, 2
_CHARS = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))


def checked_config(
    config: dict[str, dict[str, Any]] | None, parts: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """A copy of ``random_config``; ValueError if it names a part not in ``parts``."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(parts))
    if unknown:
        raise ValueError(f"random_config: no part {', '.join(unknown)} (parts: {', '.join(parts)})")
    return config


def character_tokenizer(max_length: int = 512) -> PreTrainedTokenizerFast:
    """A T5-style tokenizer built offline: lowercase, split on whitespace, one token per
    character (BPE without merges), ``</s>`` appended, ``<pad>`` = 0. Vocabulary: 3 + 68."""
    vocab = {tok: i for i, tok in enumerate(_SPECIALS + _CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_length,
    )
