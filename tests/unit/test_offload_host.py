"""Group offloading's host copies planned before they are taken
(workers/pipelines/diffusers/shared/host_memory.py, issue 44): the pinned allocator's
rounding, what a component's copies take each way, the choice between pinned and pageable
copies and the refusal, and the load path that applies it (``MemoryLayout.place`` on a
CUDA device stood in for, as tests/unit/test_memory_plan.py does: group offloading itself
needs a GPU, so what is checked here is the decision and what reaches
``apply_group_offloading``, not that it streams)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from models.memory_plan import MemoryPlan, model_memory
from models.registry import CatalogError
from tests.unit.diffusers_fixtures import tiny_wan_pipeline
from workers.pipelines.diffusers.shared import host_memory, memory
from workers.pipelines.diffusers.shared.host_memory import (
    RESERVE_MIN_BYTES,
    HostCopySizes,
    fits,
    host_available,
    host_copy_sizes,
    host_plan,
    pinned_size,
)
from workers.pipelines.diffusers.shared.memory import MemoryLayout
from workers.pipelines.diffusers.shared.offload import modules_of

MIB, GIB = 1 << 20, 1 << 30


def test_a_pinned_block_is_rounded_up_to_a_power_of_two() -> None:
    assert [pinned_size(n) for n in (0, 1, 3, 4096, 4097)] == [0, 1, 4, 4096, 8192]
    # MiniMax-H3's feed-forward weight (5376 x 14336 bfloat16, 147 MiB) pins 256 MiB
    assert pinned_size(5376 * 14336 * 2) == 256 * MIB


def test_the_copies_of_device_weights_are_counted_each_way_once() -> None:
    """Weights on the device (here the meta device: sizes, no memory) are copied to the
    host at their size when pageable, at the allocator's sizes when pinned; a tied
    parameter is one tensor."""
    with torch.device("meta"):
        ffn = torch.nn.Linear(5376, 14336, bias=False, dtype=torch.bfloat16)
        out = torch.nn.Linear(14336, 5376, bias=False, dtype=torch.bfloat16)
    out.weight = torch.nn.Parameter(ffn.weight.t())  # a view: its own tensor, same bytes
    tied = torch.nn.Sequential(ffn, out)
    tied.register_buffer("ids", torch.empty(1000, dtype=torch.int64, device="meta"))
    sizes = host_copy_sizes([tied, ffn])  # ffn's weight met twice, counted once
    weight = 5376 * 14336 * 2
    assert sizes.weights == 2 * weight + 8000
    assert sizes.pageable == sizes.weights
    assert sizes.pinned == 2 * 256 * MIB + 8192


def test_minimax_h3_s_copies_stay_pageable_on_a_128_gib_host() -> None:
    """The benchmark's H3 (its default configs, 4 text layers, built on the meta device:
    sizes only): 71.7 GiB of weights pin 101.2 GiB, over what a 128 GiB host keeps free
    beside them; a 256 GiB host pins them."""
    from workers.pipelines.diffusers.minimax_h3.random_weights import random_pipeline

    pipe = random_pipeline("meta", torch.bfloat16, text_layers=4, config={})
    sizes = host_copy_sizes(list(modules_of(pipe).values()))
    assert (round(sizes.weights / GIB, 1), round(sizes.pinned / GIB, 1)) == (71.7, 101.2)
    assert host_plan("h3", sizes, available=120 * GIB).copies == "pageable"
    assert host_plan("h3", sizes, available=240 * GIB).copies == "pinned"


def test_weights_already_on_the_host_need_no_pageable_copy() -> None:
    pipe = tiny_wan_pipeline()
    sizes = host_copy_sizes(list(modules_of(pipe).values()))
    assert sizes.pageable == 0 and sizes.pinned > sizes.weights > 0


def test_a_subclassed_weight_counts_each_tensor_it_holds() -> None:
    """torchao's FP8 weight holds its float8 data and its row scales, each pinned on its
    own: the parts ``__tensor_flatten__`` names are what is counted."""

    class TwoParts(torch.Tensor):
        @staticmethod
        def __new__(cls, data: torch.Tensor, scale: torch.Tensor) -> TwoParts:
            return torch.Tensor._make_wrapper_subclass(
                cls, data.shape, dtype=data.dtype, device=data.device
            )

        def __init__(self, data: torch.Tensor, scale: torch.Tensor) -> None:
            self.data_part, self.scale = data, scale

        def __tensor_flatten__(self) -> tuple[list[str], None]:
            return ["data_part", "scale"], None

        @classmethod
        def __torch_dispatch__(  # type: ignore[override]
            cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            raise NotImplementedError(func)  # nothing here computes with it

    module = torch.nn.Module()
    weight = TwoParts(
        torch.empty(64, 48, dtype=torch.uint8, device="meta"),
        torch.empty(64, 1, dtype=torch.float32, device="meta"),
    )
    module.register_buffer("weight", weight)
    sizes = host_copy_sizes([module])
    assert (sizes.weights, sizes.pinned) == (64 * 48 + 256, 4096 + 256)


def test_pinned_copies_when_they_fit_then_pageable_then_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sizes = HostCopySizes(pinned=100 * GIB, pageable=62 * GIB, weights=62 * GIB)
    plan = host_plan("acme/h3", sizes, available=200 * GIB)
    assert (plan.copies, plan.host_bytes, plan.low_cpu_mem_usage) == ("pinned", 100 * GIB, False)
    # with 110 GiB available, 100 + 27.5 (the reserve) does not fit, 62 + 27.5 does
    with caplog.at_level(logging.WARNING, logger=host_memory.__name__):
        plan = host_plan("acme/h3", sizes, available=110 * GIB)
    assert (plan.copies, plan.host_bytes, plan.low_cpu_mem_usage) == ("pageable", 62 * GIB, True)
    (record,) = caplog.records
    assert "acme/h3" in record.message and "keeping them pageable" in record.message
    assert "100.0 GiB" in record.message and "110.0 GiB available" in record.message
    with pytest.raises(CatalogError) as refused:
        host_plan("acme/h3", sizes, available=64 * GIB)
    why = str(refused.value)
    assert why.startswith("model 'acme/h3': offload = 'group' needs 66571993088 bytes")
    assert "this host has 68719476736 bytes (64.0 GiB) available" in why


def test_a_component_offloaded_without_the_stream_counts_pageable_either_way() -> None:
    """diffusers pins no copy of a component it offloads without the stream (its tensors
    move to the host as they are offloaded): the pinned plan counts its own bytes, so a
    host that holds the streamed components' pinned copies beside it gets them pinned."""
    streamed = HostCopySizes(pinned=40 * GIB, pageable=30 * GIB, weights=30 * GIB)
    encoder = HostCopySizes(pinned=30 * GIB, pageable=20 * GIB, weights=20 * GIB)
    plan = host_plan("acme/h3", streamed, 84 * GIB, unstreamed=encoder)  # 40 + 20 + 21 fit
    assert (plan.copies, plan.host_bytes) == ("pinned", 60 * GIB)
    plan = host_plan("acme/h3", streamed, 76 * GIB, unstreamed=encoder)  # 60 + 19 do not
    assert (plan.copies, plan.host_bytes) == ("pageable", 50 * GIB)


