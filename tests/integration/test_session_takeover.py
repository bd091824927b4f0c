"""API replicas hold no session state: a duplex ``/v1/realtime`` session started on one
replica, whose replica is SIGKILLed mid-response, is resumed on another (or on the same
port once ``omniqueue up`` restarted the API) with every event exactly once and in order
and the response completing; a ``/v1/realtime/video`` session dropped after two chunks
is resumed on another replica (and taken over from there by a third socket) with every
chunk index exactly once and a concatenation that decodes to ``num_frames``. Real
``omniqueue up`` stacks (embedded Valkey, SQLite, SeaweedFS), real API and realtime
worker processes, ``reference/voice`` and ``reference/world``."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from models.realtime_video_chunks import frames_in_chunk
from tests.helpers import next_pair, world_session_start
from tests.integration.up_process import Up, alive, api_pids, listening_ports
from workers.runtime.ports import free_port, reserve_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENV = {
    "OMNIQ_REALTIME__KEEPALIVE_S": "0.5",
    # the worker goes on without any API for this long: enough for an API restart
    "OMNIQ_REALTIME__LOST_AFTER_S": "25",
    "OMNIQ_REALTIME__RESUME_GRACE_S": "30",
}
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
QUESTION = "tell me a long story about the sea, the wind and the boats in the harbour"


async def _recv(ws: ClientConnection, timeout: float = 30) -> dict[str, Any]:
    return dict(json.loads(await asyncio.wait_for(ws.recv(), timeout)))


async def _start_response(url: str) -> tuple[ClientConnection, list[dict[str, Any]]]:
    """A duplex session on ``url`` with a response under way (two audio deltas seen)."""
    ws = await connect(url.replace("http", "ws") + "/v1/duplex?model=reference/voice")
    seen = [await _recv(ws)]
    assert seen[0]["type"] == "session.created"
    await ws.send(json.dumps({"type": "session.update", "session": MANUAL}))
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": QUESTION}],
    }
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    await ws.send(json.dumps({"type": "response.create"}))
    while sum(e["type"] == "response.output_audio.delta" for e in seen) < 2:
        seen.append(await _recv(ws))
    return ws, seen


async def _drain(ws: ClientConnection, seen: list[dict[str, Any]]) -> None:
    """What was on its way to the client before its replica died."""
    try:
        while True:
            seen.append(await _recv(ws, timeout=10))
    except (ConnectionClosed, TimeoutError):
        pass


async def _send_resume(ws: ClientConnection, session_id: str, token: str, **cursor: int) -> None:
    """``session.resume``, the same message on both protocols but for its cursor
    (``last_received_server_event_seq``, ``last_generation_chunk_index``)."""
    resume = {"type": "session.resume", "session_id": session_id, "resume_token": token}
    await ws.send(json.dumps(resume | cursor))


async def _resume(
    url: str, session: dict[str, Any], last_seq: int, again: bool = False
) -> list[dict[str, Any]]:
    """Resume on ``url`` and read to the end of the response (``again``: and through a
    second response), then close the session."""
    ws = await connect(url.replace("http", "ws") + "/v1/duplex?model=reference/voice")
    fresh = await _recv(ws)
    assert fresh["type"] == "session.created" and fresh["session"]["id"] != session["id"]
    await _send_resume(
        ws, session["id"], session["resume_token"], last_received_server_event_seq=last_seq
    )
    after = [await _recv(ws)]
    while after[-1]["type"] not in ("response.done", "session.resync_required", "error"):
        after.append(await _recv(ws))
    if again:  # the worker still serves the session: nobody stopped it
        await ws.send(json.dumps({"type": "response.create"}))
        after.append(await _recv(ws))
        while after[-1]["type"] not in ("response.done", "error"):
            after.append(await _recv(ws))
    await ws.send(json.dumps({"type": "session.heartbeat"}))
    after.append(await _recv(ws))
    await ws.send(json.dumps({"type": "session.close", "reason": "done"}))
    after.append(await _recv(ws))
    await ws.close()
    return after


def _check(before: list[dict[str, Any]], after: list[dict[str, Any]], responses: int = 1) -> None:
    assert after[0]["type"] == "session.resumed", after[:3]
    live = after[1:-2]
    if responses == 2:  # the second response: complete, numbered on
        second = [i for i, e in enumerate(live) if e["type"] == "response.created"]
        assert len(second) == 1, [e["type"] for e in live]
        assert live[-1]["type"] == "response.done"
        assert live[-1]["response"]["status"] == "completed"
        live, rest = live[: second[0]], live[second[0] :]
        seqs = [e["server_event_seq"] for e in live + rest]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert after[0]["replayed"] <= len(live)
    events = before + live
    seqs = [e["server_event_seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # every event once, in order, none missing
    ids = [e["event_id"] for e in events]
    assert len(set(ids)) == len(ids)
    done = live[-1]["response"]
    assert done["status"] == "completed", done
    kinds = [e["type"] for e in events]
    assert kinds.count("response.created") == 1 and kinds.count("response.done") == 1
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert {e["response_id"] for e in deltas} == {done["id"]}
    audio_ms = sum(len(base64.b64decode(e["delta"])) for e in deltas) // 48
    assert done["usage"]["output_tokens"] == -(-audio_ms // 100)  # what the client got
    words = "".join(
        e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"
    )
    assert words and done["output"][0]["content"][0]["transcript"] == words
    assert after[-2]["type"] == "session.heartbeat_ack"
    assert after[-1]["type"] == "session.closed" and after[-1]["reason"] == "done"


def _api_on(up: Up, port: int) -> int:
    found = [pid for pid in api_pids(up) if port in listening_ports({pid})]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """``omniqueue up --api-replicas 2``: replica A on ``up.port``, B on the next port."""
    data = Path(tmp_path_factory.mktemp("replicas")) / "data"
    up = Up(data, reserve_ports(2), ENV, workers=0, args=("--api-replicas", "2"))
    try:
        yield up
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
        assert code == 0
        assert [pid for pid in tree if alive(pid)] == []


def _urls(up: Up) -> tuple[str, str]:
    """Both replicas, once both answer (a killed one is restarted by ``up``)."""
    urls = up.url, f"http://127.0.0.1:{up.port + 1}"
    deadline = time.monotonic() + 30
    for url in urls:
        while True:
            assert time.monotonic() < deadline, up.log.read_text()[-4000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    return urls


def test_resume_on_replica_b_after_replica_a_is_killed_mid_response(replicas: Up) -> None:
    a, b = _urls(replicas)

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ws, before = await _start_response(a)
        os.kill(_api_on(replicas, replicas.port), signal.SIGKILL)  # A dies mid-response
        await _drain(ws, before)
        session = before[0]["session"]
        after = await _resume(b, session, before[-1]["server_event_seq"])
        return before, after

    before, after = asyncio.run(run())
    _check(before, after)
    assert before[-1]["type"] != "response.done"  # A died before the response ended


def test_a_live_replica_lets_a_session_resumed_elsewhere_go(replicas: Up) -> None:
    """The socket drops, replica A lives on; the session is resumed on B mid-response: A
    writes nothing more and does not stop the worker, so a second response works."""
    a, b = _urls(replicas)

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ws, before = await _start_response(a)
        assert ws.transport is not None
        ws.transport.abort()  # a dropped network; A detaches the session and goes on
        await asyncio.sleep(0.3)
        session = before[0]["session"]
        after = await _resume(b, session, before[-1]["server_event_seq"], again=True)
        return before, after

    before, after = asyncio.run(run())
    _check(before, after, responses=2)


def test_resume_after_the_only_api_is_killed_and_restarted(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", free_port(), ENV, workers=0, args=("--api-replicas", "1"))

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ws, before = await _start_response(up.url)
        api = _api_on(up, up.port)
        os.kill(api, signal.SIGKILL)
        await _drain(ws, before)
        deadline = time.monotonic() + 20
        while True:  # omniqueue up restarts the API
            assert time.monotonic() < deadline, up.log.read_text()[-4000:]
            try:
                if httpx.get(up.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        assert _api_on(up, up.port) != api
        after = await _resume(up.url, before[0]["session"], before[-1]["server_event_seq"])
        return before, after

    try:
        before, after = asyncio.run(run())
        _check(before, after)
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    assert code == 0
    assert [pid for pid in tree if alive(pid)] == []


# 20 chunks: running for a while (the test drops and resumes it twice)
WORLD_START = world_session_start(237)


async def _world_ws(url: str) -> ClientConnection:
    return await connect(
        url.replace("http", "ws") + "/v1/realtime/video", max_size=16 * 1024 * 1024
    )


async def _resume_world(url: str, start: dict[str, Any], last: int) -> ClientConnection:
    ws = await _world_ws(url)
    await _send_resume(
        ws, start["session_id"], start["resume_token"], last_generation_chunk_index=last
    )
    resumed, _ = await next_pair(ws)
    assert resumed == {
        "type": "session.resumed",
        "request_id": start["request_id"],
        "session_id": start["session_id"],
        "next_generation_chunk_index": last + 1,
    }
    init, data = await next_pair(ws)
    assert init["kind"] == "init" and init["transport_chunk_index"] == 0 and data
    assert data[4:8] == b"ftyp"
    return ws


def _decoded_frames(data: bytes) -> int:
    with av.open(io.BytesIO(data), mode="r") as container:
        return sum(1 for _ in container.decode(video=0))


def test_world_session_dropped_after_two_chunks_resumes_on_another_replica(
    replicas: Up,
) -> None:
    a, b = _urls(replicas)

    async def run() -> dict[str, Any]:
        first = await _world_ws(a)
        await first.send(json.dumps(WORLD_START))
        start, _ = await next_pair(first)
        assert start["type"] == "video.start" and start["session_id"] and start["resume_token"]
        chunks = start["config"]["chunks"]
        got: dict[int, bytes] = {}  # every media chunk the client received, by index
        while len(got) < 2:
            meta, data = await next_pair(first)
            assert meta["kind"] == "media" and data is not None
            got[meta["generation_chunk_index"]] = data
        assert first.transport is not None
        first.transport.abort()  # a dropped network, no close handshake

        # on replica B, from chunk 2 on
        second = await _resume_world(b, start, 1)
        while len(got) < 4:
            meta, data = await next_pair(second)
            assert meta["kind"] == "media" and data is not None
            assert meta["generation_chunk_index"] not in got
            got[meta["generation_chunk_index"]] = data
        # a third socket (on A again) takes the session over from B's socket
        third = await _resume_world(a, start, max(got))
        while True:
            event, _ = await next_pair(second)
            if event["type"] == "error":
                break
        assert event["code"] == "session_taken_over"
        await second.wait_closed()
        assert second.close_code == 1008
        trailer = b""
        while True:
            meta, data = await next_pair(third)
            if meta["type"] == "session.done":
                break
            assert data is not None
            if meta["kind"] == "trailer":
                trailer = data
                continue
            assert meta["generation_chunk_index"] not in got  # exactly once
            got[meta["generation_chunk_index"]] = data
        await third.close()
        assert meta["chunks"] == chunks and meta["stopped"] is False
        assert sorted(got) == list(range(chunks))
        whole = b"".join(got[i] for i in range(chunks)) + trailer
        assert _decoded_frames(whole) == WORLD_START["num_frames"]
        return start

    start = asyncio.run(run())
    chunks = start["config"]["chunks"]
    assert sum(frames_in_chunk(i) for i in range(chunks)) == WORLD_START["num_frames"]
