"""Job event streams: SSE ``/events`` and WebSocket ``/stream`` over Redis Streams."""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import httpx
import pytest
import redis
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.integration.stack import Stack

pytestmark = pytest.mark.integration

SMALL = {"size": "64x48", "seconds": "0.5", "fps": 16, "num_inference_steps": 6}


def read_sse(
    stack: Stack, key: str, vid: str, last_id: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """Parse the SSE stream until ``done`` (or ``limit`` events)."""
    headers = {"Authorization": f"Bearer {key}"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    events: list[dict[str, Any]] = []
    with httpx.stream(
        "GET", f"{stack.url}/v1/videos/{vid}/events", headers=headers, timeout=60
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        block: dict[str, str] = {}
        for line in resp.iter_lines():
            if line.startswith(":"):
                continue
            if line == "":
                if block:
                    event = json.loads(block["data"])
                    assert event["id"] == block["id"] and event["type"] == block["event"]
                    events.append(event)
                    block = {}
                    if event["type"] == "done" or (limit and len(events) >= limit):
                        return events
                continue
            name, _, value = line.partition(": ")
            block[name] = value
    return events


def _create(client: httpx.Client, **fields: Any) -> str:
    resp = client.post("/v1/videos", json={"prompt": "watch me", **SMALL, **fields})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def test_ten_watchers_see_the_same_ordered_events(
    stack: Stack, key: str, client: httpx.Client
) -> None:
    vid = _create(client)
    results: list[list[dict[str, Any]]] = [[] for _ in range(10)]

    def watch(i: int) -> None:
        results[i] = read_sse(stack, key, vid)

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    first = results[0]
    assert all(r == first for r in results)
    types = [e["type"] for e in first]
    assert types[0] == "status" and first[0]["status"] == "queued"
    assert {"status": "in_progress"}.items() <= next(
        e for e in first if e["type"] == "status" and e["status"] == "in_progress"
    ).items()
    assert types[-1] == "done" and first[-1]["status"] == "completed"
    progress = [e["progress"] for e in first if e["type"] == "progress"]
    assert progress == sorted(progress) and progress[-1] >= 95
    steps = [e["step"] for e in first if e["type"] == "progress"]
    assert 6 in steps
    previews = [e for e in first if e["type"] == "preview"]
    assert previews, "previews are on every 2 steps in the test stack"
    assert base64.b64decode(previews[0]["jpeg_b64"])[:3] == b"\xff\xd8\xff"
    ids = [e["id"] for e in first]
    assert len(set(ids)) == len(ids)


def test_resume_with_last_event_id_gives_the_rest_once(
    stack: Stack, key: str, client: httpx.Client
) -> None:
    vid = _create(client)
    full = read_sse(stack, key, vid)
    head = read_sse(stack, key, vid, limit=3)
    assert head == full[:3]
    rest = read_sse(stack, key, vid, last_id=head[-1]["id"])
    assert head + rest == full


def test_watcher_of_a_finished_job_gets_the_replay(
    stack: Stack, key: str, client: httpx.Client
) -> None:
    vid = _create(client)
    stack.wait_for(client, vid)
    replay = read_sse(stack, key, vid)
    assert replay[0]["type"] == "status" and replay[-1] == {
        **replay[-1],
        "type": "done",
        "status": "completed",
    }
    # once the stream has expired, the row still answers with status + done, at once (it
    # came after the API's 15 s block on the empty stream before)
    redis.Redis.from_url(stack.redis_url).delete(f"oq:job:{vid}:events")
    asked = time.monotonic()
    synthetic = read_sse(stack, key, vid)
    assert time.monotonic() - asked < 10
    assert [e["type"] for e in synthetic] == ["status", "done"]
    assert synthetic[-1]["status"] == "completed"


def test_cancel_ends_the_stream_with_cancelled(
    stack: Stack, key: str, client: httpx.Client
) -> None:
    vid = _create(client, size="320x240", seconds="4", num_inference_steps=200)
    stack.wait_for(client, vid, until=("in_progress",))
    client.post(f"/v1/videos/{vid}/cancel")
    events = read_sse(stack, key, vid)
    assert events[-1]["type"] == "done"
    assert events[-1]["status"] == "failed" and events[-1]["error"]["code"] == "cancelled"
    assert sum(e["type"] == "done" for e in events) == 1


def test_websocket_stream_carries_the_same_events(
    stack: Stack, key: str, client: httpx.Client
) -> None:
    vid = _create(client)
    sse = read_sse(stack, key, vid)
    ws_url = stack.url.replace("http://", "ws://") + f"/v1/videos/{vid}/stream"
    received = []
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        for message in ws:
            received.append(json.loads(message))
            if received[-1]["type"] == "done":
                break
    assert received == sse
    # browsers authenticate with the subprotocol instead of a header
    with connect(ws_url, subprotocols=[f"openai-insecure-api-key.{key}"]) as ws:  # type: ignore[list-item]
        assert json.loads(ws.recv(timeout=10))["type"] == "status"


def test_events_follow_the_ownership_rules(stack: Stack, key: str, client: httpx.Client) -> None:
    vid = _create(client)
    with stack.client(stack.create_key("stranger")) as other:
        assert other.get(f"/v1/videos/{vid}/events").status_code == 404
    with stack.client() as anonymous:
        assert anonymous.get(f"/v1/videos/{vid}/events").status_code == 401
    ws_url = stack.url.replace("http://", "ws://") + f"/v1/videos/{vid}/stream"
    with pytest.raises(InvalidStatus) as info:
        connect(ws_url).close()
    assert info.value.response.status_code == 403
    stack.wait_for(client, vid)
