"""Which Linear layers a registry entry's ``quantization = "fp8"`` makes FP8
(workers/pipelines/diffusers/shared/fp8.py): a pure function of the module tree, checked on
the transformers of the tiny pipelines the other tests build (Wan, LTX, Helios, H3), and
with the Wan and Helios ones resized to widths that are multiples of 16 (their 24-wide
layers are too narrow for ``torch._scaled_mm``, so the rule keeps every one of them).

What stays as loaded: everything outside the blocks (embedders of time, text and patches;
the final projection and its norm), and inside them the norms, adaLN and modulation
projections and MiniMax-H3's text-token refiner. The modulation projections are told
apart: an entry's ``fp8_modulation`` makes them FP8 weight-only (``fp8_kinds``), and
nothing else changes category with it. The bytes saved are the quantized
weights' elements at one byte instead of their dtype's, less a float32 scale per row. On
the CPU torchao's FP8 refuses to quantize at all; the rule itself needs no device."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from tests.unit.diffusers_fixtures import tiny_ltx_pipeline, tiny_wan_pipeline
from tests.unit.h3_fixtures import tiny_h3_pipe
from tests.unit.helios_fixtures import tiny_helios_transformer
from workers.pipelines.diffusers.shared.fp8 import (
    MODULATION,
    NARROW,
    OUTSIDE,
    SENSITIVE,
    bytes_saved,
    fp8_kinds,
    fp8_layers,
    fp8_modules,
    fp8_unsupported,
)

ATTENTION = ["to_q", "to_k", "to_v", "to_out.0"]


def by_reason(model: torch.nn.Module) -> dict[str | None, set[str]]:
    out: dict[str | None, set[str]] = {}
    for name, why in fp8_layers(model).items():
        out.setdefault(why, set()).add(name)
    return out


def wan_block(i: int, ffn: str = "ffn") -> set[str]:
    attn = {f"blocks.{i}.{a}.{p}" for a in ("attn1", "attn2") for p in ATTENTION}
    return attn | {f"blocks.{i}.{ffn}.net.0.proj", f"blocks.{i}.{ffn}.net.2"}


WAN_EMBEDDERS = {
    "condition_embedder.time_embedder.linear_1",
    "condition_embedder.time_embedder.linear_2",
    "condition_embedder.time_proj",
    "condition_embedder.text_embedder.linear_1",
    "condition_embedder.text_embedder.linear_2",
}


def resized(model: Any, **config: Any) -> Any:
    """``model``'s class built from its config with ``config`` changed (random weights)."""
    torch.manual_seed(0)
    return type(model).from_config({**model.config, **config}).eval()


def test_wan_blocks_attention_and_ffn_are_fp8_embedders_and_proj_out_are_not() -> None:
    tiny = tiny_wan_pipeline().transformer
    found = by_reason(tiny)
    assert found[OUTSIDE] == WAN_EMBEDDERS | {"proj_out"}
    assert found[NARROW] == wan_block(0) | wan_block(1)  # 24 wide: kept as loaded
    assert fp8_modules(tiny) == []
    wide = resized(tiny, attention_head_dim=8)  # 2 heads of 8: 16 wide
    found = by_reason(wide)
    assert found[None] == wan_block(0) | wan_block(1)
    assert found[OUTSIDE] == WAN_EMBEDDERS | {"proj_out"}
    assert set(found) == {None, OUTSIDE}  # nothing else in a Wan block is a Linear
    # Wan 2.2's second transformer is the same layout, rule and all
    second = tiny_wan_pipeline(two_stage=True).transformer_2
    assert fp8_layers(second) == fp8_layers(tiny)


def test_ltx_blocks_are_fp8_its_projections_and_embedders_are_not() -> None:
    transformer = tiny_ltx_pipeline().transformer
    found = by_reason(transformer)
    block = {f"transformer_blocks.0.{a}.{p}" for a in ("attn1", "attn2") for p in ATTENTION}
    assert found[None] == block | {
        "transformer_blocks.0.ff.net.0.proj",
        "transformer_blocks.0.ff.net.2",
    }
    assert found[OUTSIDE] == {
        "proj_in",
        "time_embed.emb.timestep_embedder.linear_1",
        "time_embed.emb.timestep_embedder.linear_2",
        "time_embed.linear",
        "caption_projection.linear_1",
        "caption_projection.linear_2",
        "proj_out",
    }


def test_helios_blocks_are_fp8_once_wide_enough() -> None:
    tiny = tiny_helios_transformer()
    assert fp8_modules(tiny) == []  # 24 wide, as Wan's
    found = by_reason(resized(tiny, attention_head_dim=8))
    assert found[None] == wan_block(0) | wan_block(1)
    assert found[OUTSIDE] == WAN_EMBEDDERS | {"proj_out"}


