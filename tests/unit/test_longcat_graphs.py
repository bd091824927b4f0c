"""LongCat's whole-pass CUDA graphs (``longcat_audio/graphs.py``, the adapter's
``step_graphs``): what can be checked without a device.

* the graph path's inputs: the rows stacked with their text padded to its bucket before
  the pass give, on the CPU, bit for bit what the blocks' own text padding
  (``TextBuckets``) gives: so a replay computes the eager bucketed pass;
* the settings: graphs only on CUDA, never beside the blocks' own CUDA graphs or an
  offloaded transformer (errors naming both), off by default on the CPU;
* the graph cache's rules, with the capture stood in for (a pure unit test of
  ``PassGraphs``): one capture per shape, least recently used let go beyond the limit,
  a failed capture turns the graphs off and the caller runs the pass itself.

The capture and replay themselves need CUDA: ``benchmarks/gpu/longcat_batch_step.py``
checks a replayed pass against the same pass run directly, on a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from models.memory_plan import MemoryPlan
from tests.unit.longcat_fixtures import tiny_longcat_pipeline
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.longcat_audio import graphs as graphs_module
from workers.pipelines.diffusers.longcat_audio.adapter import LongCatAudioAdapter
from workers.pipelines.diffusers.longcat_audio.batch import (
    PassInputs,
    batched_forward,
    forward_pass,
    pass_inputs,
)
from workers.pipelines.diffusers.longcat_audio.buckets import bucket
from workers.pipelines.diffusers.longcat_audio.graphs import PassGraphs, _Captured


def _adapter(**options: Any) -> LongCatAudioAdapter:
    return LongCatAudioAdapter(pipe=tiny_longcat_pipeline(), compile="off", **options)


def _rows(adapter: LongCatAudioAdapter, text: str, guidance: float = 4.0) -> list[Any]:
    request = GenerationRequest.audio(
        prompt=text, duration_s=2.0, num_inference_steps=4, seed=3, guidance_scale=guidance
    )
    state = adapter.prepare(request)
    return adapter._rows(adapter._loaded(), state)


def test_the_graph_paths_padded_text_is_the_blocks_own_padding_bit_for_bit() -> None:
    adapter = _adapter(buckets=True)
    adapter.load("cpu")
    rows = _rows(adapter, "Hello there, a prompt.")
    tokens = rows[0].text.cond.shape[1]
    assert bucket(tokens) > tokens, "the prompt must need padding for this test to mean it"
    transformer = adapter._loaded().transformer
    with torch.no_grad():
        eager = batched_forward(transformer, rows)  # TextBuckets pads inside the blocks
        graph_inputs = pass_inputs(rows, bucket(tokens))
        assert graph_inputs.cond.shape[1] == bucket(tokens)
        padded_first = forward_pass(transformer, graph_inputs)
    assert torch.equal(eager, padded_first)


def test_step_graphs_refuse_the_blocks_own_cuda_graphs() -> None:
    with pytest.raises(ValueError, match="step_graphs and compile_mode = 'reduce-overhead'"):
        LongCatAudioAdapter(
            pipe=tiny_longcat_pipeline(), step_graphs=True, compile_mode="reduce-overhead"
        )


def test_step_graphs_refuse_an_offloaded_transformer() -> None:
    plan = MemoryPlan(offload="model")
    with pytest.raises(ValueError, match="step_graphs and offload = 'model' do not combine"):
        LongCatAudioAdapter(pipe=tiny_longcat_pipeline(), step_graphs=True, memory=plan)


def test_step_graphs_refuse_two_passes_a_step() -> None:
    with pytest.raises(ValueError, match="step_graphs and guidance_batch = false do not"):
        LongCatAudioAdapter(pipe=tiny_longcat_pipeline(), step_graphs=True, guidance_batch=False)


def test_step_graphs_refuse_a_device_without_cuda_graphs() -> None:
    adapter = _adapter(step_graphs=True)
    with pytest.raises(ValueError, match="step_graphs records CUDA graphs: not on cpu"):
        adapter.load("cpu")


def test_on_the_cpu_by_default_no_graphs_and_no_buckets() -> None:
    adapter = _adapter()
    adapter.load("cpu")
    assert adapter.graphs is None
    assert adapter.buckets is False and adapter.text_buckets is None


class _Replay:
    """A captured graph stood in for: its replay runs the pass on its own inputs."""

    def __init__(self, transformer: torch.nn.Module, inputs: PassInputs, out: torch.Tensor):
        self.transformer, self.inputs, self.out = transformer, inputs, out

    def replay(self) -> None:
        self.out.copy_(forward_pass(self.transformer, self.inputs))


class _Graphs(PassGraphs):
    """``PassGraphs`` with the capture stood in for (no CUDA here); ``fail`` makes the
    next capture raise as a refused capture does."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.fail = False

    def _capture(self, transformer: torch.nn.Module, inputs: PassInputs) -> _Captured:
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        own = PassInputs(**{k: v.clone() for k, v in vars(inputs).items()})
        out = torch.empty_like(forward_pass(transformer, own))
        self.captures += 1
        return _Captured(graph=_Replay(transformer, own, out), inputs=own, output=out)


def test_one_capture_a_shape_the_oldest_let_go_and_a_replay_computes_the_pass() -> None:
    adapter = _adapter(buckets=True)
    adapter.load("cpu")
    transformer = adapter._loaded().transformer
    short, long = _rows(adapter, "Hi."), _rows(adapter, "A much longer sentence to say.")
    cache = _Graphs(limit=2)
    with torch.no_grad():
        first = pass_inputs(short, 8)
        assert torch.equal(cache.run(transformer, first), forward_pass(transformer, first))
        cache.run(transformer, pass_inputs(short, 8))  # the same shapes: replayed
        assert cache.captures == 1
        cache.run(transformer, pass_inputs(short[:1], 8))  # one row: another graph
        other = pass_inputs(long, 16)
        replayed = cache.run(transformer, other)
        assert replayed is not None and torch.equal(replayed, forward_pass(transformer, other))
    assert cache.captures == 3 and len(cache) == 2  # the first let go
    assert graphs_module.shape_key(first) not in cache._graphs


def test_a_failed_capture_turns_the_graphs_off_and_the_pass_runs_directly() -> None:
    adapter = _adapter(buckets=True)
    adapter.load("cpu")
    rows = _rows(adapter, "Hello.")
    adapter.graphs = cache = _Graphs(limit=4)
    cache.fail = True
    transformer = adapter._loaded().transformer
    with torch.no_grad():
        direct = batched_forward(transformer, rows)
        through = adapter._pass(transformer, rows)
    assert cache.failed is not None and "capturing" in cache.failed
    assert torch.equal(through, direct)
    assert cache.run(transformer, pass_inputs(rows)) is None  # off for good
