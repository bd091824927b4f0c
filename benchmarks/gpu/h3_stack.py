"""FastH3 through the whole stack on one GPU: ``omniqueue up`` (Valkey, SQLite, SeaweedFS,
the API, one GPU worker) serving a MiniMax-H3 registry entry as a deployment would, jobs
sent as vLLM-Omni's ComfyUI node sends them, followed on their event stream and downloaded.

    python -m benchmarks.gpu.h3_stack [--jobs 3] [--cancels 10] [--quantization fp8]
        [--fp8-modulation] [--offload none|model|group] [--offload-budget-gib N]
        [--attention sdpa|cudnn]
    python -m benchmarks.gpu.h3_stack --print-registry [...]   # the entry, run nothing

The entry (written to a temporary registry file):

* ``weights = "random"``: the 33.1 B transformer and the rest built from the default configs
  with a seeded random init on the GPU (minimax_h3/random_weights.py; the
  device's disk cannot hold the checkpoint), allowed by ``OMNIQ_WORKER__RANDOM_WEIGHTS``;
  the text encoder keeps its width but not its depth (``--text-layers``);
* FastH3's deployment: a LoRA (rank ``--lora-rank`` on every attention's q/k/v, random,
  made here) fused at start-up against its pinned sha256; its steps counted as transformer
  evaluations (``steps = "evaluations"``), 4 as the node sends them (the schedule of 5
  sigma points), no CFG;
* compiled blocks, warmed up at the qualification shape before the worker takes jobs.

Keys of the JSON (also ``$OUT/gpu_h3_stack.json``):

* ``worker_ready_s``: ``up`` started → the Celery worker's ``ready.`` line (load, fuse,
  warm-up compile);
* ``fasth3_first_job_s``: the first job after that line, client POST → MP4 downloaded;
* ``fasth3_warm_e2e_s``: median of ``--jobs`` more, same measure; ``jobs`` has each one's
  wall time and the job object's ``stage_durations`` (upload included);
  ``h3_stage_seconds`` the median of each stage over those jobs (``decode`` holds the
  encode it overlaps: the MP4 is written while the VAE decodes);
* ``h3_cancel_p95_ms``: ``POST /v1/videos/{id}/cancel`` sent at a random moment of a random
  denoise step → the worker's ``job …: cancelled`` line (logged after its cleanup, the
  device idle); ``cancels`` has each one, with the step and block it stopped before;
* ``h3_memory_after_jobs_mib``: the worker's ``memory_allocated()`` after each job;
* ``encode_note``: the MP4 encode of these noise frames against a smooth clip of the same
  shape (x264's time grows with what it must keep: random weights make noise);
* ``h3_resident_mib``: the worker's ``omniqueue_gpu_memory_allocated_bytes`` once ready
  (``/metrics``), ``h3_peak_mib`` the most any job held (its ``peak_memory_mb``),
  ``model_memory`` ``/v1/models``' ``memory`` of the entry (the plan, the FP8 report).

The memory plan (issue 44): ``--quantization fp8``, ``--offload`` and
``--offload-budget-gib`` go into the entry as its ``quantization``, ``offload`` and
``offload_budget_gib`` (and the JSON's, with the run's file named after them:
``gpu_h3_stack_fp8.json``…). ``offload = "group"`` takes ``--compile off`` (the registry
refuses it with compiled blocks; FP8 combines with it), ``model`` is refused on H3's
modular pipeline: an entry a worker would refuse fails before ``omniqueue up`` starts,
with the worker's reason (``plans.refusal``). With FP8 the figures are also written under
issue 44's names, with its targets in ``targets``: ``fasth3_fp8_warm_e2e_s`` (=
``fasth3_warm_e2e_s``, ≤ 3.0 s) and ``h3_fp8_transformer_gib`` (the transformer's weights
held: its loaded size, from a meta-device build of the same config, less the FP8 bytes
saved that ``/v1/models`` reports). ``--fp8-modulation`` (with ``--quantization fp8``)
puts ``fp8_modulation = true`` in the entry: the 50 joint blocks' ``adaln_proj.linear``
FP8 weight-only too (counted in ``model_memory``'s ``fp8_weight_only_modules``, their
bytes in ``bytes_saved`` and so in ``h3_fp8_transformer_gib``); the JSON's
``fp8_modulation`` says so and the file is ``gpu_h3_stack_fp8_modulation.json``.
``--fp8-components transformer,vae`` (with ``--quantization fp8``) writes the entry's
per-component form, ``quantization = {transformer = "fp8", vae = "fp8"}``: the video VAE's
ViT decoder blocks' Linear layers FP8 too, by the same rule (an A/B of the decode's time;
measure its frames with ``fp8.sh --fp8-components`` before serving it); the file is
``gpu_h3_stack_fp8_vae.json``, and ``h3_fp8_transformer_gib`` is left out (the bytes saved
are the components' together).

``--attention cudnn`` puts ``attention = "cudnn"`` in the entry (every attention of the
transformer through cuDNN's fused attention; ``shared/attention.py``), for an A/B against
the default dispatch on the same host: the JSON's ``attention`` says which, and the run's
file is named after it (``gpu_h3_stack_cudnn.json``, ``gpu_h3_stack_fp8_cudnn.json``).

up's log is written as it runs to ``--keep-log`` (default ``$OUT/up_h3_stack.log``). A
worker not loaded within ``--ready-timeout`` (240 s), or up exiting, ends the run with
``error`` and ``up_log_tail`` (up's last 40 lines, printed to stderr too) in the JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import pct
from benchmarks.embedded_stack import LogWatcher, git_state
from benchmarks.gpu.common import (
    cancel_in_step,
    completed_job,
    emit,
    random_weights_stack,
    up_failure,
    up_log_path,
)
from benchmarks.gpu.plans import (
    attention_args,
    check_memory_args,
    gauge_mib,
    memory_args,
    mode_suffix,
    model_memory,
    plan_fields,
    plan_toml,
    refusal,
)

MODEL = "MiniMaxAI/MiniMax-H3/FastH3"
PROMPT = "a red kite over a green hill at dusk, wind in the grass, a dog barks once"[:70]


def make_lora(path: Path, rank: int, transformer: dict[str, Any], seed: int = 7) -> str:
    """A random LoRA on every q/k/v projection of the H3 transformer (default config, or
    ``transformer``'s overrides), saved as diffusers saves one; its sha256. Shapes come
    from a meta-device model (no weights)."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    with torch.device("meta"):
        model: Any = MiniMaxH3Transformer3DModel(**transformer)
        model.add_adapter(
            LoraConfig(r=rank, lora_alpha=rank, target_modules=["to_q", "to_k", "to_v"])
        )
    shapes = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        f"transformer.{k}": (torch.randn(shape, generator=gen) * 1e-3).to(torch.bfloat16)
        for k, shape in shapes.items()
    }
    save_file(tensors, str(path))
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def inline_toml(value: Any) -> str:
    """``value`` as a TOML inline value (tables, arrays, strings, numbers, booleans)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {inline_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(inline_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def registry_text(args: argparse.Namespace, lora: Path | None, sha256: str = "") -> str:
    """The FastH3 entry (``lora`` None: its schedule without the fused LoRA, whose
    weights change nothing the device does)."""
    fused = f'[model.adapter_options.fused_lora]\npath = "{lora}"\nsha256 = "{sha256}"\n'
    return f"""