@pytest.mark.parametrize("partition", ["transformer", "transformer_ref"])
def test_h3_joint_blocks_are_fp8_adaln_refiner_and_embedders_are_not(partition: str) -> None:
    transformer = getattr(tiny_h3_pipe(), partition)
    found = by_reason(transformer)
    blocks = {
        f"transformer_blocks.{i}.{p}"
        for i in (0, 1)
        for p in [*(f"attn.{a}" for a in ATTENTION), "ff.net.0.proj", "ff.net.2"]
    }
    assert found[None] == blocks
    refiner = {f"token_refiner.refiner_blocks.0.attn.{a}" for a in ATTENTION}
    refiner |= {"token_refiner.refiner_blocks.0.ff.net.0.proj"}
    refiner |= {"token_refiner.refiner_blocks.0.ff.net.2"}
    assert found[SENSITIVE] == refiner
    assert found[MODULATION] == {
        "transformer_blocks.0.adaln_proj.linear",
        "transformer_blocks.1.adaln_proj.linear",
    }
    assert found[OUTSIDE] == {
        "proj_in",
        "audio_proj_in",
        "context_embedder",
        "time_embedder.linear_1",
        "time_embedder.linear_2",
        "norm_out.linear",
        "proj_out",
        "audio_proj_out",
    }


ADALN = {"transformer_blocks.0.adaln_proj.linear", "transformer_blocks.1.adaln_proj.linear"}


@pytest.mark.parametrize("partition", ["transformer", "transformer_ref"])
def test_h3_fp8_modulation_makes_the_adaln_projections_weight_only_and_nothing_else(
    partition: str,
) -> None:
    transformer = getattr(tiny_h3_pipe(), partition)
    layers = fp8_layers(transformer)
    default = fp8_kinds(layers, modulation=False)
    assert default == {name: "dynamic" for name in fp8_modules(transformer)}
    opted = fp8_kinds(layers, modulation=True)
    assert opted == {**default, **{name: "weight_only" for name in ADALN}}
    # the refiner, the embedders, time projections and the final norm's projection stay
    kept = {name for name in layers if name not in opted}
    assert kept == {name for name, why in layers.items() if why in (OUTSIDE, SENSITIVE)}
    assert {"norm_out.linear", "time_embedder.linear_1", "context_embedder"} <= kept
    assert not any("refiner" in name for name in opted)
    # both kinds save a byte an element less the row scales (float32 here: 3 bytes)
    rows, cols = 576, 16  # adaln_proj.linear: 16 -> 6 x 6 x 16
    adaln = 2 * (rows * cols * 3 - rows * 4)
    assert bytes_saved(transformer, list(opted)) == bytes_saved(transformer, list(default)) + adaln


@pytest.mark.parametrize("family", ["wan", "helios"])
def test_wan_and_helios_have_no_modulation_layer_to_change(family: str) -> None:
    """Their blocks modulate with ``scale_shift_table``, a parameter, not a Linear: the
    opt-in changes nothing on them, narrow or wide."""
    tiny = tiny_wan_pipeline().transformer if family == "wan" else tiny_helios_transformer()
    for model in (tiny, resized(tiny, attention_head_dim=8)):
        layers = fp8_layers(model)
        assert MODULATION not in layers.values()
        assert fp8_kinds(layers, modulation=True) == fp8_kinds(layers, modulation=False)
        assert hasattr(model.blocks[0], "scale_shift_table")


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.to_q = torch.nn.Linear(32, 32)
        self.modulation = torch.nn.Linear(32, 96)  # a modulation projection by name
        self.ada_ln = torch.nn.Sequential(torch.nn.SiLU(), torch.nn.Linear(32, 64))
        self.norm1 = torch.nn.Sequential(torch.nn.Linear(32, 64))  # an AdaLayerNorm: a norm
        self.time_modulation = torch.nn.Linear(32, 64)  # a time projection too: kept
        self.adaln_narrow = torch.nn.Linear(24, 48)  # too narrow for FP8 at all


