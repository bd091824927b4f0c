"""Signed webhooks on the real stack: the API, a Celery worker and ``omniqueue webhooks
serve`` as processes on PostgreSQL, Redis and SeaweedFS, and a receiver on this machine
(``tests/integration/webhook_receiver.py``) that checks every request with
``standardwebhooks`` as a customer's server would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from cli.embedded import EmbeddedS3
from storage.db import make_engine, make_sessionmaker
from storage.keys import ApiKeyStore
from storage.outbox import WebhookOutbox, event_id
from storage.settings import DatabaseSettings
from tests.integration.conftest import isolated_stack
from tests.integration.stack import REPO, Stack
from tests.integration.test_bad_input import _refused
from tests.integration.webhook_receiver import FLAKY_FAILURES, Receiver, running_receiver
from workers.runtime.processes import free_port

pytestmark = pytest.mark.integration

# Its own Redis index: a worker of the session-wide stack (conftest, index 9) would take
# this stack's messages and drop them (their jobs are not in its database).

VIDEO = {"prompt": "a lighthouse at dusk", "size": "64x48", "seconds": "0.5", "fps": 16,
         "num_inference_steps": 3}  # fmt: skip
AUDIO = {"prompt": "rain on a tin roof", "seconds": 1.0, "num_inference_steps": 3}
ENV = {
    "OMNIQ_MODELS": "reference/video,reference/audio",
    "OMNIQ_WEBHOOKS__ALLOW_PRIVATE": "true",  # the receiver is on loopback
    "OMNIQ_WEBHOOKS__BACKOFF_BASE_S": "0.2",
    "OMNIQ_WEBHOOKS__BACKOFF_CAP_S": "0.4",
    "OMNIQ_WEBHOOKS__POLL_INTERVAL_S": "0.05",
    "OMNIQ_WEBHOOKS__TIMEOUT_S": "5",
}


class Keys:
    def __init__(self, stack: Stack) -> None:
        engine = make_engine(DatabaseSettings(url=stack.database_url))
        try:
            store = ApiKeyStore(make_sessionmaker(engine))
            (self.alice_row, self.alice), (self.bob_row, self.bob) = (
                store.create("alice"),
                store.create("bob"),
            )
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def stack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    work = module_dir
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=ENV, auth="required") as st:
        st.start(workers=1)
        st._spawn("webhooks", "webhooks", "serve")
        yield st


@pytest.fixture(scope="module")
def keys(stack: Stack) -> Keys:
    return Keys(stack)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def alice(stack: Stack, keys: Keys) -> Iterator[httpx.Client]:
    with stack.client(keys.alice) as c:
        yield c


def deliveries(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    """The job's delivery rows with their attempts, read from the stack's database."""
    engine = make_engine(DatabaseSettings(url=stack.database_url))
    try:
        return WebhookOutbox(make_sessionmaker(engine)).deliveries(job_id)
    finally:
        engine.dispose()


def multipart(fields: dict[str, Any]) -> dict[str, tuple[None, str]]:
    """``fields`` as multipart/form-data parts (no file)."""
    return {k: (None, str(v)) for k, v in fields.items()}


def receipt_of(receiver: Receiver, job_id: str) -> Any:
    """The first request the receiver got for the job's event (waiting for it)."""
    eid = event_id(job_id)
    got = receiver.wait(lambda got: any(r.webhook_id == eid for r in got))
    return next(r for r in got if r.webhook_id == eid)


def create(client: httpx.Client, path: str = "/v1/videos", **fields: Any) -> dict[str, Any]:
    body = {**(AUDIO if "audio" in path else VIDEO), **fields}
    resp = client.post(path, json=body)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def secret_of(client: httpx.Client) -> str:
    resp = client.get("/v1/webhooks/secret")
    assert resp.status_code == 200, resp.text
    key = resp.json()["key"]
    assert key.startswith("whsec_")
    return str(key)


def verified(secret: str, receipt: Any) -> dict[str, Any]:
    """The event of a receipt, after ``standardwebhooks`` checked its signature."""
    return dict(Webhook(secret).verify(receipt.body, receipt.headers))


def test_secret_is_created_once_and_rotates(stack: Stack, keys: Keys) -> None:
    with stack.client(keys.bob) as bob, stack.client(keys.alice) as alice:
        first = secret_of(bob)
        assert secret_of(bob) == first
        assert secret_of(alice) != first  # one secret per key
        rotated = bob.post("/v1/webhooks/secret/rotate")
        assert rotated.status_code == 200
        assert rotated.json()["key"] not in (first, None)
        assert secret_of(bob) == rotated.json()["key"]
    assert httpx.get(stack.url + "/v1/webhooks/secret").status_code == 401