[[model]]
name = "{MODEL}"
adapter = "diffusers.minimax_h3"
weights = "random"
dtype = "{args.dtype}"
compile = "{args.compile}"
{plan_toml(args)}[[model.warmup]]
width = {args.width}
height = {args.height}
num_frames = {args.frames}
[model.adapter_options]
steps = "evaluations"
random_text_layers = {args.text_layers}
random_config = {inline_toml(args.random_config)}
{fused if lora is not None else ""}[model.spec]
min_steps = 4
max_steps = 4
default_steps = 4
no_cfg = true
{args.spec_toml}
"""


def node_form(args: argparse.Namespace, seed: int) -> dict[str, str]:
    """The ComfyUI node's FastH3 t2va request: every field a string, 4 steps."""
    return {
        "model": MODEL,
        "prompt": PROMPT,
        "size": f"{args.width}x{args.height}",
        "seconds": str(args.seconds),
        "num_inference_steps": "4",
        "seed": str(seed),
        "guidance_scale": "1.0",
        "vae_use_tiling": "false",
        "n": "1",
        "extra_params": json.dumps({"task": "t2va"}),
    }


def encode_comparison(args: argparse.Namespace, frames: int) -> dict[str, float]:
    """x264 + AAC time of a noise clip (what random weights decode to) and of a smooth
    one, same shape and audio."""
    from workers.media.mp4 import encode_mp4
    from workers.pipelines.base import Media

    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (frames, args.height, args.width, 3), dtype=np.uint8)
    x = np.linspace(0, 1, args.width, dtype=np.float32)[None, None, :, None]
    t = np.linspace(0, 1, frames, dtype=np.float32)[:, None, None, None]
    smooth = np.broadcast_to((np.sin(6 * x + 3 * t) * 0.5 + 0.5) * 255, noise.shape)
    audio = (rng.standard_normal((2, frames * 32000 // 24)) * 0.1).astype(np.float32)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, pixels in (("noise", noise), ("smooth", smooth.astype(np.uint8))):
            media = Media(frames=pixels, fps=24.0, audio=audio, sample_rate=32000)
            start = time.perf_counter()
            encode_mp4(media, Path(tmp) / f"{name}.mp4")
            out[f"encode_{name}_s"] = round(time.perf_counter() - start, 3)
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import httpx

    lora = work / "fasth3-random.safetensors"
    if (why := refusal(registry_text(args, lora, "0" * 64), MODEL, args.device)) is not None:
        return {"fasth3_warm_e2e_s": None, "error": f"refused before up: {why}"}
    t = time.perf_counter()
    sha256 = make_lora(lora, args.lora_rank, args.random_config.get("transformer", {}))
    out: dict[str, Any] = {
        "lora": {
            "rank": args.lora_rank,
            "bytes": lora.stat().st_size,
            "made_s": round(time.perf_counter() - t, 1),
        }
    }
    log = up_log_path("up_h3_stack.log", args.keep_log)
    registry = registry_text(args, lora, sha256)
    stack = random_weights_stack(work, registry, MODEL, args.device, 1, log)
    started = time.time()
    logs = LogWatcher(stack.log_path, stack.check)
    try:
        stack.start(timeout=args.ready_timeout)  # up is up once its worker has loaded
        ready = stack.workers_ready(1, args.ready_timeout)
        out["worker_ready_s"] = round(ready - started, 1)
        out |= loaded_memory(stack, args)
        with (
            httpx.Client(base_url=stack.url, timeout=900) as client,
            httpx.Client(base_url=stack.url, timeout=60) as canceller,
        ):
            canceller.get("/health").raise_for_status()

            def job(seed: int) -> tuple[float, dict[str, Any], int]:
                wall, vid, size = completed_job(client, data=node_form(args, seed))
                return wall, client.get(f"/v1/videos/{vid}").json(), size

            wall, row, size = job(42)
            out["fasth3_first_job_s"] = round(wall, 2)
            out["first_job"] = {"stage_durations": row.get("stage_durations"), "mp4_bytes": size}
            jobs = [job(42) for _ in range(args.jobs)]
            out["jobs"] = [
                {
                    "client_wall_s": round(w, 3),
                    "mp4_bytes": n,
                    "stage_durations": r["stage_durations"],
                }
                for w, r, n in jobs
            ]
            out["fasth3_warm_e2e_s"] = round(statistics.median(w for w, _, _ in jobs), 3)
            out["h3_stage_seconds"] = stage_medians([r["stage_durations"] for _, r, _ in jobs])
            rows = [row, *(r for _, r, _ in jobs)]
            peaks = [float(r["peak_memory_mb"]) for r in rows if r.get("peak_memory_mb")]
            out["h3_peak_mib"] = max(peaks) if peaks else None
            out["size"] = jobs[0][1].get("size")
            out["seconds"] = jobs[0][1].get("seconds")
            step_s = statistics.median(
                r["stage_durations"]["denoise"] / 4 for _, r, _ in jobs if r.get("stage_durations")
            )
            out["cancels"] = cancels(client, canceller, logs, args, step_s)
            stopped = [c["cancel_to_worker_stopped_ms"] for c in out["cancels"]]
            stopped = [x for x in stopped if x is not None]
            out["h3_cancel_p95_ms"] = round(pct(stopped, 0.95), 1) if stopped else None
            logs.poll()
            out["h3_memory_after_jobs_mib"] = dict(logs.cuda_allocated_mib)
    except Exception as exc:
        up_failure(out, exc, stack, "h3_stack")
    finally:
        stack.close(out)
    return out


def transformer_gib(args: argparse.Namespace) -> float:
    """The H3 transformer's weights in the entry's dtype (GiB): a meta-device build of the
    config the random weights use (no memory, no time)."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    from workers.pipelines.diffusers.shared.loading import parse_dtype

    with torch.device("meta"):
        model: Any = MiniMaxH3Transformer3DModel(**args.random_config.get("transformer", {}))
    dtype = parse_dtype(args.dtype)
    size = torch.empty((), dtype=dtype).element_size()
    return sum(p.numel() for p in model.parameters()) * size / 2**30


def loaded_memory(stack: Any, args: argparse.Namespace) -> dict[str, Any]:
    """What the worker holds once ready, and what it did with the plan (the keys of the
    module doc)."""
    listed = model_memory(stack, MODEL)
    out: dict[str, Any] = {
        "h3_resident_mib": gauge_mib(stack, "omniqueue_gpu_memory_allocated_bytes", "worker")
        or None,
        "model_memory": listed,
    }
    saved = ((listed or {}).get("memory") or {}).get("bytes_saved")
    only_transformer = args.fp8_components in (None, ["transformer"])  # saved: it alone
    if args.quantization == "fp8" and saved is not None and only_transformer:
        out["h3_fp8_transformer_gib"] = round(transformer_gib(args) - saved / 2**30, 2)
    return out


def fp8_targets(out: dict[str, Any]) -> dict[str, Any]:
    """Issue 44's H3 keys of an FP8 run, and their targets."""
    e2e = out.get("fasth3_warm_e2e_s")
    gib = out.get("h3_fp8_transformer_gib")
    return {
        "fasth3_fp8_warm_e2e_s": e2e,
        "targets": {
            "fasth3_fp8_warm_e2e_s": {
                "value": e2e,
                "target": "<= 3.0",
                "pass": e2e <= 3.0 if isinstance(e2e, int | float) else None,
            },
            "h3_fp8_transformer_gib": {"value": gib, "target": "report", "pass": None},
        },
    }


def cancels(
    client: Any, canceller: Any, logs: LogWatcher, args: argparse.Namespace, step_s: float
) -> list[dict[str, Any]]:
    """``--cancels`` jobs, each cancelled at a random moment of a random denoise step."""
    rng = random.Random(11)
    found = []
    for i in range(args.cancels):
        target = rng.randint(1, 3)
        delay = rng.uniform(0.0, step_s)
        resp = client.post("/v1/videos", data=node_form(args, 100 + i))
        resp.raise_for_status()
        vid = resp.json()["id"]
        found.append(cancel_in_step(client, canceller, logs, vid, target, delay))
    return found


def stage_medians(durations: list[dict[str, float]]) -> dict[str, float]:
    """The median of each stage over the jobs' ``stage_durations``."""
    stages = sorted({stage for d in durations for stage in d})
    return {
        stage: round(statistics.median(d[stage] for d in durations if stage in d), 3)
        for stage in stages
    }


def shape_args(p: argparse.ArgumentParser) -> None:
    """The job's shape, the model's build and the stack's timeouts (h3_frontier.py's too)."""
    p.add_argument("--width", type=int, default=448)
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--seconds", type=int, default=10, help="snapped to 17n+5 frames at 24 fps")
    p.add_argument("--text-layers", type=int, default=4)
    # up to "is up" (the worker loaded): H3 is ready in 30-80 s; well under a GPU call's
    # 10 minutes, so that a load that hangs ends with up's last lines
    p.add_argument("--ready-timeout", type=float, default=240.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--toy",
        action="store_true",
        help="h3_random.TOY_CONFIG on the CPU (float32, no compile, 64x64): checks this script",
    )


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """``--toy``'s sizes and the job's frames (``args.frames``), in place."""
    args.random_config, args.spec_toml = {}, ""
    if args.toy:
        from workers.pipelines.diffusers.minimax_h3.random_weights import TOY_CONFIG

        args.random_config = TOY_CONFIG
        args.spec_toml = "canvas_short_edge = 64\ncanvas_max_pixels = 8192"
        args.device, args.dtype, args.compile = "cpu", "float32", "off"
        args.width = args.height = 64
        args.seconds, args.lora_rank = 6, 2

    from models.catalog import FAMILY_SPECS

    args.frames = FAMILY_SPECS["diffusers.minimax_h3"].snap_frames(args.seconds * 24)
    return args


def header(args: argparse.Namespace) -> dict[str, Any]:
    """The GPU, the plan, the date and commit, the shape and the build of a run."""
    import torch

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        **plan_fields(args),
        "date": time.strftime("%Y-%m-%d"),
        **git_state(),
        "shape": {"width": args.width, "height": args.height, "num_frames": args.frames},
        "weights": f"seeded random init from the {'toy' if args.toy else 'default'} configs, "
        f"{args.dtype}, built on {args.device} (registry weights = 'random')",
        "text_encoder": f"Qwen3-VL {'toy' if args.toy else 'width 5120'}, "
        f"{args.text_layers + 1} decoder layers, read after layer {args.text_layers} (the "
        "released one reads layer 50 of 64); runs once per job",
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    shape_args(p)
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--jobs", type=int, default=3, help="warm jobs after the first (median)")
    p.add_argument("--cancels", type=int, default=10)
    p.add_argument(
        "--keep-log", default=None, help="write up's stderr here as it runs ($OUT/up_h3_stack.log)"
    )
    p.add_argument("--compile", default="blocks", choices=("blocks", "off"))
    memory_args(p, offload=True, modulation=True, components=True)
    attention_args(p)
    p.add_argument("--print-registry", action="store_true", help="print the entry, run nothing")
    args = resolve(p.parse_args())
    check_memory_args(p, args)
    if args.print_registry:
        print(registry_text(args, Path("fasth3-random.safetensors"), "0" * 64))
        return
    out = header(args)
    with tempfile.TemporaryDirectory() as tmp:
        out |= run(args, Path(tmp))
    if "error" not in out:
        out["encode_note"] = encode_comparison(args, args.frames)
    if args.quantization == "fp8":
        out |= fp8_targets(out)
    emit(out, "gpu_h3_stack" + mode_suffix(args))


if __name__ == "__main__":
    main()
