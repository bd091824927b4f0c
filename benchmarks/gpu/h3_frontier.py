"""FastH3's offload frontier through the stack (issue 44, ``h3_offload_frontier``): the warm
end-to-end time of a job and the device memory it takes, for BF16 and FP8 weights, held
resident or under a device budget of 24 or 40 GiB.

    python -m benchmarks.gpu.h3_frontier [--points bf16-none,bf16-group-40,...] [--jobs 2]
    python -m benchmarks.gpu.h3_frontier --dry-run [--toy]   # each point's entry, run nothing
    python -m benchmarks.gpu.h3_frontier --toy               # on the CPU: checks the script

A point is ``{bf16|fp8}-{none|model|group}[-BUDGET_GIB]``: the entry's ``quantization``,
``offload`` and ``offload_budget_gib``. Each point is its own ``omniqueue up`` (one GPU
worker, the FastH3 entry of ``h3_stack.py`` with that plan: random weights built on the
device, 4 transformer evaluations, no CFG, the node's form; without the fused LoRA, which
changes the weights and nothing the device does, so that no point depends on how group
offloading meets a LoRA's fusing), one first job and ``--jobs`` warm ones, then down.

Per point (the list ``h3_offload_frontier``): ``quantization``, ``offload``,
``budget_gib``, ``compile``, ``warm_e2e_s`` (the median of the warm jobs, client POST →
MP4 downloaded), ``first_e2e_s``, ``peak_mib`` (the most a job held: the jobs'
``peak_memory_mb``, ``max_memory_allocated`` from the job's start), ``resident_mib`` (the
worker's allocated memory once ready, ``/metrics``), ``memory_after_jobs_mib`` (the same
once the jobs are done: issue 44's "memory after jobs: baseline, for every mode"),
``memory`` (``/v1/models``' report) and ``seconds``; or ``error``, and then no time:

* refused by the worker before it reads a weight (``plans.refusal``): model offload on
  H3's modular pipeline, FP8 or a budget off a CUDA GPU: said with the worker's words, no
  ``up`` started;
* ``not run``: with ``offload = "none"`` and a budget under what the weights alone hold
  (their sizes from a meta-device build of the same configs, FP8's savings by the
  worker's own rule): the budget cannot hold the model (``--run-anyway`` runs it). A
  ``group`` point always runs, FP8 as BF16 (group offloading carries torchao's FP8
  weights: docs/evidence/fp8_group_probe_h100_2026-12-06.json);
* what the run met: the model unavailable (``/v1/models``' reason: a worker that
  refused the load, group offload's host copies over the host's memory say), a job that
  failed (out of memory under the budget), up that did not come up within
  ``--ready-timeout`` (240 s a point) or that exited (within a second: the stack's
  watcher). Then ``up_log_tail`` holds up's last 40 lines, printed to stderr too.

Each point's up log is written as it runs to ``--keep-logs`` (default ``$OUT``) as
``up_POINT.log``, so that a call killed at its time limit still brings it back.

Compiled blocks are off by default (``--compile``): group offloading refuses them, and
the frontier compares the points with each other; ``h3_stack.py`` measures FastH3
compiled. The points ``none`` run first, the budgets after, in the order given.

JSON on stdout and in ``$OUT/gpu_h3_frontier.json`` (the GPU's name, the commit); on a GPU
host ``bash benchmarks/device/h3.sh --frontier [args]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu.common import completed_job, emit, random_weights_stack, up_failure
from benchmarks.gpu.h3_stack import MODEL, header, node_form, registry_text, resolve, shape_args
from benchmarks.gpu.plans import gauge_mib, model_memory, refusal

DEFAULT_POINTS = "bf16-none,fp8-none,bf16-group-40,bf16-group-24,fp8-group-40,fp8-group-24"
PRECISIONS = {"bf16": "none", "fp8": "fp8"}


def parse_point(label: str) -> dict[str, Any]:
    """``fp8-group-24`` → quantization, offload and budget (ValueError naming the form)."""
    parts = label.strip().split("-")
    try:
        if len(parts) not in (2, 3) or parts[1] not in ("none", "model", "group"):
            raise ValueError
        budget = float(parts[2]) if len(parts) == 3 else None
        quantization = PRECISIONS[parts[0]]
    except (KeyError, ValueError):
        raise ValueError(
            f"point {label!r}: write {{bf16|fp8}}-{{none|model|group}}[-BUDGET_GIB]"
        ) from None
    return {"label": label, "quantization": quantization, "offload": parts[1], "budget": budget}


def point_args(args: argparse.Namespace, point: dict[str, Any]) -> argparse.Namespace:
    """The run's arguments with the point's plan (compiled blocks off with group offload)."""
    out = copy.copy(args)
    out.quantization, out.offload = point["quantization"], point["offload"]
    out.offload_budget_gib = point["budget"]
    out.compile = "off" if point["offload"] == "group" else args.compile
    return out


def weights_gib(args: argparse.Namespace) -> dict[str, float]:
    """The weights each way on the device (GiB): every component of the random pipeline
    built on the meta device (no memory), the transformer's FP8 savings by the worker's
    rule (``fp8.fp8_layers``)."""
    from workers.pipelines.diffusers.minimax_h3.random_weights import random_pipeline
    from workers.pipelines.diffusers.shared import fp8
    from workers.pipelines.diffusers.shared.loading import parse_dtype
    from workers.pipelines.diffusers.shared.offload import modules_of

    pipe = random_pipeline(
        "meta", parse_dtype(args.dtype), text_layers=args.text_layers, config=args.random_config
    )
    total = saved = 0
    for name, module in modules_of(pipe).items():
        total += sum(p.numel() * p.element_size() for p in module.parameters())
        if name.startswith("transformer"):
            saved += fp8.bytes_saved(module, fp8.fp8_modules(module))
    return {"none": round(total / 2**30, 3), "fp8": round((total - saved) / 2**30, 3)}


def not_run(point: dict[str, Any], weights: dict[str, float]) -> str | None:
    """Why a point cannot hold its weights under its budget (resident weights only)."""
    held = weights[point["quantization"]]
    if point["offload"] != "none" or point["budget"] is None or held <= point["budget"]:
        return None
    precision = "fp8" if point["quantization"] == "fp8" else "bf16"
    return (
        f"not run: the weights alone hold {held:g} GiB on the device (meta-device sizes), "
        f"over the {point['budget']:g} GiB budget, and they are not offloaded (the point "
        f"{precision}-group-{point['budget']:g} streams them; model offload is not on H3's "
        "modular pipeline)"
    )


def run_point(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One point's ``up``, its jobs, its memory (the module doc's keys). up says it is up
    once its worker has loaded the model (or stopped on a configuration error), so
    ``--ready-timeout`` bounds the load; past it, or when up exits, the point ends with
    its error and up's last lines (``up_log_tail``, on stderr too)."""
    import httpx

    out: dict[str, Any] = {}
    log = Path(args.keep_logs, f"up_{args.label}.log") if args.keep_logs else None
    stack = random_weights_stack(work, registry_text(args, None), MODEL, args.device, 1, log)
    try:
        stack.start(timeout=args.ready_timeout)
        listed = model_memory(stack, MODEL)
        out["memory"] = (listed or {}).get("memory")
        out["resident_mib"] = (
            gauge_mib(stack, "omniqueue_gpu_memory_allocated_bytes", "worker") or None
        )
        if listed is None or not listed.get("available", True):
            why = (listed or {}).get("unavailable_reason") or "not listed"
            return out | {"error": f"model unavailable: {why}"}
        with httpx.Client(base_url=stack.url, timeout=1800) as client:
            walls, peaks = [], []
            for i in range(args.jobs + 1):
                wall, vid, _ = completed_job(client, data=node_form(args, 42 + i))
                walls.append(round(wall, 3))
                peaks.append(client.get(f"/v1/videos/{vid}").json().get("peak_memory_mb"))
        out["first_e2e_s"], out["warm_jobs_s"] = walls[0], walls[1:]
        out["warm_e2e_s"] = round(statistics.median(walls[1:]), 3) if walls[1:] else None
        known = [p for p in peaks if p is not None]
        out["peak_mib"] = max(known) if known else None
        out["memory_after_jobs_mib"] = (
            gauge_mib(stack, "omniqueue_gpu_memory_allocated_bytes", "worker") or None
        )
    except Exception as exc:  # the point's outcome: the others still run
        up_failure(out, exc, stack, f"point {args.label}")
    finally:
        stack.close(out)
    return out


