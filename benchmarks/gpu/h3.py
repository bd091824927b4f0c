"""MiniMax-H3 on one GPU, in process: the adapter (step-executed, compiled blocks, cancel
gates) against diffusers' own modular pipeline call on the same pipeline object, at the
reference deployment's qualification shape (448x256, 24 fps, 10 s, seed 42), FastH3's
schedule (5 sigma points: 4 transformer evaluations, no CFG).

Run:  python -m benchmarks.gpu.h3 [--tiny]      (JSON on stdout and in $OUT/gpu_h3.json)
On a GPU host: bash benchmarks/device/h3.sh (with .wheelhouse/h3).

Weights: the 33.1 B transformer cannot be saved next to the wheelhouse on the device's
64 GiB disk, so every component is built from its default config with a seeded random
init directly on the GPU in bf16 (the registry's benchmark-only ``weights = "random"``
mode, workers/pipelines/diffusers/minimax_h3/random_weights.py). The Qwen3-VL
text encoder keeps its width (5120) but not its depth: ``--text-layers`` + 1 decoder
layers, H3's conditioning read after layer ``--text-layers`` instead of layer 50 (it runs
once per job; the JSON says so). The tokenizer is character-level, so the prompt is as
many text rows as it has characters (70, the text refiner's length at this shape).

What is measured (keys of the JSON):
* ``forward_eager_s`` / ``forward_compiled_s``: one transformer forward over the packed
  sequence (8,944 rows at this shape), median of ``--repeat``; ``compile_s`` the first;
  ``vae_compile_s`` the video VAE decoder's compile for this size (as at warm-up: the
  jobs below decode with it compiled, raw pipeline included).
* ``h3_stack_over_raw``: the adapter's job (prepare, steps, decode to uint8 frames on the
  host) ÷ ``pipe(..., output_type="np")`` (float frames on the host), both with the same
  compiled blocks, warm, median of ``--repeat`` each, alternated;
  ``h3_stack_over_raw_device`` the same over ``output_type="pt"`` (frames left on the
  GPU: diffusers' compute alone, the stricter ratio).
* ``h3_stage_seconds``: prepare / denoise / decode / encode / check (the output contract
  probe) of the median job run as the executor runs it: the MP4 (H.264 + AAC with PyAV)
  written while the VAE decodes clip by clip, so ``decode`` holds the overlapped encode
  and ``encode`` the thumbnail; ``h3_stage_seconds_unstreamed`` decoded whole, then
  encoded (the split of the two). Upload is not in process.
* ``fasth3_inprocess_e2e_s``: prepare → MP4 written and checked, warm (no HTTP, no S3),
  streamed as above.
* ``h3_cancel_p95_ms``: a stop flag set at a random moment inside a step → the step
  raised with the device idle (the executor's gate, no HTTP), over ``--cancels`` stops;
  ``block_ms`` is a forward ÷ its 50 blocks.
* ``h3_memory_after_jobs_mib``: allocated memory after load, after the first job (the
  baseline of a warm worker: compiled graphs and their constants), then after completed
  and after cancelled jobs; ``growth_over_baseline`` is what the jobs left behind.
* ``vsa_forward_ratio``: the whole forward with the joint blocks on fastvideo-kernel's
  VSA (top-k ``--vsa-topk`` of the packed sequence's blocks) ÷ the same with SDPA, eager
  (``vsa_forward_ratio_eager``) and with compiled blocks (the headline; the kernel call
  stays eager inside each compiled block); ``vsa_kernel_check`` the kernel against
  ``reference_vsa`` (plain torch) on two heads of the job's real layout. Needs
  fastvideo-kernel importable (the device script carries its Python sources); null with
  the reason otherwise, or with ``--no-vsa``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import json
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

PROMPT = "a red kite over a green hill at dusk, wind in the grass, a dog barks once"[:70]


def _sync() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def _mib() -> float:
    return torch.cuda.memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0


def build_pipeline(device: str, tiny: bool, text_layers: int) -> Any:
    """The H3 pipeline as a ``weights = "random"`` registry entry builds it
    (minimax_h3/random_weights.py): default configs (``--tiny``: TOY_CONFIG), seeded random weights
    built on the device, H3's conditioning read after ``text_layers`` layers."""
    from workers.pipelines.diffusers.minimax_h3.random_weights import TOY_CONFIG, random_pipeline

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = TOY_CONFIG if tiny else None
    return random_pipeline(device, dtype, seed=42, text_layers=text_layers, config=config)


