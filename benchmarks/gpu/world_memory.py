"""What a world session leaves on the device once it ended (issue 43 §3): the Helios
adapter a realtime worker serves, in this process, through the phases of a worker's
sessions, with the device memory and the live tensors after each.

    python -m benchmarks.gpu.world_memory [--chunks 2] [--quantization fp8] [--attention cudnn]
                                          [--top 20]
    python -m benchmarks.gpu.world_memory --tiny     # the same on the CPU, 64x64

The world stack (``world_stack.py``) kept +953 MiB of ``memory_allocated`` after its
sessions over the baseline its warm-up session left, on an H100. Here the same registry
entry (``world_stack.registry_text``: random weights, compiled blocks, ``--quantization``,
``--attention``, ``--vae-channels-last``) is loaded as a worker loads it
(``PipelineRegistry``), and the adapter's session API is driven as
``workers/sessions/world.py`` drives it (``start``, ``step`` under ``step_stops``,
``take_chunk`` under ``checkpoints``, ``interact``, the checkpoint's ``capture_snapshot``
and its packing on another thread, ``restore``), phase by phase:

1. ``warm_up``: a session of ``--chunks`` chunks (the compiled blocks' graphs; the cancel
   points of a chunk's decode counted); the baseline is taken after it, as the stack's;
2. ``plain``: the same session again;
3. ``interactions``: a session with a prompt change at a chunk boundary (over two chunks)
   and one inside a chunk (after its first step);
4. ``stopped_in_step``: chunk 1 stopped before block ``--stop-block`` of its first step
   (``SessionStopped`` from the block gate, its traceback's frames cleared as the runner
   clears them);
5. ``stopped_in_decode``: chunk 0's decode stopped halfway through its cancel points (the
   runner's ``SessionStopped`` from ``checkpoint()``);
6. ``checkpoint``: every chunk's snapshot captured on the device's thread and packed on a
   second one (the delivery lane's split), then the last one restored as a new session
   (a takeover) that makes one chunk;
7. ``two_threads``: two sessions at once, each on a thread of its own taking turns at the
   device (``FairTurns``), as a worker's two session slots do.

After each phase, with the session's objects dropped: ``allocated_mib`` after the worker's
own release (``release_after_run``: a young-generation collection, the device
synchronised) and ``allocated_full_gc_mib`` after a full collection (a difference is a
reference cycle), ``reserved_mib``, ``delta_mib`` against the baseline, the VAE's feature
cache (``vae_feat_map_tensors``), dynamo's graphs and cache entries of the blocks' forward
(compiled blocks), and ``live``: the tensors on the device that were not there at the
baseline, largest first, each with what holds it (``live_tensors.py``), and the MiB the
allocator counts that no live tensor explains.

On the CPU (``--tiny``: ``helios_random.TINY_CONFIG``, float32, no compile) there is no
allocator to read: the census of CPU tensors alone, which checks the phases and the
diffing. JSON on stdout and in ``$OUT/gpu_world_memory.json`` (``_fp8`` in FP8 mode), with
the GPU's name and the commit; on a GPU host ``bash benchmarks/device/world.sh --memory``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from benchmarks.gpu.common import emit, provenance
from benchmarks.gpu.live_tensors import MIB, Census
from benchmarks.gpu.plans import mode_suffix
from benchmarks.gpu.world_stack import (
    CHUNK_FRAMES,
    FPS,
    MODEL,
    PROMPT,
    PROMPTS,
    entry_args,
    entry_config,
    registry_text,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--chunks", type=int, default=2, help="per session (>= 2)")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=384)
    p.add_argument("--stop-block", type=int, default=2)
    p.add_argument("--top", type=int, default=20, help="new tensors listed per phase")
    p.add_argument("--holders", type=int, default=8, help="of them, with what holds each")
    entry_args(p)
    args = p.parse_args()
    entry_config(args)
    if args.chunks < 2:
        p.error("--chunks must be at least 2 (the stops land in chunk 1)")
    return args


def world_config(args: argparse.Namespace, chunks: int, seed: int) -> Any:
    """The stack benchmark's session (``world_stack.start_event``) as the runner hands it
    to the adapter: Distilled's 3 steps a chunk, no CFG."""
    from workers.pipelines.base import WorldConfig

    return WorldConfig(
        prompt=PROMPT,
        width=args.width,
        height=args.height,
        num_frames=CHUNK_FRAMES * chunks,
        fps=float(FPS),
        seed=seed,
        steps_per_chunk=3,
        extra={"guidance_scale": 1.0, "max_chunks_ahead": 0},
    )


