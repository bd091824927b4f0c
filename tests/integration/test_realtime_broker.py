"""Losing Redis/Valkey under live realtime sessions: ``WS /v1/realtime`` and
``WS /v1/realtime/video`` each send an ``error`` (``broker_error``) and close 1011, instead
of dropping the socket (1006). The deployment has a Redis of its own (a ``redis-server``
started here on a free port) so the test can kill it without touching anyone else's."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from cli.embedded import EmbeddedS3
from tests.integration.conftest import new_database
from tests.integration.stack import Stack
from tests.integration.test_realtime_video import LONG
from workers.runtime.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# long enough (80 chunks at 256x256) to still run when Redis goes
WORLD_START = {k: v for k, v in LONG.items() if k != "seed"}


class PrivateRedis:
    def __init__(self, work: Path) -> None:
        server = shutil.which("redis-server") or shutil.which("valkey-server")
        assert server, "redis-server (or valkey-server) is needed for this test"
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        self.proc = subprocess.Popen(
            [server, *args, "--appendonly", "no", "--dir", str(work)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def bstack(tmp_path: Path, s3_server: EmbeddedS3) -> Iterator[tuple[Stack, PrivateRedis]]:
    private = PrivateRedis(tmp_path)
    env = {
        "OMNIQ_REALTIME__SLOTS": "2",
        "OMNIQ_REALTIME__ADMISSION_TIMEOUT_S": "10",
        "OMNIQ_REALTIME__LOST_AFTER_S": "30",  # so the broker, not the worker, is missed
        "OMNIQ_REALTIME__KEEPALIVE_S": "0.5",
    }
    with new_database("postgresql", tmp_path) as url:
        st = Stack(
            work=tmp_path, database_url=url, redis_url=private.url, s3=s3_server, auth="off",
            extra_env=env,
        )  # fmt: skip
        try:
            st.start(workers=0, realtime_workers=1)
            yield st, private
        finally:
            private.kill()
            st.stop(graceful=False)


async def _ws(st: Stack, path: str) -> ClientConnection:
    return await connect(st.url.replace("http://", "ws://") + path, max_size=16 * 1024 * 1024)


async def _until(ws: ClientConnection, kind: str, timeout: float = 30) -> dict[str, Any]:
    async def wait() -> dict[str, Any]:
        while True:
            message = await ws.recv()
            if isinstance(message, str) and json.loads(message)["type"] == kind:
                return dict(json.loads(message))

    return await asyncio.wait_for(wait(), timeout)


async def _close_code(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 30)
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


async def _two_live_sessions(st: Stack) -> tuple[ClientConnection, ClientConnection]:
    """A world session streaming and a voice session on its worker."""
    video = await _ws(st, "/v1/realtime/video")
    voice = await _ws(st, "/v1/realtime?model=reference/voice")
    await video.send(json.dumps(WORLD_START))
    await _until(video, "video.start")
    await _until(video, "video.chunk_metadata")
    await _until(voice, "session.created")
    await asyncio.sleep(1.0)  # the voice session is on its worker
    return video, voice


def test_redis_lost_mid_session_is_an_error_then_close_1011(
    bstack: tuple[Stack, PrivateRedis],
) -> None:
    st, private = bstack

    async def run() -> list[tuple[dict[str, Any], int | None]]:
        video, voice = await _two_live_sessions(st)
        private.kill()
        out = []
        for ws in (video, voice):
            error = await _until(ws, "error")
            out.append((error, await _close_code(ws)))
        # and sessions opened while it is down are told the same, not dropped
        video = await _ws(st, "/v1/realtime/video")
        await video.send(json.dumps(WORLD_START))
        out.append((await _until(video, "error"), await _close_code(video)))
        voice = await _ws(st, "/v1/realtime?model=reference/voice")
        out.append((await _until(voice, "error"), await _close_code(voice)))
        return out

    (video_err, video_close), (voice_err, voice_close), *later = asyncio.run(run())
    assert video_err["code"] == "broker_error" and video_close == 1011
    assert "broker" in video_err["message"]
    assert voice_err["error"]["code"] == "broker_error" and voice_close == 1011
    assert voice_err["error"]["type"] == "server_error"
    (late_video, late_video_close), (late_voice, late_voice_close) = later
    assert (late_video["code"], late_video_close) == ("broker_error", 1011)
    assert (late_voice["error"]["code"], late_voice_close) == ("broker_error", 1011)
    assert "Traceback" not in st.log("api")


def test_a_stalled_redis_is_an_error_then_close_1011(bstack: tuple[Stack, PrivateRedis]) -> None:
    """SIGSTOP: the broker's sockets stay open but nothing answers (no RST, keep-alives
    answered by the kernel): the sessions must not hang until it comes back."""
    st, private = bstack

    async def run() -> list[tuple[dict[str, Any], int | None]]:
        video, voice = await _two_live_sessions(st)
        private.proc.send_signal(signal.SIGSTOP)
        try:
            out = []
            for ws in (video, voice):
                error = await _until(ws, "error", timeout=20)
                out.append((error, await _close_code(ws)))
            return out
        finally:
            private.proc.send_signal(signal.SIGCONT)

    (video_err, video_close), (voice_err, voice_close) = asyncio.run(run())
    assert (video_err["code"], video_close) == ("broker_error", 1011)
    assert (voice_err["error"]["code"], voice_close) == ("broker_error", 1011)
