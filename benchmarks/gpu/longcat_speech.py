"""LongCat-AudioDiT text-to-speech through the whole stack on one GPU: ``omniqueue up``
(Valkey, SQLite, SeaweedFS, the API, ``--workers`` GPU job workers on that one GPU)
serving a ``diffusers.longcat_audio`` entry, and ``--concurrency`` clients each sending
``POST /v1/audio/speech`` with ``response_format: "pcm"`` (the PCM16 stream; ``--sse``:
its ``stream_format: "sse"`` events) at once.

    python -m benchmarks.gpu.longcat_speech [--concurrency 8] [--rounds 3] [--workers 8]
    python -m benchmarks.gpu.longcat_speech --workers 1 --batch 8   # one worker, batched
    python -m benchmarks.gpu.longcat_speech --tiny     # the toy model on this CPU

The entry (written to a temporary registry file) has ``weights = "random"``: LongCat-
AudioDiT-1B's configs (a 24-block 1536-wide DiT, umt5-base, the 2048x audio VAE) with a
seeded random init on the GPU (workers/pipelines/diffusers/longcat_audio/random_weights.py: the
tokenizer is character-level), allowed by ``OMNIQ_WORKER__RANDOM_WEIGHTS``; the blocks
compiled (``--compile``, the family's default on CUDA: one graph set for every clip and
prompt length, made at worker start; ``--compile-mode reduce-overhead`` adds CUDA graphs
with bucketed lengths) and the VAE decoded in windows of ``--decode-window`` latent frames
and up, each window's PCM sent before the next decodes (0: whole). Each worker holds its
own copy (about 4 GB in bfloat16), so ``--workers`` requests run side by side. ``--batch
N`` (``OMNIQ_WORKER__BATCH_SIZE`` of every worker) has each worker run N requests at once,
their denoise steps one batched forward (workers/jobs/batcher.py); the run fails unless
the workers' log says they batch. A request alone runs its conditional and null passes as
one pass of two rows too (the adapter's ``guidance_batch``, its default); ``--two-passes``
runs ``__call__``'s two passes a step instead, to compare.

Each round sends ``--concurrency`` requests together (the same paragraph, a different
seed each; the clip's length follows the text, so every clip is as long); one warm-up
round first is not counted. Per request, from just before it is sent:

* ``ttfa_ms``: the first PCM byte of the body (the API answers a PCM stream at its first
  chunk): the job's queue, prepare and denoise, then the first decode window;
* ``ttfa_after_denoise_ms``: ``ttfa_ms`` less the job's queue, prepare and denoise
  (its ``stage_durations``): the first window's decode and the way to the client;
* ``total_ms``: the body's end; ``audio_s``: the clip's length (PCM16 mono 24 kHz);
* ``rtf``: ``total_ms / 1000 / audio_s`` (below 1: faster than real time).

Keys of the JSON (also ``$OUT/gpu_longcat_speech.json``): ``ttfa_ms``,
``ttfa_after_denoise_ms``, ``total_ms``, ``rtf`` (n, mean, p50, p95, p99, max over every
counted request), ``aggregate_rtf`` (a round's wall time over the audio it made, median
over rounds), ``worker_ready_s``, ``stage_seconds`` (medians of the jobs'
``stage_durations``), ``compile``, ``compile_mode``, ``decode_window``,
``guidance_batch``, ``step_graphs`` (the settings),
``compile_log`` (from the workers' log: ``compiled`` shapes and their ``compile_s``,
``recompiled_while_denoising`` lines, which should be none, ``fell_back`` to eager,
``pass_graphs`` captured by the steps' CUDA graphs and why they went off, if they did),
``batch`` (the setting) and ``batch_log`` (from the workers' log: how many workers
batch, and how many jobs each job's steps ran with at most, counted over every job, the
warm-up round's too), ``up_exit_code``, and the comparison point:
vLLM-Omni's ~2 s to the first chunk (vllm-omni #1635).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import summary
from benchmarks.embedded_stack import git_state, say
from benchmarks.gpu.common import emit, random_weights_stack
from benchmarks.gpu.h3_stack import inline_toml, stage_medians

MODEL = "meituan-longcat/LongCat-AudioDiT-1B/random"
TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest. "
    "Nobody saw where it went, but the birds were singing all afternoon."
)
RATE = 24_000  # the speech route's PCM16 rate (mono)
VLLM_OMNI_FIRST_CHUNK_S = 2.0  # vllm-omni #1635


def registry_text(args: argparse.Namespace) -> str:
    options = f"decode_window = {args.decode_window}\n"
    options += f"guidance_batch = {str(args.guidance_batch).lower()}\n"
    if args.step_graphs is not None:
        options += f"step_graphs = {str(args.step_graphs == 'on').lower()}\n"
    if args.random_config:
        options += f"random_config = {inline_toml(args.random_config)}\n"
    mode = f'compile_mode = "{args.compile_mode}"\n' if args.compile_mode else ""
    return f"""