def _request(args: argparse.Namespace, seed: int = 42) -> Any:
    from workers.pipelines.base import GenerationRequest

    return GenerationRequest.video(
        prompt=PROMPT,
        width=args.width,
        height=args.height,
        num_frames=args.frames,
        fps=24.0,
        num_inference_steps=args.steps,
        seed=seed,
    )


def _raw(pipe: Any, args: argparse.Namespace, output_type: str = "np") -> float:
    from workers.pipelines.diffusers.minimax_h3.inputs import call_inputs
    from workers.pipelines.diffusers.shared.common import make_generator

    request = _request(args)
    start = _sync()
    pipe(**call_inputs(request, make_generator(request.seed)), output_type=output_type)
    return _sync() - start


def _stack(adapter: Any, args: argparse.Namespace, work: Path, stream: bool) -> dict[str, float]:
    """One job as the worker runs it, stage by stage (upload aside). ``stream``: as the
    executor does, the MP4 written while the VAE decodes (``decode`` then holds the
    overlapped encode, ``encode`` the thumbnail); else decoded whole, then encoded."""
    from workers.jobs.output_check import Expected, check_mp4
    from workers.media.mp4 import decode_streamed, encode_mp4, finish_video

    stages: dict[str, float] = {}
    t = _sync()
    state = adapter.prepare(_request(args))
    stages["prepare"] = (t1 := _sync()) - t
    while not state.done:
        adapter.step(state)
    stages["denoise"] = (t2 := _sync()) - t1
    path = work / "video.mp4"
    if stream:
        streamed = decode_streamed(adapter, state, 24.0, work)
        assert streamed is not None, "the H3 adapter streams its decode"
        adapter.end()
        stages["decode"] = (t3 := _sync()) - t2
        finish_video(streamed.middle, work)
    else:
        media = adapter.decode(state)
        adapter.end()
        stages["decode"] = (t3 := _sync()) - t2
        encode_mp4(media, path)
    stages["encode"] = (t4 := time.perf_counter()) - t3
    check_mp4(path, Expected(args.width, args.height, 24.0, args.frames, audio=True))
    stages["check"] = time.perf_counter() - t4
    stages["total"] = time.perf_counter() - t
    return stages


def _forward(adapter: Any, state: Any) -> float:
    """One transformer forward over the job's packed sequence (a copy of its loop state)."""
    trial = copy.deepcopy(state.block_state)
    denoiser = state.loop.sub_blocks["denoiser"]
    start = _sync()
    with torch.no_grad():
        denoiser(state.components, trial, i=0, t=state.timesteps[0])
    return _sync() - start


def _rows(state: Any) -> int:
    fields = state.block_state.denoiser_input_fields
    tags = fields.get("token_tags")
    return int(tags.numel()) if tags is not None else -1


def _vsa(adapter: Any, args: argparse.Namespace) -> dict[str, Any]:
    """VSA against SDPA over the qualification job's packed sequence (see the docstring).
    Runs last: it swaps the joint blocks' processors."""
    from workers.pipelines.diffusers.minimax_h3.vsa import (
        VSA_BLOCK,
        VsaContext,
        install_vsa,
        kernel_name,
        load_kernel,
        reference_vsa,
        vsa_layout,
    )

    try:
        kernel = load_kernel(adapter.device)
    except ValueError as exc:
        return {"vsa_forward_ratio": None, "vsa_note": f"not measured: {exc}"}
    state = adapter._state(adapter.prepare(_request(args)))
    rows = state.block_state.denoiser_input_fields
    layout = vsa_layout(rows["token_tags"], rows["position_ids"]).to(adapter.device)
    context = VsaContext(topk=args.vsa_topk, kernel=kernel, layout=layout)
    n = args.repeat
    with torch.compiler.set_stance("force_eager"):
        sdpa_eager = [_forward(adapter, state) for _ in range(n + 1)][1:]
    sdpa_compiled = [_forward(adapter, state) for _ in range(n)]
    install_vsa(adapter._loaded().transformer, context)
    with torch.compiler.set_stance("force_eager"):
        vsa_eager = [_forward(adapter, state) for _ in range(n + 1)][1:]
    vsa_compile_s = _forward(adapter, state)  # the blocks recompile around the kernel
    vsa_compiled = [_forward(adapter, state) for _ in range(n)]
    adapter.end()

    # the kernel against plain torch, two heads of the real layout (bf16 inputs)
    gen = torch.Generator(device=adapter.device).manual_seed(0)
    shape = (1, 2, layout.blocks * VSA_BLOCK, 128)
    real = torch.zeros(shape[2], dtype=torch.bool, device=adapter.device)
    real[layout.row_slot] = True
    q, k, v = (
        (torch.randn(shape, generator=gen, device=adapter.device) * real[:, None]).to(
            torch.bfloat16
        )
        for _ in range(3)
    )
    sizes = layout.block_sizes
    got = kernel(q, k, v, sizes, sizes, args.vsa_topk).float()[:, :, real]
    want = reference_vsa(q.float(), k.float(), v.float(), sizes, sizes, args.vsa_topk)[:, :, real]
    med = statistics.median
    return {
        "vsa_forward_ratio": round(med(vsa_compiled) / med(sdpa_compiled), 3),
        "vsa_forward_ratio_eager": round(med(vsa_eager) / med(sdpa_eager), 3),
        "vsa_forward_s": {
            "sdpa_eager": round(med(sdpa_eager), 4),
            "vsa_eager": round(med(vsa_eager), 4),
            "sdpa_compiled": round(med(sdpa_compiled), 4),
            "vsa_compiled": round(med(vsa_compiled), 4),
            "vsa_recompile_s": round(vsa_compile_s, 1),
        },
        "vsa_topk": args.vsa_topk,
        "vsa_blocks": layout.blocks,
        "vsa_kernel": kernel_name(),
        "vsa_calls": dict(context.calls),
        "vsa_kernel_check": {
            "max_abs_err": round(float((got - want).abs().max()), 4),
            "mean_abs_err": round(float((got - want).abs().mean()), 5),
            "inputs": "bf16 randn, 2 heads x 128, the job's layout; reference in float32",
        },
    }


