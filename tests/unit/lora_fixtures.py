"""Tiny random LoRA adapters for the tiny Wan of ``diffusers_fixtures`` (or another tiny
transformer named), written in code as diffusers' ``save_lora_weights`` writes them
(``pytorch_lora_weights.safetensors``, keys ``transformer.<module>.lora_{A,B}.weight``).
``lora_B`` is random and non-zero, so an adapter changes the output."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from diffusers import WanPipeline

from tests.unit.diffusers_fixtures import tiny_wan_pipeline

# Linear layers of the tiny Wan transformer (2 blocks).
SELF_ATTN = [f"blocks.{i}.attn1.{p}" for i in (0, 1) for p in ("to_q", "to_k", "to_v", "to_out.0")]
CROSS_ATTN = [f"blocks.{i}.attn2.{p}" for i in (0, 1) for p in ("to_q", "to_k", "to_v", "to_out.0")]
FFN = [f"blocks.{i}.ffn.{p}" for i in (0, 1) for p in ("net.0.proj", "net.2")]

_SHAPES: dict[str, tuple[int, int]] = {}


def _shape(module: str) -> tuple[int, int]:
    """(out, in) of a linear layer of the tiny Wan transformer."""
    if not _SHAPES:
        for name, mod in tiny_wan_pipeline().transformer.named_modules():
            if isinstance(mod, torch.nn.Linear):
                _SHAPES[name] = (mod.out_features, mod.in_features)
    return _SHAPES[module]


def lora_weights(
    targets: Sequence[str],
    *,
    rank: int,
    seed: int,
    std: float = 0.2,
    transformer: torch.nn.Module | None = None,
) -> dict[str, torch.Tensor]:
    """Random LoRA pairs (module-relative keys) for the linear layers ``targets`` of
    ``transformer`` (the tiny Wan's unless given)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for module in targets:
        if transformer is None:
            n_out, n_in = _shape(module)
        else:
            layer = transformer.get_submodule(module)
            n_out, n_in = layer.out_features, layer.in_features
        out[f"{module}.lora_A.weight"] = torch.randn(rank, n_in, generator=gen) * std
        out[f"{module}.lora_B.weight"] = torch.randn(n_out, rank, generator=gen) * std
    return out


def write_lora(
    directory: Path,
    targets: Sequence[str],
    *,
    rank: int,
    seed: int,
    alpha: float | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    transformer: torch.nn.Module | None = None,
) -> Path:
    """An adapter directory (diffusers' layout) of ``weights``, or of random pairs for
    ``targets`` of ``transformer`` (the tiny Wan's unless given); with ``alpha``, its LoRA
    metadata says ``lora_alpha`` (scaling ``alpha / rank``), else diffusers' default
    (scaling 1)."""
    if weights is None:
        weights = lora_weights(targets, rank=rank, seed=seed, transformer=transformer)
    meta = None
    if alpha is not None:
        meta = {"r": rank, "lora_alpha": alpha, "target_modules": list(targets)}
    WanPipeline.save_lora_weights(
        directory, transformer_lora_layers=weights, transformer_lora_adapter_metadata=meta
    )
    return directory / "pytorch_lora_weights.safetensors"
