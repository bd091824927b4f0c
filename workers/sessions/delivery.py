"""A world session's delivery lane: what happens to a chunk after the device made it.

The device's thread only denoises and decodes (docs/architecture.md, rule 15). Each chunk
it makes is handed here with everything it needs captured at that moment (its frames, its
events, the session's checkpoint, the last command read); one thread then encodes it,
packs the checkpoint and sends both, in the order the chunks were made, while the device
goes on with the next chunk.

* **Order.** One thread, a FIFO: chunk ``k`` is sent before chunk ``k + 1``.
* **Lead.** At most ``depth`` chunks wait here: while the lane is :attr:`full` the device's
  loop begins no chunk (it reads commands meanwhile), so a slow link or encoder slows the
  session rather than filling memory, and a stop is not kept waiting.
* **Failure.** An error of the lane (the session taken over, Redis gone) is raised in the
  device's thread at its next hand-over or :meth:`check`, so the session ends as it did
  when the send was in its loop; nothing is sent after a failure.
* **The end.** :meth:`drain` waits for every chunk handed over, at a session's normal end;
  its last words (the trailer, ``finished``) go after them. A stopped session
  closes the lane instead (:meth:`close`): the chunk being sent is finished, the ones not begun
  are dropped (the client asked for no more).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)


class DeliveryLane:
    """One session's ordered lane; :meth:`close` it (or use it as a context manager)."""

    def __init__(self, name: str, depth: int = 2) -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self.depth = depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"deliver-{name}")
        self._pending: deque[Future[None]] = deque()
        self._failed = threading.Event()
        self._error: BaseException | None = None  # the first, raised again on every call

    def __enter__(self) -> DeliveryLane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hand_over(self, deliver: Callable[[], None]) -> None:
        """Queue ``deliver`` behind the chunks handed over before; waits while ``depth``
        are queued. Raises the lane's first error, if any."""
        self.check()
        while len(self._pending) >= self.depth:
            self._settle(self._pending.popleft())
        self._pending.append(self._pool.submit(self._run, deliver))

    @property
    def full(self) -> bool:
        """``depth`` chunks wait: the next hand-over would block until one leaves."""
        self.check()
        return len(self._pending) >= self.depth

    def check(self) -> None:
        """Raise the lane's first error now, if a chunk handed over has failed."""
        if self._error is not None:
            raise self._error
        while self._pending and self._pending[0].done():
            self._settle(self._pending.popleft())

    def drain(self) -> None:
        """Wait for every chunk handed over; raises the lane's first error."""
        if self._error is not None:
            raise self._error
        while self._pending:
            self._settle(self._pending.popleft())

    def close(self) -> None:
        """Stop the lane: what is queued and not yet begun is dropped (the session ended
        on an error or a stop that :meth:`drain` did not wait for)."""
        self._failed.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()

    def _run(self, deliver: Callable[[], None]) -> None:
        if self._failed.is_set():  # a chunk before this one failed: send nothing more
            return
        try:
            deliver()
        except BaseException:
            self._failed.set()
            raise

    def _settle(self, future: Future[None]) -> None:
        try:
            future.result()
        except BaseException as exc:
            self._error = exc
            raise


class ChunkTimes:
    """Where a session's chunks spent their time, logged per chunk (DEBUG) and summed
    per session (INFO): on the device's thread the denoise and the decode, on the lane
    the checkpoint's capture (device's thread) and packing, the encode, and the send."""

    STAGES = ("denoise", "decode", "capture", "encode", "send")

    def __init__(self) -> None:
        self.chunks = 0
        self.totals = dict.fromkeys(self.STAGES, 0.0)

    def add(
        self, index: int, denoise: float, decode: float, capture: float, encode: float, send: float
    ) -> None:
        stages = dict(zip(self.STAGES, (denoise, decode, capture, encode, send), strict=True))
        self.chunks += 1
        for stage, seconds in stages.items():
            self.totals[stage] += seconds
        log.debug(
            "chunk %d: %s", index, " ".join(f"{k} {v * 1000:.1f} ms" for k, v in stages.items())
        )

    def log_summary(self, session: str) -> None:
        if self.chunks:
            means = " ".join(f"{k} {v / self.chunks * 1000:.1f}" for k, v in self.totals.items())
            log.info("session %s: %d chunks, mean ms per chunk: %s", session, self.chunks, means)
