"""``WS /v1/realtime`` (OpenAI Realtime GA) and its duplex alias ``/v1/duplex``: the thin
asyncio shell around ``RealtimeProtocol``.

The protocol decides everything (sans-I/O); this module moves data and owns the clocks.
Client frames go through the protocol (voice-activity detection runs there, in a worker
thread so the event loop stays free); the protocol's commands go to the worker over the
session's ``in`` stream; the worker's outputs (``audio``, ``response_finished``,
``failed``) come back from the ``out`` stream. Admission (no worker slot within the
admission timeout → ``resource_exhausted``) and liveness (a silent worker →
``worker_lost``) are judged here, as for video sessions, and so is the broker: a Redis
command that fails mid-session ends it with ``error broker_error`` and close 1011.

Duplex sessions outlive their socket for ``realtime.resume_grace_s``: the session keeps
running and logging events; ``session.resume`` on a new socket re-attaches it, on any API
replica: each flush stores the new events and the protocol state in Redis before anything
is sent (``realtime/voice_state.py``), so a replica that does not hold the session (or
whose replica died mid-response) takes it over from there. ``app_state.voice_sessions``
is this process's cache of the sessions it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from api.broker import BROKER_ERRORS, bounded
from api.deps import websocket_owner
from api.state import AppState
from realtime.audio_protocol import (
    Cancel,
    RealtimeOptions,
    RealtimeProtocol,
    Respond,
    State,
    Stop,
)
from realtime.session_snapshot import Relay
from realtime.voice_state import TakenOverSession, VoiceStateSync, take_over
from realtime.worker_watch import BROKER_ERROR, BROKER_ERROR_MESSAGE, WorkerWatch
from storage.constants import session_abandoned_key, session_in_key, session_out_key

router = APIRouter(tags=["realtime"])


def _vad_factory(threshold: float, silence_duration_ms: int) -> Any:
    from realtime.vad import SileroVAD  # torch-backed: imported when a session needs it

    return SileroVAD(threshold=threshold, silence_duration_ms=silence_duration_ms)


class VoiceSession:
    """One realtime audio session: its protocol, its worker and (while attached) a socket."""

    def __init__(
        self,
        state: AppState,
        owner: str,
        model: str,
        duplex: bool,
        taken: TakenOverSession | None = None,
    ) -> None:
        self.state = state
        self.owner = owner
        self.model = model
        if taken is None:
            self.id = "sess_" + secrets.token_hex(12)
            options = _options(state, model, duplex)
            self.protocol = RealtimeProtocol(self.id, options, _vad_factory, time.monotonic())
        else:  # resumed from another replica's stored state
            self.protocol = taken.protocol
            self.id = self.protocol.id
        relay = taken.relay if taken is not None else Relay()
        self.sync: VoiceStateSync | None = None
        if duplex:
            self.sync = (
                taken.sync if taken else VoiceStateSync(state.session_states, self.id, owner)
            )
        self.inbox, self.outbox = session_in_key(self.id), session_out_key(self.id)
        self.lock = asyncio.Lock()  # the protocol is driven from the socket and the relay
        self.ws: WebSocket | None = None
        self.placed = relay.placed
        self.worker_admitted = relay.worker_admitted
        self.cursor = relay.out_cursor  # the last worker output applied
        self.tasks: list[asyncio.Task[None]] = []
        self.grace: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()

    # ---------------------------------------------------------------- socket side

    async def flush(self) -> None:
        """Send what the protocol produced: stored first (duplex), then the commands to the
        worker, then the frames to the client."""
        try:
            commands = self.protocol.commands()
            if self.sync is not None and not await self._save(bool(commands)):
                self.protocol.release()  # another replica resumed it: not ours to command
                commands = []
            for cmd in commands:
                await self._command(cmd)
        except BROKER_ERRORS:
            self.broker_lost()
        ws = self.ws
        if ws is None:
            return  # detached: frames wait in the replay log
        for frame in self.protocol.data_to_send():
            try:
                await ws.send_text(frame)
            except (RuntimeError, OSError, WebSocketDisconnect):
                return  # the reader notices the drop
        if self.protocol.close_expected():
            with contextlib.suppress(RuntimeError, OSError):
                await ws.close(code=self.protocol.close_code or 1000)
            self.ended.set()

    async def receive(self, text: str) -> None:
        async with self.lock:
            now = time.monotonic()
            if self.protocol.vad_active and '"input_audio_buffer.append"' in text[:200]:
                await run_in_threadpool(self.protocol.receive_text, text, now)
            else:
                self.protocol.receive_text(text, now)
            if not self.placed and not self.protocol.close_expected():
                await self.place()
            await self.flush()

    async def clock(self) -> None:
        """The protocol's deadlines (cancel grace, idle timeout), checked when due."""
        while not self.protocol.close_expected():
            deadline = self.protocol.next_deadline()
            wait = 1.0 if deadline is None else deadline - time.monotonic()
            await asyncio.sleep(min(max(wait, 0.01), 1.0))
            async with self.lock:
                self.protocol.check_timeouts(time.monotonic())
                await self.flush()

    async def _save(self, force: bool) -> bool:
        assert self.sync is not None
        relay = Relay(self.placed, self.worker_admitted, self.cursor)
        saved = self.sync.save(
            self.protocol, relay, force=force, now=time.monotonic(), wall=time.time()
        )
        return await bounded(saved)

    # ---------------------------------------------------------------- worker side

    def broker_lost(self) -> None:
        """Redis is gone: the session ends with ``broker_error`` (sent at the next flush)."""
        self.protocol.worker_failed(BROKER_ERROR, BROKER_ERROR_MESSAGE)

    async def place(self) -> None:
        """Put the session on a worker of the model's realtime queue."""
        self.placed = True
        rt = self.state.settings.realtime
        config = {"kind": "voice", "model": self.model, "owner": self.owner, "sample_rate": 24000}
        try:
            stream = self.state.abus.publish(self.inbox, {"type": "keepalive"})  # + its TTL
            await bounded(stream)
            placed = run_in_threadpool(
                self.state.queue.start_session,
                self.id,
                self.model,
                config,
                expires_s=rt.admission_timeout_s,
            )
            await bounded(placed)
        except BROKER_ERRORS:
            self.broker_lost()
            return
        self.tasks.append(asyncio.create_task(self._relay()))
        self.tasks.append(asyncio.create_task(self._keepalive()))

    async def _command(self, cmd: Respond | Cancel | Stop) -> None:
        if isinstance(cmd, Respond):
            event: dict[str, Any] = {
                "type": "respond",
                "response_id": cmd.response_id,
                "turn": {
                    "text": cmd.text,
                    "voice": cmd.voice,
                    "speed": cmd.speed,
                    "instructions": cmd.instructions,
                },
            }
            await bounded(self.state.abus.publish(self.inbox, event, cmd.pcm16 or None))
        elif isinstance(cmd, Cancel):
            cancel = {"type": "cancel", "response_id": cmd.response_id, "reason": cmd.reason}
            await bounded(self.state.abus.publish(self.inbox, cancel))
        elif self.placed:
            stop = {"type": "stop", "reason": cmd.reason}
            await bounded(self.state.abus.publish(self.inbox, stop))

    async def _relay(self) -> None:
        """Worker outputs → protocol → socket, with the admission and liveness clocks."""
        rt = self.state.settings.realtime
        watch = WorkerWatch(rt.admission_timeout_s, rt.lost_after_s, time.monotonic())
        watch.admitted = self.worker_admitted
        while not self.protocol.close_expected():
            try:
                read = self.state.abus.read(self.outbox, self.cursor, block_ms=250)
                entries = await bounded(read)
            except BROKER_ERRORS:
                async with self.lock:
                    self.broker_lost()
                    await self.flush()
                break
            now = time.monotonic()
            watch.heard([e.type for e in entries], now)
            self.worker_admitted = watch.admitted
            async with self.lock:
                verdict = None if entries else watch.verdict(now)
                if verdict is not None:
                    code, message = verdict
                    if code == "resource_exhausted":  # a late worker must not start it
                        with contextlib.suppress(*BROKER_ERRORS):
                            key = session_abandoned_key(self.id)
                            await bounded(self.state.abus.redis.set(key, 1, ex=3600))
                    self.protocol.worker_failed(code, message)
                for event, data in _coalesce(entries):
                    self._apply(event, data, now)
                if entries:
                    self.cursor = entries[-1].id
                await self.flush()
        await self.finish()

    def _apply(self, event: dict[str, Any], data: bytes | None, now: float) -> None:
        kind = event.get("type")
        if kind == "audio":
            self.protocol.worker_audio(
                event["response_id"], data or b"", event.get("text"), event.get("produced_at")
            )
        elif kind == "response_finished":
            self.protocol.worker_finished(event["response_id"], event["status"], now)
        elif kind == "failed":
            self.protocol.worker_failed(event["code"], event["message"])
        elif kind == "finished" and not self.protocol.close_expected():
            self.protocol.worker_failed("worker_lost", "the worker ended the session")

    async def _keepalive(self) -> None:
        interval = self.state.settings.realtime.keepalive_s
        while not self.protocol.close_expected():
            await asyncio.sleep(interval)
            try:
                await bounded(self.state.abus.publish(self.inbox, {"type": "keepalive"}))
                if self.sync is not None:
                    await self._touch()
            except BROKER_ERRORS:
                async with self.lock:
                    self.broker_lost()
                    await self.flush()

    async def _touch(self) -> None:
        """Keep the stored state alive; let the session go if another replica has it."""
        assert self.sync is not None
        if not await bounded(self.sync.touch(self.protocol, time.monotonic())):
            async with self.lock:
                self.protocol.release()
                await self.flush()

    # ---------------------------------------------------------------- lifecycle

    def attach(self, ws: WebSocket) -> None:
        self.ws = ws
        if self.grace is not None:
            self.grace.cancel()
            self.grace = None

    async def disconnected(self) -> None:
        """The socket is gone: a duplex session waits for a resume, others end."""
        async with self.lock:
            self.ws = None
            self.protocol.connection_lost(time.monotonic())
            await self.flush()
        if self.protocol.state is State.DETACHED:
            self.grace = asyncio.create_task(self._expire())
        else:
            await self.finish()

    async def _expire(self) -> None:
        await asyncio.sleep(self.state.settings.realtime.resume_grace_s)
        async with self.lock:
            if self.protocol.state is State.DETACHED:
                self.protocol.close("resume_grace_expired", time.monotonic())
                await self.flush()
        await self.finish()

    async def finish(self) -> None:
        if self.state.voice_sessions.get(self.id) is self:
            del self.state.voice_sessions[self.id]
        sync, self.sync = self.sync, None  # nothing is stored for it any more
        if sync is not None:
            with contextlib.suppress(*BROKER_ERRORS):
                await bounded(sync.drop(self.protocol))  # refused if another replica has it
        self.ended.set()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


