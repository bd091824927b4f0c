"""Per-key quotas on the real stack (``api/quotas.py``): two API processes on one
PostgreSQL database and one Redis, no job worker (jobs stay queued, so active counts
are exact).

Every refusal is a 429 with the OpenAI error body, ``Retry-After`` and the
``x-ratelimit-*`` headers, and stores nothing: no job row, no S3 object, no message on
the model's queue. A key's own value beats the server default; 0 is unlimited.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import redis.asyncio
from PIL import Image
from sqlalchemy import create_engine, func, select
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from api.quotas import Quotas
from cli.embedded import EmbeddedS3
from models.db import Job
from storage.constants import job_queue
from storage.db import make_engine, make_sessionmaker
from storage.keys import ApiKeyStore
from storage.settings import DatabaseSettings, Settings
from tests.integration.conftest import started_stack
from tests.integration.stack import REPO, Stack

pytestmark = pytest.mark.integration

SMALL = {"size": "64x48", "seconds": "0.5", "fps": 16, "num_inference_steps": 1}
# what OpenAI's x-ratelimit-reset-* look like: 250ms, 1s, 1.5s, 6m0s
GO_DURATION = re.compile(r"^(\d+ms|\d+(\.\d+)?s|(\d+h)?\d+m\d+s)$")
DEFAULTS = {
    "OMNIQ_QUOTAS__CREATES_PER_MINUTE": "3",
    "OMNIQ_QUOTAS__MAX_ACTIVE_JOBS": "2",
    "OMNIQ_QUOTAS__MAX_SESSIONS": "1",
    "OMNIQ_REALTIME__START_TIMEOUT_S": "30",
}


@dataclass
class Deployment:
    """One deployment served by two API processes."""

    a: Stack
    b: Stack

    def key(self, name: str, **quotas: int | None) -> tuple[str, str]:
        """A new key with ``quotas`` of its own: ``(secret, key id)``."""
        engine = make_engine(DatabaseSettings(url=self.a.database_url))
        try:
            row, secret = ApiKeyStore(make_sessionmaker(engine)).create(name, **quotas)
        finally:
            engine.dispose()
        return secret, row.id

    def stored(self, owner: str) -> tuple[int, int, int]:
        """What the deployment holds: the owner's job rows, messages on the model's
        queue, objects under ``videos/``."""
        engine = create_engine(self.a.database_url)
        try:
            with engine.connect() as conn:
                q = select(func.count()).select_from(Job).where(Job.owner == owner)
                rows = int(conn.execute(q).scalar_one())
        finally:
            engine.dispose()
        client = redis.Redis.from_url(self.a.redis_url)
        try:
            messages = int(client.llen(job_queue("reference/video")))
        finally:
            client.close()
        listed = self.a.s3.client().list_objects_v2(Bucket=self.a.s3.bucket, Prefix="videos/")
        return rows, messages, len(listed.get("Contents", []))


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, redis_db: int
) -> Iterator[Deployment]:
    with started_stack(
        tmp_path_factory,
        s3_server,
        "quotas",
        redis_db=redis_db,
        workers=0,
        extra_env=DEFAULTS,
        auth="required",
    ) as a:
        b = a.sibling(Path(tmp_path_factory.mktemp("quotas-b")), {})  # a second API process
        b.start(workers=0)
        try:
            yield Deployment(a, b)
        finally:
            b.stop()


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _create_with_reference(client: httpx.Client, **headers: str) -> httpx.Response:
    """A multipart create that uploads an input reference (an S3 object) when stored."""
    data = {"prompt": "a red wall", **{k: str(v) for k, v in SMALL.items()}}
    files = {"input_reference": ("ref.png", _png(), "image/png")}
    return client.post("/v1/videos", data=data, files=files, headers=headers)


def _assert_refused(resp: httpx.Response, param: str) -> dict[str, Any]:
    assert resp.status_code == 429, resp.text
    error = resp.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert error["param"] == param and param in error["message"]
    assert 1 <= int(resp.headers["retry-after"]) <= 60
    return dict(error)


def test_creates_per_minute_are_shared_by_two_api_processes(deployment: Deployment) -> None:
    secret, owner = deployment.key("rate", max_active_jobs=0)  # the default 3 per minute
    a, b = deployment.a.client(secret), deployment.b.client(secret)
    with a, b:
        remaining = []
        for i, client in enumerate((a, b, a)):
            resp = (
                _create_with_reference(client)
                if i == 0
                else client.post("/v1/videos", json={"prompt": "p", **SMALL})
            )
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-ratelimit-limit-requests"] == "3"
            assert GO_DURATION.match(resp.headers["x-ratelimit-reset-requests"])
            remaining.append(resp.headers["x-ratelimit-remaining-requests"])
        assert remaining == ["2", "1", "0"]
        before = deployment.stored(owner)
        assert before[0] == 3
        refused = _create_with_reference(b)
        _assert_refused(refused, "creates_per_minute")
        assert refused.headers["x-ratelimit-limit-requests"] == "3"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert GO_DURATION.match(refused.headers["x-ratelimit-reset-requests"])
        # every create endpoint counts, and refuses before reading the body
        for path in ("/v1/videos/sync", "/v1/audio/speech", "/v1/audio/generate"):
            _assert_refused(a.post(path, json={"prompt": "p", **SMALL}), "creates_per_minute")
        assert deployment.stored(owner) == before
    # the OpenAI SDK sees its RateLimitError (and would retry after Retry-After)
    sdk = openai.OpenAI(base_url=deployment.a.url + "/v1", api_key=secret, max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.videos.create(prompt="p", seconds="4", size="720x1280")
    assert caught.value.code == "rate_limit_exceeded"
    assert int(caught.value.response.headers["retry-after"]) >= 1
    assert deployment.stored(owner) == before


def test_active_jobs_default_and_a_key_override(deployment: Deployment) -> None:
    default_secret, default_owner = deployment.key("defaults")  # 3/min, 2 active
    with deployment.a.client(default_secret) as client:
        for _ in range(2):
            assert client.post("/v1/videos", json={"prompt": "p", **SMALL}).status_code == 200
        before = deployment.stored(default_owner)
        refused = _create_with_reference(client)
        _assert_refused(refused, "max_active_jobs")
        assert refused.headers["retry-after"] == "10"
        # a refusal after the rate-limit hit still says where the key stands
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert deployment.stored(default_owner) == before

    secret, owner = deployment.key("bigger", max_active_jobs=3, creates_per_minute=0)
    with deployment.a.client(secret) as a, deployment.b.client(secret) as b:
        first = a.post(
            "/v1/videos", json={"prompt": "p", **SMALL}, headers={"Idempotency-Key": "k1"}
        )
        assert first.status_code == 200, first.text
        assert "x-ratelimit-limit-requests" not in first.headers  # no rate limit applies
        for client in (b, a):
            assert client.post("/v1/videos", json={"prompt": "p", **SMALL}).status_code == 200
        before = deployment.stored(owner)
        _assert_refused(_create_with_reference(b), "max_active_jobs")
        assert deployment.stored(owner) == before
        # a retried create of a job that exists gets that job, not a 429
        again = b.post(
            "/v1/videos", json={"prompt": "p", **SMALL}, headers={"Idempotency-Key": "k1"}
        )
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        # once one of them ends, the key may create again
        assert a.post(f"/v1/videos/{first.json()['id']}/cancel").status_code == 200
        assert _create_with_reference(b).status_code == 200
        rows, _, _ = deployment.stored(owner)
        assert rows == before[0] + 1


def test_zero_is_unlimited(deployment: Deployment) -> None:
    secret, owner = deployment.key("free", creates_per_minute=0, max_active_jobs=0)
    with deployment.a.client(secret) as client:
        for _ in range(6):
            resp = client.post("/v1/videos", json={"prompt": "p", **SMALL})
            assert resp.status_code == 200, resp.text
            assert "x-ratelimit-limit-requests" not in resp.headers
    assert deployment.stored(owner)[0] == 6


def _ws(st: Stack, secret: str, path: str) -> ClientConnection:
    url = st.url.replace("http://", "ws://") + path
    return connect(url, additional_headers={"Authorization": f"Bearer {secret}"})


def _refused_socket(st: Stack, secret: str, path: str) -> dict[str, Any]:
    """The error event of a socket refused for its key's session limit (then 1013)."""
    with _ws(st, secret, path) as ws:
        event = json.loads(ws.recv(timeout=10))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    assert event["type"] == "error"
    return dict(event)


