"""Whole-pass CUDA graphs for LongCat's denoiser (the adapter's ``step_graphs``).

LongCat's step is launch-bound: a 1B DiT over a few hundred frames and tokens is a few
milliseconds of device work, but some thousand kernel launches from Python. Measured on
an H100 (docs/PERFORMANCE.md): 48 ms a step eager, 31 ms with its blocks compiled as
CUDA graphs (``compile_mode = "reduce-overhead"``, one graph a block, with dynamo's guards
and the graph trees' bookkeeping around each), so a 16-step clip's first audio waited
half a second on the host.

Here one pass, :func:`~workers.pipelines.diffusers.longcat_audio.batch.forward_pass`
over a step's stacked rows, is one CUDA graph: captured the first time its input shapes
are seen (rows, frames, tokens: with bucketed lengths a bounded set), then replayed
after the step's inputs are copied into the graph's own input tensors. The blocks inside
run as they would outside (compiled by inductor, or eager); the graph removes the host
between them. A replay runs the kernels the capture recorded, so it computes what the
same pass run directly computes.

What changes, and why it is safe:

* **stops land between steps**, not between blocks: the block gates
  (``workers/pipelines/blocks.py``) are Python hooks, which a replay does not run. A
  step is a few milliseconds, less than one block of the video models the gates are for.
  The capture itself runs outside the step's stop question (``outside_step``): the gates'
  pacing waits on CUDA events, which a capturing stream refuses;
* **a pass's output is valid until the next replay** of any graph: the graphs share one
  memory pool, so a later replay may reuse the earlier output's memory. The adapter reads
  the predictions at once (the guidance and the scheduler step make new tensors);
* **at most** :data:`GRAPH_LIMIT` graphs are kept, the least recently used let go;
* **a capture that fails** is logged and turns the graphs off for the process: every
  pass then runs directly, as before (the compiled blocks' fallback rule).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from typing import Any

import torch

from workers.pipelines.base import outside_step
from workers.pipelines.diffusers.longcat_audio.batch import PassInputs, forward_pass

log = logging.getLogger(__name__)

# Graphs kept at once: with bucketed lengths a worker sees some twenty frame sizes, a few
# token sizes and five row counts, most of them rarely.
GRAPH_LIMIT = 48

Key = tuple[tuple[str, tuple[int, ...], torch.dtype], ...]


def shape_key(inputs: PassInputs) -> Key:
    """What a captured graph is specific to: every input's shape and dtype."""
    return tuple(
        (field.name, tuple(tensor.shape), tensor.dtype)
        for field in dataclasses.fields(inputs)
        for tensor in [getattr(inputs, field.name)]
    )


@dataclasses.dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: PassInputs  # the tensors the graph reads: each replay's inputs copied in
    output: torch.Tensor  # the tensor the graph writes

    def replay(self, inputs: PassInputs) -> torch.Tensor:
        for field in dataclasses.fields(inputs):
            getattr(self.inputs, field.name).copy_(getattr(inputs, field.name))
        self.graph.replay()
        return self.output


class PassGraphs:
    """The captured passes of one adapter (see the module docstring)."""

    def __init__(self, limit: int = GRAPH_LIMIT) -> None:
        self.limit = limit
        self.failed: str | None = None  # why the graphs were turned off, once they were
        self.captures = 0  # graphs captured so far (a benchmark reports it)
        self._graphs: OrderedDict[Key, _Captured] = OrderedDict()
        self._pool: Any = None

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, transformer: torch.nn.Module, inputs: PassInputs) -> torch.Tensor | None:
        """``forward_pass(transformer, inputs)`` replayed from the graph of ``inputs``'
        shapes (captured now if new); None once the graphs are off (the caller runs the
        pass directly)."""
        if self.failed is not None:
            return None
        key = shape_key(inputs)
        captured = self._graphs.get(key)
        if captured is None:
            try:
                captured = self._capture(transformer, inputs)
            except RuntimeError as exc:  # CUDA's and dynamo's errors both are
                self.failed = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
                log.warning("LongCat pass graphs: off for this process: %s", self.failed)
                self._graphs.clear()
                return None
            self._graphs[key] = captured
            while len(self._graphs) > self.limit:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return captured.replay(inputs)

    def _capture(self, transformer: torch.nn.Module, inputs: PassInputs) -> _Captured:
        """One pass at ``inputs``' shapes as a CUDA graph: run once on a side stream first
        (lazy initialisation, the kernels' first launch), then captured, outside the
        step's stop question (module docstring)."""
        device = inputs.hidden_states.device
        own = PassInputs(
            **{f.name: getattr(inputs, f.name).clone() for f in dataclasses.fields(inputs)}
        )
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with outside_step():
            current = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                forward_pass(transformer, own)
            current.wait_stream(side)
            # thread_local: the worker's other threads (a stream's decode, a lane's copies) may
            # use the device while this one captures.
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                output = forward_pass(transformer, own)
        self.captures += 1
        log.info("LongCat pass graph %d captured for %s", self.captures, shape_key(inputs))
        return _Captured(graph=graph, inputs=own, output=output)
