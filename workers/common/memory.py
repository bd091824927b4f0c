"""A worker's device memory: its cap, and what a failed job leaves referenced.

**The cap.** ``OMNIQ_WORKER__MEMORY_FRACTION`` limits this process's CUDA caching
allocator to a fraction of each of its devices (``torch.cuda.set_per_process_memory_fraction``):
an allocation past it raises ``torch.OutOfMemoryError`` as a full device would, so the
job fails ``oom`` (``workers/common/failures.py``) while other processes keep their share.
:func:`apply_memory_fraction` sets it once per worker process, before the models load
(``workers/runtime/celery_app.py``; a worker group's other ranks in ``workers/runtime/group.py``).

**What a failure keeps.** An exception's traceback references every frame it passed
through, and each frame its locals: the failed step's activations, the job's latents and
embeddings. Whatever keeps the exception (a log handler that holds its records, an
error reporter, a chained exception) keeps those tensors on the device, and
``torch.cuda.empty_cache()`` cannot give back a block that is still referenced: memory
stays above the weights' baseline after an out-of-memory. :func:`forget_frames` clears
the finished frames' locals (the traceback itself, file and line, stays printable).
"""

from __future__ import annotations

import gc
import logging
import resource
import traceback
from collections.abc import Iterable

import torch

log = logging.getLogger(__name__)


def apply_memory_fraction(fraction: float | None, devices: Iterable[str]) -> dict[str, int]:
    """Cap this process's caching allocator at ``fraction`` of each CUDA device among
    ``devices`` (before anything is allocated there). Returns the cap in bytes per device;
    a CPU device is skipped with a log line saying so."""
    if fraction is None:
        return {}
    caps: dict[str, int] = {}
    for name in dict.fromkeys(devices):
        device = torch.device(name)
        if device.type != "cuda":
            log.info("memory fraction %.2f ignored on %s (CUDA devices only)", fraction, name)
            continue
        if not torch.cuda.is_available():
            log.warning("memory fraction %.2f not applied: CUDA is not available", fraction)
            continue
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        caps[str(device)] = int(total * fraction)
        log.info(
            "%s: memory fraction %.2f of %.1f GiB: %.1f GiB",
            device,
            fraction,
            total / 2**30,
            total * fraction / 2**30,
        )
    return caps


def forget_frames(exc: BaseException) -> None:
    """Clear the locals of every finished frame in the tracebacks of ``exc`` and of the
    exceptions chained to it, so no tensor of the failed work stays referenced through
    them. Frames still running (the caller's) are left as they are."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)


__all__ = ["apply_memory_fraction", "forget_frames"]


def release_after_run(*, after_oom: bool = False, stopped: bool = False) -> None:
    """After a job's run: per-job tensors die with the state by reference counting; a
    young-generation collection catches short cycles (a full one costs ~250 ms with
    diffusers loaded). A job stopped inside a step may have left blocks queued on the
    device: wait for them, so "stopped" means the device is idle. After an OOM the
    allocator's cached blocks go back to the driver as well, so the next job starts
    unfragmented: the failed step's tensors are unreferenced by then (the executor cleared
    the frames of its traceback), so allocated memory is the weights' again."""
    gc.collect(0)
    if stopped and torch.cuda.is_available():
        torch.cuda.synchronize()
    if after_oom:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def peak_memory_mb() -> float:
    """Peak device memory of this job on CUDA; the process's peak RSS on CPU."""
    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