def _first_event_once_admitted(st: Stack, secret: str, tries: int = 50) -> dict[str, Any]:
    """The first event of a ``/v1/realtime`` socket, retried while it is refused."""
    for _ in range(tries):
        with _ws(st, secret, "/v1/realtime") as ws:
            event = dict(json.loads(ws.recv(timeout=10)))
        if event["type"] != "error":
            return event
        time.sleep(0.1)
    raise AssertionError(f"still refused: {event}")


def test_a_session_over_the_limit_is_refused_with_1013(deployment: Deployment) -> None:
    secret, _ = deployment.key("sessions")  # the default: one session
    with _ws(deployment.a, secret, "/v1/realtime/video"):  # held open, on API process a
        voice = _refused_socket(deployment.b, secret, "/v1/realtime")  # any replica knows
        assert voice["error"]["code"] == "rate_limit_exceeded"
        assert voice["error"]["param"] == "max_sessions"
        video = _refused_socket(deployment.a, secret, "/v1/realtime/video")
        assert video["code"] == "rate_limit_exceeded" and video["param"] == "max_sessions"
    # the held session ended: its place is free again (once its handler let it go)
    assert _first_event_once_admitted(deployment.b, secret)["type"] == "session.created"
    # a key's own limit beats the default
    two, _ = deployment.key("two sessions", max_sessions=2)
    with _ws(deployment.a, two, "/v1/realtime/video"), _ws(deployment.b, two, "/v1/realtime") as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"


