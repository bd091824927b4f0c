"""One ``WS /v1/realtime/video`` world session as the GPU world benchmark
(``benchmarks/gpu/world.py``) drives it: ``session.start`` sent, every media chunk's
arrival recorded with its metadata, and hooks called on each chunk that may send a
prompt change, close the socket or kill the worker. Nothing here is timed by the
server: arrivals are this client's clock (``time.monotonic``), and the wall clock
(``time.time``) is kept beside it where a server log line is compared.

What a :class:`SessionRun` gives: the first chunk's time after ``session.start``, the
delivered frame rate over the chunks after the first, and each prompt change's time to
the first chunk whose ``started_event_ids`` carries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import websockets

MAX_SIZE = 64 * 2**20
PING_S = 10.0  # the server stops a session whose client is silent for 60 s


@dataclass
class Chunk:
    """A media chunk as received: its metadata and when its binary frame arrived."""

    index: int  # generation_chunk_index
    num_frames: int
    arrived: float  # monotonic
    arrived_wall: float
    started_event_ids: list[str]


@dataclass
class SessionRun:
    start: dict[str, Any]
    sent: float = 0.0  # session.start, monotonic
    session_id: str | None = None
    chunks: list[Chunk] = field(default_factory=list)
    done: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    interactions: dict[str, float] = field(default_factory=dict)  # event id → sent
    closed_wall: float | None = None  # when this client closed the socket (time.time)
    resumed: int = 0  # session.resumed events (a takeover says none)
    notes: dict[str, Any] = field(default_factory=dict)  # what a hook found
    tasks: list[asyncio.Task[None]] = field(default_factory=list)  # a hook's, kept alive

    @property
    def first_chunk_s(self) -> float | None:
        return self.chunks[0].arrived - self.sent if self.chunks else None

    def delivered_fps(self) -> float | None:
        """Frames of the chunks after the first ÷ the time from the first's arrival to
        the last's: the rate a client sees once streaming."""
        if len(self.chunks) < 2:
            return None
        frames = sum(c.num_frames for c in self.chunks[1:])
        return frames / (self.chunks[-1].arrived - self.chunks[0].arrived)

    def interaction_latencies(self) -> dict[str, float | None]:
        """Each prompt change: sent → the first chunk that carries it arrived."""
        out: dict[str, float | None] = {}
        for event_id, sent in self.interactions.items():
            carried = [c for c in self.chunks if event_id in c.started_event_ids]
            out[event_id] = carried[0].arrived - sent if carried else None
        return out

    def summary(self) -> dict[str, Any]:
        gaps = [b.arrived - a.arrived for a, b in zip(self.chunks, self.chunks[1:], strict=False)]
        return {
            "session_id": self.session_id,
            "chunks": len(self.chunks),
            "first_chunk_s": _round(self.first_chunk_s),
            "delivered_fps": _round(self.delivered_fps()),
            "inter_chunk_s_median": _round(statistics.median(gaps)) if gaps else None,
            "done": self.done,
            "errors": self.errors,
            **({"resumed": self.resumed} if self.resumed else {}),
            **self.notes,
        }


# A hook: (the run so far, the socket, the chunk just received) → True to stop reading.
Hook = Callable[[SessionRun, Any, Chunk], Awaitable[bool | None]]


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


async def _pinger(ws: Any) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            await asyncio.sleep(PING_S)
            await ws.send(json.dumps({"type": "session.ping"}))


async def run_session(
    ws_url: str, start: dict[str, Any], hook: Hook | None = None, timeout: float = 600.0
) -> SessionRun:
    """Send ``start``, read to ``session.done`` (or an error, or a hook's True, or the
    socket closed by a hook); ``hook`` runs after every media chunk."""
    run = SessionRun(start=start)
    async with websockets.connect(ws_url, max_size=MAX_SIZE, ping_interval=None) as ws:
        run.sent = time.monotonic()
        await ws.send(json.dumps(start))
        pinger = asyncio.create_task(_pinger(ws))
        try:
            await asyncio.wait_for(_read(ws, run, hook), timeout)
        except websockets.ConnectionClosed:
            if run.closed_wall is None:
                run.errors.append("the server closed the socket")
        except TimeoutError:
            run.errors.append(f"no session.done within {timeout:.0f} s")
        finally:
            pinger.cancel()
    return run


async def _read(ws: Any, run: SessionRun, hook: Hook | None) -> None:
    meta: dict[str, Any] | None = None
    async for message in ws:
        if isinstance(message, bytes):
            now, wall = time.monotonic(), time.time()
            if meta is not None and meta.get("kind") == "media":
                chunk = Chunk(
                    index=int(meta["generation_chunk_index"]),
                    num_frames=int(meta["num_frames"]),
                    arrived=now,
                    arrived_wall=wall,
                    started_event_ids=list(meta.get("started_event_ids") or []),
                )
                run.chunks.append(chunk)
                if hook is not None and await hook(run, ws, chunk):
                    return
            meta = None
            continue
        event = json.loads(message)
        kind = event["type"]
        if kind == "video.start":
            run.session_id = event.get("session_id")
        elif kind == "video.chunk_metadata":
            meta = event
        elif kind == "session.resumed":
            run.resumed += 1
        elif kind == "session.done":
            run.done = {k: event.get(k) for k in ("chunks", "stopped")}
            return
        elif kind == "error":
            run.errors.append(f"{event.get('code')}: {event.get('message')}")
            return


async def send_prompt(
    ws: Any, run: SessionRun, event_id: str, prompt: str, delay: float = 0.0
) -> None:
    """A prompt change ``delay`` s from now (Helios has no camera), its send time kept."""
    await asyncio.sleep(delay)
    interaction = {"event_id": event_id, "event": {"prompt": prompt}}
    run.interactions[event_id] = time.monotonic()
    await ws.send(json.dumps({"type": "session.interaction", "interaction": interaction}))


async def close_after(ws: Any, run: SessionRun, delay: float) -> None:
    """Close the socket cleanly ``delay`` s from now (a clean close ends the session at
    once); the moment is kept as wall time, to compare with the worker's log."""
    await asyncio.sleep(delay)
    run.closed_wall = time.time()
    await ws.close()