def _coalesce(entries: list[Any]) -> list[tuple[dict[str, Any], bytes | None]]:
    """The worker's entries, with consecutive ``audio`` steps of one response joined into
    one delta: entries that arrive together (a prebuffer burst, a relay that fell behind)
    cost one client event instead of one per 40 ms step."""
    out: list[tuple[dict[str, Any], bytes | None]] = []
    for entry in entries:
        event, data = entry.event, entry.data
        if out and event.get("type") == "audio":
            last, pcm = out[-1]
            if last.get("type") == "audio" and last["response_id"] == event["response_id"]:
                text = (last.get("text") or "") + (event.get("text") or "")
                out[-1] = ({**last, "text": text or None}, (pcm or b"") + (data or b""))
                continue
        out.append((event, data))
    return out


def _options(state: AppState, model: str, duplex: bool) -> RealtimeOptions:
    rt = state.settings.realtime
    return RealtimeOptions(
        model=model, duplex=duplex, max_session_s=rt.max_session_s, replay_events=rt.replay_events
    )


def _pick_model(state: AppState, requested: str | None) -> str | None:
    voice = [n for n, s in state.specs.items() if s.streaming and s.modality == "audio"]
    if requested:
        return requested if requested in voice else None
    return voice[0] if voice else None


async def _serve(websocket: WebSocket, duplex: bool) -> None:
    state: AppState = websocket.state.app
    owner, subprotocol = await websocket_owner(websocket, state)
    if owner is None:
        await websocket.close(code=1008, reason="invalid or missing API key")
        return
    await websocket.accept(subprotocol=subprotocol)
    requested = websocket.query_params.get("model")
    model = _pick_model(state, requested)
    if model is None:
        await websocket.send_json(
            {
                "type": "error",
                "event_id": "event_" + secrets.token_hex(10),
                "error": {
                    "type": "invalid_request_error",
                    "code": "model_not_found",
                    "message": f"model {requested!r} does not serve realtime audio sessions",
                    "param": "model",
                },
            }
        )
        await websocket.close(code=1008)
        return
    session = VoiceSession(state, owner, model, duplex)
    session.attach(websocket)
    state.voice_sessions[session.id] = session
    session.tasks.append(asyncio.create_task(session.clock()))
    await session.flush()  # session.created
    if not duplex:
        await session.place()  # placed now, so the first response does not wait for it
        await session.flush()  # the broker_error when it could not be placed
    try:
        await _read_loop(websocket, session, state, owner)
    except WebSocketDisconnect:
        pass
    finally:
        current = _current(websocket, session)
        if current.ws is websocket:
            await current.disconnected()


