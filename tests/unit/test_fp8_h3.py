"""FP8 with FastH3's fused LoRA: fused in the loaded dtype first, then quantized
(docs/adapters.md, "FP8 and offload"). The FP8 step itself needs a GPU of compute
capability 8.9 (torchao refuses the CPU), so here the device check is passed and torchao's
quantization recorded instead of run: what it is handed is what it would quantize.

Also: the cancel gates and the load's order are the adapter's whatever the plan (the
gates are forward pre-hooks on the blocks, and FP8 swaps a Linear layer's weight, never a
module), and ``offload = "model"`` is refused on H3's modular pipeline before the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from models.catalog import FAMILY_SPECS
from models.memory_plan import MemoryPlan, MemoryReport
from models.registry import CatalogError
from tests.unit.h3_fixtures import tiny_h3_lora, tiny_h3_pipe
from workers.pipelines.blocks import denoiser_blocks
from workers.pipelines.diffusers.minimax_h3.adapter import FusedLora, MiniMaxH3Adapter
from workers.pipelines.diffusers.shared import fp8

SPEC = FAMILY_SPECS["diffusers.minimax_h3"]


def _adapter(plan: MemoryPlan | None, **options: Any) -> MiniMaxH3Adapter:
    return MiniMaxH3Adapter(pipe=tiny_h3_pipe(), spec=SPEC, memory=plan, **options)


Handed = dict[int, dict[str, torch.Tensor]]


@pytest.fixture
def quantized(monkeypatch: pytest.MonkeyPatch) -> Handed:
    """The weights torchao's quantization is handed: the module's id -> its layers'
    weights by name; the device check passed (the CPU stands in for an FP8 GPU with
    torchao)."""
    seen: Handed = {}
    monkeypatch.setattr(fp8, "fp8_unsupported", lambda device: None)
    monkeypatch.setattr(fp8, "library_missing", lambda: None)

    def record(model: torch.nn.Module, kinds: dict[str, Any], device: torch.device) -> None:
        seen[id(model)] = {n: model.get_submodule(n).weight.detach().clone() for n in kinds}

    monkeypatch.setattr(fp8, "quantize", record)
    return seen


def test_fasth3_s_lora_is_fused_before_its_weights_become_fp8(
    tmp_path: Path, quantized: Handed
) -> None:
    """``"fp8"`` quantizes every transformer* the pipeline holds: the tiny pipe holds
    both partitions (a deployment loads one), the LoRA is fused into ``transformer``."""
    path = tmp_path / "fasth3.safetensors"
    fused = {"path": str(path), "sha256": tiny_h3_lora(path)}
    adapter = _adapter(MemoryPlan(quantization="fp8"), fused_lora=fused)
    adapter.load("cpu")
    handed = quantized[id(adapter.pipe.transformer)]
    plain = tiny_h3_pipe().transformer
    reference = tiny_h3_pipe()
    FusedLora(**fused).fuse(reference, "transformer")
    assert sorted(handed) == sorted(fp8.fp8_modules(plain)) and len(handed) == 12
    for name, weight in handed.items():
        assert torch.equal(weight, reference.transformer.get_submodule(name).weight), name
    # the LoRA targets to_q/k/v: those FP8 weights are the fused ones, not the plain ones
    q = "transformer_blocks.0.attn.to_q"
    assert not torch.equal(handed[q], plain.get_submodule(q).weight)
    assert id(adapter.pipe.transformer_ref) in quantized
    saved = fp8.bytes_saved(plain, sorted(handed))
    assert adapter.memory_report() == MemoryReport(
        fp8_modules={"transformer": 12, "transformer_ref": 12},
        bytes_saved=2 * saved,  # two partitions of one layout
        offload="none",
    )


def test_the_gates_are_on_the_blocks_of_an_fp8_transformer(quantized: Handed) -> None:
    adapter = _adapter(MemoryPlan(quantization={"transformer": "fp8", "vae": "none"}))
    adapter.load("cpu")
    blocks = denoiser_blocks(adapter.pipe)
    assert blocks and all(getattr(b, "_omniq_gate", None) is adapter.gate for b in blocks)
    assert list(quantized) == [id(adapter.pipe.transformer)]  # the one component named


def test_a_component_the_pipeline_lacks_is_named(quantized: Handed) -> None:
    adapter = _adapter(MemoryPlan(quantization={"transfomer": "fp8"}))
    with pytest.raises(CatalogError, match="quantization names component 'transfomer'"):
        adapter.load("cpu")
    assert quantized == {}  # nothing quantized on the way to the refusal


def test_model_offload_is_refused_on_the_modular_pipeline() -> None:
    adapter = _adapter(MemoryPlan(offload="model"))
    with pytest.raises(CatalogError, match="MiniMaxH3ModularPipeline has none"):
        adapter.load("cpu")
