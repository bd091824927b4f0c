"""One ``WS /v1/realtime`` session in the API process: the asyncio shell that joins the
client socket, the sans-I/O ``VoiceSessionProtocol`` and the worker (through the shared
:class:`~api.realtime.relay.Relay`).

Client frames go through the protocol; the audio they append goes to the process's VAD
scorer (``api/realtime/vad_batch.py``: one thread scores every session's detector, batched),
whose events go back into the protocol; the protocol's commands (``Respond``, ``Cancel``,
``Stop``) go to the worker as ``models.session_bus`` commands on the session's ``in``
stream; the worker's outputs (``audio``, ``response_finished``, ``failed``,
``finished``) come back through the relay into the protocol, and the protocol's frames
go to the socket. One lock serialises the protocol between the socket, the clock and the
relay.

Duplex sessions outlive their socket for ``realtime.resume_grace_s``: the session keeps
running and logging events; ``session.resume`` on a new socket re-attaches it, on any API
replica: the protocol hands the shell a ``session.resume`` that opens a socket
(:func:`try_resume`), and each flush stores the new events, the protocol state and
the relay's position in Redis, with the worker's new commands in the same write, before
anything is sent to the client (``api/realtime/voice_state.py``), so a
replica that does not hold the session (or whose holder died mid-response) takes it over
from there. A replica that cannot store (Redis lost) sends nothing more: it closes the
socket with 1012 and leaves the stored session for the replica the client resumes on
(:meth:`VoiceSession._let_go`). The host's ``voice_sessions`` is this process's cache of
the sessions it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import secrets
import time
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from pydantic import BaseModel

from api.realtime.broker import BROKER_ERRORS, bounded
from api.realtime.relay import Relay, SessionHost
from api.realtime.vad_batch import VadScorer, scorer
from api.realtime.voice_state import TakenOverSession, VoiceStateSync, take_over
from models.session_bus import (
    CancelCommand,
    FailedOutput,
    FinishedOutput,
    RespondCommand,
    ResponseAudioOutput,
    ResponseFinishedOutput,
    SessionOutput,
    StopCommand,
    VoiceSessionConfig,
    VoiceTurnSpec,
)
from realtime.audio_protocol import (
    Cancel,
    Respond,
    ResumeRequested,
    State,
    Stop,
    VoiceSessionOptions,
    VoiceSessionProtocol,
)
from realtime.vad import SileroVAD
from realtime.worker_watch import BROKER_ERROR, BROKER_ERROR_MESSAGE
from storage.bus import BusMessage

SAMPLE_RATE = 24000
# A duplex session's socket closed by a replica that lost Redis (1012, "service restart"):
# the session goes on, resumable on any replica.
CLOSE_RESUME_ELSEWHERE = 1012


def _vad_factory(threshold: float, silence_duration_ms: int) -> Any:
    return SileroVAD(threshold=threshold, silence_duration_ms=silence_duration_ms)


class Storage(enum.Enum):
    """Whether this replica keeps a session's state in Redis (:attr:`VoiceSession.storage`).
    Only a ``STORED`` session writes there: each flush stores the new events, the protocol
    state and the worker's commands in one write (``VoiceSession.sync``) before anything
    is sent; in every other state the commands go straight to the worker."""

    NOT_DUPLEX = "not_duplex"  # a plain session: nothing is ever stored
    STORED = "stored"  # a duplex session this replica holds
    LET_GO = "let_go"  # duplex, this replica lost Redis: the stored state is left as it
    # stands for the replica the client resumes on, and this one sends nothing more
    DROPPED = "dropped"  # duplex, ended here: the stored state was dropped (unless
    # another replica had taken the session over)


class VoiceSession:
    """One voice session (``WS /v1/realtime``, plain or duplex): its protocol, its worker
    and (while attached) a socket."""

    def __init__(
        self,
        host: SessionHost,
        owner: str,
        model: str,
        duplex: bool,
        taken: TakenOverSession | None = None,
    ) -> None:
        """``taken``: a duplex session resumed from another replica's stored state."""
        self.host = host
        self.owner = owner
        self.model = model
        self.sync: VoiceStateSync | None = None  # duplex: the link to its Redis-held state
        self.storage = Storage.NOT_DUPLEX
        if taken is None:
            self.id = "sess_" + secrets.token_hex(12)
            options = _options(host, model, duplex)
            self.protocol = VoiceSessionProtocol(self.id, options, _vad_factory, time.monotonic())
            if duplex:
                self.sync = VoiceStateSync(host.session_states, self.id, owner)
                self.storage = Storage.STORED
        else:
            self.protocol, self.sync = taken.protocol, taken.sync
            self.storage = Storage.STORED
            self.id = self.protocol.id
        self.relay = Relay(self.id, host, self, taken.relay if taken else None)
        self.lock = asyncio.Lock()  # the protocol is driven from the socket and the relay
        self.ws: WebSocket | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.grace: asyncio.Task[None] | None = None
        self.ended_event = asyncio.Event()
        self._vad_scorer: VadScorer | None = None

    @property
    def let_go(self) -> bool:
        """Duplex: this replica lost Redis and gave the session up (:meth:`_let_go`)."""
        return self.storage is Storage.LET_GO

    # ---------------------------------------------------------------- socket side

    async def flush(self) -> None:
        """Send what the protocol produced: the commands to the worker (duplex: in the
        write that stores the session), then the frames to the client."""
        if self.let_go:
            return
        try:
            commands = [w for cmd in self.protocol.commands() if (w := self._wire(cmd))]
            if self.storage is not Storage.STORED:
                for command, data in commands:
                    await self.relay.command(command, data)
            elif not await self._save(commands):  # stored and sent to the worker at once
                self.protocol.release()  # another replica resumed it: not ours to command
        except BROKER_ERRORS:
            if self.storage is Storage.STORED:
                await self._let_go()  # nothing that was not stored reaches the client
                return
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

    async def receive(self, text: str) -> VoiceSession:
        """Feed a client frame; the session that serves the socket from now on: this one,
        or the detached one the frame's ``session.resume`` re-attached to it."""
        async with self.lock:
            if self.let_go:
                return self
            self.protocol.receive_text(text, time.monotonic())
            request = self.protocol.resume_requested()
            if request is not None:
                try:
                    resumed = await try_resume(self, request)
                except BROKER_ERRORS:  # the stored session cannot be read now: retry later
                    await self._let_go()
                    return self
                if resumed is not None:
                    await self.finish()  # this fresh session was never placed
                    return resumed
                self.protocol.resume_refused(request.session_id)
            unscored = self.protocol.input.take_unscored()
            vad = self.protocol.input.vad
            if unscored and vad is not None:
                if isinstance(vad, SileroVAD):  # scored with other sessions' input
                    events = await self._scorer().feed(vad, unscored)
                else:
                    events = vad.feed(unscored)
                self.protocol.vad_scored(events, time.monotonic())
            if not self.relay.placed and not self.protocol.close_expected():
                await self.place()
            await self.flush()
        return self

    def _scorer(self) -> VadScorer:
        if self._vad_scorer is None:  # this process's, started by its first VAD append
            self._vad_scorer = scorer(self.host.settings.realtime.vad_batch_ms)
        return self._vad_scorer

    async def clock(self) -> None:
        """The protocol's deadlines (cancel grace, idle timeout), checked when due."""
        while not self.ended():
            deadline = self.protocol.next_deadline()
            wait = 1.0 if deadline is None else deadline - time.monotonic()
            await asyncio.sleep(min(max(wait, 0.01), 1.0))
            async with self.lock:
                self.protocol.check_timeouts(time.monotonic())
                await self.flush()

    async def _save(self, commands: list[tuple[BaseModel, bytes | None]]) -> bool:
        assert self.storage is Storage.STORED and self.sync is not None
        position, now, wall = self.relay.position, time.monotonic(), time.time()
        saved = self.sync.save(self.protocol, position, commands=commands, now=now, wall=wall)
        return await bounded(saved)

    # ---------------------------------------------------------------- worker side

    def _broker_lost(self) -> None:
        """Redis is gone: the session ends with ``broker_error`` (sent at the next flush)."""
        self.protocol.worker_failed(BROKER_ERROR, BROKER_ERROR_MESSAGE)

    async def _let_go(self) -> None:
        """Duplex, Redis lost: this replica gives the session up without a word. What the
        protocol produced since the last save could not be stored, so none of it is sent
        (a client that saw it could not resume anywhere): the socket closes with 1012 and
        the reason ``broker_error``, and the stored session is left as it stands for the
        replica the client resumes on, whose relay goes on from the stored position."""
        if self.let_go:
            return
        self.storage = Storage.LET_GO  # so that finish() leaves the stored state alone
        self.protocol.data_to_send()  # not stored: never sent
        ws, self.ws = self.ws, None
        if ws is not None:
            with contextlib.suppress(RuntimeError, OSError):
                await ws.close(code=CLOSE_RESUME_ELSEWHERE, reason=BROKER_ERROR)
        await self.finish()

    async def place(self) -> None:
        """Put the session on a worker of the model's realtime queue."""
        config = VoiceSessionConfig(model=self.model, owner=self.owner, sample_rate=SAMPLE_RATE)
        try:
            await self.relay.place(config)
        except BROKER_ERRORS:
            self._broker_lost()

    def _wire(self, cmd: Respond | Cancel | Stop) -> tuple[BaseModel, bytes | None] | None:
        """A protocol command as the session bus command (and its bytes) for the worker;
        None for a stop of a session never placed."""
        if isinstance(cmd, Respond):
            turn = VoiceTurnSpec(
                text=cmd.text, voice=cmd.voice, speed=cmd.speed, instructions=cmd.instructions
            )
            return RespondCommand(response_id=cmd.response_id, turn=turn), cmd.pcm16 or None
        if isinstance(cmd, Cancel):
            return CancelCommand(response_id=cmd.response_id, reason=cmd.reason), None
        return (StopCommand(reason=cmd.reason), None) if self.relay.placed else None

    # RelayTarget: what the relay calls

    def ended(self) -> bool:
        return self.let_go or self.protocol.close_expected()

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
            if self.storage is Storage.STORED:
                await self._let_go()
                return
            self._broker_lost()
            await self.flush()

    async def keepalive_due(self) -> bool:
        """Keep the stored state alive; let the session go if another replica has it."""
        if self.storage is not Storage.STORED:
            return True
        assert self.sync is not None
        if await bounded(self.sync.touch(self.protocol, time.monotonic())):
            return True
        async with self.lock:
            self.protocol.release()
            await self.flush()
        return False

    async def relay_ended(self) -> None:
        await self.finish()

    def _apply(self, output: SessionOutput, data: bytes | None, now: float) -> None:
        if isinstance(output, ResponseAudioOutput):
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
        if self.let_go:
            return  # finished already; the stored session waits for a resume elsewhere
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
        if self.host.voice_sessions.get(self.id) is self:
            del self.host.voice_sessions[self.id]
        if self.storage is Storage.STORED and self.sync is not None:
            self.storage = Storage.DROPPED  # nothing is stored for it any more
            with contextlib.suppress(*BROKER_ERRORS):
                await bounded(self.sync.drop(self.protocol))  # refused if another replica has it
        self.ended_event.set()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        self.relay.stop()


