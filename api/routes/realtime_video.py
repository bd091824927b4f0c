"""``WS /v1/realtime/video``: the thin asyncio shell around ``VideoSessionProtocol``.

The protocol object decides everything (sans-I/O); this handler only moves data: client
frames in, commands out to the worker over the session's ``in`` stream, worker outputs
from the ``out`` stream back into the protocol, and the protocol's frames to the socket.
It owns the clocks: the start and stall timeouts, the session time limit, the admission
timeout (no worker slot → ``resource_exhausted``) and the worker's liveness (silent
worker → ``worker_lost``). Losing Redis mid-session ends it with ``error broker_error``
and close 1011, never a bare dropped socket.
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
from models.realtime_video import StartLimits, VideoErrorCode
from realtime.video_protocol import (
    InteractionRequested,
    StartRequested,
    StopRequested,
    VideoSessionOptions,
    VideoSessionProtocol,
)
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
        self.tasks.append(asyncio.create_task(self._relay()))
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
                await self.command({"type": "keepalive"})
        except BROKER_ERRORS:
            await self.broker_lost()

    async def run(self) -> None:
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
                if message.get("text") is not None:
                    self.protocol.receive_text(message["text"], now)
                elif message.get("bytes") is not None:
                    self.protocol.receive_binary(message["bytes"], now)
            await self.dispatch()
            await self.flush()

    async def close(self, disconnected: bool) -> None:
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
    disconnected = False
    try:
        await session.run()
    except WebSocketDisconnect:
        disconnected = True
    except BROKER_ERRORS:  # placing the session or sending a command
        await session.broker_lost()
    finally:
        await session.close(disconnected)
