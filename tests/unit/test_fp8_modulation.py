"""A registry entry's ``fp8_modulation``: the denoiser blocks' adaLN / modulation
projections FP8 weight-only too (docs/configuration.md, "Memory: FP8 weights and
offload"). Off by default; refused, naming both fields, on a plan that makes nothing FP8;
written by ``describe()``; reported by the worker apart from the rule's FP8 layers, its
bytes in ``bytes_saved``, and listed by ``/v1/models``.

The FP8 step needs a GPU of compute capability 8.9 (torchao refuses the CPU), so here the
device check is passed and torchao's quantization recorded instead of run: what it is
handed, and with which kind, is what it would quantize (tests/unit/test_fp8_rule.py
checks which torchao config each kind gets)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from models.catalog import FAMILY_SPECS
from models.memory_plan import MemoryPlan, MemoryReport, model_memory
from models.registry import CatalogError, parse_registry
from tests.unit.h3_fixtures import tiny_h3_pipe
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.shared import fp8

ENTRY = 'adapter = "diffusers.minimax_h3"\npath = "/w"\n'
ADALN = ["transformer_blocks.0.adaln_proj.linear", "transformer_blocks.1.adaln_proj.linear"]


def one(keys: str) -> Any:
    return parse_registry(f'[[model]]\nname = "m"\n{ENTRY}{keys}\n')["m"]


def test_the_field_is_the_plan_s_and_describe_writes_it() -> None:
    plan = one('quantization = "fp8"\nfp8_modulation = true').spec.memory
    assert plan == MemoryPlan(quantization="fp8", fp8_modulation=True)
    assert plan.describe() == "quantization = 'fp8', fp8_modulation = true"
    each = one(
        'quantization = {transformer = "fp8", vae = "none"}\nfp8_modulation = true\n'
        'offload = "group"'
    ).spec.memory
    assert each.describe() == (
        'quantization = {transformer = "fp8", vae = "none"}, fp8_modulation = true, '
        "offload = 'group'"
    )
    default = one('quantization = "fp8"').spec.memory
    assert default.fp8_modulation is False and "fp8_modulation" not in default.describe()
    assert one("fp8_modulation = false").spec.memory is None  # the default: no plan


@pytest.mark.parametrize(
    ("keys", "quantization"),
    [
        ("", "'none'"),
        ('quantization = "none"', "'none'"),
        ('quantization = {transformer = "none"}', '{transformer = "none"}'),
        ('offload = "group"', "'none'"),
    ],
)
def test_without_an_fp8_component_it_is_refused_naming_both(keys: str, quantization: str) -> None:
    with pytest.raises(CatalogError, match="model\\[0\\] \\(m\\)") as raised:
        one(f"{keys}\nfp8_modulation = true")
    why = str(raised.value)
    assert "fp8_modulation = true needs quantization = 'fp8'" in why
    assert f"quantization = {quantization} makes no component FP8" in why


Handed = dict[int, dict[str, fp8.Fp8Kind]]


@pytest.fixture
def quantized(monkeypatch: pytest.MonkeyPatch) -> Handed:
    """What torchao's quantization is handed: the module's id -> its layers' kinds."""
    seen: Handed = {}
    monkeypatch.setattr(fp8, "fp8_unsupported", lambda device: None)
    monkeypatch.setattr(fp8, "library_missing", lambda: None)

    def record(model: torch.nn.Module, kinds: dict[str, fp8.Fp8Kind], device: Any) -> None:
        seen[id(model)] = dict(kinds)

    monkeypatch.setattr(fp8, "quantize", record)
    return seen


def _load(plan: MemoryPlan) -> MiniMaxH3Adapter:
    adapter = MiniMaxH3Adapter(
        pipe=tiny_h3_pipe(), spec=FAMILY_SPECS["diffusers.minimax_h3"], memory=plan
    )
    adapter.load("cpu")
    return adapter


def test_h3_s_adaln_projections_are_handed_weight_only_and_reported_apart(
    quantized: Handed, caplog: pytest.LogCaptureFixture
) -> None:
    plain = tiny_h3_pipe().transformer
    rule = fp8.fp8_modules(plain)
    with caplog.at_level(logging.INFO):
        adapter = _load(MemoryPlan(quantization="fp8", fp8_modulation=True))
    for partition in ("transformer", "transformer_ref"):
        kinds = quantized[id(getattr(adapter.pipe, partition))]
        assert kinds == {**dict.fromkeys(rule, "dynamic"), **dict.fromkeys(ADALN, "weight_only")}
    saved = fp8.bytes_saved(plain, [*rule, *ADALN])
    report = adapter.memory_report()
    assert report == MemoryReport(
        fp8_modules={"transformer": 12, "transformer_ref": 12},
        fp8_weight_only_modules={"transformer": 2, "transformer_ref": 2},
        bytes_saved=2 * saved,  # two partitions of one layout
        offload="none",
    )
    assert saved > fp8.bytes_saved(plain, rule)
    lines = [r.getMessage() for r in caplog.records]
    summary = next(line for line in lines if "fp8_modulation = true;" in line)
    assert "modulation layers FP8 weight-only {" in summary
    assert "'transformer': 2" in summary and "'transformer_ref': 2" in summary
    assert any(
        "transformer: 12 Linear layers FP8, 2 modulation layers FP8 weight-only" in line
        for line in lines
    )
    listed = model_memory(MemoryPlan(quantization="fp8", fp8_modulation=True), report)
    assert listed is not None and listed.fp8_modulation is True
    assert (listed.fp8_modules, listed.fp8_weight_only_modules) == (24, 4)
    assert listed.fp8_weight_only_components == {"transformer": 2, "transformer_ref": 2}
    assert listed.bytes_saved == 2 * saved


def test_without_the_opt_in_the_modulation_stays_as_loaded(quantized: Handed) -> None:
    adapter = _load(MemoryPlan(quantization={"transformer": "fp8"}))
    (kinds,) = quantized.values()
    assert set(kinds.values()) == {"dynamic"} and not set(ADALN) & set(kinds)
    report = adapter.memory_report()
    assert report is not None and report.fp8_weight_only_modules == {}
    listed = model_memory(adapter.memory.plan, report)
    assert listed is not None and listed.fp8_modulation is False
    assert listed.fp8_weight_only_modules == 0
