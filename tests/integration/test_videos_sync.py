"""``POST /v1/videos/sync`` follows the job's event stream instead of polling its row.

A stack of its own (PostgreSQL, Redis, SeaweedFS, an API and a worker process) whose API
logs every SQL statement (``OMNIQ_DATABASE__ECHO``), so a test can count the ``SELECT``s
the API made on ``jobs`` while a sync request waited.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from cli.embedded import EmbeddedS3
from storage.constants import job_events_key
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = {"size": "64x48", "seconds": "0.5", "fps": 16, "num_inference_steps": 4}
# A statement that reads the jobs table, as SQLAlchemy's echo writes it.
_JOBS_READ = re.compile(r"SELECT\b[^;]*?\bFROM jobs\b", re.S)


class SyncStack(Stack):
    def api_log_size(self) -> int:
        return (self.work / "api.log").stat().st_size

    def api_log_from(self, offset: int) -> str:
        with (self.work / "api.log").open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")


@pytest.fixture(scope="module")
def sstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[SyncStack]:
    work = module_dir
    env = {
        "OMNIQ_DATABASE__ECHO": "true",
    }
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env, cls=SyncStack) as st:
        st.set_failpoints({})
        st.start(workers=1)
        yield st


@pytest.fixture
def client(sstack: SyncStack) -> Iterator[httpx.Client]:
    with sstack.client_without_failpoints(timeout=60) as c:
        yield c


def _find(client: httpx.Client, prompt: str, *statuses: str) -> dict[str, Any]:
    """The newest video with ``prompt`` once it has one of ``statuses``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for video in client.get("/v1/videos", params={"limit": 10}).json()["data"]:
            if video["prompt"] == prompt and video["status"] in statuses:
                return dict(video)
        time.sleep(0.1)
    raise AssertionError(f"no video {prompt!r} with status in {statuses}")


def _sync_running(
    client: httpx.Client, prompt: str
) -> tuple[threading.Thread, list[httpx.Response], dict[str, Any]]:
    """``POST /v1/videos/sync`` of ``prompt`` in a thread (its response lands in the list);
    returns once the job is in progress, with the job."""
    body = {"prompt": prompt, **SMALL}
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(client.post("/v1/videos/sync", json=body)))
    thread.start()
    return thread, out, _find(client, prompt, "in_progress")


def test_sync_waits_on_the_event_stream_not_the_row(
    sstack: SyncStack, client: httpx.Client
) -> None:
    sstack.set_failpoints({"step:1": "sleep:3"})
    thread, out, video = _sync_running(client, "sync without polling")
    offset = sstack.api_log_size()
    time.sleep(1.0)  # the old wait read the row 5 times in a second
    reads_while_waiting = _JOBS_READ.findall(sstack.api_log_from(offset))
    thread.join(60)
    assert reads_while_waiting == []
    (resp,) = out
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "video/mp4"
    assert resp.headers["x-request-id"] == video["id"]
    assert resp.content[4:8] == b"ftyp"
    stored = client.get(f"/v1/videos/{video['id']}").json()
    assert stored["status"] == "completed"
    assert float(resp.headers["x-inference-time-s"]) == pytest.approx(
        stored["inference_time_s"], abs=0.001
    )


def test_sync_of_a_job_that_fails_answers_its_error(
    client: httpx.Client, sstack: SyncStack
) -> None:
    sstack.set_failpoints({"step:1": "raise"})
    resp = client.post("/v1/videos/sync", json={"prompt": "sync that fails", **SMALL})
    assert resp.status_code == 500, resp.text
    error = resp.json()["error"]
    assert error["code"] == "internal_error"
    video = _find(client, "sync that fails", "failed")
    assert video["error"]["code"] == "internal_error"


def test_sync_client_disconnect_cancels_the_job(sstack: SyncStack, client: httpx.Client) -> None:
    sstack.set_failpoints({"step:1": "pause"})
    with pytest.raises(httpx.ReadTimeout):
        client.post(
            "/v1/videos/sync",
            json={"prompt": "sync abandoned", **SMALL},
            timeout=httpx.Timeout(30, read=1.5),
        )
    video = _find(client, "sync abandoned", "failed")
    assert video["error"]["code"] == "cancelled"
    assert video["error"]["message"] == "client disconnected"


def test_sync_of_a_job_that_ended_before_the_wait(sstack: SyncStack, client: httpx.Client) -> None:
    """Idempotent replay of a finished job: its ``done`` is on the stream, or (stream
    expired) only in the row; both answer at once with the stored video."""
    body = {"prompt": "sync replay", **SMALL}
    first = client.post("/v1/videos/sync", json=body, headers={"Idempotency-Key": "replay-1"})
    assert first.status_code == 200, first.text
    video_id = first.headers["x-request-id"]
    again = client.post("/v1/videos/sync", json=body, headers={"Idempotency-Key": "replay-1"})
    assert again.status_code == 200 and again.headers["x-request-id"] == video_id
    assert again.content == first.content
    redis.Redis.from_url(sstack.redis_url).delete(job_events_key(video_id))
    # Without the stream the wait must read the row at once (its quiet-stream check
    # comes only after 15 s; a client giving up after 10 s would see a timeout).
    expired = client.post(
        "/v1/videos/sync", json=body, headers={"Idempotency-Key": "replay-1"}, timeout=10
    )
    assert expired.status_code == 200 and expired.content == first.content


def test_sync_of_a_job_deleted_meanwhile_is_not_a_server_error(
    sstack: SyncStack, client: httpx.Client
) -> None:
    sstack.set_failpoints({"step:1": "pause"})
    thread, out, video = _sync_running(client, "sync deleted")
    assert client.delete(f"/v1/videos/{video['id']}").status_code == 200
    thread.join(60)
    (resp,) = out
    # the delete cancels first (409 cancelled) and then removes the record (404)
    assert resp.status_code in (404, 409), resp.text
    assert resp.json()["error"]["code"] in ("not_found", "cancelled")
