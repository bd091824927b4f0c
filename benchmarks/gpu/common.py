"""What the GPU benchmark scripts share: the job shape's arguments, the run's header, the
raw ``pipe(...)`` call, the saved random-weight Wan pipeline (``random_wan.py``) and its
registry entry, the job as the adapter and as the API take it, one job timed in process,
a job followed on its event stream, a stack serving random weights, and the JSON at the
end."""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.embedded_stack import UP_TAIL_LINES, Stack, UpExited, git_state, last_lines, say
from benchmarks.gpu.random_wan import build_pipeline

MODEL = "wan-1.3b-random"
PROMPT = "a red ball bouncing over a blue ocean at sunset"


def shape_args(p: argparse.ArgumentParser, *, frames: int = 33, steps: int = 20) -> None:
    """The job shape (832x480 by default) and the model's depth."""
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--frames", type=int, default=frames)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--guidance", type=float, default=5.0)
    p.add_argument("--layers", type=int, default=30, help="of the transformer's 30 blocks")


def provenance() -> dict[str, Any]:
    """Where and from what a run came: the GPU (None without CUDA), torch's and diffusers'
    versions, the date and the commit."""
    import diffusers

    cuda = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "date": datetime.date.today().isoformat(),
        **git_state(),
    }


def header(args: argparse.Namespace) -> dict[str, Any]:
    """The machine, the versions, the date, the commit and the job shape of a run."""
    cuda = torch.cuda.is_available()
    return {
        **provenance(),
        "gpus_visible": torch.cuda.device_count() if cuda else 0,
        "shape": {
            "height": args.height,
            "width": args.width,
            "frames": args.frames,
            "steps": args.steps,
            "guidance_scale": args.guidance,
            "layers": args.layers,
            "dtype": "bfloat16",
        },
    }


def sync_time() -> float:
    """``perf_counter()`` once the device is idle."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def job_shape(args: argparse.Namespace) -> dict[str, int]:
    """The job's size, length and step count under the names that diffusers' ``pipe()``,
    ``GenerationRequest`` and ``VideoSpec`` share: the raw call and the job the executor
    runs are one shape by construction."""
    return {
        "height": args.height,
        "width": args.width,
        "num_frames": args.frames,
        "num_inference_steps": args.steps,
    }


def raw_call(pipe: Any, args: argparse.Namespace, seed: int) -> tuple[float, Any]:
    """The raw ``pipe(...)`` of the job: its wall time and frames."""
    start = sync_time()
    frames = pipe(
        PROMPT,
        **job_shape(args),
        guidance_scale=args.guidance,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
    ).frames
    return sync_time() - start, frames


def generation_request(args: argparse.Namespace, seed: int = 1, **more: Any) -> Any:
    """The job as an adapter takes it (``more``: fields in place of the job's, e.g.
    ``num_inference_steps``, ``lora``)."""
    from workers.pipelines.base import GenerationRequest

    fields = {**job_shape(args), "fps": 16, "seed": seed, "guidance_scale": args.guidance}
    return GenerationRequest.video(prompt=PROMPT, **fields | more)


def job_body(args: argparse.Namespace, **more: Any) -> dict[str, Any]:
    """The job as ``POST /v1/videos`` takes it."""
    return {
        "model": MODEL,
        "prompt": PROMPT,
        "size": f"{args.width}x{args.height}",
        "num_frames": args.frames,
        "fps": 16,
        "num_inference_steps": args.steps,
        "guidance_scale": args.guidance,
        **more,
    }


def save_wan(work: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """Build the random-weight pipeline, save it under ``work``, write a registry entry
    for it; returns (model directory, registry file)."""
    model_dir = work / MODEL
    device = "cuda" if torch.cuda.is_available() else "cpu"
    build_pipeline(device, num_layers=args.layers).save_pretrained(model_dir)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    registry = work / "models.toml"
    registry.write_text(
        f'[[model]]\nname = "{MODEL}"\nadapter = "diffusers.wan"\n'
        f'path = "{model_dir}"\ndtype = "bfloat16"\n'
        # Eager, as these scripts measured it before compiled blocks became the default on
        # CUDA; lane.py writes its own compiled entry.
        'compile = "off"\n'
    )
    return model_dir, registry


def free_memory() -> None:
    """Collect garbage and hand the allocator's cached blocks back to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def timed_job(adapter: Any, request: Any, decode: bool = True) -> dict[str, Any]:
    """One job in process: prepare, the steps (each timed), decode; then ``end``."""
    from workers.pipelines.diffusers.shared.compiled import graphs_made

    graphs = graphs_made()
    start = sync_time()
    state = adapter.prepare(request)
    prepared = sync_time()
    steps = []
    try:
        while not state.done:
            t = sync_time()
            adapter.step(state)
            steps.append(sync_time() - t)
        denoised = sync_time()
        latents = state.latents.float().cpu()
        frames = adapter.decode_frames(state) if decode else None
    finally:
        adapter.end()
    return {
        "prepare_s": prepared - start,
        "denoise_s": denoised - prepared,
        "step_s": steps,
        "latents": latents,
        "frames": frames,
        "graphs_made": graphs_made() - graphs,
        "recompiles": adapter.last_recompiles,
    }


