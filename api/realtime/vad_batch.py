"""Server VAD for every voice session of an API process, scored on one thread, in batches.

A voice session's detector (:class:`realtime.vad.SileroVAD`) scores each 32 ms frame with
silero's network. Called once per session per append, the network is mostly fixed cost
(0.15 ms for one frame on this project's 2-core box, 0.08 ms a frame in a batch of 8),
and a thread hop per append wakes the event loop once more each time. Here the appends
of all sessions meet on one thread: it takes the first, waits ``gather_ms`` for others
(0: none), then scores them together: frame ``k`` of every append in one network call,
so each detector's frames still go through in order with its own recurrent state (rows
of a batch are bit-identical to one-row calls). Results go back to the event loop in one
wake-up per batch.

A detector is fed by one session, which awaits each append before the next
(``api/realtime/voice_session.py`` holds the session's lock), so a batch holds at most one
append per detector; a second one would wait for the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from realtime.vad import Net, SileroVAD, VadEvent, load_model

log = logging.getLogger(__name__)


@dataclass
class _Append:
    vad: SileroVAD
    pcm: bytes
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[VadEvent]]
    at: float = field(default_factory=time.monotonic)
    frames: np.ndarray | None = None
    probs: list[float] = field(default_factory=list)


class VadScorer:
    def __init__(self, net: Net, gather_ms: float = 0.0) -> None:
        self._net = net
        self._gather_s = gather_ms / 1000
        self._appends: queue.SimpleQueue[_Append] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="vad-scorer", daemon=True)
        self._thread.start()

    async def feed(self, vad: SileroVAD, pcm16: bytes) -> list[VadEvent]:
        """``vad.feed(pcm16)``, scored on the scorer's thread with other sessions' appends."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[VadEvent]] = loop.create_future()
        self._appends.put(_Append(vad, pcm16, loop, future))
        return await future

    def _work(self) -> None:
        while True:
            first = self._appends.get()
            wait = first.at + self._gather_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            batch = [first]
            while True:
                try:
                    batch.append(self._appends.get_nowait())
                except queue.Empty:
                    break
            while batch:  # one append per detector per round
                seen: set[int] = set()
                now: list[_Append] = []
                later: list[_Append] = []
                for a in batch:
                    (later if id(a.vad) in seen else now).append(a)
                    seen.add(id(a.vad))
                self._score(now)
                batch = later

    def _score(self, batch: list[_Append]) -> None:
        done: list[tuple[_Append, list[VadEvent] | BaseException]] = []
        live: list[_Append] = []
        for a in batch:
            try:
                with a.vad.lock:
                    a.frames = a.vad.frames(a.pcm)
                live.append(a)
            except Exception as exc:  # handed to the awaiting session
                done.append((a, exc))
        try:
            self._rounds(live)
            for a in live:
                with a.vad.lock:
                    done.append((a, a.vad.decide(a.probs)))
        except Exception as exc:  # the network failed: every append of the batch
            log.exception("VAD batch of %d failed", len(live))
            done += [(a, exc) for a in live]
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Append, object]]] = {}
        for a, result in done:
            by_loop.setdefault(a.loop, []).append((a, result))
        for loop, results in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, results)

    def _rounds(self, live: list[_Append]) -> None:
        """Frame k of every append in one call, k = 0, 1, …"""
        k = 0
        while True:
            rows = [a for a in live if a.frames is not None and len(a.frames) > k]
            if not rows:
                return
            x = np.concatenate([a.vad.net_input(a.frames[k]) for a in rows])  # type: ignore[index]
            state = np.concatenate([a.vad.state for a in rows], axis=1)
            probs, state = self._net.batch(x, state)
            for i, a in enumerate(rows):
                a.vad.scored(x[i : i + 1], state[:, i : i + 1])
                a.probs.append(float(probs[i]))
            k += 1


def _resolve(results: list[tuple[_Append, object]]) -> None:
    for a, result in results:
        if a.future.done():
            continue  # the session stopped waiting (its socket closed)
        if isinstance(result, BaseException):
            a.future.set_exception(result)
        else:
            a.future.set_result(result)  # type: ignore[arg-type]


_scorer_lock = threading.Lock()
_scorer: VadScorer | None = None


def scorer(gather_ms: float) -> VadScorer:
    """This process's scorer (started on first use, with the first caller's ``gather_ms``)."""
    global _scorer
    with _scorer_lock:
        if _scorer is None:
            _scorer = VadScorer(load_model(), gather_ms)
        return _scorer
