"""``lane.py``'s LoRA phase: per-request adapters hot-swapped into one slot under
compiled blocks (``workers/pipelines/diffusers/shared/lora.py``).

Adapters are built in code: rank ``--lora-rank`` on every linear layer of the
transformer's blocks (diffusers' key format), small random weights, one file each. What is
measured, on the lane's adapter (its blocks already compiled):

* the slot going in (a worker does this at load, before compiling; here after, so the
  first LoRA job recompiles the blocks once: ``lora_first_job_graphs``) and what a
  parked slot costs a step (``lora_parked_step_ratio``: a job without LoRA, slot in,
  ÷ the same job before it);
* ``lora_swap_ms_p95``: ``activate`` of an adapter already in the cache, device idle
  before and after (the swap a job's prepare makes);
* ``lora_recompiles``: graphs dynamo made during jobs that each ran another cached adapter
  (and one without) after the first LoRA job;
* ``lora_memory``: device memory while ``--loras`` adapters pass through a cache of
  ``--lora-cache``: the most it held over the slot-only baseline, next to the cache's own
  count of the bytes it holds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import pct, summary
from benchmarks.gpu.common import generation_request, timed_job
from benchmarks.gpu.common import sync_time as _sync_time


def _adapters(shapes: dict[str, tuple[int, int]], n: int, rank: int, work: Path) -> list[Any]:
    from safetensors.torch import save_file

    from models.job_specs import LoraSpec

    specs = []
    for seed in range(n):
        g, weights = torch.Generator().manual_seed(seed), {}
        for name, (out_f, in_f) in shapes.items():
            if name.startswith("blocks."):
                weights[f"transformer.{name}.lora_A.weight"] = (
                    torch.randn(rank, in_f, generator=g) * 0.01
                ).to(torch.bfloat16)
                weights[f"transformer.{name}.lora_B.weight"] = (
                    torch.randn(out_f, rank, generator=g) * 0.01
                ).to(torch.bfloat16)
        path = work / f"lora{seed}.safetensors"
        save_file(weights, str(path))
        specs.append(LoraSpec(name=f"lora{seed}", path=str(path), scale=1.0))
    return specs


def lora_lane(adapter: Any, args: argparse.Namespace) -> dict[str, Any]:
    from workers.pipelines.diffusers.shared.compiled import graphs_made
    from workers.pipelines.diffusers.shared.lora import LoraCache

    pipe = adapter.pipe
    out: dict[str, Any] = {}
    short = generation_request(args, num_inference_steps=4)
    before = statistics.median(timed_job(adapter, short, decode=False)["step_s"])

    cache = LoraCache(max_adapters=args.lora_cache, max_bytes=64 << 30, max_rank=args.lora_rank)
    adapter.use_lora(cache)
    t = time.perf_counter()
    cache.install(pipe)
    out["lora_slot_install_s"] = round(time.perf_counter() - t, 2)
    out["lora_slot_bytes"] = cache.stats().slot_bytes
    work = Path(tempfile.mkdtemp(prefix="oq-lora-"))
    specs = _adapters(cache.layer_shapes(), args.loras, args.lora_rank, work)
    out["lora_adapter_bytes"] = specs and (work / "lora0.safetensors").stat().st_size

    graphs = graphs_made()
    with_lora = generation_request(args, num_inference_steps=4, lora=specs[0])
    timed_job(adapter, with_lora, decode=False)  # the blocks compiled again, with the slot
    out["lora_first_job_graphs"] = graphs_made() - graphs
    parked = statistics.median(timed_job(adapter, short, decode=False)["step_s"])
    out["lora_parked_step_ratio"] = round(parked / before, 4)

    k = min(args.lora_cache, len(specs))
    for spec in specs[:k]:  # the misses: read, convert, check, onto the device
        cache.activate(pipe, spec)
        cache.release(pipe)
    swaps = []
    for i in range(100):
        start = _sync_time()
        cache.activate(pipe, specs[i % k])
        swaps.append((_sync_time() - start) * 1000)
        cache.release(pipe)
    out["lora_swap_ms"] = summary(swaps, 2)
    out["lora_swap_ms_p95"] = round(pct(swaps, 0.95), 2)

    graphs = graphs_made()
    for spec in [*specs[:k], None, specs[0]]:
        request = generation_request(args, num_inference_steps=2, lora=spec)
        timed_job(adapter, request, decode=False)
    out["lora_recompiles"] = graphs_made() - graphs

    cache.release(pipe)
    if not torch.cuda.is_available():
        return out  # a CPU smoke run: no device memory to follow
    torch.cuda.synchronize()
    held = cache.stats().cached_bytes
    baseline = torch.cuda.memory_allocated() - held  # the slot, the model: no adapters
    peak = 0
    for spec in specs:  # every adapter through the cache once, in order: evictions
        cache.activate(pipe, spec)
        cache.release(pipe)
        torch.cuda.synchronize()
        peak = max(peak, torch.cuda.memory_allocated() - baseline)
    stats = cache.stats()
    out["lora_memory"] = {
        "adapters_cycled": len(specs),
        "cache_adapters": args.lora_cache,
        "adapter_bytes_on_device": stats.cached_bytes // max(1, stats.entries),
        "max_over_baseline_bytes": peak,
        "cache_budget_bytes": args.lora_cache * (stats.cached_bytes // max(1, stats.entries)),
        "after_bytes_over_baseline": torch.cuda.memory_allocated() - baseline,
        "cached_bytes_after": stats.cached_bytes,
        "evictions": stats.evictions,
    }
    return out
