"""GPU evidence for step execution: a Wan2.1-T2V-1.3B-shaped pipeline with random bf16
weights, the raw diffusers call against the same job through omniqueue's StepExecutor.

    python -m benchmarks.gpu.wan --height 480 --width 832 --frames 33 --steps 20

Prints JSON: raw ``pipe(...)`` wall times; the executor's wall time and its
``inference_time_s`` (prepare → denoise → decode, with the per-step ownership check and
throttled progress writes against a real SQLite database) plus encode/upload; the
overhead ratio; cancel latency at several steps (cancel UPDATE → the executor returned,
next to the step time); ``torch.cuda.memory_allocated()`` before and after each job.

What is real and what is not: the transformer has the Wan2.1-T2V-1.3B config (30 layers,
dim 1536) and the VAE is Wan's, both with random weights; the text encoder is a 2-layer
UMT5 with the real 4096 width (``random_wan.py``; it runs once per job, identically in
both paths); the
artifact store writes to a local directory instead of S3 (no S3 on the GPU machine), so
"upload" is a file copy. The database is SQLite through the real JobStore.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

import torch

from benchmarks.gpu.common import PROMPT, emit, header, job_shape, raw_call, shape_args
from benchmarks.gpu.random_wan import build_pipeline


class LocalArtifacts:
    """The slice of ArtifactStore the executor uses, on a local directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bucket = "local"

    def upload_file(self, key: str, path: str | Path, content_type: str, **_: Any) -> int:
        dest = self.root / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        return dest.stat().st_size

    def get_bytes(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def delete_prefix(self, prefix: str) -> int:
        target = self.root / prefix
        n = sum(1 for p in target.rglob("*") if p.is_file()) if target.exists() else 0
        shutil.rmtree(target, ignore_errors=True)
        return n


def main() -> None:
    p = argparse.ArgumentParser()
    shape_args(p)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cancel-steps", default="1,10,19")
    args = p.parse_args()
    device = "cuda"
    out: dict[str, Any] = header(args)
    t0 = time.perf_counter()
    pipe = build_pipeline(device, num_layers=args.layers)
    out["build_s"] = round(time.perf_counter() - t0, 2)
    out["transformer_params_m"] = round(
        sum(p.numel() for p in pipe.transformer.parameters()) / 1e6, 1
    )

    raw_call(pipe, args, 0)  # warm-up (kernels, allocator)
    raw = [raw_call(pipe, args, 1)[0] for _ in range(args.repeats)]
    out["raw_wall_s"] = [round(x, 3) for x in raw]

    # ---- the same job through the StepExecutor ----------------------------------------
    from models.catalog import FAMILY_SPECS
    from models.db import Base, Job
    from models.job_specs import VideoSpec
    from models.registry import ServedModel
    from storage.artifacts import ArtifactStore
    from storage.db import make_engine, make_sessionmaker
    from storage.jobs import JobStore
    from storage.settings import Settings
    from workers.jobs.executor import StepExecutor
    from workers.pipelines.diffusers.wan.adapter import WanAdapter
    from workers.pipelines.registry import PipelineRegistry

    work = Path(tempfile.mkdtemp(prefix="oq-gpu-"))
    settings = Settings(
        database={"url": f"sqlite:///{work / 'jobs.db'}"},
        worker={"tmp_dir": str(work), "progress_interval_s": 0.25, "heartbeat_s": 5},
    )
    engine = make_engine(settings.database)
    Base.metadata.create_all(engine)
    jobs = JobStore(make_sessionmaker(engine))
    spec = FAMILY_SPECS["diffusers.wan"].model_copy(update={"name": "wan-1.3b-random"})
    model = ServedModel(name=spec.name, adapter="diffusers.wan", dtype="bfloat16", spec=spec)
    registry = PipelineRegistry({spec.name: model}, device)
    adapter = WanAdapter(pipe=pipe, dtype="bfloat16", spec=spec, compile="off")
    adapter.load(device)
    registry._loaded[spec.name] = adapter
    executor = StepExecutor(
        settings,
        jobs,
        cast(ArtifactStore, LocalArtifacts(work / "s3")),  # the slice the executor uses
        registry,
        worker_id="gpu-bench:1:w",
    )

    def new_job(seed: int) -> str:
        job_id = f"video_gpu{time.time_ns()}"
        job_spec = VideoSpec(
            model=spec.name,
            prompt=PROMPT,
            seed=seed,
            **job_shape(args),
            fps=16,
            timeout_s=3600,
            options={"guidance_scale": args.guidance},
        )
        jobs.create(Job.new(job_spec, id=job_id, owner="bench"), idempotency_window_s=0)
        return job_id

    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    runs: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        job_id = new_job(1)
        start = time.perf_counter()
        outcome = executor.run(job_id, spec.name)
        wall = time.perf_counter() - start
        torch.cuda.synchronize()
        row = jobs.get(job_id)
        assert row is not None
        runs.append(
            {
                "outcome": outcome,
                "wall_s": round(wall, 3),
                "inference_time_s": row.inference_time_s,
                "stages": row.stage_durations,
                "memory_after_minus_baseline": torch.cuda.memory_allocated() - baseline,
                "peak_memory_mb": row.peak_memory_mb,
            }
        )
    out["executor_runs"] = runs
    raw_med = statistics.median(raw)
    inf_med = statistics.median(r["inference_time_s"] for r in runs)
    out["overhead_ratio_inference"] = round(inf_med / raw_med, 4)
    out["overhead_ratio_wall_incl_encode_upload"] = round(
        statistics.median(r["wall_s"] for r in runs) / raw_med, 4
    )

    # ---- cancel latency ---------------------------------------------------------------
    # The executor runs on this (main) thread as in a solo-pool worker; a second thread
    # plays the API and cancels. "observed" is when the executor's ownership check first
    # saw the cancel (the loop stops computing there); "returned" is when run() returned,
    # after cleanup (temp files, objects, gc, CUDA cache).
    observed: list[float] = []
    original_update = jobs.update_running
    original_owned = jobs.still_owned

    def update_running(*a: Any, **kw: Any) -> bool:
        ok = original_update(*a, **kw)
        if not ok and not observed:
            observed.append(time.perf_counter())
        return ok

    def still_owned(*a: Any, **kw: Any) -> bool:
        ok = original_owned(*a, **kw)
        if not ok and not observed:
            observed.append(time.perf_counter())
        return ok

    release_ms: list[float] = []
    original_release = executor._release_memory

    def release(**kw: Any) -> None:
        t = time.perf_counter()
        original_release(**kw)
        release_ms.append((time.perf_counter() - t) * 1000)

    executor._release_memory = release  # type: ignore[method-assign]
    jobs.update_running = update_running  # type: ignore[method-assign]
    jobs.still_owned = still_owned  # type: ignore[method-assign]
    cancels = []
    for at in [int(s) for s in args.cancel_steps.split(",")]:
        job_id = new_job(2)
        observed.clear()
        requested: list[float] = []

        def canceller(j: str = job_id, step: int = at, req: list[float] = requested) -> None:
            while (row := jobs.get(j)) is not None and row.step < step:
                time.sleep(0.001)
            req.append(time.perf_counter())
            jobs.cancel(j)

        thread = threading.Thread(target=canceller)
        thread.start()
        outcome = executor.run(job_id, spec.name)
        returned = time.perf_counter()
        thread.join()
        torch.cuda.synchronize()
        cancels.append(
            {
                "at_step": at,
                "outcome": outcome,
                "cancel_to_observed_ms": round((observed[0] - requested[0]) * 1000, 1),
                "cancel_to_returned_ms": round((returned - requested[0]) * 1000, 1),
                "release_memory_ms": round(release_ms[-1], 1),
                "memory_after_minus_baseline": torch.cuda.memory_allocated() - baseline,
                "temp_dirs_left": len(list(work.glob("omniq-*"))),
            }
        )
    out["step_time_s"] = round(
        statistics.median(r["stages"]["denoise"] / args.steps for r in runs), 4
    )
    out["cancels"] = cancels
    out["baseline_allocated_mb"] = round(baseline / 2**20, 1)
    emit(out, "gpu_wan")


if __name__ == "__main__":
    main()
