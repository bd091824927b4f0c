"""A registry entry's ``attention = "cudnn"`` (cuDNN's fused attention through diffusers'
``_native_cudnn`` backend; workers/pipelines/diffusers/shared/attention.py): the registry
accepts it for the families whose attention goes through diffusers' dispatch and writes
their roles (what ``/v1/models`` lists), refuses it elsewhere and with ``vsa_topk``; a
worker off a CUDA device refuses the model at load, naming ``attention``, and lists it
unavailable; on load every attention processor of every denoiser gets the backend, set by
the production :func:`attention.install` (the load path run on the CPU with only the
device check bypassed: cuDNN's kernel itself runs on a GPU, the device benchmark's)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

from api.model_list import model_object
from models.catalog import CUDNN_FAMILIES, ModelSpec
from models.registry import CatalogError, parse_registry
from storage.settings import LimitSettings
from tests.unit.diffusers_fixtures import (
    TINY_SEQ_LEN,
    tiny_cogvideox_pipeline,
    tiny_ltx_pipeline,
    tiny_wan_entry,
    tiny_wan_pipeline,
)
from tests.unit.diffusers_fixtures_av import tiny_ltx2_pipeline
from tests.unit.h3_fixtures import tiny_h3_pipe
from tests.unit.helios_fixtures import SEQ_LEN, tiny_helios_pyramid_pipeline
from tests.unit.longcat_fixtures import tiny_longcat_pipeline
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.shared import attention
from workers.pipelines.diffusers.wan.adapter import WanAdapter
from workers.pipelines.registry import PipelineRegistry

CUDNN = AttentionBackendName._NATIVE_CUDNN


def entry(adapter: str, extra: str = 'attention = "cudnn"\n') -> str:
    return f'[[model]]\nname = "m"\nadapter = "{adapter}"\npath = "/w"\n{extra}'


def spec_of(adapter: str, extra: str = 'attention = "cudnn"\n') -> ModelSpec:
    return parse_registry(entry(adapter, extra))["m"].spec


def processors(model: torch.nn.Module) -> list[Any]:
    """Every attention processor of ``model`` that dispatches through diffusers."""
    found = [getattr(m, "processor", None) for m in model.modules()]
    return [p for p in found if p is not None and hasattr(p, "_attention_backend")]


def attention_modules(model: torch.nn.Module) -> int:
    return sum(1 for m in model.modules() if getattr(m, "processor", None) is not None)


# --- the registry ------------------------------------------------------------------


@pytest.mark.parametrize("adapter", CUDNN_FAMILIES)
def test_the_families_take_it_and_v1_models_lists_the_roles(adapter: str) -> None:
    spec = spec_of(adapter)
    if adapter == "diffusers.minimax_h3":  # one backend for the whole transformer
        want = {"blocks": "cudnn", "token_refiner": "cudnn"}
    else:
        want = {"blocks": "cudnn"}
    assert spec.attention == want and spec.vsa_topk is None
    assert model_object(spec, LimitSettings()).attention == want
    assert spec_of(adapter, "").attention in ({}, {"blocks": "sdpa", "token_refiner": "sdpa"})


@pytest.mark.parametrize(
    "adapter", ["diffusers.cogvideox", "diffusers.stable_audio", "acme.models:MyAdapter"]
)
def test_a_family_outside_diffusers_dispatch_is_refused_naming_it(adapter: str) -> None:
    with pytest.raises(CatalogError, match="attention = 'cudnn' is implemented for") as info:
        parse_registry(entry(adapter))
    assert str(info.value).endswith(f"not {adapter}")


def test_vsa_topk_stays_vsa_s() -> None:
    with pytest.raises(CatalogError, match="vsa_topk needs attention = 'vsa'"):
        parse_registry(entry("diffusers.minimax_h3", 'attention = "cudnn"\nvsa_topk = 32\n'))


def test_a_context_parallel_group_takes_it() -> None:
    """Ulysses and ring keep the backend set at load: cuDNN's is one diffusers' context
    parallelism runs (what ``enable_parallelism`` asks of each processor's backend)."""
    for strategy in ("ulysses", "ring"):
        model = parse_registry(
            entry("diffusers.wan", f'attention = "cudnn"\ndevices = 2\nparallel = "{strategy}"\n')
        )["m"]
        assert model.spec.attention == {"blocks": "cudnn"}
    assert _AttentionBackendRegistry._is_context_parallel_available(CUDNN)


# --- the device ----------------------------------------------------------------------


def test_the_cpu_is_refused_at_load_and_the_model_listed_unavailable(tmp_path: Path) -> None:
    text = tiny_wan_entry("acme/wan", tmp_path / "wan", 'attention = "cudnn"\n')
    failed = PipelineRegistry(parse_registry(text), "cpu").load_each()
    why = (
        "model 'acme/wan': attention = 'cudnn' runs cuDNN's fused attention on a CUDA GPU, "
        "and device cpu is not one"
    )
    assert {name: f.reason for name, f in failed.items()} == {"acme/wan": why}
    spec = parse_registry(text)["acme/wan"].spec
    listed = model_object(spec, LimitSettings(), None, why)
    assert (listed.available, listed.unavailable_reason) == (False, why)


def test_helios_and_h3_refuse_the_cpu_too() -> None:
    helios = HeliosWorldAdapter(
        pipe=tiny_helios_pyramid_pipeline(distilled=True),
        dtype="float32",
        max_sequence_length=SEQ_LEN,
        spec=spec_of("diffusers.helios"),
    )
    with pytest.raises(CatalogError, match=r"attention = 'cudnn'.*device cpu is not one"):
        helios.load("cpu")
    h3 = MiniMaxH3Adapter(pipe=tiny_h3_pipe(), spec=spec_of("diffusers.minimax_h3"))
    with pytest.raises(CatalogError, match=r"attention = 'cudnn'.*device cpu is not one"):
        h3.load("cpu")


# --- what load installs ---------------------------------------------------------------


PIPES: dict[str, Callable[[], Any]] = {
    "diffusers.wan": lambda: tiny_wan_pipeline(two_stage=True),
    "diffusers.ltx": tiny_ltx_pipeline,
    "diffusers.ltx2": tiny_ltx2_pipeline,
    "diffusers.longcat_audio": tiny_longcat_pipeline,
    "diffusers.minimax_h3": tiny_h3_pipe,
    "diffusers.helios": lambda: tiny_helios_pyramid_pipeline(distilled=True),
}


@pytest.mark.parametrize("adapter", CUDNN_FAMILIES)
def test_every_attention_processor_of_every_denoiser_gets_cudnn(adapter: str) -> None:
    """The families' claim: every attention module of each ``transformer*`` dispatches
    through diffusers, so the one call reaches every role; diffusers' process-wide
    active backend (what another model's processors fall back on) is left alone."""
    pipe = PIPES[adapter]()
    active = _AttentionBackendRegistry._active_backend
    names = attention.install(pipe, spec_of(adapter))
    assert set(names) == set(attention.denoisers(pipe)) and "transformer" in names
    for name in names:
        model = getattr(pipe, name)
        found = processors(model)
        assert found and len(found) == attention_modules(model)  # none left on its own path
        assert {p._attention_backend for p in found} == {CUDNN}
    assert _AttentionBackendRegistry._active_backend == active


def test_an_entry_without_it_keeps_diffusers_default() -> None:
    pipe = tiny_wan_pipeline()
    assert attention.install(pipe, spec_of("diffusers.wan", "")) == []
    assert {p._attention_backend for p in processors(pipe.transformer)} == {None}


def test_cogvideox_s_processors_bypass_the_dispatch() -> None:
    """Why the registry refuses CogVideoX: its processors call PyTorch's SDPA themselves,
    so no backend setting reaches them."""
    pipe = tiny_cogvideox_pipeline()
    assert attention_modules(pipe.transformer) > 0 and processors(pipe.transformer) == []


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load path as on a CUDA device: only the device check is bypassed."""
    monkeypatch.setattr(attention, "refuse_off_cuda", lambda spec, device: None)


@pytest.mark.usefixtures("on_cuda")
def test_load_installs_it_and_logs_each_role(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=attention.__name__)
    wan = WanAdapter(
        pipe=tiny_wan_pipeline(),
        dtype="float32",
        max_sequence_length=TINY_SEQ_LEN,
        spec=spec_of("diffusers.wan").model_copy(update={"name": "acme/wan"}),
    )
    wan.load("cpu")
    assert {p._attention_backend for p in processors(wan.pipe.transformer)} == {CUDNN}
    assert "acme/wan attention: blocks cudnn; _native_cudnn on transformer" in caplog.text
    helios = HeliosWorldAdapter(
        pipe=tiny_helios_pyramid_pipeline(distilled=True),
        dtype="float32",
        max_sequence_length=SEQ_LEN,
        spec=spec_of("diffusers.helios"),
    )
    helios.load("cpu")
    assert {p._attention_backend for p in processors(helios.pipe.transformer)} == {CUDNN}
    caplog.clear()
    h3 = MiniMaxH3Adapter(pipe=tiny_h3_pipe(), spec=spec_of("diffusers.minimax_h3"))
    h3.load("cpu")
    denoisers = attention.denoisers(h3.pipe)  # the tiny pipe holds both partitions
    for model in denoisers.values():
        assert {p._attention_backend for p in processors(model)} == {CUDNN}
    lines = [r.getMessage() for r in caplog.records if "attention:" in r.getMessage()]
    on = ", ".join(denoisers)
    assert lines == [f"m attention: blocks cudnn, token_refiner cudnn; _native_cudnn on {on}"]