def follow_events(client: Any, vid: str, on_progress: Any = None) -> dict[str, Any]:
    """Read the job's SSE stream until its ``done`` event; returns that event."""
    with client.stream("GET", f"/v1/videos/{vid}/events", timeout=None) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event.get("type") == "progress" and on_progress is not None:
                on_progress(event)
            if event.get("type") == "done":
                return dict(event)
    raise RuntimeError(f"the event stream of {vid} ended without done")


def completed_job(client: Any, **post: Any) -> tuple[float, str, int]:
    """``POST /v1/videos`` with ``post`` (``json=`` or ``data=``), its event stream followed
    to ``done``, its MP4s downloaded (each of its ``n``): (client wall seconds, job id,
    MP4 bytes). Raises
    unless the job completed."""
    start = time.perf_counter()
    resp = client.post("/v1/videos", **post)
    resp.raise_for_status()
    vid = resp.json()["id"]
    done = follow_events(client, vid)
    if done.get("status") != "completed":
        raise RuntimeError(f"{vid}: {done}")
    size = 0
    for index in range(int(post.get("json", post.get("data", {})).get("n", 1))):
        content = client.get(f"/v1/videos/{vid}/content", params={"index": index})
        content.raise_for_status()
        size += len(content.content)
    return time.perf_counter() - start, vid, size


def cancel_in_step(
    client: Any, canceller: Any, logs: Any, vid: str, after_step: int, delay: float
) -> dict[str, Any]:
    """Follow job ``vid``'s events; ``delay`` s into denoise step ``after_step``, send
    ``POST /v1/videos/{id}/cancel`` on ``canceller`` (a warm connection); then read up's
    log (``logs``, an embedded_stack.LogWatcher) for the worker's release. The record:
    cancel → worker stopped (its ``job …: cancelled`` line, logged after cleanup), → the
    stop noticed inside the step, where (step, block), and the HTTP round trip."""
    sent: list[float] = []
    answered: list[float] = []

    def on_progress(event: dict[str, Any]) -> None:
        if sent or event.get("stage") != "denoise" or event.get("step", 0) < after_step:
            return
        time.sleep(delay)
        sent.append(time.time())
        canceller.post(f"/v1/videos/{vid}/cancel").raise_for_status()
        answered.append(time.time())

    follow_events(client, vid, on_progress)
    released = logs.wait_released(vid, timeout=120)
    logs.poll()
    stop = logs.stopped_in_step.get(vid)

    def ms(at: float | None) -> float | None:
        return round((at - sent[0]) * 1000, 1) if at is not None and sent else None

    return {
        "after_step": after_step,
        "delay_ms": round(delay * 1000, 1),
        "outcome": released[1] if released else None,
        "cancel_to_worker_stopped_ms": ms(released[0] if released else None),
        "cancel_to_noticed_ms": ms(stop[0] if stop else None),
        "stopped_at": {"step": stop[1], "block": stop[2]} if stop else None,
        "cancel_round_trip_ms": ms(answered[0] if answered else None),
    }


def emit(out: dict[str, Any], name: str, *, partial: bool = False) -> None:
    """Print the run's JSON, and write it to ``$OUT/<name>.json`` when OUT is set
    (``partial``: only written, what a run has so far, kept if it is killed later)."""
    text = json.dumps(out, indent=2)
    if not partial:
        print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{name}.json").write_text(text)


def random_weights_stack(
    work: Path,
    registry: str,
    model: str,
    device: str,
    workers: int,
    log_path: Path | None = None,
) -> Stack:
    """``omniqueue up`` (not started yet) serving ``model`` of the registry text
    ``registry`` (written to ``work``) with random weights (``OMNIQ_WORKER__RANDOM_WEIGHTS``):
    ``workers`` job workers on ``device``, no realtime worker, no previews; up's log
    written to ``log_path`` as it runs (:func:`up_log_path`)."""
    path = work / "models.toml"
    path.write_text(registry)
    env = {
        "OMNIQ_MODEL_REGISTRY": str(path),
        "OMNIQ_MODELS": model,
        "OMNIQ_WORKER__DEVICE": device,
        "OMNIQ_WORKER__RANDOM_WEIGHTS": "true",
        "OMNIQ_WORKER__PREVIEW_EVERY": "0",
    }
    return Stack(workers=workers, env=env, args=("--realtime-workers", "0"), log_path=log_path)


def up_log_path(name: str, given: str | None = None) -> Path | None:
    """Where a run's up log is written as it runs: ``given``, else ``$OUT/<name>`` when OUT
    is set (what a GPU call brings back even when it is killed at its time limit), else
    None (the stack's own directory)."""
    if given:
        return Path(given)
    return Path(os.environ["OUT"], name) if os.environ.get("OUT") else None


def up_failure(out: dict[str, Any], exc: BaseException, stack: Stack, label: str) -> None:
    """A run that failed: its error (the first line, short) and up's last lines in ``out``
    (``up_log_tail``, a list), those printed to stderr too unless up's watcher already did
    (up exited on its own: ``UpExited``), so that a run that timed out says where the
    worker stood."""
    first = (str(exc).splitlines() or [""])[0]
    out["error"] = f"{type(exc).__name__}: {' '.join(first.split())[:600]}"
    tail = last_lines(stack.log_path)
    out["up_log_tail"] = tail.splitlines()
    if not isinstance(exc, UpExited):
        say(
            f"{label}: {out['error']}; the last {UP_TAIL_LINES} lines of up's log "
            f"({stack.log_path}):\n{tail}\n(end of up's log)"
        )
