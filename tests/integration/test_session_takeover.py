"""API replicas hold no session state: a duplex ``/v1/realtime`` session started on one
replica, whose replica is SIGKILLed mid-response, is resumed on another (or on the same
port once ``omniqueue up`` restarted the API) with every event exactly once and in order
and the response completing. Real ``omniqueue up`` stacks (embedded Valkey, SQLite,
SeaweedFS), real API and realtime worker processes, ``reference/voice``."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from cli.embedded import free_port
from tests.integration.test_up import Up, _alive, _api_pids, _listening_ports, _port_free

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


async def _resume(url: str, session: dict[str, Any], last_seq: int) -> list[dict[str, Any]]:
    """Resume on ``url`` and read to the end of the response, then close the session."""
    ws = await connect(url.replace("http", "ws") + "/v1/duplex?model=reference/voice")
    fresh = await _recv(ws)
    assert fresh["type"] == "session.created" and fresh["session"]["id"] != session["id"]
    resume = {
        "type": "session.resume",
        "session_id": session["id"],
        "resume_token": session["resume_token"],
        "last_received_server_event_seq": last_seq,
    }
    await ws.send(json.dumps(resume))
    after = [await _recv(ws)]
    while after[-1]["type"] not in ("response.done", "session.resync_required", "error"):
        after.append(await _recv(ws))
    await ws.send(json.dumps({"type": "session.heartbeat"}))
    after.append(await _recv(ws))
    await ws.send(json.dumps({"type": "session.close", "reason": "done"}))
    after.append(await _recv(ws))
    await ws.close()
    return after


def _check(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    assert after[0]["type"] == "session.resumed", after[:3]
    live = after[1:-2]
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
    found = [pid for pid in _api_pids(up) if port in _listening_ports({pid})]
    assert len(found) == 1, found
    return found[0]


def _two_free_ports() -> int:
    port = free_port()
    while not _port_free(port + 1):
        port = free_port()
    return port


def test_resume_on_replica_b_after_replica_a_is_killed_mid_response(tmp_path: Path) -> None:
    port = _two_free_ports()
    up = Up(tmp_path / "data", port, ENV, workers=0, args=("--api-replicas", "2"))
    a, b = up.url, f"http://127.0.0.1:{port + 1}"

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ws, before = await _start_response(a)
        os.kill(_api_on(up, port), signal.SIGKILL)  # replica A dies mid-response
        await _drain(ws, before)
        session = before[0]["session"]
        after = await _resume(b, session, before[-1]["server_event_seq"])
        return before, after

    try:
        before, after = asyncio.run(run())
        _check(before, after)
        assert before[-1]["type"] != "response.done"  # A died before the response ended
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []


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
    assert [pid for pid in tree if _alive(pid)] == []