def _current(websocket: WebSocket, session: VoiceSession) -> VoiceSession:
    return getattr(websocket.state, "voice_session", session)


async def _read_loop(
    websocket: WebSocket, session: VoiceSession, state: AppState, owner: str
) -> None:
    first = True
    while True:
        current = _current(websocket, session)
        if current.ended.is_set() or current.protocol.close_expected():
            return
        # No timeout here: a timer per message costs the event loop dearly at hundreds of
        # appends a second; the protocol's clocks run in the session's clock task.
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        text = message.get("text")
        if text is None:
            continue  # binary frames carry nothing in this protocol
        if first and session.protocol.options.duplex and '"session.resume"' in text[:100]:
            first = False
            resumed = await _try_resume(websocket, session, state, owner, text)
            if resumed is not None:
                websocket.state.voice_session = resumed
                await session.finish()  # the fresh session was never placed
                continue
        first = False
        await current.receive(text)


async def _try_resume(
    websocket: WebSocket, fresh: VoiceSession, state: AppState, owner: str, text: str
) -> VoiceSession | None:
    try:
        event = json.loads(text)
        session_id = str(event.get("session_id"))
        token = str(event.get("resume_token", ""))
        last_seq = int(event.get("last_received_server_event_seq", -1))
    except (ValueError, TypeError, AttributeError):
        return None
    target = state.voice_sessions.get(session_id)
    taken = target is None or (target is not fresh and not await _holds(target))
    if taken:  # held by another replica (or a dead one): take it over
        target = await _take_over(state, fresh, owner, session_id, token, last_seq)
    if target is None or target is fresh or target.owner != owner or target.ws is not None:
        return None
    async with target.lock:
        if not target.protocol.resume(token, last_seq):
            if taken:  # the events after last_seq are gone: nobody can resume it
                target.protocol.close("resync_required", time.monotonic())
                await target.flush()
            return None
        target.attach(websocket)
        fresh.ws = None
        await target.flush()
    return target


