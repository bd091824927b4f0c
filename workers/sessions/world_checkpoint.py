"""A world session that outlives its worker (issue 31 §5), the worker's half: every
chunk sent goes out with a checkpoint, and a worker placed to take a session over
(``SessionTask.attempt`` > 1) begins from the last one.

What is stored with media chunk ``k`` (``storage/session_checkpoint.py``: the chunk and
its checkpoint enter Redis in one script, or neither does):

* the pipeline's snapshot of the session right after ``take_chunk`` of chunk ``k``
  (``SupportsSnapshot.snapshot``; a model without one sends its chunks as before and its
  sessions cannot be taken over), with every interaction applied so far, one that entered
  chunk ``k`` between two of its steps included;
* where the fMP4 stream stands (frames and fragments written, its init segment), so the
  taker's writer goes on with it (``FragmentedMP4Writer.continuing``) and the client's
  decoder never sees a second init segment;
* the last command read from the session's ``in`` stream: every command up to it is in
  the snapshot, so the taker applies exactly the ones after it. One the dead worker read
  during the chunk it never sent (and may have taken into it mid-chunk) applies from the
  first step of the taker's first chunk, the chunk under way with none of its steps run
  when the taker reads it: the rules of any interaction.

The snapshot's bytes depend on the session as captured at the chunk's end only, never on
the chunk's encoded bytes, so they are packed on a thread of their own from the capture on,
beside the chunk's encode on the delivery lane; what depends on the encode (the stream's
frames, fragments and init segment) is read from the writer at the send, after the chunk's
fragment is muxed.

The taker starts its playback clock afresh (the client's buffer ran down while the worker
was being replaced) and sends no second ``started``. A worker whose session was taken over
while it was presumed dead learns it when its next chunk is refused
(:class:`~models.errors.SessionTakenOver`) and ends without a word.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from models.errors import SessionTakenOver
from models.session_bus import OUTPUTS, ChunkOutput, WorldCheckpoint, WorldSessionConfig
from storage.session_checkpoint import CheckpointStore
from workers.media.fmp4 import FragmentedMP4Writer
from workers.pipelines.base import (
    SupportsSnapshot,
    SupportsSnapshotLater,
    WorldConfig,
    WorldPipeline,
)
from workers.sessions.slot import SessionSlot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Captured:
    """A chunk's checkpoint as captured when the chunk was made: ``snapshot`` is being
    packed (its bytes and the seconds the packing took; None: the model takes none),
    ``commands_after`` is the last command the session had read."""

    snapshot: Future[tuple[bytes, float]] | None
    commands_after: str


class SessionCheckpoint:
    """One session's checkpoints, as the runner sends its chunks."""

    def __init__(
        self,
        store: CheckpointStore,
        slot: SessionSlot,
        config: WorldSessionConfig,
        pipe: WorldPipeline[Any],
    ) -> None:
        self.store = store
        self.slot = slot
        self.config = config
        self.pipe = pipe
        # Packs each chunk's snapshot from its capture on, beside the chunk's encode on the
        # delivery lane, so that the send after the encode is only the Redis writes.
        self._packer: ThreadPoolExecutor | None = None

    @property
    def taking_over(self) -> bool:
        """This worker was placed to take the session over."""
        return self.slot.attempt > 1

    def resume(self, world: WorldConfig) -> tuple[Any, FragmentedMP4Writer, int]:
        """The session's state, fMP4 writer and media chunks sent, as the last checkpoint
        left them; the slot reads commands on from the one it had applied."""
        slot = self.slot
        stored = self.store.load(slot.id, slot.attempt)
        if stored is None:  # expired, or placed again meanwhile
            raise SessionTakenOver(f"no checkpoint of {slot.id} for attempt {slot.attempt}")
        meta = stored.meta
        if not isinstance(self.pipe, SupportsSnapshot):  # served otherwise since it was stored
            raise RuntimeError(
                f"a checkpoint of {slot.id} is stored, but this worker's "
                f"{type(self.pipe).__name__} cannot restore one (no SupportsSnapshot)"
            )
        state = self.pipe.restore(world, stored.state)
        writer = FragmentedMP4Writer.continuing(
            world.width,
            world.height,
            world.fps,
            init_segment=stored.init,
            frames=meta.frames,
            fragments=meta.fragments,
        )
        slot.after = meta.commands_after
        log.info(
            "session %s taken over (attempt %d) from chunk %d", slot.id, slot.attempt, meta.chunks
        )
        return state, writer, meta.chunks

    def capture(self, state: Any) -> Captured:
        """What the checkpoint of the chunk just taken needs from the session, taken now,
        on the device's thread, before the next chunk moves it on: the snapshot (its
        tensors copied off the device where the model packs later,
        :class:`SupportsSnapshotLater`, and packed from now on on the packing thread;
        else packed now) and the last command read."""
        pack: Callable[[], bytes] | None = None
        if isinstance(self.pipe, SupportsSnapshotLater):
            pack = self.pipe.capture_snapshot(state)
        elif isinstance(self.pipe, SupportsSnapshot):
            pack = functools.partial(bytes, self.pipe.snapshot(state))  # packed now
        if pack is None:
            return Captured(None, self.slot.after)
        if self._packer is None:
            name = f"pack-{self.slot.id}"
            self._packer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        return Captured(self._packer.submit(_timed, pack), self.slot.after)

    def close(self) -> None:
        """The session's chunks are all sent or dropped: the packing thread ends (after
        the snapshot it packs, if any; the ones not begun are dropped)."""
        if self._packer is not None:
            self._packer.shutdown(wait=True, cancel_futures=True)

    def send(
        self, chunk: ChunkOutput, data: bytes, captured: Captured, writer: FragmentedMP4Writer
    ) -> float:
        """Send media chunk ``chunk`` (its fMP4 bytes ``data``, just written by ``writer``)
        with the checkpoint ``captured`` after it, once packed; returns the seconds the
        packing took. Raises ``SessionTakenOver`` when the session is another worker's
        now."""
        if captured.snapshot is None or writer.init_segment is None:
            self.slot.send(chunk, data)
            return 0.0
        snapshot, pack_s = captured.snapshot.result()
        assert chunk.generation_chunk_index is not None
        meta = WorldCheckpoint(
            config=self.config,
            chunks=chunk.generation_chunk_index + 1,
            frames=writer.frames_written,
            fragments=writer.fragments_written,
            commands_after=captured.commands_after,
        )
        slot = self.slot
        sent = self.store.publish_chunk(
            slot.id, slot.attempt, chunk, data, meta, writer.init_segment, snapshot
        )
        if sent is None:
            raise SessionTakenOver(f"session {slot.id} was taken over from attempt {slot.attempt}")
        return pack_s

    def ended(self) -> None:
        """The session ended here (done, stopped or failed): its checkpoint goes."""
        self.store.drop(self.slot.id, self.slot.attempt)

    def copy_sent(self, out: IO[bytes], chunks: int) -> None:
        """Write the fMP4 bytes of the first ``chunks`` media chunks, as the client got
        them, to ``out`` (a session persisted to S3 and taken over: the taker has only its
        own chunks)."""
        for data in self._sent_media(chunks):
            out.write(data)

    def _sent_media(self, chunks: int) -> Iterator[bytes]:
        bus, after, left = self.store.bus, "0-0", chunks
        while left:
            entries = bus.read_as(OUTPUTS, self.slot.out, after, count=100)
            if not entries:
                raise RuntimeError(f"{left} sent chunks of {self.slot.id} are gone")
            for entry in entries:
                output = entry.event
                media = isinstance(output, ChunkOutput) and output.kind == "media"
                if media and entry.data and left:
                    left -= 1
                    yield entry.data
            after = entries[-1].id


def _timed(pack: Callable[[], bytes]) -> tuple[bytes, float]:
    began = time.perf_counter()
    data = pack()
    return data, time.perf_counter() - began
