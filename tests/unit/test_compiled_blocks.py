"""Compiled blocks on the tiny Wan, in process: dynamo compiles each block's ``forward``
(here with its ``eager`` backend, which traces and guards as inductor does but runs the
graph's ops as they are, so frames stay bit-equal and CPU CI stays fast; inductor itself
is measured on the GPU by ``benchmarks/gpu/lane.py``). The cancel gates and the cache
tiers' hooks stay outside the compiled region; a second job of a shape compiles nothing;
warm-up shapes compile before any job; a compile failure falls back to eager."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from models.errors import JobLost
from models.registry import WarmupShape
from tests.unit.job_steps import job_frames
from tests.unit.test_diffusers_video import CASES, _reference, _request
from workers.common import metrics
from workers.pipelines.base import step_stops
from workers.pipelines.diffusers.shared.compiled import graphs_made
from workers.pipelines.diffusers.wan.adapter import WanAdapter
from workers.pipelines.registry import PipelineRegistry

STEPS = 4
CASE = CASES["wan"]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(backend: str = "eager", **kwargs: Any) -> WanAdapter:
    adapter = WanAdapter(
        pipe=CASE.build(),
        max_sequence_length=16,
        compile="blocks",
        compile_backend=backend,
        **kwargs,
    )
    adapter.load("cpu")
    return adapter


def _run(adapter: WanAdapter, **overrides: Any) -> np.ndarray:
    return job_frames(adapter, _request(CASE, num_inference_steps=STEPS, **overrides))


def test_compiled_blocks_give_the_eager_frames_and_compile_once_per_shape() -> None:
    adapter = _compiled()
    blocks = adapter.pipe.transformer.blocks
    assert all(getattr(b.forward, "_omniq_compiled", False) for b in blocks)
    before = graphs_made()
    frames = _run(adapter)
    assert graphs_made() - before == 1  # one graph for both blocks, made in prepare
    assert adapter.last_recompiles == 0
    ref = _reference(CASE.build(), _request(CASE, num_inference_steps=STEPS))
    np.testing.assert_allclose(frames, ref, rtol=0, atol=1e-6)

    before = graphs_made()
    np.testing.assert_array_equal(_run(adapter), frames)  # the second job: nothing
    _run(adapter, quality="fast")  # a cache tier wraps the compiled blocks: nothing
    assert graphs_made() == before and adapter.last_recompiles == 0

    _run(adapter, width=48)  # another shape: compiled in its prepare, not while denoising
    assert graphs_made() == before + 1 and adapter.last_recompiles == 0


def test_warm_up_compiles_the_declared_shapes_before_any_job() -> None:
    adapter = _compiled(warmup=[WarmupShape(width=32, height=32, num_frames=9)])
    before = graphs_made()
    adapter.warm_up()
    assert graphs_made() == before + 1
    assert ("WanState", (1, 16, 3, 4, 4), True) in adapter.compiler.shapes
    _run(adapter)
    assert graphs_made() == before + 1


def test_the_registry_warms_up_on_load(tmp_path: Any) -> None:
    from models.registry import parse_registry

    CASE.build().save_pretrained(tmp_path / "wan")
    registry = parse_registry(
        f'[[model]]\nname = "tiny/wan"\nadapter = "diffusers.wan"\npath = "{tmp_path / "wan"}"\n'
        'dtype = "float32"\ncompile = "blocks"\ncompile_backend = "eager"\n'
        "[model.adapter_options]\nmax_sequence_length = 16\n"
        "[[model.warmup]]\nwidth = 32\nheight = 32\nnum_frames = 9\n"
    )
    seconds = metrics.COMPILE_SECONDS.labels("tiny/wan", "warmup")
    observed = seconds._sum.get()  # type: ignore[attr-defined]
    pipes = PipelineRegistry(registry, "cpu")
    pipes.load_all()
    assert len(pipes.get("tiny/wan").compiler.shapes) == 1  # type: ignore[attr-defined]
    assert seconds._sum.get() > observed  # type: ignore[attr-defined]


def test_cancel_inside_a_compiled_step_lands_before_the_next_block() -> None:
    adapter = _compiled()
    state = adapter.prepare(_request(CASE, num_inference_steps=STEPS))
    asked: list[int] = []

    def stop(block: int) -> BaseException | None:
        asked.append(block)
        return JobLost() if block == 2 else None

    adapter.step(state)
    with pytest.raises(JobLost), step_stops(stop):
        adapter.step(state)
    adapter.end()
    assert asked == [1, 2]  # the gates ran before each block of the compiled step
    assert state.step_index == 1


def test_a_compile_failure_falls_back_to_eager_and_never_fails_the_job() -> None:
    @torch._dynamo.register_backend(name="omniq_test_broken")  # type: ignore[misc]
    def broken(gm: Any, example_inputs: Any) -> Any:
        raise RuntimeError("this backend cannot compile")

    fallbacks = metrics.COMPILE_FALLBACKS.labels("diffusers.wan")
    before = fallbacks._value.get()  # type: ignore[attr-defined]
    adapter = _compiled(backend="omniq_test_broken")
    frames = _run(adapter)
    assert adapter.compiler.failed is not None and "cannot compile" in adapter.compiler.failed
    assert fallbacks._value.get() == before + 1  # type: ignore[attr-defined]
    ref = _reference(CASE.build(), _request(CASE, num_inference_steps=STEPS))
    np.testing.assert_allclose(frames, ref, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(_run(adapter), frames)  # and stays eager


def test_compile_defaults_to_off_on_the_cpu() -> None:
    adapter = WanAdapter(pipe=CASE.build(), max_sequence_length=16)
    adapter.load("cpu")
    assert not adapter.compiler.enabled
    assert not any(
        getattr(b.forward, "_omniq_compiled", False) for b in adapter.pipe.transformer.blocks
    )


def test_the_recompile_limit_falls_back_to_eager_and_never_fails_the_job() -> None:
    """A block that meets dynamo's recompile limit (here 1 graph: the second frame size
    needs another) raises under ``fullgraph``; the blocks go eager, the job completes
    with the eager frames. The limit is set through dynamo's own ``config.patch``: with
    pytest's ``monkeypatch`` the undo deletes the setting, which torch's config module
    then hides, and every later compile in the process fails on it."""
    name = (
        "recompile_limit"
        if hasattr(torch._dynamo.config, "recompile_limit")
        else "cache_size_limit"
    )
    with torch._dynamo.config.patch(**{name: 1}):
        adapter = _compiled()
        _run(adapter)  # the first shape compiles its graph
        frames = _run(adapter, width=32, height=48)  # a new shape meets the limit
    assert adapter.compiler.failed is not None and "RecompileLimit" in adapter.compiler.failed
    ref = _reference(CASE.build(), _request(CASE, num_inference_steps=STEPS, width=32, height=48))
    np.testing.assert_array_equal(frames, ref)
