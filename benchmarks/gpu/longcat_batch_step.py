"""LongCat-AudioDiT's denoise step alone and batched, the transformer only, on one GPU:
what one batched forward over k jobs (``workers/pipelines/diffusers/longcat_audio/batch.py``,
the step a worker with ``OMNIQ_WORKER__BATCH_SIZE`` runs) costs against the k jobs' own
steps, and how far each batched row is from its job's own forward.

    python -m benchmarks.gpu.longcat_batch_step [--jobs 1 2 4 8] [--dtype bfloat16]
    python -m benchmarks.gpu.longcat_batch_step --tiny      # the toy DiT on this CPU

The DiT is ``LongCatAudioDiTTransformer``'s default config (LongCat-AudioDiT-1B: 24
blocks of 1536) with seeded random weights (its zero-initialised output layers drawn
too, so that the prediction is not 0), eager. Each job is under guidance (a conditional
and a null row) with its own clip length (about the 9.7 s clip of
``longcat_speech.py``: 105 to 122 latent frames) and prompt length (130 to 160 tokens of
random embeddings), at its own timestep. Per k:

* ``solo_ms``: the k jobs' steps one after another, each two forwards (``__call__``'s
  step: the adapter's with ``guidance_batch = false``; by default a lone job's step is
  the batched pass of its own two rows, ``batched_ms`` at k = 1), the median of
  ``--repeat`` timed steps after a warm-up;
* ``batched_ms``: one ``batched_forward`` over the 2k rows (the text side made once per
  job beforehand, as the adapter keeps it);
* ``row_vs_solo``: the largest difference of a batched row from its own forward, over
  the row's peak (the batched bound, in the run's dtype);
* on CUDA, ``graph_ms``: the same pass replayed from its CUDA graph
  (``longcat_audio/graphs.py``, the adapter's ``step_graphs``: the inputs copied in, then
  one replay), and ``graph_vs_direct``: its largest difference from the pass run directly
  (0: a replay runs the recorded kernels).

Needs only torch and diffusers (and this file's imports): it runs on a bare GPU host.
Prints JSON (also ``$OUT/gpu_longcat_batch_step.json`` when OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from workers.pipelines.diffusers.longcat_audio.batch import (
    Row,
    batched_forward,
    forward_pass,
    pass_inputs,
    text_side,
)
from workers.pipelines.diffusers.longcat_audio.graphs import PassGraphs

TINY = {"dit_dim": 32, "dit_depth": 2, "dit_heads": 4, "dit_text_dim": 32, "latent_dim": 8}


def _transformer(device: str, dtype: torch.dtype, config: dict[str, Any]) -> Any:
    from diffusers import LongCatAudioDiTTransformer

    torch.manual_seed(0)
    model: Any = LongCatAudioDiTTransformer(**config)
    model = model.to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    return model


Job = tuple[Row, Row, torch.Tensor]  # a job's conditional row, its null row, its prompt


def _jobs(model: Any, count: int, device: str, dtype: torch.dtype) -> list[Job]:
    """``count`` jobs under guidance: their own lengths, text and timestep."""
    config = model.config
    gen = torch.Generator().manual_seed(count)
    jobs = []
    for i in range(count):
        frames = 105 + (i * 7) % 18
        tokens = 130 + (i * 11) % 31
        latents = torch.randn(1, frames, config.latent_dim, generator=gen).to(device, dtype)
        mask = torch.ones(1, frames, dtype=torch.bool, device=device)
        cond = torch.zeros_like(latents)
        t = torch.tensor([1.0 - i / (2 * count)], device=device, dtype=dtype)
        text_mask = torch.ones(1, tokens, dtype=torch.bool, device=device)
        embeds = torch.randn(1, tokens, config.dit_text_dim, generator=gen).to(device, dtype)
        own, null = (
            Row(latents, mask, cond, t, text_side(model, e, text_mask))
            for e in (embeds, torch.zeros_like(embeds))
        )
        jobs.append((own, null, embeds))
    return jobs


def _timed(run: Any, device: str, repeat: int) -> float:
    run()
    times = []
    for _ in range(repeat):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(model: Any, count: int, device: str, dtype: torch.dtype, repeat: int) -> dict[str, Any]:
    jobs = _jobs(model, count, device, dtype)

    def forward(row: Row, embeds: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = model(
            hidden_states=row.latents,
            encoder_hidden_states=embeds,
            encoder_attention_mask=row.text.mask,
            timestep=row.timestep,
            attention_mask=row.mask,
            latent_cond=row.latent_cond,
        ).sample
        return out

    def solo() -> list[torch.Tensor]:
        outs = []
        for cond, null, embeds in jobs:
            outs.append(forward(cond, embeds))
            outs.append(forward(null, torch.zeros_like(embeds)))
        return outs

    rows = [row for cond, null, _ in jobs for row in (cond, null)]
    with torch.no_grad():
        solo_ms = _timed(solo, device, repeat)
        batched_ms = _timed(lambda: batched_forward(model, rows), device, repeat)
        alone, together = solo(), batched_forward(model, rows)
    worst = 0.0
    for i, (row, own) in enumerate(zip(rows, alone, strict=True)):
        frames = row.latents.shape[1]
        diff = (together[i : i + 1, :frames] - own).abs().max() / own.abs().max()
        worst = max(worst, float(diff))
    out = {
        "jobs": count,
        "rows": len(rows),
        "solo_ms": round(solo_ms, 2),
        "batched_ms": round(batched_ms, 2),
        "speedup": round(solo_ms / batched_ms, 2),
        "row_vs_solo": float(f"{worst:.3g}"),
    }
    if device.startswith("cuda"):
        out |= _graphed(model, rows, device, repeat)
    return out


def _graphed(model: Any, rows: list[Row], device: str, repeat: int) -> dict[str, Any]:
    """The pass over ``rows`` replayed from its CUDA graph: its time, and how far it is
    from the pass run directly."""
    graphs, inputs = PassGraphs(), pass_inputs(rows)
    with torch.no_grad():
        direct = forward_pass(model, inputs)
        graph_ms = _timed(lambda: graphs.run(model, inputs), device, repeat)
        replayed = graphs.run(model, inputs)
    if replayed is None:
        return {"graph_failed": graphs.failed}
    return {
        "graph_ms": round(graph_ms, 2),
        "graph_vs_direct": float((replayed - direct).abs().max()),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the tiny DiT on the CPU (checks this)")
    args = p.parse_args()
    config: dict[str, Any] = {}
    if args.tiny:
        args.device, args.repeat, config = "cpu", 2, TINY
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("longcat_batch_step: no CUDA device (--tiny runs on the CPU)")
    out: dict[str, Any] = {
        "benchmark": "gpu_longcat_batch_step",
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "model": "LongCatAudioDiTTransformer " + ("tiny" if args.tiny else "default (1B)"),
        "runs": [],
    }
    for name in args.dtype:
        dtype = getattr(torch, name)
        model = _transformer(args.device, dtype, config)
        for count in args.jobs:
            run = measure(model, count, args.device, dtype, args.repeat)
            out["runs"].append({"dtype": name, **run})
            print(json.dumps(out["runs"][-1]), flush=True)
        del model
    text = json.dumps(out, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_longcat_batch_step.json").write_text(text)


if __name__ == "__main__":
    main()