def _cancels(adapter: Any, args: argparse.Namespace, count: int) -> list[float]:
    """Stop flags set at random moments inside a step: ms until the step raised, device
    idle (the executor's own gate path, without HTTP and the database)."""
    from workers.pipelines.base import step_stops

    class Stop(Exception):
        pass

    latencies = []
    for _ in range(count):
        state = adapter.prepare(_request(args))
        flag: list[float] = []

        def cancel(flag: list[float] = flag) -> None:
            flag.append(time.perf_counter())

        def reason(block: int, flag: list[float] = flag) -> BaseException | None:
            return Stop() if flag else None

        timer = threading.Timer(random.uniform(0.0, args.step_s * 0.8), cancel)
        timer.start()
        try:
            with step_stops(reason):
                adapter.step(state)
        except Stop:
            latencies.append((_sync() - flag[0]) * 1000)  # else the step ended first
        timer.join()
        adapter.end()
        del state
    return latencies


def _git() -> dict[str, Any]:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return {"commit": head.stdout.strip() or None}
    except OSError:
        return {"commit": None}


def _write(out: dict[str, Any]) -> str:
    """``out`` as JSON, in $OUT/gpu_h3.json too when $OUT is set."""
    text = json.dumps(out, indent=2)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_h3.json").write_text(text)
    return text


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tiny", action="store_true", help="toy sizes, for a CPU check of the script")
    p.add_argument("--width", type=int, default=448)
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--frames", type=int, default=240, help="snapped up to 17n+5 (243)")
    p.add_argument("--steps", type=int, default=5, help="sigma points (5: 4 evaluations)")
    p.add_argument("--text-layers", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--cancels", type=int, default=20)
    p.add_argument("--vsa-topk", type=int, default=64)
    p.add_argument("--no-vsa", action="store_true", help="skip the VSA measurement")
    args = p.parse_args()
    if args.tiny:
        args.width = args.height = 64
        args.frames, args.cancels, args.repeat = 124, 3, 2
    from models.catalog import FAMILY_SPECS
    from workers.pipelines.blocks import denoiser_blocks
    from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter

    spec = FAMILY_SPECS["diffusers.minimax_h3"]
    args.frames = spec.snap_frames(args.frames)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        **_git(),
        "shape": {
            "width": args.width,
            "height": args.height,
            "num_frames": args.frames,
            "fps": 24,
            "num_inference_steps": args.steps,
            "seed": 42,
        },
        "weights": "seeded random init from the default configs, bf16, built on the GPU",
        "text_encoder": f"Qwen3-VL width 5120, {args.text_layers + 1} decoder layers, read "
        f"after layer {args.text_layers} (the released one reads layer 50 of 64); runs once "
        "per job",
    }
    t = time.perf_counter()
    pipe = build_pipeline(device, args.tiny, args.text_layers)
    out["build_s"] = round(_sync() - t, 1)
    params = sum(x.numel() for x in pipe.transformer.parameters())
    out["transformer_params_b"] = round(params / 1e9, 2)
    baseline = _mib()

    # eager forward first, then the same adapter with its blocks compiled
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=spec, compile="off")
    adapter.load(device)
    state = adapter.prepare(_request(args))
    out["packed_rows"] = _rows(state)
    eager = [_forward(adapter, state) for _ in range(args.repeat + 1)][1:]
    adapter.end()
    adapter.entry = dataclasses.replace(adapter.entry, compile="blocks")
    adapter.compiler.install(pipe)
    compile_s = _forward(adapter, state)
    compiled = [_forward(adapter, state) for _ in range(args.repeat)]
    # the video VAE's decoder compiled as the worker's load and warm-up compile it
    adapter.compiler.compile_module(pipe.vae.decoder, "H3 video VAE decoder")
    t = time.perf_counter()
    adapter._compile_for(state, "warmup")
    vae_compile_s = time.perf_counter() - t
    del state
    out |= {
        "forward_eager_s": round(statistics.median(eager), 4),
        "forward_compiled_s": round(statistics.median(compiled), 4),
        "compile_s": round(compile_s, 1),
        "vae_compile_s": round(vae_compile_s, 1),
        "block_ms": round(statistics.median(compiled) / len(denoiser_blocks(pipe)) * 1000, 2),
    }
    args.step_s = statistics.median(compiled)
    print(
        json.dumps({k: out[k] for k in ("packed_rows", "forward_eager_s", "forward_compiled_s")}),
        flush=True,
    )

    with tempfile.TemporaryDirectory() as tmp:
        first = _stack(adapter, args, Path(tmp), stream=True)  # the first job after load
        gc.collect()
        warm = _mib()  # what a warm worker holds between jobs: the baseline
        raws, raws_pt, stacks, streams = [], [], [], []
        for _ in range(args.repeat):
            raws.append(_raw(pipe, args))
            raws_pt.append(_raw(pipe, args, "pt"))
            stacks.append(_stack(adapter, args, Path(tmp), stream=False))
            streams.append(_stack(adapter, args, Path(tmp), stream=True))
    gc.collect()
    after_done = _mib()
    median = sorted(streams, key=lambda s: s["total"])[len(streams) // 2]
    whole = sorted(stacks, key=lambda s: s["total"])[len(stacks) // 2]
    job = statistics.median(s["prepare"] + s["denoise"] + s["decode"] for s in stacks)
    out |= {
        "raw_pipe_s": [round(r, 3) for r in raws],
        "raw_pipe_pt_s": [round(r, 3) for r in raws_pt],
        "stack_job_s": [round(s["prepare"] + s["denoise"] + s["decode"], 3) for s in stacks],
        "h3_stack_over_raw": round(job / statistics.median(raws), 4),
        "h3_stack_over_raw_device": round(job / statistics.median(raws_pt), 4),
        "h3_stage_seconds": {k: round(v, 3) for k, v in median.items()},
        "h3_stage_seconds_unstreamed": {k: round(v, 3) for k, v in whole.items()},
        "fasth3_first_job_inprocess_s": round(first["total"], 2),
        "fasth3_inprocess_e2e_s": round(statistics.median(s["total"] for s in streams), 3),
    }
    latencies = _cancels(adapter, args, args.cancels)
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    out |= {
        "h3_cancel_ms": [round(x, 1) for x in sorted(latencies)],
        "h3_cancel_p95_ms": round(statistics.quantiles(latencies, n=20)[-1], 1)
        if len(latencies) > 1
        else None,
        "h3_memory_after_jobs_mib": {
            "after_load": round(baseline, 1),
            "baseline_after_first_job": round(warm, 1),
            "after_completed": round(after_done, 1),
            "after_cancelled": round(_mib(), 1),
            "growth_over_baseline": round(max(after_done, _mib()) - warm, 1),
        },
    }
    _write(out)  # what is measured so far, should the VSA part fail
    if args.no_vsa:
        out |= {"vsa_forward_ratio": None, "vsa_note": "not measured (--no-vsa)"}
    else:
        try:
            out |= _vsa(adapter, args)
        except Exception as exc:  # a kernel failure is a finding, reported with the rest
            out |= {"vsa_forward_ratio": None, "vsa_error": repr(exc)[:500]}
    print(_write(out))


if __name__ == "__main__":
    main()
