r"""A world session's delivery lane: what happens to a chunk after the device made it.

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
* **A chunk before it is whole.** :meth:`stream` hands a chunk over as its decode begins:
  the lane takes its pieces (frames, as the VAE decodes them) one by one as the device's
  thread :meth:`~LaneStream.put`\ s them, so it encodes a piece while the next decodes;
  the rest of the chunk's delivery comes with :meth:`~LaneStream.end`, once the decode
  is done. A stream that is :meth:`~LaneStream.abandon`\ ed (a stop or an error inside the
  decode), or still open when the lane closes, ends its turn on the lane with nothing
  sent. It is one chunk of the FIFO: it takes its place, and its depth, at the hand-over.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

PieceT = TypeVar("PieceT")


class LaneStream(Generic[PieceT]):
    """A chunk on the lane before it is whole (:meth:`DeliveryLane.stream`): the device's
    thread puts its pieces, then ends it with the rest of its delivery, or abandons it."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[PieceT | _End | None] = queue.SimpleQueue()
        self.closed = False  # ended or abandoned: nothing more may be put

    def put(self, piece: PieceT) -> None:
        """The next piece, for the lane to take in order."""
        if self.closed:
            raise RuntimeError("the chunk's stream is closed")
        self._queue.put(piece)

    def end(self, then: Callable[[], None]) -> None:
        """Every piece is in: the lane calls ``then`` after taking the last."""
        if self.closed:
            raise RuntimeError("the chunk's stream is closed")
        self.closed = True
        self._queue.put(_End(then))

    def abandon(self) -> None:
        """The chunk will not be whole: the lane drops it, sending nothing (a no-op once
        the stream is closed)."""
        if not self.closed:
            self.closed = True
            self._queue.put(None)

    def take(self, piece_taken: Callable[[PieceT], None]) -> None:
        """The lane's side: ``piece_taken`` of each piece as it comes, then the end's
        ``then``; returns early on an abandon."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, _End):
                item.then()
                return
            piece_taken(item)


class _End:
    """A stream's end: the rest of its chunk's delivery."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then


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
        self._stream: LaneStream[Any] | None = None  # the last chunk handed over as a stream

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

    def stream(self, piece_taken: Callable[[PieceT], None]) -> LaneStream[PieceT]:
        """Hand over a chunk whose pieces are still to come: in its turn the lane calls
        ``piece_taken`` on each piece put, then what the stream is ended with. One stream
        at a time: the last must be closed (ended or abandoned) before the next."""
        if self._stream is not None and not self._stream.closed:
            raise RuntimeError("the last chunk's stream is still open")
        stream: LaneStream[PieceT] = LaneStream()
        self.hand_over(functools.partial(stream.take, piece_taken))
        self._stream = stream
        return stream

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
        if self._stream is not None:
            self._stream.abandon()  # its turn, if begun, waits for no piece more
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
    """Where a session's chunks spent their time, logged per chunk (DEBUG) and as means
    per session (INFO). The stages overlap; per chunk:

    * on the device's thread, one after the other: ``denoise``; ``decode`` (its pieces
      handed to the lane as they decode); ``capture`` (the checkpoint's copy off the
      device);
    * ``encode``: the lane's x264 encode and mux of the chunk, all but its last piece's
      beside the decode (a model without ``SupportsChunkStream``: after it);
    * ``pack``: the checkpoint's packing, on a thread of its own from the capture on,
      beside the encode's end;
    * ``send``: from the chunk's bytes to the chunk and checkpoint in Redis (any wait
      for the packing, then the writes);
    * ``tail``: from the decode's end (the capture done) to the chunk sent: what of the
      lane's work follows the device's, a first chunk's latency past its decode (for a
      later chunk, with any wait behind the chunk before it).
    """

    STAGES = ("denoise", "decode", "capture", "encode", "pack", "send", "tail")

    def __init__(self) -> None:
        self.chunks = 0
        self.totals = dict.fromkeys(self.STAGES, 0.0)

    def add(self, index: int, seconds: dict[str, float]) -> None:
        """Chunk ``index``'s seconds in each of :attr:`STAGES`."""
        if set(seconds) != set(self.STAGES):
            raise ValueError(f"a chunk's times are {self.STAGES}, got {tuple(seconds)}")
        self.chunks += 1
        for stage in self.STAGES:
            self.totals[stage] += seconds[stage]
        log.debug(
            "chunk %d: %s",
            index,
            " ".join(f"{k} {seconds[k] * 1000:.1f} ms" for k in self.STAGES),
        )

    def log_summary(self, session: str) -> None:
        if self.chunks:
            means = " ".join(f"{k} {v / self.chunks * 1000:.1f}" for k, v in self.totals.items())
            log.info("session %s: %d chunks, mean ms per chunk: %s", session, self.chunks, means)
