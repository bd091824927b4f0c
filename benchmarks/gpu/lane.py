"""Compiled blocks, cache tiers and per-request LoRA on one GPU (issue 22's evidence): a
Wan2.1-T2V-1.3B-architecture pipeline with random bf16 weights, saved and loaded back as
the worker loads it.

    python -m benchmarks.gpu.lane --height 480 --width 832 --frames 33 --steps 20

Phases, one after the other on the same GPU (``--skip-*`` leaves one out):

1. **Raw eager.** ``pipe(...)`` (one warm-up, then ``--repeats``): the yardstick.
2. **Eager steps.** The job through ``WanAdapter`` with compile off: step times and the
   denoise time of a lossless job.
3. **Compiled blocks.** The same adapter with its blocks compiled (``compiled.py``): the
   warm-up compile of the job's shape (``compile_warmup_s``), then two jobs: step time
   (``compiled_step_ratio`` = compiled ÷ eager median step), graphs dynamo made during
   the second job (``recompiles_second_job``), the final latents against eager's. Then
   stops raised at a random moment inside a compiled step: flag → device idle
   (``cancel_p95_ms_compiled``, next to ``block_ms``).
4. **Cache tiers**, compiled: a job per tier; denoise time ÷ the eager lossless job's
   (``tier_denoise_ratio_high`` / ``_fast``), the same ÷ compiled lossless, the frames'
   PSNR against lossless (random weights: this says how far a tier moves the output, not
   how it looks).
5. **LoRA**, compiled: ``--loras`` rank-``--lora-rank`` adapters on every attention and
   feed-forward projection of the transformer, built in code, served through a cache of
   ``--lora-cache`` (``workers/pipelines/diffusers/shared/lora.py``): swaps among cached adapters
   timed (``lora_swap_ms_p95``), graphs made while swapping (``lora_recompiles``), device
   memory while cycling all of them through the cache and after (``lora_memory``).
6. **The stack**, compiled: ``omniqueue up`` with the model's registry entry set to
   ``compile = "blocks"`` and its shape as a warm-up bucket; ``--jobs`` jobs from the
   client's POST to the MP4 downloaded; their median ÷ the raw eager median is
   ``full_stack_wall_over_raw_compiled``; ``--cancels`` cancels through the API.

Prints one JSON object (also ``$OUT/gpu_lane.json`` when ``OUT`` is set).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import parser, pct, summary
from benchmarks.embedded_stack import say
from benchmarks.gpu.common import (
    MODEL,
    emit,
    free_memory,
    generation_request,
    shape_args,
    timed_job,
)
from benchmarks.gpu.common import sync_time as _sync_time
from benchmarks.gpu.lora import lora_lane
from benchmarks.gpu.stack import load_and_time_raw, stack_figures, stack_phase


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return round(10 * math.log10(1.0 / mse), 2) if mse > 0 else float("inf")


def _stops(adapter: Any, request: Any, step_s: float, trials: int) -> list[float]:
    """Stops at a random moment inside a step: flag set → the step raised, device idle."""
    from workers.pipelines.base import step_stops

    rng = random.Random(7)
    state = adapter.prepare(request)
    out: list[float] = []
    try:
        for _ in range(trials):
            if state.done:
                adapter.end()
                state = adapter.prepare(request)
            flag = threading.Event()
            set_at: list[float] = []
            delay = rng.uniform(0.05, 0.95) * step_s

            def setter(
                f: threading.Event = flag, d: float = delay, o: list[float] = set_at
            ) -> None:
                time.sleep(d)
                o.append(time.perf_counter())
                f.set()

            def reason(block: int, f: threading.Event = flag) -> BaseException | None:
                return RuntimeError(f"stop at block {block}") if f.is_set() else None

            _sync_time()
            thread = threading.Thread(target=setter)
            thread.start()
            stopped = False
            try:
                with step_stops(reason):
                    adapter.step(state)
            except RuntimeError:
                stopped = True
            idle = _sync_time()
            thread.join()
            if stopped:
                out.append((idle - set_at[0]) * 1000)
    finally:
        adapter.end()
    return out


def lane_phase(pipe: Any, args: argparse.Namespace, raw_median: float) -> dict[str, Any]:
    from models.catalog import FAMILY_SPECS
    from models.registry import WarmupShape
    from workers.pipelines.diffusers.wan.adapter import WanAdapter

    spec = FAMILY_SPECS["diffusers.wan"].model_copy(update={"name": MODEL})
    adapter = WanAdapter(
        pipe=pipe, dtype="bfloat16", spec=spec, compile="off", compile_backend=args.backend
    )
    adapter.load(args.device)
    request = generation_request(args)
    out: dict[str, Any] = {}

    say("eager jobs")
    timed_job(adapter, request)  # warm-up (cuDNN plans, allocator)
    eager = timed_job(adapter, request)
    eager_step = statistics.median(eager["step_s"])
    out["eager"] = {
        "step_ms": round(eager_step * 1000, 1),
        "denoise_s": round(eager["denoise_s"], 3),
    }
    blocks = len(pipe.transformer.blocks)

    say("compiled blocks: warm-up")
    adapter.compiler.install(pipe)
    shape = WarmupShape(width=args.width, height=args.height, num_frames=args.frames)
    adapter.entry = dataclasses.replace(adapter.entry, warmup=[shape])
    t = time.perf_counter()
    adapter.warm_up()
    out["compile_warmup_s"] = round(time.perf_counter() - t, 1)
    out["compile_failed"] = adapter.compiler.failed
    say("compiled jobs")
    first = timed_job(adapter, request)
    second = timed_job(adapter, request)
    compiled_step = statistics.median(second["step_s"])
    out["compiled"] = {
        "step_ms": round(compiled_step * 1000, 1),
        "denoise_s": round(second["denoise_s"], 3),
        "graphs_made_first_job": first["graphs_made"],
        "graphs_made_second_job": second["graphs_made"],
        "max_abs_latent_diff_vs_eager": round(
            float((second["latents"] - eager["latents"]).abs().max()), 4
        ),
        "frames_psnr_vs_eager_db": _psnr(second["frames"], eager["frames"]),
    }
    out["compiled_step_ratio"] = round(compiled_step / eager_step, 4)
    out["recompiles_second_job"] = second["graphs_made"]
    out["block_ms"] = round(compiled_step / blocks * 1000, 2)

    say("stops inside compiled steps")
    stops = _stops(adapter, request, compiled_step, args.stop_trials)
    out["cancel_ms_compiled"] = summary(stops)
    out["cancel_p95_ms_compiled"] = round(pct(stops, 0.95), 1) if stops else None

    say("cache tiers")
    tiers: dict[str, Any] = {"lossless": second}
    for quality in ("high", "fast"):
        request_q = generation_request(args, quality=quality)
        tiers[quality] = timed_job(adapter, request_q)
    out["tiers"] = {
        q: {
            "denoise_s": round(r["denoise_s"], 3),
            "over_eager_lossless": round(r["denoise_s"] / eager["denoise_s"], 4),
            "over_compiled_lossless": round(r["denoise_s"] / second["denoise_s"], 4),
            "frames_psnr_vs_lossless_db": _psnr(r["frames"], second["frames"]),
            "graphs_made": r["graphs_made"],
        }
        for q, r in tiers.items()
    }
    out["tier_denoise_ratio_high"] = out["tiers"]["high"]["over_eager_lossless"]
    out["tier_denoise_ratio_fast"] = out["tiers"]["fast"]["over_eager_lossless"]
    out["in_process_compiled_job_over_raw"] = round(
        (second["prepare_s"] + second["denoise_s"]) / raw_median, 4
    )

    if not args.skip_lora:
        say("LoRA")
        out.update(lora_phase(adapter, args))
    del adapter
    return out


def lora_phase(adapter: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Swaps among cached adapters under compiled blocks (``lora.py``'s cache)."""
    return lora_lane(adapter, args)