class _Tree(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.adaln_out = torch.nn.Linear(32, 64)  # outside the blocks
        self.blocks = torch.nn.ModuleList([_Block()])


def test_a_modulation_layer_is_one_kept_for_modulation_parts_alone() -> None:
    layers = fp8_layers(_Tree())
    assert layers == {
        "adaln_out": OUTSIDE,
        "blocks.0.to_q": None,
        "blocks.0.modulation": MODULATION,
        "blocks.0.ada_ln.1": MODULATION,
        "blocks.0.norm1.0": SENSITIVE,
        "blocks.0.time_modulation": SENSITIVE,
        "blocks.0.adaln_narrow": SENSITIVE,
    }
    assert fp8_kinds(layers, modulation=True) == {
        "blocks.0.to_q": "dynamic",
        "blocks.0.modulation": "weight_only",
        "blocks.0.ada_ln.1": "weight_only",
    }
    assert fp8_kinds(layers, modulation=False) == {"blocks.0.to_q": "dynamic"}


def test_a_text_encoders_layers_are_blocks_too() -> None:
    """Per component (``text_encoder = "fp8"``): a T5 encoder's layers, its relative
    attention bias (an Embedding) and norms never."""
    encoder = tiny_wan_pipeline().text_encoder
    found = by_reason(encoder)
    names = set().union(*found.values())
    assert names and all(n.startswith("encoder.block.") for n in names)
    assert all(n.rsplit(".", 1)[-1] in {"q", "k", "v", "o", "wi_0", "wi_1", "wo"} for n in names)


def test_the_rule_reads_the_tree_and_changes_nothing() -> None:
    transformer = tiny_h3_pipe().transformer
    before = {k: v.clone() for k, v in transformer.state_dict().items()}
    assert fp8_layers(transformer) == fp8_layers(transformer)
    after = transformer.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bytes_saved_is_one_byte_an_element_less_the_row_scales(dtype: torch.dtype) -> None:
    transformer = tiny_ltx_pipeline().transformer.to(dtype)
    names = fp8_modules(transformer)
    # 8 attention projections of 32x32, the FFN's 32->128 and 128->32
    element = torch.finfo(dtype).bits // 8
    saved = 8 * (32 * 32 * (element - 1) - 32 * 4)
    saved += 32 * 128 * (element - 1) - 128 * 4  # net.0.proj: 128 rows
    saved += 128 * 32 * (element - 1) - 32 * 4  # net.2: 32 rows
    assert bytes_saved(transformer, names) == saved
    assert bytes_saved(transformer, []) == 0


def test_the_cpu_has_no_fp8() -> None:
    assert fp8_unsupported(torch.device("cpu")) == "device cpu is not a CUDA GPU"


def test_torchao_missing_is_said_with_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchao is the fp8 extra, in no other: where it is missing, an FP8 entry is refused
    at load naming what to install (the worker lists the model unavailable with it)."""
    from workers.pipelines.diffusers.shared import fp8

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name)
    )
    assert fp8.library_missing() == "it is not installed: pip install 'omniqueue[fp8]'"


def test_each_layer_is_handed_to_torchao_with_its_kind_s_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchao's FP8 refuses the CPU, so its ``quantize_`` is recorded here (a stand-in
    module): each layer alone, with the dynamic or the weight-only config, row-wise scales
    and torchao's process-wide inductor settings left alone; then the component moved."""
    import sys
    from types import ModuleType

    from workers.pipelines.diffusers.shared.fp8 import quantize

    handed: list[tuple[torch.nn.Module, str, dict[str, Any], Any]] = []

    def config(kind: str) -> Any:
        return lambda **kwargs: (kind, kwargs)

    def quantize_(module: torch.nn.Module, cfg: Any, filter_fn: Any, device: Any) -> None:
        assert filter_fn(module, "") is True
        handed.append((module, cfg[0], cfg[1], device))

    stand_in = ModuleType("torchao.quantization")
    stand_in.Float8DynamicActivationFloat8WeightConfig = config("dynamic")  # type: ignore[attr-defined]
    stand_in.Float8WeightOnlyConfig = config("weight_only")  # type: ignore[attr-defined]
    stand_in.PerRow = lambda: "per-row"  # type: ignore[attr-defined]
    stand_in.quantize_ = quantize_  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchao", ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.quantization", stand_in)
    tree = _Tree()
    kinds = fp8_kinds(fp8_layers(tree), modulation=True)
    quantize(tree, kinds, torch.device("cpu"))
    assert [(tree.get_submodule(n), k) for n, k in kinds.items()] == [
        (module, kind) for module, kind, _, _ in handed
    ]
    assert [kind for _, kind, _, _ in handed] == ["dynamic", "weight_only", "weight_only"]
    for _, _, kwargs, device in handed:
        assert kwargs == {"granularity": "per-row", "set_inductor_config": False}
        assert device == torch.device("cpu")
    with pytest.raises(TypeError, match=r"blocks\.0\.ada_ln is a Sequential, not a Linear"):
        quantize(tree, {"blocks.0.ada_ln": "weight_only"}, torch.device("cpu"))
