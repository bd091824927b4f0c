"""One ``WS /v1/realtime`` session in the API process: the asyncio shell that joins the
client socket, the sans-I/O ``RealtimeProtocol`` and the worker (through the shared
:class:`~realtime.relay.Relay`).

Client frames go through the protocol (voice-activity detection runs there, in a worker
thread so the event loop stays free); the protocol's commands (``Respond``, ``Cancel``,
``Stop``) go to the worker as ``models.session_bus`` commands on the session's ``in``
stream; the worker's outputs (``audio``, ``response_finished``, ``failed``,
``finished``) come back through the relay into the protocol, and the protocol's frames
go to the socket. One lock serialises the protocol between the socket, the clock and the
relay.

Duplex sessions outlive their socket for ``realtime.resume_grace_s``: the session keeps
running and logging events; ``session.resume`` on a new socket of the same API process
re-attaches it (:func:`try_resume`, the host's ``voice_sessions``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from models.session_bus import (
    AudioOutput,
    CancelCommand,
    FailedOutput,
    FinishedOutput,
    RespondCommand,
    ResponseFinishedOutput,
    SessionOutput,
    StopCommand,
    VoiceSessionConfig,
    VoiceTurnSpec,
)
from realtime.audio_protocol import Cancel, RealtimeOptions, RealtimeProtocol, Respond, State, Stop
from realtime.broker import BROKER_ERRORS
from realtime.relay import Relay, SessionHost
from realtime.worker_watch import BROKER_ERROR, BROKER_ERROR_MESSAGE
from storage.bus import BusMessage

SAMPLE_RATE = 24000


def _vad_factory(threshold: float, silence_duration_ms: int) -> Any:
    from realtime.vad import SileroVAD  # torch-backed: imported when a session needs it

    return SileroVAD(threshold=threshold, silence_duration_ms=silence_duration_ms)


class VoiceSession:
    """One realtime audio session: its protocol, its worker and (while attached) a socket."""

    def __init__(self, host: SessionHost, owner: str, model: str, duplex: bool) -> None:
        self.host = host
        self.owner = owner
        self.model = model
        self.id = "sess_" + secrets.token_hex(12)
        rt = host.settings.realtime
        options = RealtimeOptions(model=model, duplex=duplex, max_session_s=rt.max_session_s)
        self.protocol = RealtimeProtocol(self.id, options, _vad_factory, time.monotonic())
        self.relay = Relay(self.id, host, self)
        self.lock = asyncio.Lock()  # the protocol is driven from the socket and the relay
        self.ws: WebSocket | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.grace: asyncio.Task[None] | None = None
        self.ended_event = asyncio.Event()

    # ---------------------------------------------------------------- socket side

    async def flush(self) -> None:
        """Send what the protocol produced; commands go to the worker first."""
        try:
            for cmd in self.protocol.commands():
                await self._command(cmd)
        except BROKER_ERRORS:
            self._broker_lost()
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
            self.ended_event.set()

    async def receive(self, text: str) -> None:
        async with self.lock:
            now = time.monotonic()
            if self.protocol.vad_active and '"input_audio_buffer.append"' in text[:200]:
                await run_in_threadpool(self.protocol.receive_text, text, now)
            else:
                self.protocol.receive_text(text, now)
            if not self.relay.placed and not self.protocol.close_expected():
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

    # ---------------------------------------------------------------- worker side

    def _broker_lost(self) -> None:
        """Redis is gone: the session ends with ``broker_error`` (sent at the next flush)."""
        self.protocol.worker_failed(BROKER_ERROR, BROKER_ERROR_MESSAGE)

    async def place(self) -> None:
        """Put the session on a worker of the model's realtime queue."""
        config = VoiceSessionConfig(model=self.model, owner=self.owner, sample_rate=SAMPLE_RATE)
        try:
            await self.relay.place(config)
        except BROKER_ERRORS:
            self._broker_lost()

    async def _command(self, cmd: Respond | Cancel | Stop) -> None:
        if isinstance(cmd, Respond):
            turn = VoiceTurnSpec(
                text=cmd.text, voice=cmd.voice, speed=cmd.speed, instructions=cmd.instructions
            )
            respond = RespondCommand(response_id=cmd.response_id, turn=turn)
            await self.relay.command(respond, cmd.pcm16 or None)
        elif isinstance(cmd, Cancel):
            await self.relay.command(CancelCommand(response_id=cmd.response_id, reason=cmd.reason))
        elif self.relay.placed:
            await self.relay.command(StopCommand(reason=cmd.reason))

    # RelayTarget: what the relay calls

    def ended(self) -> bool:
        return self.protocol.close_expected()

    async def outputs(self, entries: list[BusMessage[SessionOutput]], now: float) -> None:
        async with self.lock:
            for output, data in coalesce(entries):
                self._apply(output, data, now)
            await self.flush()

    async def worker_gone(self, code: str, message: str) -> None:
        async with self.lock:
            self.protocol.worker_failed(code, message)
            await self.flush()

    async def broker_lost(self) -> None:
        async with self.lock:
            self._broker_lost()
            await self.flush()

    async def relay_ended(self) -> None:
        await self.finish()

    def _apply(self, output: SessionOutput, data: bytes | None, now: float) -> None:
        if isinstance(output, AudioOutput):
            self.protocol.worker_audio(
                output.response_id, data or b"", output.text, output.produced_at
            )
        elif isinstance(output, ResponseFinishedOutput):
            self.protocol.worker_finished(output.response_id, output.status, now)
        elif isinstance(output, FailedOutput):
            self.protocol.worker_failed(output.code, output.message)
        elif isinstance(output, FinishedOutput) and not self.protocol.close_expected():
            self.protocol.worker_failed("worker_lost", "the worker ended the session")

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
        await asyncio.sleep(self.host.settings.realtime.resume_grace_s)
        async with self.lock:
            if self.protocol.state is State.DETACHED:
                self.protocol.close("resume_grace_expired", time.monotonic())
                await self.flush()
        await self.finish()

    async def finish(self) -> None:
        self.host.voice_sessions.pop(self.id, None)
        self.ended_event.set()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        self.relay.stop()


