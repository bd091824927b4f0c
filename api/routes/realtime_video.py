"""``WS /v1/realtime/video``: the thin asyncio shell around ``VideoSessionProtocol``.

The protocol object decides everything (sans-I/O); this handler only moves data: client
frames in, commands out to the worker over the session's ``in`` stream, worker outputs
from the ``out`` stream back into the protocol, and the protocol's frames to the socket.
It owns the clocks: the start and stall timeouts, the session time limit, the admission
timeout (no worker slot → ``resource_exhausted``) and the worker's liveness (silent
worker → ``worker_lost``). Losing Redis mid-session ends it with ``error broker_error``
and close 1011, never a bare dropped socket.

A streaming session outlives a dropped socket (no close handshake) for
``realtime.resume_grace_s`` (the worker goes on; its chunks wait in the ``out`` stream)
and is resumed through any replica with ``session.resume`` as a socket's first message
(``realtime/video_resume.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from api.broker import BROKER_ERRORS, bounded
from api.deps import websocket_owner
from api.inputs import reference_from_url
from api.state import AppState
from models.errors import OmniqueueError
from models.realtime_video import SessionResume, StartLimits, VideoErrorCode
from realtime.video_protocol import (
    InteractionRequested,
    StartRequested,
    State,
    StopRequested,
    VideoSessionOptions,
    VideoSessionProtocol,
)
from realtime.video_resume import VideoResumeRecord, take_over
from realtime.worker_watch import BROKER_ERROR, BROKER_ERROR_MESSAGE, WorkerWatch
from storage.constants import session_abandoned_key, session_in_key, session_out_key

router = APIRouter(tags=["realtime"])


class _Session:
    def __init__(self, ws: WebSocket, state: AppState, owner: str) -> None:
        self.ws = ws
        self.state = state
        self.owner = owner
        self.id = "rtv_" + secrets.token_hex(12)
        rt = state.settings.realtime
        streaming = [s for s in state.specs.values() if s.streaming and s.modality == "video"]
        self.protocol = VideoSessionProtocol(
            self.id,
            time.monotonic(),
            VideoSessionOptions(
                start_timeout=rt.start_timeout_s,
                stall_timeout=rt.stall_timeout_s,
                max_start_bytes=rt.max_start_bytes,
                models=frozenset(s.name for s in streaming),
                default_model=streaming[0].name if streaming else None,
                model_limits={
                    s.name: StartLimits(
                        max_width=s.max_width,
                        max_height=s.max_height,
                        max_frames=s.max_frames,
                        max_fps=s.max_fps,
                    )
                    for s in streaming
                },
                max_session_s=rt.max_session_s,
            ),
        )
        self.inbox, self.outbox = session_in_key(self.id), session_out_key(self.id)
        self.send_lock = asyncio.Lock()
        self.tasks: list[asyncio.Task[None]] = []
        self.model: str | None = None
        self.record: VideoResumeRecord | None = None  # set once the session is resumable

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

    async def command(self, event: dict[str, Any]) -> None:
        await bounded(self.state.abus.publish(self.inbox, event))

    async def dispatch(self) -> None:
        for cmd in self.protocol.events_received():
            if isinstance(cmd, StartRequested):
                await self._place(cmd)
            elif isinstance(cmd, InteractionRequested):
                await self._save()  # its event id, before the reply goes out
                await self.command(
                    {
                        "type": "interaction",
                        "event_id": cmd.event_id,
                        "prompt": cmd.prompt,
                        "camera": _camera(cmd.camera),
                        "transition_chunks": cmd.transition_chunks,
                    }
                )
            elif isinstance(cmd, StopRequested):
                await self.command({"type": "stop", "reason": cmd.reason})

    async def _place(self, cmd: StartRequested) -> None:
        start, cfg = cmd.start, cmd.config
        self.model = start.model or self.protocol.options.default_model
        extra = start.extra_params.model_dump(exclude_none=True) if start.extra_params else {}
        config = {
            "model": self.model,
            "owner": self.owner,
            "prompt": start.prompt,
            "negative_prompt": start.negative_prompt,
            "width": cfg.width,
            "height": cfg.height,
            "num_frames": cfg.num_frames,
            "fps": cfg.fps,
            "seed": start.seed
            if start.seed is not None and start.seed >= 0
            else secrets.randbelow(2**31),
            "extra_params": extra,
        }
        rt = self.state.settings.realtime
        if start.image_reference is not None:
            # The first frame, decoded and fitted here so the worker gets exactly its size.
            url = start.image_reference.image_url
            try:
                png = await run_in_threadpool(
                    reference_from_url,
                    url,
                    cfg.width,
                    cfg.height,
                    self.state.settings,
                    "image_reference",
                )
            except OmniqueueError as exc:
                self.protocol.failed(VideoErrorCode.INVALID_IMAGE_REFERENCE, str(exc))
                return
            image = self.state.abus.publish(self.inbox, {"type": "reference_image"}, png)
            await bounded(image)
        await self.command({"type": "keepalive"})  # creates the in stream with its TTL
        placed = run_in_threadpool(
            self.state.queue.start_session,
            self.id,
            str(self.model),
            config,
            expires_s=rt.admission_timeout_s,
        )
        await bounded(placed)
        self.tasks.append(asyncio.create_task(self._relay(), name="relay"))
        self.tasks.append(asyncio.create_task(self._keepalive()))

    async def broker_lost(self) -> None:
        """Redis is gone: say so (``broker_error``) and close 1011."""
        self.protocol.failed(BROKER_ERROR, BROKER_ERROR_MESSAGE)
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await self.flush()

    async def _relay(self) -> None:
        """Worker outputs → protocol → socket; a broker loss ends the session."""
        try:
            await self._relay_outputs()
        except BROKER_ERRORS:
            await self.broker_lost()

    async def _relay_outputs(self) -> None:
        """Worker outputs → protocol → socket, with the admission and liveness clocks."""
        rt = self.state.settings.realtime
        watch = WorkerWatch(rt.admission_timeout_s, rt.lost_after_s, time.monotonic())
        after = "0-0"
        while not self.protocol.close_expected():
            entries = await bounded(self.state.abus.read(self.outbox, after, block_ms=250))
            now = time.monotonic()
            watch.heard([e.type for e in entries], now)
            if not entries:
                verdict = watch.verdict(now)
                if verdict is not None:
                    await self._give_up(verdict)
                await self.flush()
                continue
            for entry in entries:
                after = entry.id
                self._apply(entry.event, entry.data, now)
            if self.record is None and self.protocol.state is State.STREAMING:
                self.record = VideoResumeRecord(self.state.session_states, self.id, self.owner)
                await self._save()  # before video.start hands out the resume token
            await self.dispatch()
            await self.flush()

    async def _give_up(self, verdict: tuple[str, str]) -> None:
        code, message = verdict
        if code == "resource_exhausted":  # a worker that takes it late must not start it
            abandoned = session_abandoned_key(self.id)
            await bounded(self.state.abus.redis.set(abandoned, 1, ex=3600))
        self.protocol.failed(code, message)

    def _apply(self, event: dict[str, Any], data: bytes | None, now: float) -> None:
        kind = event.get("type")
        if kind == "started":
            self.protocol.started(now=now)
        elif kind == "chunk" and data is not None:
            self.protocol.chunk(
                event["kind"],
                data,
                now=now,
                produced_at=event["produced_at"],
                generation_chunk_index=event.get("generation_chunk_index"),
                num_frames=event.get("num_frames", 0),
                started_event_ids=event.get("started_event_ids", ()),
                active_event_ids=event.get("active_event_ids", ()),
                completed_event_ids=event.get("completed_event_ids", ()),
            )
        elif kind == "finished":
            self.protocol.finished(stopped=event["stopped"], artifact_id=event.get("artifact_id"))
        elif kind == "failed":
            self.protocol.failed(event["code"], event["message"])

    async def _keepalive(self) -> None:
        interval = self.state.settings.realtime.keepalive_s
        try:
            while not self.protocol.close_expected():
                await asyncio.sleep(interval)
                if self.record is not None and not await bounded(self.record.holds()):
                    self.protocol.taken_over()  # resumed elsewhere: the worker is theirs
                    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                        await self.flush()
                    return
                await self.command({"type": "keepalive"})
        except BROKER_ERRORS:
            await self.broker_lost()

    async def _save(self) -> None:
        if self.record is not None and self.model is not None:
            saved = self.record.save(self.protocol, self.model, time.monotonic(), time.time())
            if not await bounded(saved):
                self.protocol.taken_over()

    async def resume(self, text: str) -> None:
        """``session.resume`` as the first message: take the named session over."""
        try:
            message = SessionResume.model_validate_json(text)
            now, wall = time.monotonic(), time.time()
            call = take_over(
                self.state.session_states, message, self.owner, self.protocol.options, now, wall
            )
            taken = await bounded(call)
        except (ValueError, *BROKER_ERRORS):  # ValueError: pydantic's ValidationError too
            taken = None
        if taken is None:
            self.protocol.resume_refused()
            return
        self.protocol, self.record, self.model = taken.protocol, taken.record, taken.model
        self.id = taken.protocol.request_id
        self.inbox, self.outbox = session_in_key(self.id), session_out_key(self.id)
        self.tasks.append(
            asyncio.create_task(self._relay(), name="relay")
        )  # from the stream's start
        self.tasks.append(asyncio.create_task(self._keepalive()))

    def detach(self) -> bool:
        """The socket dropped mid-stream: keep the session for a resume (True), its
        keep-alives going, until the grace period ends."""
        if self.record is None or self.protocol.state is not State.STREAMING:
            return False
        for task in self.tasks:  # the relay goes; chunks wait in the out stream
            if task.get_name() == "relay":
                task.cancel()
        self.state.detached_video[self.id] = self
        self.tasks.append(asyncio.create_task(self._expire()))
        return True

    async def _expire(self) -> None:
        """No resume within the grace period: stop the worker, forget the session."""
        await asyncio.sleep(self.state.settings.realtime.resume_grace_s)
        try:
            record = self.record
            if record is not None and await bounded(record.holds()):
                await self.command({"type": "stop", "reason": "disconnected"})
                await bounded(record.drop())
        except BROKER_ERRORS:
            pass  # the worker stops by itself once keep-alives stop
        finally:
            self.state.detached_video.pop(self.id, None)
            for task in self.tasks:
                if task is not asyncio.current_task():
                    task.cancel()

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
        which a streaming session survives; a client that closes it cleanly ends it."""
        if dropped and self.detach():
            return
        if self.record is not None and self.protocol.close_expected():
            with contextlib.suppress(*BROKER_ERRORS):
                await bounded(self.record.drop())  # ended: nothing to resume
        if disconnected:
            self.protocol.connection_lost()
            with contextlib.suppress(Exception):
                await self.dispatch()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _camera(camera: Any) -> str | None:
    """Camera actions as the worker holds them: the w/a/s/d keys pressed in the block
    (three per-latent-frame lists), or a dict's ``actions`` in the same shape."""
    if isinstance(camera, dict):
        camera = camera.get("actions")
    if not isinstance(camera, list):
        return None
    keys = {k for frame in camera if isinstance(frame, list) for k in frame}
    return "".join(k for k in "wasd" if k in keys)


@router.websocket("/v1/realtime/video")
async def realtime_video(websocket: WebSocket) -> None:
    state: AppState = websocket.state.app
    owner, subprotocol = await websocket_owner(websocket, state)
    if owner is None:
        await websocket.close(code=1008, reason="invalid or missing API key")
        return
    await websocket.accept(subprotocol=subprotocol)
    session = _Session(websocket, state, owner)
    disconnected = dropped = False
    try:
        await session.run()
    except WebSocketDisconnect as exc:
        disconnected, dropped = True, exc.code not in (1000, 1001)
    except BROKER_ERRORS:  # placing the session or sending a command
        await session.broker_lost()
    finally:
        await session.close(disconnected, dropped)