def test_every_event_is_signed_and_arrives_once_after_three_failures(
    stack: Stack, alice: httpx.Client, receiver: Receiver
) -> None:
    """A receiver answering 503 to the first three attempts of each event gets every
    event (completed, failed, cancelled; video and audio) exactly once, by webhook-id,
    each attempt with the same id and a valid signature."""
    url = receiver.url + "/flaky"
    jobs: dict[str, str] = {}  # job id -> expected event type
    jobs[create(alice, webhook_url=url)["id"]] = "video.completed"
    jobs[create(alice, "/v1/audio/generations", webhook_url=url)["id"]] = "audio.completed"
    for job, kind in jobs.items():  # before any failpoint is set
        stack.wait_for(alice, job, collection="audio/generations" if "audio" in kind else "videos")
    with stack.client_without_failpoints() as _:
        stack.set_failpoints({"step:0": "raise"})
        failed = create(alice, webhook_url=url)["id"]
        assert stack.wait_for(alice, failed)["status"] == "failed"
        jobs[failed] = "video.failed"
        stack.set_failpoints({"prepare": "pause"})
        cancelled = create(alice, webhook_url=url)["id"]
        stack.wait_for(alice, cancelled, until=("in_progress",))
        assert alice.post(f"/v1/videos/{cancelled}/cancel").status_code == 200
        jobs[cancelled] = "video.cancelled"

    ids = {event_id(job): job for job in jobs}
    receiver.wait(lambda _: all(receiver.accepted(e) for e in ids), timeout=120)
    secret = secret_of(alice)
    for eid, job in ids.items():
        tries = [r for r in receiver.receipts if r.webhook_id == eid]
        assert [r.status for r in tries] == [503] * FLAKY_FAILURES + [200]
        events = [verified(secret, r) for r in tries]
        assert events[0] == {
            "object": "event",
            "id": eid,
            "type": jobs[job],
            "created_at": events[0]["created_at"],
            "data": {"id": job},
        }
        assert all(e == events[0] for e in events)  # the same event every time
        assert isinstance(events[0]["created_at"], int)
        # The receiver answers before the sender stores the outcome: wait for the stored
        # state, as a client would (3 retries, then delivered; no more).
        _wait(lambda j=job: [r["status"] for r in deliveries(stack, j)] == ["delivered"])
        [row] = deliveries(stack, job)
        assert row["status"] == "delivered" and row["attempts"] == FLAKY_FAILURES + 1
        made = row["attempts_made"]
        assert [a["outcome"] for a in made] == ["retry"] * FLAKY_FAILURES + ["delivered"]
        assert [a["status_code"] for a in made] == [503] * FLAKY_FAILURES + [200]


def test_a_receiver_that_was_down_gets_the_event_when_it_is_back(
    stack: Stack, alice: httpx.Client
) -> None:
    """Refused connections are retried, across a restart of the sender (the state is in
    the database), until the receiver is back; then the event arrives once."""
    port = free_port()  # nothing listens there yet: connections are refused
    job = create(alice, webhook_url=f"http://127.0.0.1:{port}/ok")["id"]
    stack.wait_for(alice, job)

    def refused_three_times() -> bool:
        rows = deliveries(stack, job)
        return bool(rows) and rows[0]["attempts"] >= 3

    _wait(refused_three_times)
    stack.stop_process("webhooks")
    assert deliveries(stack, job)[0]["status"] == "pending"
    stack._spawn("webhooks", "webhooks", "serve")
    with running_receiver(port) as back:
        [receipt] = back.wait(lambda got: bool(got))
        assert receipt.webhook_id == event_id(job)
        assert verified(secret_of(alice), receipt)["data"] == {"id": job}
        _wait(lambda: deliveries(stack, job)[0]["status"] == "delivered")
    made = deliveries(stack, job)[0]["attempts_made"]
    assert all(a["status_code"] is None and a["error"] for a in made[:-1])
    assert made[-1]["status_code"] == 200


def test_4xx_is_not_retried(stack: Stack, alice: httpx.Client, receiver: Receiver) -> None:
    job = create(alice, webhook_url=receiver.url + "/reject")["id"]
    _wait(lambda: bool(rows := deliveries(stack, job)) and rows[0]["status"] == "failed")
    [row] = deliveries(stack, job)
    assert row["attempts"] == 1 and row["last_status_code"] == 400
    assert len([r for r in receiver.receipts if r.webhook_id == event_id(job)]) == 1


@pytest.mark.parametrize(
    ("path", "body", "form"),
    [
        ("/v1/videos", {}, False),
        ("/v1/videos", {}, True),
        ("/v1/videos/sync", {}, False),
        ("/v1/audio/generations", {}, False),
        ("/v1/audio/speech", {"input": "hello there", "voice": "alloy"}, False),
        ("/v1/audio/generate", {"input": "a gong", "audio_length": 1.0}, False),
    ],
)
def test_every_create_endpoint_takes_a_webhook(
    stack: Stack,
    alice: httpx.Client,
    receiver: Receiver,
    path: str,
    body: dict[str, Any],
    form: bool,
) -> None:
    kind = "audio" if "audio" in path else "video"
    fields = body or (AUDIO if kind == "audio" else VIDEO)
    hook = {"webhook_url": f"{receiver.url}/ok{path}", "webhook_events": f"{kind}.completed"}
    if form:  # one form field: "a,b"
        resp = alice.post(path, files=multipart({**fields, **hook}), timeout=120)
    else:
        events = [f"{kind}.completed"]
        resp = alice.post(path, json={**fields, **hook, "webhook_events": events}, timeout=120)
    assert resp.status_code == 200, resp.text
    sync = not resp.headers["content-type"].startswith("application/json")
    job = resp.headers["x-request-id"] if sync else resp.json()["id"]
    receipt = receipt_of(receiver, job)
    assert receipt.path == f"/ok{path}"
    assert verified(secret_of(alice), receipt)["type"] == f"{kind}.completed"