# An API replica holding one session place of ``key_killed``, renewing a 3 s lease.
_HOLDER = """
import asyncio, sys
import redis.asyncio
from api.quotas import Quotas
from storage.settings import Settings

async def main():
    url = sys.argv[1]
    settings = Settings(redis={"url": url}, _env_file=None)
    quotas = Quotas(settings, redis.asyncio.Redis.from_url(url), session_lease_s=3.0)
    async with quotas.session_lease("key_killed", 1) as admitted:
        print("admitted" if admitted else "refused", flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


def _admitted(redis_url: str) -> bool:
    """Whether a session of ``key_killed`` (limit 1) is admitted now (and let go)."""

    async def attempt() -> bool:
        client = redis.asyncio.Redis.from_url(redis_url)
        settings = Settings(redis={"url": redis_url}, _env_file=None)  # type: ignore[call-arg]
        try:
            async with Quotas(settings, client, session_lease_s=3.0).session_lease(
                "key_killed", 1
            ) as admitted:
                return admitted
        finally:
            await client.aclose()

    return asyncio.run(attempt())


def test_the_sessions_of_a_killed_replica_expire(deployment: Deployment) -> None:
    url = deployment.a.redis_url
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url], cwd=REPO, env=env, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"admitted"
        assert not _admitted(url)
        time.sleep(4)  # past one lease: the holder renewed it
        assert not _admitted(url)
    finally:
        holder.kill()  # no chance to let go of its place
        holder.wait(10)
    deadline = time.monotonic() + 15
    while not _admitted(url):
        assert time.monotonic() < deadline, "the killed holder's lease never expired"
        time.sleep(0.2)