def frontier(args: argparse.Namespace, points: list[dict[str, Any]], out: dict[str, Any]) -> None:
    """Every point, refused or estimated out first, run otherwise (``--dry-run``: none),
    each appended to ``out["h3_offload_frontier"]`` and the JSON written as it is, so that
    a run killed at a time limit keeps the points it finished."""
    weights = weights_gib(args)
    found = out["h3_offload_frontier"] = []
    for point in points:
        run = point_args(args, point)
        run.label = point["label"]
        record: dict[str, Any] = {
            "point": point["label"],
            "quantization": run.quantization,
            "offload": run.offload,
            "budget_gib": run.offload_budget_gib,
            "compile": run.compile,
        }
        registry = registry_text(run, None)
        why = None if args.run_anyway else not_run(point, weights)
        why = why or refusal(registry, MODEL, run.device)
        if why is not None:
            record["error"] = why
        elif args.dry_run:
            record["registry"] = registry
        else:
            began = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                record |= run_point(run, Path(tmp))
            record["seconds"] = round(time.perf_counter() - began, 1)
        print(f"point {point['label']}: {json.dumps(record)[:400]}", file=sys.stderr, flush=True)
        found.append(record)
        emit(out, "gpu_h3_frontier", partial=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    shape_args(p)
    p.add_argument("--points", default=DEFAULT_POINTS, help=f"(default: {DEFAULT_POINTS})")
    p.add_argument("--jobs", type=int, default=2, help="warm jobs a point, after its first")
    p.add_argument("--compile", default="off", choices=("blocks", "off"))
    p.add_argument("--run-anyway", action="store_true", help="run points estimated not to fit")
    p.add_argument("--dry-run", action="store_true", help="each point's entry; run nothing")
    p.add_argument(
        "--keep-logs",
        default=os.environ.get("OUT") or None,
        help="write each point's up log to DIR/up_POINT.log as it runs (default: $OUT)",
    )
    args = p.parse_args()
    try:
        args.point_list = [parse_point(label) for label in args.points.split(",") if label]
    except ValueError as exc:
        p.error(str(exc))
    args.quantization, args.offload, args.offload_budget_gib = "none", "none", None
    return resolve(args)


def main() -> None:
    args = parse_args()
    out = header(args)
    del out["quantization"], out["offload"], out["offload_budget_gib"]  # per point
    out["weights_gib"] = weights_gib(args)
    out["jobs_per_point"] = {"first": 1, "warm": args.jobs}
    frontier(args, args.point_list, out)
    emit(out, "gpu_h3_frontier")


if __name__ == "__main__":
    main()