def test_the_reserve_is_a_quarter_of_the_host_and_at_least_4_gib() -> None:
    assert fits(10 * GIB, 14 * GIB) and not fits(10 * GIB + 1, 14 * GIB)
    assert fits(75 * GIB, 100 * GIB) and not fits(75 * GIB + 1, 100 * GIB)
    assert RESERVE_MIN_BYTES == 4 * GIB


def test_the_host_s_available_memory_is_read() -> None:
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert 0 < host_available() <= total


# --- the load path: MemoryLayout.place with group offload, the GPU stood in for ----------


def _device_pipe() -> Any:
    """A tiny Wan whose weights are "on the device": the meta device, sizes only."""
    pipe = tiny_wan_pipeline()
    for component in modules_of(pipe).values():
        component.to("meta")
    return pipe


def _device_weights() -> int:
    return host_copy_sizes(list(modules_of(_device_pipe()).values())).weights


def _place(
    monkeypatch: pytest.MonkeyPatch,
    available: int,
    on_device: bool = True,
    plan: MemoryPlan | None = None,
) -> tuple[Any, list[tuple[Any, ...]]]:
    """Place a tiny Wan with ``offload = "group"`` on a stood-in CUDA device whose host has
    ``available`` bytes; its weights on the device (the meta device: ``weights =
    "random"``) unless ``on_device`` is False. Returns the report and the offload calls."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(memory, "offload", lambda *args: calls.append(args))
    monkeypatch.setattr(memory, "weights_on_device", lambda pipe, device: on_device)
    monkeypatch.setattr(memory, "set_budget", lambda plan, device, held=0: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(host_memory, "host_available", lambda: available)
    pipe = _device_pipe() if on_device else tiny_wan_pipeline()
    layout = MemoryLayout("acme/wan", plan or MemoryPlan(offload="group"))
    return layout.place(pipe, "cuda"), calls


def test_a_host_that_holds_the_pinned_copies_gets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    report, calls = _place(monkeypatch, available=64 * GIB)
    ((*_, pageable, without_stream),) = calls
    assert pageable is False and without_stream == frozenset()
    assert report.offload_host == "pinned" and report.offload_host_bytes > 0
    listed = model_memory(MemoryPlan(offload="group"), report)
    assert listed is not None and listed.offload_host == "pinned"
    assert listed.offload_host_bytes == report.offload_host_bytes


def test_a_host_short_of_the_pinned_copies_keeps_them_pageable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    weights = _device_weights()
    report, calls = _place(monkeypatch, available=RESERVE_MIN_BYTES + weights)
    ((*_, pageable, without_stream),) = calls
    assert pageable is True  # diffusers' low_cpu_mem_usage
    assert without_stream == frozenset()
    assert (report.offload_host, report.offload_host_bytes) == ("pageable", weights)


def test_a_host_short_of_even_the_pageable_copies_refuses_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    weights = _device_weights()
    with pytest.raises(CatalogError, match=r"model 'acme/wan': offload = 'group' needs \d+"):
        _place(monkeypatch, available=RESERVE_MIN_BYTES + weights - 1)
    # the same host holds weights loaded on the host: their pageable copies are them
    report, _ = _place(monkeypatch, available=RESERVE_MIN_BYTES + weights - 1, on_device=False)
    assert report.offload_host == "pageable"


def test_the_load_counts_a_nested_text_encoder_at_its_own_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``offload_blocks`` under Wan's UMT5 nest its groups, so it goes without the stream:
    the pinned plan holds the other components' pinned blocks and its own bytes."""
    pipe = _device_pipe()
    parts = modules_of(pipe)
    streamed = host_copy_sizes([m for name, m in parts.items() if name != "text_encoder"])
    encoder = host_copy_sizes([parts["text_encoder"]])
    plan = MemoryPlan(offload="group", offload_blocks=["text_encoder.encoder.block"])
    report, calls = _place(monkeypatch, available=64 * GIB, plan=plan)
    ((*_, pageable, without_stream),) = calls
    assert without_stream == {"text_encoder"} and pageable is False  # decided once, here
    assert report.offload_host == "pinned"
    assert report.offload_host_bytes == streamed.pinned + encoder.weights
    assert encoder.pinned > encoder.weights  # what it was counted at before