[[model]]
name = "{MODEL}"
adapter = "diffusers.longcat_audio"
weights = "random"
dtype = "{args.dtype}"
compile = "{args.compile}"
{mode}[model.adapter_options]
{options}
[model.spec]
default_steps = {args.steps}
"""


def one(client: Any, seed: int, text: str, sse: bool) -> dict[str, Any]:
    """One speech request, its PCM stream (raw, or ``speech.audio.delta`` events) read to
    the end."""
    body = {"model": MODEL, "input": text, "response_format": "pcm", "seed": seed}
    if sse:
        body["stream_format"] = "sse"
    started = time.perf_counter()
    first: float | None = None
    size = 0
    with client.stream("POST", "/v1/audio/speech", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"speech: {resp.status_code} {resp.read()!r}")
        job = resp.headers.get("x-request-id")
        pieces = resp.iter_lines() if sse else resp.iter_bytes()
        for piece in pieces:
            if sse:
                if not (piece.startswith("data: ") and '"speech.audio.delta"' in piece):
                    continue
                piece = base64.b64decode(json.loads(piece[6:])["audio"])
            if first is None and piece:
                first = time.perf_counter()
            size += len(piece)
    ended = time.perf_counter()
    if first is None:
        raise RuntimeError("speech: an empty body")
    audio_s = size / 2 / RATE
    return {
        "job": job,
        "ttfa_ms": (first - started) * 1000,
        "total_ms": (ended - started) * 1000,
        "audio_s": audio_s,
        "rtf": (ended - started) / audio_s,
    }


def compile_log(text: str) -> dict[str, Any]:
    """What the workers' log says of the compiled blocks (workers/pipelines/diffusers/
    shared/compiled.py and adapter.py's lines)."""
    made = re.findall(r"compiled blocks for .*: (\d+) graph\(s\) in ([\d.]+) s", text)
    return {
        "compiled": len(made),
        "graphs": sum(int(g) for g, _ in made),
        "compile_s": [float(s) for _, s in made],
        "recompiled_while_denoising": len(re.findall(r"compiled while a job denoised", text)),
        "fell_back": len(re.findall(r"compiled blocks: falling back to eager", text)),
        "pass_graphs": len(re.findall(r"LongCat pass graph \d+ captured", text)),
        "pass_graphs_off": re.findall(r"LongCat pass graphs: off for this process: (.*)", text),
    }


def batch_log(text: str, batch: int) -> dict[str, Any]:
    """What the workers' log says of batching (workers/jobs/executor.py's and output.py's
    lines): the workers that batch, and per job the most jobs its steps ran with. A run
    with ``--batch`` above 1 whose workers do not batch fails here."""
    batching = len(re.findall(r"up to \d+ jobs at once, their steps batched", text))
    if batch > 1 and not batching:
        raise RuntimeError(f"--batch {batch}: no worker says it batches the model's steps")
    largest = [int(n) for n in re.findall(r"denoised in batches of up to (\d+) jobs", text)]
    return {
        "workers_batching": batching,
        "jobs_by_largest_batch": {n: largest.count(n) for n in sorted(set(largest))},
    }


def after_denoise(run: dict[str, Any], row: dict[str, Any]) -> float | None:
    """``ttfa_ms`` less the job's queue, prepare and denoise seconds (None: no stages)."""
    stages = row.get("stage_durations") or {}
    if "denoise" not in stages:
        return None
    before = sum(stages.get(k, 0.0) for k in ("queue", "prepare", "denoise"))
    return float(run["ttfa_ms"]) - 1000 * before


