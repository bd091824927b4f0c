"""The whole stack on one GPU: ``omniqueue up`` (Valkey, SQLite, SeaweedFS, the API and
one GPU worker) serving a Wan2.1-T2V-1.3B-architecture pipeline with random bf16 weights,
jobs sent over HTTP, followed on their event stream and downloaded back.

    python -m benchmarks.gpu.stack --height 480 --width 832 --frames 33 --steps 20

Phases, all on the same GPU, one after the other:

1. **Raw.** The pipeline is built (``random_wan.py``), saved, and loaded
   back with ``from_pretrained(dtype=bfloat16)`` exactly as the worker will load it; the
   raw ``pipe(...)`` call is timed (one warm-up, then ``--repeats``).
2. **Block gates, in process.** The same pipeline through ``WanAdapter``: denoise steps
   with the block gates idle (outside a job) and active (inside one, at lookahead 1, 2
   and 4), interleaved; the blocks a step has and the time of one block; then stops
   raised at a random moment inside a step: flag set → the step raised and the device
   idle.
3. **The stack.** ``up`` with the saved pipeline in a model registry; ``--jobs`` jobs,
   each timed from the client's POST to the MP4 downloaded after the ``done`` event of
   ``GET /v1/videos/{id}/events``; their median ÷ the raw median is
   ``full_stack_wall_over_raw``. Then ``--cancels`` jobs cancelled with
   ``POST /v1/videos/{id}/cancel`` at a random moment of a random denoise step: cancel →
   the worker's ``job …: cancelled`` line (logged after its cleanup: temp files, objects,
   tensors, the device idle), where it stopped (step, block), and the worker's
   ``memory_allocated()`` after every job. With ``--outputs N``, jobs of ``n = N``
   against ``n = 1`` (``n_outputs_wall_ratio``; issue 32 asks N = 4 at 832x480x33).

Prints one JSON object (also written to ``$OUT/gpu_stack.json`` when ``OUT`` is set), with
the keys of the multi-GPU issue at its top level; the rows that need two GPUs are null.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import parser, pct, summary
from benchmarks.embedded_stack import LogWatcher, Stack, say
from benchmarks.gpu.common import (
    MODEL,
    cancel_in_step,
    completed_job,
    emit,
    free_memory,
    generation_request,
    header,
    job_body,
    raw_call,
    save_wan,
    shape_args,
)
from benchmarks.gpu.common import sync_time as _sync_time


def raw_phase(pipe: Any, args: argparse.Namespace) -> list[float]:
    raw_call(pipe, args, 0)  # warm-up
    return [raw_call(pipe, args, 1)[0] for _ in range(args.repeats)]


def gate_phase(pipe: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Step time with the gates idle and active; blocks per step; stop latency."""
    from models.catalog import FAMILY_SPECS
    from workers.pipelines.base import step_stops
    from workers.pipelines.diffusers.wan.adapter import WanAdapter

    spec = FAMILY_SPECS["diffusers.wan"].model_copy(update={"name": MODEL})
    adapter = WanAdapter(pipe=pipe, dtype="bfloat16", spec=spec, compile="off")
    adapter.load(args.device)
    request = generation_request(args)
    state: Any = adapter.prepare(request)
    seen: list[int] = []

    def go_on(block: int) -> BaseException | None:
        seen.append(block)
        return None

    def one_step(mode: str) -> float:
        nonlocal state
        if state.done:
            state = adapter.prepare(request)
        start = _sync_time()
        if mode == "idle":
            adapter.step(state)
        else:
            adapter.gate.lookahead = int(mode.removeprefix("lookahead_"))
            with step_stops(go_on):
                adapter.step(state)
        return _sync_time() - start

    modes = ["idle", "lookahead_1", "lookahead_2", "lookahead_4"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    one_step("idle")
    for r in range(args.gate_rounds):
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            for _ in range(2):
                times[mode].append(one_step(mode))
    seen.clear()
    one_step("lookahead_2")
    blocks = max(seen)
    step_s = {m: statistics.median(v) for m, v in times.items()}
    idle = step_s["idle"]

    # Stops at a random moment inside a step (lookahead 2, the default).
    adapter.gate.lookahead = 2
    stops: list[dict[str, Any]] = []
    rng = random.Random(7)
    for _ in range(args.stop_trials):
        if state.done:
            state = adapter.prepare(request)
        flag = threading.Event()
        set_at: list[float] = []

        def reason(block: int, f: threading.Event = flag) -> BaseException | None:
            return RuntimeError(f"stop at block {block}") if f.is_set() else None

        delay = rng.uniform(0.05, 0.95) * idle

        def setter(f: threading.Event = flag, d: float = delay, out: list[float] = set_at) -> None:
            time.sleep(d)
            out.append(time.perf_counter())
            f.set()

        _sync_time()
        thread = threading.Thread(target=setter)
        thread.start()
        message = ""
        try:
            with step_stops(reason):
                adapter.step(state)
        except RuntimeError as exc:
            message = str(exc)
        stopped = _sync_time()
        thread.join()
        if message:  # the flag came before the step's end
            stops.append(
                {
                    "flag_to_device_idle_ms": round((stopped - set_at[0]) * 1000, 1),
                    "stopped": message,
                }
            )
    latencies = [s["flag_to_device_idle_ms"] for s in stops]
    del state
    return {
        "blocks_per_step": blocks,
        "step_ms": {m: round(v * 1000, 1) for m, v in step_s.items()},
        "step_ms_all": {m: [round(x * 1000, 1) for x in v] for m, v in times.items()},
        "block_ms": round(idle / blocks * 1000, 2),
        "overhead_ratio": {m: round(v / idle - 1, 4) for m, v in step_s.items() if m != "idle"},
        "in_process_stops": stops,
        "in_process_stop_ms": summary(latencies),
    }


def stack_phase(registry: Path, args: argparse.Namespace, step_s: float) -> dict[str, Any]:
    import httpx

    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_MODELS": MODEL,
        "OMNIQ_WORKER__DEVICE": args.device,
        "OMNIQ_WORKER__PREVIEW_EVERY": "0",
    }
    stack = Stack(workers=1, env=env, args=("--realtime-workers", "0"))
    stack.start(timeout=600)
    out: dict[str, Any] = {}
    body = job_body(args, seed=1)
    logs = LogWatcher(stack.log_path, stack.check)
    try:
        with (
            httpx.Client(base_url=stack.url, timeout=600) as client,
            httpx.Client(base_url=stack.url, timeout=60) as canceller,  # a warm connection
        ):
            canceller.get("/health").raise_for_status()

            def job() -> tuple[float, str, int]:
                return completed_job(client, json=body)

            say("warm-up job (loads the weights, compiles nothing)")
            job()
            walls, sizes, ids = [], [], []
            for _ in range(args.jobs):
                wall, vid, size = job()
                walls.append(wall)
                sizes.append(size)
                ids.append(vid)
            rows = [client.get(f"/v1/videos/{v}").json() for v in ids]
            out["jobs"] = [
                {
                    "client_wall_s": round(w, 3),
                    "mp4_bytes": n,
                    "stage_durations": row.get("stage_durations"),
                    "inference_time_s": row.get("inference_time_s"),
                }
                for w, n, row in zip(walls, sizes, rows, strict=True)
            ]
            out["client_wall_s"] = [round(w, 3) for w in walls]

            rng = random.Random(11)
            cancels = []
            for _ in range(args.cancels):
                target = rng.randint(1, max(1, args.steps - 2))
                delay = rng.uniform(0.0, step_s)
                resp = client.post("/v1/videos", json={**body, "seed": 2})
                resp.raise_for_status()
                vid = resp.json()["id"]
                cancels.append(cancel_in_step(client, canceller, logs, vid, target, delay))
            out["cancels"] = cancels
            if args.outputs > 1:
                out["outputs"] = outputs_phase(client, body, args)
            logs.poll()
            out["cuda_allocated_mib_after_each_job"] = dict(logs.cuda_allocated_mib)
    finally:
        stack.close(out)
    return out