def _options(host: SessionHost, model: str, duplex: bool) -> VoiceSessionOptions:
    rt = host.settings.realtime
    return VoiceSessionOptions(
        model=model,
        duplex=duplex,
        max_session_s=rt.max_session_s,
        replay_events=rt.replay_events,
        defer_vad=True,
    )


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
            assert isinstance(first, ResponseAudioOutput)
            steps = [e.event for e in run if isinstance(e.event, ResponseAudioOutput)]
            text = "".join(step.text or "" for step in steps)
            joined = (
                first
                if (text or None) == first.text
                else first.model_copy(update={"text": text or None})
            )
            out.append((joined, b"".join(e.data or b"" for e in run)))
        run.clear()

    for entry in entries:
        output = entry.event
        if isinstance(output, ResponseAudioOutput):
            head = run[0].event if run else None
            if isinstance(head, ResponseAudioOutput) and head.response_id != output.response_id:
                close_run()
            run.append(entry)
            continue
        close_run()
        out.append((output, entry.data))
    close_run()
    return out


async def try_resume(fresh: VoiceSession, request: ResumeRequested) -> VoiceSession | None:
    """Re-attach the detached duplex session ``fresh``'s first event asked for, to
    ``fresh``'s socket, for its owner holding its token: from this process's cache if it
    still holds the session, else taken over from its Redis-held state (another replica
    served it, or this one lost it). None (nothing changed) when there is none; one of
    ``BROKER_ERRORS`` when the stored state cannot be read now."""
    host, owner, websocket = fresh.host, fresh.owner, fresh.ws
    session_id, token, last_seq = request.session_id, request.resume_token, request.last_seq
    if websocket is None:
        return None
    target = host.voice_sessions.get(session_id)
    taken = target is None or (target is not fresh and not await _holds(target))
    if taken:  # held by another replica (or a dead one): take it over
        target = await _take_over(fresh, owner, session_id, token, last_seq)
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
    if session.storage is not Storage.STORED or session.sync is None or not session.sync.created:
        return True
    holder = session.sync.holder
    with contextlib.suppress(*BROKER_ERRORS):
        return await bounded(session.host.session_states.holds(session.id, holder))
    return False


async def _take_over(
    fresh: VoiceSession, owner: str, session_id: str, token: str, last_seq: int
) -> VoiceSession | None:
    """A session this process does not hold, rebuilt from its stored state, its relay to
    the worker running again from where the last holder stood; None when there is none
    to resume."""
    host = fresh.host
    options = _options(host, fresh.model, True)
    now, wall = time.monotonic(), time.time()
    states = host.session_states
    call = take_over(states, session_id, token, owner, last_seq, options, _vad_factory, now, wall)
    taken = await bounded(call)  # BROKER_ERRORS: the caller lets its fresh socket go
    if taken is None:
        return None
    stale = host.voice_sessions.get(session_id)
    session = host.voice_sessions[session_id] = VoiceSession(host, owner, taken.model, True, taken)
    if stale is not None:  # an older copy in this process: it lets the session go
        async with stale.lock:
            stale.protocol.release()
            await stale.flush()
        await stale.finish()
    session.tasks.append(asyncio.create_task(session.clock()))
    if session.relay.placed:
        session.relay.start()
    return session
