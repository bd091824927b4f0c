"""One side of benchmarks/gpu/fp8_quality.py: a registry entry loaded as a worker loads it
(``PipelineRegistry``: the memory plan's refusals, the device check, FP8 and offload
applied, the worker's report), then one job (``prepare`` -> ``step`` x N -> ``decode``)
or one world session (``start`` -> ``step`` ... ``take_chunk`` per chunk) at a fixed seed,
with the latents after every step kept on the host, the decoded uint8 frames, the step
times and the device memory (the whole process's, and the ``transformer*`` components'
weights on the device: ``transformer_gib``); and what compares two sides (latent cosine
similarity per step, frames' PSNR)."""

from __future__ import annotations

import gc
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from models.model_spec import QualityTier
from models.registry import ServedModel

PROMPT = "a red ball bouncing over a blue ocean at sunset"
SEED = 42


@dataclass
class Shape:
    """What each side makes: a job's size, frames and steps, or a session's chunks."""

    width: int
    height: int
    frames: int
    steps: int
    chunks: int = 1
    quality: QualityTier = "lossless"


@dataclass
class Side:
    """What one side made, or why its model did not load."""

    label: str
    refused: str | None = None
    latents: list[torch.Tensor] = field(default_factory=list)  # float32, host
    frames: np.ndarray | None = None  # uint8 T x H x W x 3
    step_s: list[float] = field(default_factory=list)
    load_s: float = 0.0
    resident_mib: float | None = None  # device memory held once loaded
    transformer_gib: float | None = None  # the transformer* weights on the device, loaded
    peak_mib: float | None = None  # the most held while the job ran
    after_mib: float | None = None  # held once the job is done (against resident_mib)
    report: dict[str, Any] | None = None  # the worker's MemoryReport
    probes: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The side as the JSON lists it (no tensors)."""
        if self.refused is not None:
            return {"refused": self.refused}
        steps = sorted(self.step_s)
        return {
            "load_s": round(self.load_s, 2),
            "step_s_median": round(steps[len(steps) // 2], 4) if steps else None,
            "resident_mib": self.resident_mib,
            "transformer_gib": self.transformer_gib,
            "peak_mib": self.peak_mib,
            "after_mib": self.after_mib,
            "memory_report": self.report,
            **self.probes,
        }


def _sync() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def _mib(value: int) -> float:
    return round(value / 2**20, 1)


def _latents(state: Any) -> torch.Tensor:
    """What a step updates: a job's (or session's chunk's) latents, with H3's packed
    audio latents after its video ones."""
    block_state = getattr(state, "block_state", None)
    if block_state is not None:
        parts = [block_state.latents, block_state.audio_latents]
        return torch.cat([p.detach().float().flatten() for p in parts]).cpu()
    return state.latents.detach().float().cpu()


def _request(entry: ServedModel, shape: Shape) -> Any:
    from workers.pipelines.base import GenerationRequest

    return GenerationRequest.video(
        prompt=PROMPT,
        width=shape.width,
        height=shape.height,
        num_frames=entry.spec.snap_frames(shape.frames),
        fps=float(entry.spec.default_fps),
        num_inference_steps=shape.steps,
        seed=SEED,
        quality=shape.quality,
    )


def _world_config(entry: ServedModel, shape: Shape) -> Any:
    from workers.pipelines.base import WorldConfig

    per_chunk = entry.spec.frame_multiple or entry.spec.frame_offset
    return WorldConfig(
        prompt=PROMPT,
        width=shape.width,
        height=shape.height,
        num_frames=per_chunk * shape.chunks,
        fps=float(entry.spec.default_fps),
        seed=SEED,
        steps_per_chunk=shape.steps,
    )


def run_side(
    label: str,
    entry: ServedModel,
    device: str,
    shape: Shape,
    *,
    cancel: bool = False,
    warm: bool = False,
) -> Side:
    """Load ``entry`` on ``device`` as a worker does and run one job or session of
    ``shape``; a model the worker refuses gives a side with only the reason. ``cancel``:
    first stop a step at its third block (the cancel gate), as a cancel would, and say
    where it stopped (the job then runs from the start). ``warm``: one untimed job or
    session of the same shape first (compiled blocks make their graphs there, so the
    timed one's steps are the steady state's)."""
    from workers.pipelines.registry import PipelineRegistry

    side = Side(label)
    registry = PipelineRegistry({entry.name: entry}, device, random_weights=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = _sync()
    failed = registry.load_each()
    if entry.name in failed:
        side.refused = failed[entry.name].reason
        return side
    side.load_s = _sync() - start
    report = registry.memory.get(entry.name)
    side.report = report.model_dump() if report is not None else None
    adapter = registry.get(entry.name)
    side.transformer_gib = transformer_gib(adapter, device)
    if torch.cuda.is_available():
        side.resident_mib = _mib(torch.cuda.memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    try:
        if warm:
            began = _sync()
            _run(adapter, entry, shape, Side(f"{label} warm-up"))
            side.probes["warm_up_s"] = round(_sync() - began, 2)
        if cancel and entry.spec.kind != "world":
            side.probes["cancel"] = _cancel_probe(adapter, _request(entry, shape))
        _run(adapter, entry, shape, side)
        if torch.cuda.is_available():
            side.after_mib = _mib(torch.cuda.memory_allocated())
    finally:
        if torch.cuda.is_available():
            side.peak_mib = _mib(torch.cuda.max_memory_allocated())
            torch.cuda.set_per_process_memory_fraction(1.0)
        del adapter, registry
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return side


def transformer_gib(adapter: Any, device: str) -> float | None:
    """The weights (parameters and buffers) of the adapter's ``transformer*`` components
    that are on ``device`` (offloaded ones are not), FP8 ones as held (their float8 data
    and scales), in GiB; None for an adapter without a diffusers pipeline."""
    from workers.pipelines.diffusers.shared.offload import modules_of

    pipe = getattr(adapter, "pipe", None)
    if pipe is None:
        return None
    held = 0
    for name, module in modules_of(pipe).items():
        if name.startswith("transformer"):
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                if tensor.device.type == torch.device(device).type:
                    held += tensor_bytes(tensor)
    return round(held / 2**30, 4)


def tensor_bytes(tensor: torch.Tensor) -> int:
    """What ``tensor`` holds: a plain tensor's elements at its element size, a tensor
    subclass's (torchao's FP8 weights: float8 data and float32 scales) its inner
    tensors' (its own element size is the dtype it stands for)."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:
        names, _ = flatten()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def _run(adapter: Any, entry: ServedModel, shape: Shape, side: Side) -> None:
    """One job or session of ``shape``, as the entry's kind is."""
    if entry.spec.kind == "world":
        _run_world(adapter, entry, shape, side)
    else:
        _run_job(adapter, _request(entry, shape), side)


