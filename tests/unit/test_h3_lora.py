"""Per-request LoRA on MiniMax-H3 (the ``transformer`` partition: t2va, fl2va): a job with
an adapter is bit-equal to a fresh pipeline with that adapter alone, loaded by diffusers
(``load_lora_weights`` + ``set_adapters``); a job without one, after it, is the base model;
FastH3's fused LoRA and a per-request one add up; a ``transformer_ref`` deployment refuses
``lora`` when it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.catalog import FAMILY_SPECS
from models.job_specs import LoraSpec
from models.registry import CatalogError
from tests.unit.h3_fixtures import h3_request, tiny_h3_lora, tiny_h3_pipe
from tests.unit.job_steps import run_job
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.minimax_h3.inputs import call_inputs
from workers.pipelines.diffusers.shared.common import make_generator, to_uint8
from workers.pipelines.diffusers.shared.lora import LoraCache

RANK = 2  # tiny_h3_lora's


def _pipe() -> Any:
    return tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192)


def _spec(workflows: list[str] | None = None) -> Any:
    base = FAMILY_SPECS["diffusers.minimax_h3"]
    update: dict[str, Any] = {"parameters": [*base.parameters, "lora"]}
    if workflows is not None:
        update["workflows"] = workflows
    return base.model_copy(update=update)


def _adapter(pipe: Any, **options: Any) -> MiniMaxH3Adapter:
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=_spec(), **options)
    adapter.use_lora(LoraCache(max_rank=RANK))
    adapter.load("cpu")
    return adapter


def _frames(adapter: MiniMaxH3Adapter, lora: LoraSpec | None) -> np.ndarray:
    request = h3_request(lora=lora)
    return np.asarray(run_job(adapter, request).frames)


def _fresh(path: Path | None, scale: float = 1.0) -> np.ndarray:
    """diffusers' own call on a fresh pipeline with only this adapter (None: none)."""
    pipe = _pipe()
    if path is not None:
        pipe.load_lora_weights(str(path), adapter_name="only")
        pipe.set_adapters(["only"], [scale])
    request = h3_request()
    out = pipe(**call_inputs(request, make_generator(request.seed)), output_type="np")
    return to_uint8(np.asarray(out.get("videos")[0]))


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("h3-loras")
    out = {}
    for name, seed in (("A", 1), ("B", 2)):
        path = root / f"{name}.safetensors"
        tiny_h3_lora(path, seed=seed)
        out[name] = path
    return out


def _lora(path: Path, scale: float = 1.0) -> LoraSpec:
    return LoraSpec(name=path.stem, path=str(path), scale=scale)


def test_jobs_with_adapters_match_a_fresh_pipeline_with_that_adapter_alone(
    loras: dict[str, Path],
) -> None:
    adapter = _adapter(_pipe())
    base = _fresh(None)
    for name, scale in (("A", 1.0), ("B", 0.5), (None, 1.0), ("A", 1.0)):
        got = _frames(adapter, None if name is None else _lora(loras[name], scale))
        want = base if name is None else _fresh(loras[name], scale)
        assert np.array_equal(got, want), (name, scale)
        if name is not None:
            assert not np.array_equal(got, base)  # the adapter changed the video
    assert adapter.lora is not None
    stats = adapter.lora.stats()
    assert (stats.misses, stats.hits) == (2, 1)


def test_a_transformer_ref_deployment_refuses_lora_at_start() -> None:
    adapter = MiniMaxH3Adapter(pipe=_pipe(), spec=_spec(["ref2va"]))
    with pytest.raises(CatalogError, match="transformer partition"):
        adapter.use_lora(LoraCache(max_rank=RANK))


def test_fasth3_s_fused_lora_and_a_per_request_one_add_up(
    loras: dict[str, Path], tmp_path: Path
) -> None:
    """The deployment's LoRA fused at start, the job's in the slot: bit-equal to a fresh
    pipeline that fused the one and loaded the other."""
    fused = tmp_path / "fused.safetensors"
    digest = tiny_h3_lora(fused, seed=9)
    adapter = _adapter(_pipe(), fused_lora={"path": str(fused), "sha256": digest})
    got = _frames(adapter, _lora(loras["A"]))
    pipe = _pipe()
    pipe.load_lora_weights(str(fused), adapter_name="fused")
    pipe.fuse_lora(components=["transformer"], lora_scale=1.0, adapter_names=["fused"])
    pipe.unload_lora_weights()
    pipe.load_lora_weights(str(loras["A"]), adapter_name="only")
    pipe.set_adapters(["only"], [1.0])
    request = h3_request()
    out = pipe(**call_inputs(request, make_generator(request.seed)), output_type="np")
    assert np.array_equal(got, to_uint8(np.asarray(out.get("videos")[0])))
    assert not np.array_equal(got, _fresh(loras["A"]))  # the fused LoRA counts too