def coalesce(
    entries: list[BusMessage[SessionOutput]],
) -> list[tuple[SessionOutput, bytes | None]]:
    """The worker's outputs, with consecutive ``audio`` steps of one response joined into
    one delta: entries that arrive together (a prebuffer burst, a relay that fell behind)
    cost one client event instead of one per 40 ms step. A joined run keeps its first
    model (copied once, only when the run's text differs from the first one's)."""
    out: list[tuple[SessionOutput, bytes | None]] = []
    run: list[BusMessage[SessionOutput]] = []  # audio of one response, not yet in out

    def close_run() -> None:
        if len(run) == 1:
            out.append((run[0].event, run[0].data))
        elif run:
            first = run[0].event
            assert isinstance(first, AudioOutput)
            text = "".join(e.event.text or "" for e in run if isinstance(e.event, AudioOutput))
            joined = (
                first
                if (text or None) == first.text
                else first.model_copy(update={"text": text or None})
            )
            out.append((joined, b"".join(e.data or b"" for e in run)))
        run.clear()

    for entry in entries:
        output = entry.event
        if isinstance(output, AudioOutput):
            head = run[0].event if run else None
            if isinstance(head, AudioOutput) and head.response_id != output.response_id:
                close_run()
            run.append(entry)
            continue
        close_run()
        out.append((output, entry.data))
    close_run()
    return out


async def try_resume(
    websocket: WebSocket, fresh: VoiceSession, owner: str, text: str
) -> VoiceSession | None:
    """Re-attach the detached duplex session a ``session.resume`` names, if this process
    holds it for this owner and the token matches."""
    try:
        event = json.loads(text)
        target = fresh.host.voice_sessions.get(str(event.get("session_id")))
        token = str(event.get("resume_token", ""))
        last_seq = int(event.get("last_received_server_event_seq", -1))
    except (ValueError, TypeError, AttributeError):
        return None
    if target is None or target is fresh or target.owner != owner or target.ws is not None:
        return None
    async with target.lock:
        if not target.protocol.resume(token, last_seq):
            return None
        target.attach(websocket)
        fresh.ws = None
        await target.flush()
    return target