class Stopped(Exception):
    """A stop raised inside a step or a decode, as ``SessionStopped`` is."""


class Phases:
    """The adapter and what the phases share: the checkpoint count of a decode (from the
    warm-up), the device's turns."""

    def __init__(self, adapter: Any, args: argparse.Namespace) -> None:
        from workers.sessions.turns import FairTurns

        self.adapter, self.args = adapter, args
        self.decode_checkpoints = 0
        self.turns = FairTurns()
        self.notes: dict[str, Any] = {}

    def chunk(self, state: Any, check: Callable[[], None] | None = None) -> Any:
        """The current chunk's steps and decode, as the runner makes one (its turn)."""
        from workers.pipelines.base import checkpoints

        a = self.adapter
        with self.turns.turn():
            while not a.chunk_done(state):
                a.step(state)
            with checkpoints(check or (lambda: None)):
                return a.take_chunk(state)

    def session(self, seed: int, chunks: int | None = None) -> None:
        a = self.adapter
        state = a.start(world_config(self.args, chunks or self.args.chunks, seed))
        while not state.done:
            self.chunk(state)

    def warm_up(self) -> None:
        counted = [0]

        def count() -> None:
            counted[0] += 1

        a = self.adapter
        state = a.start(world_config(self.args, self.args.chunks, seed=100))
        self.chunk(state, count)
        self.decode_checkpoints = counted[0]
        while not state.done:
            self.chunk(state)

    def plain(self) -> None:
        self.session(seed=1)

    def interactions(self) -> None:
        a = self.adapter
        state = a.start(world_config(self.args, self.args.chunks + 1, seed=2))
        self.chunk(state)
        a.interact(state, PROMPTS[0], None, 2, "boundary")
        a.step(state)  # chunk 1's first step, then a change inside it
        a.interact(state, PROMPTS[1], None, 1, "inside")
        while not state.done:
            self.chunk(state)

    def stopped_in_step(self) -> None:
        from workers.common.memory import forget_frames
        from workers.pipelines.base import step_stops

        a, block = self.adapter, self.args.stop_block
        state = a.start(world_config(self.args, self.args.chunks, seed=3))
        self.chunk(state)
        try:
            with step_stops(lambda b: Stopped(f"before block {b}") if b >= block else None):
                a.step(state)
            self.notes["stopped_in_step"] = "not stopped (fewer blocks?)"
        except Stopped as exc:
            forget_frames(exc)
            self.notes["stopped_in_step"] = str(exc)

    def stopped_in_decode(self) -> None:
        from workers.common.memory import forget_frames

        a, at, calls = self.adapter, max(1, self.decode_checkpoints // 2), [0]

        def check() -> None:
            calls[0] += 1
            if calls[0] == at:
                raise Stopped(f"at cancel point {at} of {self.decode_checkpoints} of a decode")

        state = a.start(world_config(self.args, self.args.chunks, seed=4))
        try:
            self.chunk(state, check)
            self.notes["stopped_in_decode"] = "not stopped (no cancel point in the decode?)"
        except Stopped as exc:
            forget_frames(exc)
            self.notes["stopped_in_decode"] = str(exc)

    def checkpoint(self) -> None:
        a = self.adapter
        config = world_config(self.args, self.args.chunks + 1, seed=5)
        state = a.start(config)
        packed = b""
        with ThreadPoolExecutor(1, thread_name_prefix="deliver-memory") as lane:
            for _ in range(self.args.chunks):
                self.chunk(state)
                packed = lane.submit(a.capture_snapshot(state)).result()
        del state
        taken = a.restore(config, packed)  # another worker's takeover, here
        self.chunk(taken)
        self.notes["checkpoint_bytes"] = len(packed)

    def two_threads(self) -> None:
        errors: list[BaseException] = []

        def run(seed: int) -> None:
            try:
                self.session(seed)
            except BaseException as exc:  # reported, not raised in a thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(10 + i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


PHASES = (
    "warm_up",
    "plain",
    "interactions",
    "stopped_in_step",
    "stopped_in_decode",
    "checkpoint",
    "two_threads",
)


def device_mib() -> dict[str, float | None]:
    """``memory_allocated`` and ``memory_reserved`` in MiB (None off CUDA)."""
    if not torch.cuda.is_available():
        return {"allocated_mib": None, "reserved_mib": None}
    return {
        "allocated_mib": round(torch.cuda.memory_allocated() / MIB, 1),
        "reserved_mib": round(torch.cuda.memory_reserved() / MIB, 1),
    }


def compiled_state(adapter: Any) -> dict[str, Any]:
    """Dynamo's graphs so far and the cache entries of the blocks' forward."""
    from workers.pipelines.blocks import denoiser_blocks
    from workers.pipelines.diffusers.shared.compiled import graphs_made

    out: dict[str, Any] = {"graphs_made": graphs_made(), "cache_entries": None}
    blocks = denoiser_blocks(adapter._loaded())
    with contextlib.suppress(Exception):  # a private helper of dynamo's
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        out["cache_entries"] = len(_debug_get_cache_entry_list(type(blocks[0]).forward.__code__))
    return out


def feat_map_tensors(adapter: Any) -> int:
    """Tensors in the VAE's causal feature cache (none between decodes)."""
    cache = getattr(adapter._loaded().vae, "_feat_map", None) or []
    return sum(isinstance(t, torch.Tensor) for t in cache)


def measure(phases: Phases, census: Census, baseline: float | None) -> dict[str, Any]:
    """What the phase left: the worker's release, then a full collection (see the doc);
    against the baseline once there is one (the warm-up's phase sets it)."""
    from workers.common.memory import release_after_run

    release_after_run(stopped=True)
    worker = device_mib()["allocated_mib"]
    gc.collect()
    now = device_mib()
    allocated = now["allocated_mib"]
    delta = None
    if allocated is not None and baseline is not None:
        delta = round(allocated - baseline, 1)
    out: dict[str, Any] = {
        "allocated_mib": worker,
        "allocated_full_gc_mib": allocated,
        "reserved_mib": now["reserved_mib"],
        "delta_mib": delta,
        "vae_feat_map_tensors": feat_map_tensors(phases.adapter),
        "compiled": compiled_state(phases.adapter),
    }
    if census.has_baseline:
        out["live"] = census.diff(phases.args.top, delta, phases.args.holders)
    else:
        out["baseline_tensors"] = census.set_baseline()
    return out


@contextlib.contextmanager
def timed(record: dict[str, Any]) -> Iterator[None]:
    began = time.perf_counter()
    try:
        yield
    finally:
        record["seconds"] = round(time.perf_counter() - began, 2)


def summary(record: dict[str, Any]) -> str:
    """One line of a phase's figures for the log."""
    live = record.get("live", {})
    return (
        f"{record['seconds']} s, allocated {record['allocated_mib']} MiB "
        f"(delta {record['delta_mib']}), VAE cache {record['vae_feat_map_tensors']} tensors, "
        f"new tensors {live.get('new_tensors')} ({live.get('new_mib')} MiB)"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from models.registry import parse_registry
    from workers.pipelines.registry import PipelineRegistry

    entry = parse_registry(registry_text(args, max_sessions=2))[MODEL]
    registry = PipelineRegistry({MODEL: entry}, args.device, random_weights=True)
    began = time.perf_counter()
    failed = registry.load_each()
    if MODEL in failed:
        return {"error": f"the worker would not load it: {failed[MODEL].reason}"}
    out: dict[str, Any] = {"load_s": round(time.perf_counter() - began, 1)}
    report = registry.memory.get(MODEL)
    out["memory_report"] = report.model_dump() if report is not None else None
    phases = Phases(registry.get(MODEL), args)
    census = Census("cuda" if torch.cuda.is_available() else "cpu")
    out["after_load"] = device_mib()
    baseline: float | None = None
    out["phases"] = {}
    for name in PHASES:
        record: dict[str, Any] = {}
        print(f"phase {name} …", flush=True, file=sys.stderr)
        with timed(record):
            getattr(phases, name)()
        record |= measure(phases, census, baseline)
        if name == "warm_up":
            baseline = record["allocated_full_gc_mib"]
        out["phases"][name] = record
        print(f"phase {name}: {summary(record)}", flush=True, file=sys.stderr)
    out["notes"] = phases.notes | {"decode_checkpoints": phases.decode_checkpoints}
    out["baseline_mib"] = baseline
    return out


def main() -> None:
    args = parse_args()
    out: dict[str, Any] = {
        "benchmark": "benchmarks.gpu.world_memory",
        "mode": "tiny: CPU tensors only" if args.tiny else "Helios-Distilled shape",
        "quantization": args.quantization,
        "attention": args.attention,
        "vae_channels_last": args.vae_channels_last,
        **provenance(),
        "shape": {
            "width": args.width,
            "height": args.height,
            "chunks": args.chunks,
            "dtype": args.dtype,
            "compile": args.compile,
        },
    }
    out |= run(args)
    emit(out, "gpu_world_memory" + mode_suffix(args))


if __name__ == "__main__":
    main()