def rounds(client: Any, args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[float]]:
    """``--rounds`` rounds of ``--concurrency`` requests sent together (after a warm-up
    round): every request, and each round's wall time over its audio."""
    found: list[dict[str, Any]] = []
    aggregate: list[float] = []
    with ThreadPoolExecutor(args.concurrency) as pool:
        for r in range(args.rounds + 1):
            started = time.perf_counter()
            seeds = [1000 * r + i for i in range(args.concurrency)]
            runs = list(pool.map(lambda seed: one(client, seed, args.text, args.sse), seeds))
            wall = time.perf_counter() - started
            if r == 0:
                say(f"warm-up round: {wall:.2f} s")
                continue
            found += runs
            aggregate.append(wall / sum(x["audio_s"] for x in runs))
            p95 = max(x["ttfa_ms"] for x in runs)
            say(f"round {r}: {wall:.2f} s, slowest first audio {p95:.0f} ms")
    return found, aggregate


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import httpx

    # up's workers take their settings from this environment (cli/up_children.py).
    os.environ["OMNIQ_WORKER__BATCH_SIZE"] = str(args.batch)
    stack = random_weights_stack(work, registry_text(args), MODEL, args.device, args.workers)
    out: dict[str, Any] = {}
    started = time.time()
    try:
        stack.start(timeout=900)
        ready = stack.workers_ready(args.workers, args.ready_timeout)
        out["worker_ready_s"] = round(ready - started, 1)
        limits = httpx.Limits(max_connections=args.concurrency + 2)
        with httpx.Client(base_url=stack.url, timeout=900, limits=limits) as client:
            runs, aggregate = rounds(client, args)
            out |= {key: summary([x[key] for x in runs], 3) for key in ("ttfa_ms", "total_ms")}
            out["rtf"] = summary([x["rtf"] for x in runs], 3)
            out["audio_s"] = summary([x["audio_s"] for x in runs], 3)
            out["aggregate_rtf"] = round(statistics.median(aggregate), 3)
            rows = [client.get(f"/v1/audio/generations/{x['job']}").json() for x in runs]
            out["stage_seconds"] = stage_medians(
                [r["stage_durations"] for r in rows if r.get("stage_durations")]
            )
            for x, row in zip(runs, rows, strict=True):
                x["ttfa_after_denoise_ms"] = after_denoise(x, row)
            late = [x["ttfa_after_denoise_ms"] for x in runs]
            out["ttfa_after_denoise_ms"] = summary([v for v in late if v is not None], 3)
            out["requests"] = [
                {k: round(v, 3) if isinstance(v, float) else v for k, v in x.items()} for x in runs
            ]
        log = stack.log_path.read_text(errors="replace")
        out["compile_log"] = compile_log(log)
        out["batch_log"] = batch_log(log, args.batch)
    finally:
        stack.close(out, args.keep_log)
    return out


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, default=8, help="requests sent together")
    p.add_argument("--rounds", type=int, default=3, help="counted rounds (after a warm-up)")
    p.add_argument("--workers", type=int, default=8, help="job workers on the one GPU")
    p.add_argument(
        "--batch",
        type=positive,
        default=1,
        help="requests each worker runs at once, their steps batched (OMNIQ_WORKER__BATCH_SIZE)",
    )
    p.add_argument("--steps", type=int, default=16, help="denoise steps (__call__'s 16)")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--sse", action="store_true", help='stream_format "sse" instead of raw PCM')
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--keep-log", default=None, help="copy up's stderr here")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--compile", choices=("blocks", "off"), default=None, help="default: blocks (--tiny: off)"
    )
    p.add_argument(
        "--compile-mode",
        default=None,
        help='torch.compile mode (e.g. "reduce-overhead": CUDA graphs, bucketed lengths)',
    )
    p.add_argument(
        "--decode-window", type=int, default=16, help="first decode window, frames (0: whole)"
    )
    p.add_argument(
        "--step-graphs",
        choices=("on", "off"),
        default=None,
        help="each step one CUDA graph (the adapter's step_graphs; default: the adapter's, "
        "on with CUDA unless --compile-mode records graphs of its own)",
    )
    p.add_argument(
        "--two-passes",
        dest="guidance_batch",
        action="store_false",
        help="__call__'s two passes a step (guidance_batch = false), not one pass of 2 rows",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="longcat_random.TINY_CONFIG on the CPU (float32, 1 worker, 1 round of 2, "
        "2 steps): checks this script",
    )
    args = p.parse_args()
    args.random_config = {}
    if args.tiny:
        from workers.pipelines.diffusers.longcat_audio.random_weights import TINY_CONFIG

        args.random_config = TINY_CONFIG
        args.device, args.dtype = "cpu", "float32"
        args.workers, args.concurrency, args.rounds, args.steps = 1, 2, 1, 2
        args.compile = args.compile or "off"  # inductor takes minutes on a CPU
    args.compile = args.compile or "blocks"

    out: dict[str, Any] = {
        "benchmark": "gpu_longcat_speech",
        "date": time.strftime("%Y-%m-%d"),
        **git_state(),
        "model": MODEL,
        "weights": f"seeded random init from the {'tiny' if args.tiny else 'LongCat-AudioDiT-1B'}"
        f" configs, {args.dtype}, built on {args.device} (registry weights = 'random')",
        "stream": "sse" if args.sse else "pcm",
        "concurrency": args.concurrency,
        "workers": args.workers,
        "batch": args.batch,
        "steps": args.steps,
        "text_chars": len(args.text),
        "compile": args.compile,
        "compile_mode": args.compile_mode,
        "decode_window": args.decode_window,
        "guidance_batch": args.guidance_batch,
        "step_graphs": args.step_graphs,
        "compare": {"vllm_omni_first_chunk_s": VLLM_OMNI_FIRST_CHUNK_S},
    }
    if not args.tiny:
        import torch

        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    # bench.sh's BENCH_TIMEOUT_S sends SIGTERM: unwind, so that up is stopped and
    # --keep-log is written (two GPU runs killed so left no word of where they stood)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    with tempfile.TemporaryDirectory() as tmp:
        out |= run(args, Path(tmp))
    emit(out, "gpu_longcat_speech")


if __name__ == "__main__":
    main()