def _run_job(adapter: Any, request: Any, side: Side) -> None:
    from workers.pipelines.diffusers.shared.compiled import graphs_made

    state = adapter.prepare(request)
    graphs = graphs_made()
    try:
        while not state.done:
            t = _sync()
            adapter.step(state)
            side.step_s.append(_sync() - t)
            side.latents.append(_latents(state))
        side.frames = np.asarray(adapter.decode(state).frames)
    finally:
        adapter.end()
    side.probes["graphs_made_while_denoising"] = graphs_made() - graphs


def _run_world(adapter: Any, entry: ServedModel, shape: Shape, side: Side) -> None:
    from workers.pipelines.diffusers.shared.compiled import graphs_made

    state = adapter.start(_world_config(entry, shape))
    graphs = graphs_made()
    chunks = []
    for _ in range(adapter.num_chunks(state)):
        while not adapter.chunk_done(state):
            t = _sync()
            adapter.step(state)
            side.step_s.append(_sync() - t)
            side.latents.append(_latents(state))
        chunks.append(np.asarray(adapter.take_chunk(state)))
    side.frames = np.concatenate(chunks)
    side.probes["graphs_made_while_denoising"] = graphs_made() - graphs


class _Stopped(Exception):
    """The probe's stop, raised by the cancel gate before a block."""


def _cancel_probe(adapter: Any, request: Any) -> dict[str, Any]:
    """A stop at the third block of the second step, as the executor's cancel question
    answers it: which blocks asked, and whether it stopped there."""
    from workers.pipelines.base import step_stops

    asked: list[int] = []

    def stop(block: int) -> BaseException | None:
        asked.append(block)
        return _Stopped() if block == 3 else None

    state = adapter.prepare(request)
    stopped = False
    try:
        adapter.step(state)
        t = _sync()
        with step_stops(stop):
            try:
                adapter.step(state)
            except _Stopped:
                stopped = True
        stop_ms = (_sync() - t) * 1000
    finally:
        adapter.end()
    return {"stopped": stopped, "blocks_asked": asked, "step_to_stop_ms": round(stop_ms, 1)}


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two latents (flattened, float64)."""
    x, y = a.double().flatten(), b.double().flatten()
    return float(torch.dot(x, y) / (x.norm() * y.norm()).clamp_min(1e-30))


def psnr(a: np.ndarray, b: np.ndarray) -> float | None:
    """PSNR of two uint8 videos in dB; None where they are identical (infinite)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return None if mse == 0 else round(10 * math.log10(255.0**2 / mse), 2)


def compare(base: Side, other: Side) -> dict[str, Any]:
    """``other`` against ``base``: per-step latent cosine similarity, its minimum, the
    largest latent difference, the frames' PSNR, and the memory and time it changes."""
    if base.refused is not None or other.refused is not None:
        return {"compared": False}
    cos = [round(cosine(a, b), 6) for a, b in zip(base.latents, other.latents, strict=True)]
    diff = max(float((a - b).abs().max()) for a, b in zip(base.latents, other.latents, strict=True))
    out: dict[str, Any] = {
        "latent_cosine_per_step": cos,
        "latent_cosine_min": min(cos),
        "latent_max_abs_diff": round(diff, 6),
        "frames_psnr_db": psnr(base.frames, other.frames)
        if base.frames is not None and other.frames is not None
        else None,
    }
    if base.resident_mib is not None and other.resident_mib is not None:
        out["resident_mib_saved"] = round(base.resident_mib - other.resident_mib, 1)
    if base.transformer_gib is not None and other.transformer_gib is not None:
        out["transformer_gib_saved"] = round(base.transformer_gib - other.transformer_gib, 4)
    if base.step_s and other.step_s:
        b, o = sorted(base.step_s), sorted(other.step_s)
        out["step_speedup"] = round(b[len(b) // 2] / o[len(o) // 2], 3)
    return out