async def _holds(session: VoiceSession) -> bool:
    """Whether this process still serves ``session`` (no other replica took it over)."""
    if session.sync is None or not session.sync.created:
        return True
    holder = session.sync.holder
    with contextlib.suppress(*BROKER_ERRORS):
        return await bounded(session.state.session_states.holds(session.id, holder))
    return False


async def _take_over(
    state: AppState, fresh: VoiceSession, owner: str, session_id: str, token: str, last_seq: int
) -> VoiceSession | None:
    """A session this process does not hold, rebuilt from its stored state, its relay to
    the worker running again; None when there is none to resume."""
    options = _options(state, fresh.model, True)
    now, wall = time.monotonic(), time.time()
    try:
        call = take_over(
            state.session_states,
            session_id,
            token,
            owner,
            last_seq,
            options,
            _vad_factory,
            now,
            wall,
        )
        taken = await bounded(call)
    except BROKER_ERRORS:
        return None
    if taken is None:
        return None
    stale = state.voice_sessions.get(session_id)
    session = state.voice_sessions[session_id] = VoiceSession(
        state, owner, taken.model, True, taken
    )
    if stale is not None:  # an older copy in this process: it lets the session go
        async with stale.lock:
            stale.protocol.release()
            await stale.flush()
        await stale.finish()
    session.tasks.append(asyncio.create_task(session.clock()))
    if session.placed:
        session.tasks.append(asyncio.create_task(session._relay()))
        session.tasks.append(asyncio.create_task(session._keepalive()))
    return session


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    duplex = websocket.query_params.get("duplex", "").lower() in ("1", "true", "yes")
    await _serve(websocket, duplex)


@router.websocket("/v1/duplex")
async def duplex(websocket: WebSocket) -> None:
    await _serve(websocket, True)