def test_webhook_events_filter(stack: Stack, alice: httpx.Client, receiver: Receiver) -> None:
    unwanted = create(alice, webhook_url=receiver.url + "/ok", webhook_events=["video.failed"])
    control = create(alice, webhook_url=receiver.url + "/ok")["id"]
    # one worker runs them in order, and queues a job's deliveries before its next job
    receiver.wait(lambda got: any(r.webhook_id == event_id(control) for r in got))
    assert stack.wait_for(alice, unwanted["id"])["status"] == "completed"
    assert deliveries(stack, unwanted["id"]) == []


def test_per_key_endpoints(stack: Stack, keys: Keys, receiver: Receiver) -> None:
    url = receiver.url + "/ok/bob"
    added = _cli(stack, "webhooks", "add", url, "--key", keys.bob_row.id,
                 "--events", "video.completed")  # fmt: skip
    assert added.returncode == 0, added.stderr
    endpoint = added.stdout.strip()
    listed = _cli(stack, "webhooks", "list", "--key", keys.bob_row.id).stdout
    assert f"{endpoint}\t{keys.bob_row.id}\tvideo.completed\t{url}" in listed
    with stack.client(keys.bob) as bob:
        job = create(bob)["id"]  # no webhook_url: the key's endpoint gets it
        receipt = receipt_of(receiver, job)
        assert receipt.path == "/ok/bob"
        assert verified(secret_of(bob), receipt)["data"] == {"id": job}
    # alice's secret does not verify bob's events
    with stack.client(keys.alice) as alice, pytest.raises(WebhookVerificationError):
        Webhook(secret_of(alice)).verify(receipt.body, receipt.headers)
    assert _cli(stack, "webhooks", "remove", endpoint).returncode == 0
    assert endpoint not in _cli(stack, "webhooks", "list").stdout


BAD = [
    ({"webhook_url": "ftp://example.com/hook"}, "webhook_url"),
    ({"webhook_url": "not a url"}, "webhook_url"),
    ({"webhook_url": "https://user:pw@example.com/hook"}, "webhook_url"),
    ({"webhook_url": "https://example.com/" + "a" * 2048}, "webhook_url"),
    ({"webhook_url": 42}, "webhook_url"),
    ({"webhook_url": "https://example.com/h", "webhook_events": ["video.exploded"]},
     "webhook_events"),
    ({"webhook_url": "https://example.com/h", "webhook_events": ["audio.completed"]},
     "webhook_events"),
    ({"webhook_url": "https://example.com/h", "webhook_events": []}, "webhook_events"),
    ({"webhook_events": ["video.completed"]}, "webhook_events"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), BAD)
def test_invalid_webhook_stores_nothing(
    stack: Stack, alice: httpx.Client, fields: dict[str, Any], param: str
) -> None:
    _refused(stack, lambda: alice.post("/v1/videos", json={**VIDEO, **fields}), param)
    if fields.get("webhook_events") != []:  # a form has no empty list ("" is "not given")
        form = {**VIDEO, **fields}
        if isinstance(form.get("webhook_events"), list):
            form["webhook_events"] = ",".join(form["webhook_events"])
        _refused(stack, lambda: alice.post("/v1/videos", files=multipart(form)), param)


def test_private_destinations_are_refused_unless_allowed(
    stack: Stack, keys: Keys, tmp_path: Path
) -> None:
    strict = stack.sibling(tmp_path, {"OMNIQ_WEBHOOKS__ALLOW_PRIVATE": "false"})
    strict.port = free_port()
    strict._spawn("api", "api", "--host", "127.0.0.1", "--port", str(strict.port))
    try:
        strict.wait_ready()
        before = stack.count_jobs()
        with strict.client(keys.alice) as alice:
            for url in ("http://127.0.0.1:9/hook", "http://localhost/hook", "http://10.1.2.3/"):
                resp = alice.post("/v1/videos", json={**VIDEO, "webhook_url": url})
                assert resp.status_code == 400, (url, resp.text)
                assert resp.json()["error"]["param"] == "webhook_url"
        assert stack.count_jobs() == before
        refused = _cli(strict, "webhooks", "add", "http://127.0.0.1:9/hook")
        assert refused.returncode == 2 and "not a destination" in refused.stderr
    finally:
        strict.stop()


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=REPO, env=stack.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _wait(condition: Any, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.1)
