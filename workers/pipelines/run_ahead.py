"""How far the host may queue work ahead of the device, bounded at each cancel point.

CUDA kernels are queued asynchronously: without a bound, the host queues a whole denoise
step, or a whole VAE decode, within milliseconds, and a stop it then notices "at block 3"
or "at the decoder's next layer" still leaves every kernel queued behind it to run before
the session or job can report stopped and free its tensors. The H100's FP8 Helios run
saw stops in the VAE decode 104-110 ms after the close against 25-34 ms in the
denoiser, whose gates were already bounded.

:class:`RunAhead` is that bound, one object per sequence of cancel points: at each point
the host records a CUDA event on the stream, then waits until the device has reached the
event recorded ``lookahead`` points back, asking the stop question meanwhile. A stop
then leaves at most ``lookahead + 1`` pieces of queued work, the one the device is in
among them.
Two users, one logic:

* the denoiser's per-block gates (:class:`~workers.pipelines.blocks.BlockGate`);
* the cancel points inside prepare and decode (the forward pre-hooks on every text
  encoder, VAE and vocoder block, ``workers/pipelines/diffusers/shared/loading.py``),
  through :func:`pace_checkpoint`, which keeps one :class:`RunAhead` per thread.

On the CPU nothing is queued (each kernel runs as it is called), so nothing is paced.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

# How long the host sleeps between polls of an event (the poll is also when a stop is
# noticed while the host waits for the device).
POLL_S = 0.0002

# The cancel points' lookahead. A VAE's blocks are finer and far less even than a
# denoiser's: Wan's decoder (Helios's) has 22 per latent frame, from 0 (an up block's
# hook right before its first resnet's) to ~7.5 ms (a resnet at full resolution, 640x384
# on an H100), median ~0.5 ms. 3 keeps a few ms queued at the small ones through a GIL
# switch, and at most ~22 ms at the large ones (docs/PERFORMANCE.md, issue 43's stop).
# The default of ``OMNIQ_WORKER__CHECKPOINT_LOOKAHEAD``, which :func:`configure_checkpoints`
# applies at a worker's start.
CHECKPOINT_LOOKAHEAD = 3


class DeviceEvent(Protocol):
    """What :class:`RunAhead` needs of a CUDA event (a fake one in the unit tests)."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...


class RunAhead:
    """The host's run-ahead of the device, bounded at each cancel point (module doc)."""

    def __init__(
        self,
        lookahead: int,
        event: Callable[[], DeviceEvent] = torch.cuda.Event,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.lookahead = lookahead  # points the host may be ahead (a benchmark sets it)
        self._event = event
        self._sleep = sleep
        self._marks: deque[DeviceEvent] = deque()

    def clear(self) -> None:
        """Forget the marks so far (a new step). Marks of earlier work need no clearing to
        be correct, since they have landed or precede what comes next on the stream."""
        self._marks.clear()

    def pace(self, poll: Callable[[], None] | None = None, stream: Any = None) -> None:
        """Mark this point on ``stream`` (the current one by default); wait until the
        device has reached the mark ``lookahead`` points back, calling ``poll`` between
        looks (it raises to stop the wait: the caller's stop question)."""
        event = self._event()
        event.record(stream)
        self._marks.append(event)
        while len(self._marks) > self.lookahead:
            oldest = self._marks.popleft()
            while not oldest.query():
                if poll is not None:
                    poll()
                self._sleep(POLL_S)


_THREAD = threading.local()
# The lookahead of the pacers made from now on (:func:`configure_checkpoints`).
_CHECKPOINTS = {"lookahead": CHECKPOINT_LOOKAHEAD}


def configure_checkpoints(lookahead: int) -> None:
    """Set the cancel points' lookahead of this process (``OMNIQ_WORKER__CHECKPOINT_LOOKAHEAD``),
    once at a worker's start, before its threads pace: a process-wide setting as the
    memory fraction and the GIL switch interval are, since the hook that paces is
    installed on a model's blocks, shared by every session and job of the worker.
    0: the cancel points do not pace (:func:`pace_checkpoint`)."""
    _CHECKPOINTS["lookahead"] = lookahead


def checkpoint_pacer() -> RunAhead:
    """This thread's :class:`RunAhead` for the cancel points of prepare and decode (one
    per thread: the threads of a worker decode independently)."""
    pacer: RunAhead | None = getattr(_THREAD, "pacer", None)
    if pacer is None:
        pacer = _THREAD.pacer = RunAhead(_CHECKPOINTS["lookahead"])
    return pacer


def pace_checkpoint(args: tuple[Any, ...], check: Callable[[], None]) -> None:
    """At a cancel point before a block called with ``args``: on CUDA (the block's first
    tensor argument is there), bound the host's run-ahead to :func:`checkpoint_pacer`'s
    lookahead on that tensor's stream, asking ``check`` (the job's or session's stop)
    while it waits. On the CPU, with no tensor argument to tell, or with a lookahead of
    0 (not paced: no event, no wait; the stop is the checkpoint's own question), nothing."""
    pacer = checkpoint_pacer()
    if pacer.lookahead <= 0:
        return
    stream = _stream_of(args)
    if stream is not None:
        pacer.pace(check, stream)


def _stream_of(args: tuple[Any, ...]) -> Any:
    """The current CUDA stream of the device of the first tensor in ``args``; None when
    there is none or it is not on a CUDA device."""
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if tensor is None or tensor.device.type != "cuda":
        return None
    return torch.cuda.current_stream(tensor.device)
