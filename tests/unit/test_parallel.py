"""The worker-group strategies on two gloo ranks (two processes on CPUs): a tiny Wan job
run across both ranks, with the block gates agreeing before every block as in a job,
decodes to exactly the frames the single-device run decodes."""

from __future__ import annotations

import gc
import multiprocessing
from typing import Any

import numpy as np
import pytest
import torch

from models.registry import ParallelStrategy
from tests.unit.diffusers_fixtures import TINY_SEQ_LEN, tiny_wan_pipeline
from tests.unit.reference_fixtures import video_request
from workers.pipelines.base import step_stops
from workers.pipelines.diffusers.wan.adapter import WanAdapter
from workers.runtime.processes import free_port

REQUEST = video_request(
    width=32, height=32, num_frames=9, fps=16, num_inference_steps=3, seed=4, guidance_scale=5.0
)


def _adapter() -> WanAdapter:
    adapter = WanAdapter(
        pipe=tiny_wan_pipeline(), dtype="float32", max_sequence_length=TINY_SEQ_LEN
    )
    adapter.load("cpu")
    return adapter


def _frames(adapter: WanAdapter) -> tuple[np.ndarray, list[int]]:
    state: Any = adapter.prepare(REQUEST)
    blocks: list[int] = []

    def go_on(block: int) -> None:
        blocks.append(block)
        return None

    while not state.done:
        with step_stops(go_on):
            adapter.step(state)
    return adapter.decode_frames(state), blocks


def _rank(rank: int, port: int, strategy: ParallelStrategy, out: Any) -> None:
    import torch.distributed as dist

    from workers.pipelines.parallel import GroupParallel, enable

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        adapter = _adapter()
        enable(adapter, GroupParallel(rank=rank, world=2, strategy=strategy))
        frames, blocks = _frames(adapter)
        out.put((rank, frames, blocks))
    finally:
        dist.destroy_process_group()
        # The rank's work is done: its exit skips the last garbage collections over
        # torch's objects (a second of each rank's exit), as the worker commands' do.
        gc.freeze()


@pytest.mark.parametrize("strategy", ["cfg", "ulysses"])
def test_two_ranks_decode_exactly_the_single_device_frames(strategy: ParallelStrategy) -> None:
    torch.set_num_threads(1)
    expected, single_blocks = _frames(_adapter())
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, strategy, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    try:
        results = {
            rank: (frames, blocks) for rank, frames, blocks in (out.get(timeout=240) for _ in procs)
        }
    finally:
        for proc in procs:
            proc.join(30)
            if proc.exitcode is None:
                proc.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    for rank in (0, 1):
        frames, blocks = results[rank]
        np.testing.assert_array_equal(frames, expected)  # bit-exact on every rank
        # Every rank passes the same blocks (the gates' agreement needs it); under cfg
        # each rank runs one of the two passes a single device runs.
        per_step = len(single_blocks) // REQUEST.num_inference_steps
        want = per_step // 2 if strategy == "cfg" else per_step
        assert len(blocks) == want * REQUEST.num_inference_steps
