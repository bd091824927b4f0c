"""One ``WS /v1/realtime/video`` session in the API process: the asyncio shell around
``WorldSessionProtocol`` and the worker (through the shared :class:`~api.realtime.relay.Relay`).

The protocol object decides everything (sans-I/O); this class only moves data: client
frames in, commands out to the worker as ``models.session_bus`` commands, worker outputs
back into the protocol, and the protocol's frames to the socket. It owns the clocks: the
start and stall timeouts and the session time limit here; the admission timeout (no
worker slot → ``resource_exhausted``) and the worker's liveness (silent worker →
``worker_lost``) in the relay. Losing Redis mid-session ends it with ``error
broker_error`` and close 1011, never a bare dropped socket.

A streaming session outlives a dropped socket (no close handshake) for
``realtime.resume_grace_s``: the worker goes on, its chunks wait in the ``out`` stream,
the keep-alives go on, and ``session.resume`` as a socket's first message takes it over
on any replica (``api/realtime/world_resume.py``; the record it needs is stored before
``video.start`` hands out the resume token). A session resumed elsewhere ends here with
``session_taken_over``. A clean close (a close frame) ends the session at once: no grace
period, and ``session.resume`` naming it is answered ``session_not_found``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from api.realtime.broker import BROKER_ERRORS, bounded
from api.realtime.relay import Relay, SessionHost
from api.realtime.world_resume import WorldResumeRecord, take_over
from api.validation import resolve_seed
from models.errors import OmniqueueError
from models.realtime_video import SessionResume, VideoErrorCode
from models.realtime_video_start import StartLimits
from models.session_bus import (
    ChunkOutput,
    FailedOutput,
    FinishedOutput,
    InteractionCommand,
    ReferenceImageCommand,
    SessionOutput,
    StartedOutput,
    StopCommand,
    WorldSessionConfig,
)
from realtime.video_protocol import (
    InteractionRequested,
    StartRequested,
    State,
    StopRequested,
    WorldSessionOptions,
    WorldSessionProtocol,
)
from realtime.worker_watch import BROKER_ERROR, BROKER_ERROR_MESSAGE
from storage.bus import BusMessage

# (url, width, height) → PNG of that size; raises OmniqueueError with a safe message.
FetchReference = Callable[[str, int, int], bytes]


def _options(host: SessionHost, specs: list[Any]) -> WorldSessionOptions:
    rt = host.settings.realtime
    return WorldSessionOptions(
        start_timeout=rt.start_timeout_s,
        stall_timeout=rt.stall_timeout_s,
        max_start_bytes=rt.max_start_bytes,
        models=frozenset(s.name for s in specs),
        default_model=specs[0].name if specs else None,
        model_limits={s.name: StartLimits.of(s) for s in specs},
        max_session_s=rt.max_session_s,
    )


class WorldSession:
    def __init__(
        self,
        ws: WebSocket,
        host: SessionHost,
        owner: str,
        specs: list[Any],
        fetch_reference: FetchReference,
    ) -> None:
        """``specs``: the streaming video models' ``ModelSpec``, the default first."""
        self.ws = ws
        self.host = host
        self.owner = owner
        self.id = "rtv_" + secrets.token_hex(12)
        self.protocol = WorldSessionProtocol(self.id, time.monotonic(), _options(host, specs))
        self.relay = Relay(self.id, host, self)
        self.fetch_reference = fetch_reference
        self.send_lock = asyncio.Lock()
        self.model: str | None = None
        self.record: WorldResumeRecord | None = None  # set once the session is resumable
        self._grace: asyncio.Task[None] | None = None  # a detached session's expiry

    async def flush(self) -> None:
        async with self.send_lock:
            for frame in self.protocol.data_to_send():
                if isinstance(frame, bytes):
                    await self.ws.send_bytes(frame)
                else:
                    await self.ws.send_text(frame)
            if self.protocol.close_expected():
                with contextlib.suppress(RuntimeError):
                    await self.ws.close(code=self.protocol.close_code or 1000)

    async def dispatch(self) -> None:
        for cmd in self.protocol.events_received():
            if isinstance(cmd, StartRequested):
                await self._place(cmd)
            elif isinstance(cmd, InteractionRequested):
                await self._save()  # its event id, before the reply goes out
                interaction = InteractionCommand(
                    event_id=cmd.event_id,
                    prompt=cmd.prompt,
                    camera=_camera(cmd.camera),
                    transition_chunks=cmd.transition_chunks,
                )
                await self.relay.command(interaction)
            elif isinstance(cmd, StopRequested):
                await self.relay.command(StopCommand(reason=cmd.reason))

    async def _place(self, cmd: StartRequested) -> None:
        start, cfg = cmd.start, cmd.config
        self.model = str(self.protocol.model)  # the start's, or the default: resolved
        config = WorldSessionConfig(
            model=self.model,
            owner=self.owner,
            prompt=start.prompt,
            negative_prompt=start.negative_prompt,
            **cfg.model_dump(exclude={"chunks"}),  # the resolved rollout, as video.start says
            seed=resolve_seed(start.seed),
            extra_params=_extra_params(start),
        )
        if start.image_reference is not None:
            # The first frame, decoded and fitted here so the worker gets exactly its size.
            url = start.image_reference.image_url
            try:
                png = await run_in_threadpool(self.fetch_reference, url, cfg.width, cfg.height)
            except OmniqueueError as exc:
                self.protocol.failed(VideoErrorCode.INVALID_IMAGE_REFERENCE, str(exc))
                return
            await self.relay.command(ReferenceImageCommand(), png)
        await self.relay.place(config)

    # RelayTarget: what the relay calls

    def ended(self) -> bool:
        return self.protocol.close_expected()

    async def outputs(self, entries: list[BusMessage[SessionOutput]], now: float) -> None:
        if entries and self.record is not None and not await bounded(self.record.still_held()):
            await self._taken_over()
            return
        for entry in entries:
            self._apply(entry.event, entry.data, now)
        if self.record is None and self.protocol.state is State.STREAMING:
            self.record = WorldResumeRecord(self.host.session_states, self.id, self.owner)
            await self._save()  # before video.start hands out the resume token
        if entries:
            await self.dispatch()
        await self.flush()

    async def worker_gone(self, code: str, message: str) -> None:
        self.protocol.failed(code, message)
        await self.flush()

    async def broker_lost(self) -> None:
        """Redis is gone: say so (``broker_error``) and close 1011."""
        self.protocol.failed(BROKER_ERROR, BROKER_ERROR_MESSAGE)
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await self.flush()

    async def keepalive_due(self) -> bool:
        """Whether this replica still holds the session (refreshing the stored record):
        one resumed elsewhere ends here, and its worker is the other replica's to keep."""
        if self.record is None or await bounded(self.record.holds()):
            return True
        await self._taken_over()
        return False

    async def _taken_over(self) -> None:
        self.protocol.taken_over()
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await self.flush()

    async def relay_ended(self) -> None:
        pass  # the socket loop ends the session

    def _apply(self, output: SessionOutput, data: bytes | None, now: float) -> None:
        if isinstance(output, StartedOutput):
            self.protocol.started(now=now)
        elif isinstance(output, ChunkOutput) and data is not None:
            self.protocol.chunk(output, data, now=now)
        elif isinstance(output, FinishedOutput):
            self.protocol.finished(stopped=output.stopped, artifact_id=output.artifact_id)
        elif isinstance(output, FailedOutput):
            self.protocol.failed(output.code, output.message)

    async def _save(self) -> None:
        if self.record is not None and self.model is not None:
            saved = self.record.save(self.protocol, self.model, time.monotonic(), time.time())
            if not await bounded(saved):
                self.protocol.taken_over()

    async def resume(self, text: str) -> None:
        """``session.resume`` as the first message: take the named session over, then relay
        its worker's outputs from the start of the stream (the protocol sends the init
        segment and the chunks after the client's last one)."""
        try:
            message = SessionResume.model_validate_json(text)
            now, wall = time.monotonic(), time.time()
            states = self.host.session_states
            call = take_over(states, message, self.owner, self.protocol.options, now, wall)
            taken = await bounded(call)
        except (ValueError, *BROKER_ERRORS):  # ValueError: pydantic's ValidationError too
            taken = None
        if taken is None:
            self.protocol.resume_refused()
            return
        self.protocol, self.record, self.model = taken.protocol, taken.record, taken.model
        self.id = taken.protocol.request_id
        self.relay = Relay(self.id, self.host, self)
        self.relay.placed = True
        self.relay.start()

    def detach(self) -> bool:
        """The socket dropped mid-stream: keep the session for a resume (True), its
        keep-alives going, until the grace period ends."""
        if self.record is None or self.protocol.state is not State.STREAMING:
            return False
        self.relay.stop_reading()  # chunks wait in the out stream
        self.host.detached_world_sessions[self.id] = self
        self._grace = asyncio.create_task(self._expire())
        return True

    async def _expire(self) -> None:
        """No resume within the grace period: stop the worker, forget the session."""
        await asyncio.sleep(self.host.settings.realtime.resume_grace_s)
        try:
            record = self.record
            if record is not None and await bounded(record.holds()):
                await self.relay.command(StopCommand(reason="disconnected"))
                await bounded(record.drop())
        except BROKER_ERRORS:
            pass  # the worker stops by itself once keep-alives stop
        finally:
            if self.host.detached_world_sessions.get(self.id) is self:  # not a later detached copy
                del self.host.detached_world_sessions[self.id]
            self.relay.stop()

    async def run(self) -> None:
        first = True
        while not self.protocol.close_expected():
            deadline = self.protocol.next_deadline()
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                message = await asyncio.wait_for(self.ws.receive(), timeout)
            except TimeoutError:
                self.protocol.check_timeouts(time.monotonic())
            else:
                if message["type"] == "websocket.disconnect":
                    raise WebSocketDisconnect(message.get("code", 1000))
                now = time.monotonic()
                text = message.get("text")
                if first and text is not None and '"session.resume"' in text[:100]:
                    await self.resume(text)
                elif text is not None:
                    self.protocol.receive_text(text, now)
                elif message.get("bytes") is not None:
                    self.protocol.receive_binary(message["bytes"], now)
                first = False
            await self.dispatch()
            await self.flush()

    async def close(self, disconnected: bool, dropped: bool = False) -> None:
        """``dropped``: the socket went away without a close handshake (a lost network),
        which a streaming session survives; a client that closes it cleanly ends it, and
        its resume record goes first, so a ``session.resume`` after a clean close is
        answered ``session_not_found`` (never ``session.resumed`` and a replay of its
        end). The record is only deleted while this replica holds it."""
        if dropped and self.detach():
            return
        if self.record is not None:
            with contextlib.suppress(*BROKER_ERRORS):
                await bounded(self.record.drop())  # ended: nothing to resume
        if disconnected:
            self.protocol.connection_lost()
            with contextlib.suppress(Exception):
                await self.dispatch()
        await self.relay.close()


def _camera(camera: Any) -> str | None:
    """Camera actions as the worker holds them: the w/a/s/d keys pressed in the block
    (three per-latent-frame lists), or a dict's ``actions`` in the same shape."""
    if isinstance(camera, dict):
        camera = camera.get("actions")
    if not isinstance(camera, list):
        return None
    keys = {k for frame in camera if isinstance(frame, list) for k in frame}
    return "".join(k for k in "wasd" if k in keys)


def _extra_params(start: Any) -> dict[str, Any]:
    """``extra_params`` as the worker gets them: vLLM-Omni's top-level ``guidance_scale``
    goes in where the start's ``extra_params`` does not set it (the model reads it from
    there, or ignores it if it has no guidance)."""
    extra = start.extra_params.model_dump(exclude_none=True)
    if start.guidance_scale is not None:
        extra.setdefault("guidance_scale", start.guidance_scale)
    return extra