def outputs_phase(client: Any, body: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``n = --outputs`` jobs against ``n = 1`` jobs of the same shape, alternated (issue
    32 §2): each timed from the POST to its last MP4 downloaded; the ratio of medians
    (the outputs are made one after another: never above n, less by what they share)."""
    n = args.outputs
    many, one, stages = [], [], []
    for i in range(args.jobs):
        wall, vid, _ = completed_job(client, json={**body, "seed": 100 + i, "n": n})
        many.append(wall)
        stages.append(client.get(f"/v1/videos/{vid}").json().get("stage_durations"))
        one.append(completed_job(client, json={**body, "seed": 100 + i})[0])
    ratio = statistics.median(many) / statistics.median(one)
    return {
        "n": n,
        "wall_s": [round(w, 3) for w in many],
        "stage_durations": stages,
        "one_output_wall_s": [round(w, 3) for w in one],
        "ratio": round(ratio, 4),
    }


def load_and_time_raw(
    args: argparse.Namespace, prefix: str
) -> tuple[dict[str, Any], Path, Path, Any, list[float]]:
    """The run's header; the random-weight pipeline built, saved (with a registry entry)
    and loaded back as a worker loads it; its raw ``pipe(...)`` timed. Returns (the run's
    JSON so far, the model directory, the registry file, the pipe, the raw wall times)."""
    from diffusers import WanPipeline

    out = header(args)
    t0 = time.perf_counter()
    model_dir, registry = save_wan(Path(tempfile.mkdtemp(prefix=prefix)), args)
    free_memory()
    pipe = WanPipeline.from_pretrained(model_dir, dtype=torch.bfloat16).to(args.device)
    out["build_save_load_s"] = round(time.perf_counter() - t0, 1)
    say("raw pipe(...)")
    raw = raw_phase(pipe, args)
    out["raw_wall_s"] = [round(x, 3) for x in raw]
    return out, model_dir, registry, pipe, raw


def stack_figures(stack: dict[str, Any], raw: list[float]) -> tuple[float | None, list[float]]:
    """The stack phase's median client wall ÷ the raw median (None without jobs), and its
    cancels' cancel → worker stopped times (ms)."""
    walls = stack.get("client_wall_s") or []
    ratio = round(statistics.median(walls) / statistics.median(raw), 4) if walls else None
    stopped = [
        c["cancel_to_worker_stopped_ms"]
        for c in stack.get("cancels", [])
        if c["cancel_to_worker_stopped_ms"] is not None
    ]
    return ratio, stopped


def main() -> int:
    p = parser(__doc__)
    shape_args(p)
    p.add_argument("--repeats", type=int, default=3, help="raw pipe(...) calls timed")
    p.add_argument("--jobs", type=int, default=3, help="jobs timed through the stack")
    p.add_argument("--cancels", type=int, default=10)
    p.add_argument("--gate-rounds", type=int, default=4)
    p.add_argument("--stop-trials", type=int, default=12)
    p.add_argument(
        "--outputs", type=int, default=1, help="also time jobs of n = OUTPUTS against n = 1"
    )
    p.add_argument("--skip-stack", action="store_true", help="phases 1 and 2 only")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script")
    args = p.parse_args()
    out, _, registry, pipe, raw = load_and_time_raw(args, "oq-gpu-stack-")
    say("block gates")
    gates = gate_phase(pipe, args)
    out["gates"] = gates
    out["block_ms"] = gates["block_ms"]
    out["checkpoint_overhead_ratio"] = gates["overhead_ratio"]["lookahead_2"]
    del pipe
    free_memory()

    if not args.skip_stack:
        say("the stack")
        stack = stack_phase(registry, args, gates["step_ms"]["idle"] / 1000)
        out["stack"] = stack
        out["full_stack_wall_over_raw"], stopped = stack_figures(stack, raw)
        out["cancel_p95_ms"] = round(pct(stopped, 0.95), 1) if stopped else None
        out["cancel_ms"] = summary(stopped)
    for key in ("scaleout_2_workers", "multi_gpu_step_speedup_2", "multi_gpu_strategy"):
        out.setdefault(key, None)  # one GPU: not measured here
    out.setdefault("max_abs_frame_diff", None)
    outputs = out.get("stack", {}).get("outputs")
    out["n_outputs_wall_ratio"] = outputs["ratio"] if outputs else None
    emit(out, "gpu_stack")
    return 0


if __name__ == "__main__":
    sys.exit(main())