def _registry(model_dir: Path, args: argparse.Namespace) -> Path:
    registry = model_dir.parent / "models-compiled.toml"
    registry.write_text(
        f'[[model]]\nname = "{MODEL}"\nadapter = "diffusers.wan"\n'
        f'path = "{model_dir}"\ndtype = "bfloat16"\ncompile = "blocks"\n'
        f"[[model.warmup]]\nwidth = {args.width}\nheight = {args.height}\n"
        f"num_frames = {args.frames}\n"
    )
    return registry


def main() -> int:
    p = parser(__doc__)
    shape_args(p)
    p.add_argument("--repeats", type=int, default=3, help="raw pipe(...) calls timed")
    p.add_argument("--jobs", type=int, default=3, help="jobs timed through the stack")
    p.add_argument("--cancels", type=int, default=5, help="cancels through the stack")
    p.add_argument("--stop-trials", type=int, default=20)
    p.add_argument("--loras", type=int, default=20)
    p.add_argument("--lora-cache", type=int, default=4)
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--skip-lora", action="store_true")
    p.add_argument("--skip-stack", action="store_true")
    p.add_argument("--skip-lane", action="store_true", help="raw and the stack only")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (eager: smoke)")
    args = p.parse_args()
    out, model_dir, _, pipe, raw = load_and_time_raw(args, "oq-gpu-lane-")
    raw_median = statistics.median(raw)
    if not args.skip_lane:
        out.update(lane_phase(pipe, args, raw_median))
    del pipe
    free_memory()
    torch._dynamo.reset()

    if not args.skip_stack:
        say("the stack, compiled")
        step_s = out.get("compiled", {}).get("step_ms", 300) / 1000
        stack = stack_phase(_registry(model_dir, args), args, step_s)
        out["stack"] = stack
        out["full_stack_wall_over_raw_compiled"], stopped = stack_figures(stack, raw)
        out["stack_cancel_ms"] = summary(stopped)
    emit(out, "gpu_lane")
    return 0


if __name__ == "__main__":
    sys.exit(main())
