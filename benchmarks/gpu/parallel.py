"""One job across N GPUs against one GPU: step time and frames of the worker-group
strategies, on a Wan2.1-T2V-1.3B-architecture pipeline with random bf16 weights.

    python -m benchmarks.gpu.parallel --gpus 2 --height 480 --width 832 --frames 81 --steps 10
    python -m benchmarks.gpu.parallel --device cpu --gpus 2 --layers 2 --height 64 --width 64 \\
        --frames 5 --steps 2                                     # a smoke run on gloo ranks

The ranks run exactly what a worker group's ranks run (``workers/pipelines/parallel.py``: the
adapter, the strategy applied by ``enable``, the block gates agreeing before every block
as inside a job), in processes spawned here rather than under the queue, so the step time
is the denoiser's alone. For each strategy (``cfg``, ``ulysses``, ``ring``; a strategy
that cannot run reports its error) it measures the median step time after a warm-up, and
rank 0 decodes the job so its frames can be compared with the single-device run's:
``max_abs_frame_diff`` is the largest difference of the float frames in [0, 1] (0.0 is
bit-identical).

Prints one JSON object (also ``$OUT/gpu_parallel.json``) with ``multi_gpu_step_speedup_N``
(the best strategy's), ``multi_gpu_strategy`` and ``max_abs_frame_diff`` at its top level.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import parser
from benchmarks.embedded_stack import say
from benchmarks.gpu.common import emit, generation_request, header, save_wan, shape_args
from benchmarks.gpu.common import sync_time as _sync
from workers.runtime.processes import free_port


def _run_job(adapter: Any, args: argparse.Namespace, decode: bool) -> tuple[list[float], Any]:
    """Prepare, every step (timed, inside a stop question as in a job), decode."""
    from workers.pipelines.base import step_stops

    state: Any = adapter.prepare(generation_request(args))
    times = []
    while not state.done:
        start = _sync()
        with step_stops(lambda block: None):
            adapter.step(state)
        times.append(_sync() - start)
    frames = adapter.decode_frames(state) if decode else None
    return times, frames


def _adapter(model_dir: Path, device: str) -> Any:
    from diffusers import WanPipeline

    from models.catalog import FAMILY_SPECS
    from workers.pipelines.diffusers.wan.adapter import WanAdapter

    pipe = WanPipeline.from_pretrained(model_dir, dtype=torch.bfloat16)
    spec = FAMILY_SPECS["diffusers.wan"]
    adapter = WanAdapter(pipe=pipe, dtype="bfloat16", spec=spec, compile="off")
    adapter.load(device)
    return adapter


def _rank(
    rank: int, world: int, port: int, strategy: str, model_dir: str, args: Any, out: Any
) -> None:
    import torch.distributed as dist

    from workers.pipelines.parallel import GroupParallel, enable

    device = f"cuda:{rank}" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if args.device == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        adapter = _adapter(Path(model_dir), device)
        enable(adapter, GroupParallel(rank=rank, world=world, strategy=strategy))  # type: ignore[arg-type]
        _run_job(adapter, args, decode=False)  # warm-up
        times, frames = _run_job(adapter, args, decode=rank == 0)
        out.put({"rank": rank, "step_s": times, "frames": frames})
    except Exception as exc:
        out.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"[:500]})
    finally:
        dist.destroy_process_group()


def _group(strategy: str, world: int, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, strategy, str(model_dir), args, out))
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + args.timeout
    try:
        while len(results) < world and time.monotonic() < deadline:
            try:
                item = out.get(timeout=5)
            except Exception:
                if any(p.exitcode not in (None, 0) for p in procs):
                    break
                continue
            results[item["rank"]] = item
    finally:
        for proc in procs:
            proc.join(30)
            if proc.exitcode is None:
                proc.kill()
    errors = [r["error"] for r in results.values() if "error" in r]
    if errors or 0 not in results:
        return {"error": errors[0] if errors else f"ranks exited: {[p.exitcode for p in procs]}"}
    return results[0]


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--gpus", type=int, default=2, help="ranks of the group")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    shape_args(p, frames=81, steps=10)
    p.add_argument("--strategies", default="cfg,ulysses,ring")
    p.add_argument("--timeout", type=float, default=900, help="per strategy (s)")
    args = p.parse_args()
    world = args.gpus
    cuda = args.device == "cuda"
    out = header(args)
    if cuda and torch.cuda.device_count() < world:
        out["error"] = f"{world} GPUs asked for, {torch.cuda.device_count()} visible"
        print(json.dumps(out, indent=2))
        return 1
    model_dir, _ = save_wan(Path(tempfile.mkdtemp(prefix="oq-gpu-par-")), args)
    say("one device")
    single = _adapter(model_dir, "cuda:0" if cuda else "cpu")
    _run_job(single, args, decode=False)
    times, expected = _run_job(single, args, decode=True)
    del single
    if cuda:
        torch.cuda.empty_cache()
    base = statistics.median(times)
    out["single_step_s"] = round(base, 4)
    results: dict[str, Any] = {}
    for strategy in args.strategies.split(","):
        say(f"{strategy} on {world} ranks")
        got = _group(strategy, world, model_dir, args)
        if "error" in got:
            results[strategy] = {"error": got["error"]}
            continue
        step = statistics.median(got["step_s"])
        diff = float(np.abs(got["frames"] - expected).max())
        results[strategy] = {
            "step_s": round(step, 4),
            "speedup": round(base / step, 3),
            "max_abs_frame_diff": diff,
            "step_s_all": [round(x, 4) for x in got["step_s"]],
        }
    out["strategies"] = results
    ok = {k: v for k, v in results.items() if "speedup" in v}
    if ok:
        best = max(ok, key=lambda k: ok[k]["speedup"])
        out[f"multi_gpu_step_speedup_{world}"] = ok[best]["speedup"]
        out["multi_gpu_strategy"] = best
        out["max_abs_frame_diff"] = ok[best]["max_abs_frame_diff"]
    emit(out, "gpu_parallel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
