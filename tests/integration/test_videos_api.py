"""``/v1/videos`` end to end: API process → Redis → Celery worker process → PyAV → S3."""

from __future__ import annotations

import io
import json
import time
import uuid
from typing import Any

import av
import httpx
import numpy as np
import pytest
from PIL import Image
from sqlalchemy import create_engine, func, select

from models.db import Artifact, Job
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.settings import DatabaseSettings
from tests.helpers import video_spec
from tests.integration.stack import Stack, assert_not_found

pytestmark = pytest.mark.integration

SMALL = {"size": "64x48", "seconds": "0.5", "fps": 16, "num_inference_steps": 3}


def _create(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    resp = client.post(
        "/v1/videos", json={"prompt": "a red ball over a blue sea", **SMALL, **fields}
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_video_job_end_to_end(stack: Stack, client: httpx.Client) -> None:
    created = _create(client, seed=7)
    assert created["object"] == "video"
    assert created["status"] == "queued"
    assert created["seed"] == 7
    assert created["num_frames"] == 8 and created["size"] == "64x48"
    done = stack.wait_for(client, created["id"])
    assert done["status"] == "completed", done
    assert done["progress"] == 100
    assert done["step"] == 3
    assert done["error"] is None
    assert done["completed_at"] >= done["started_at"] >= done["created_at"]
    assert done["expires_at"] > done["completed_at"]
    assert done["inference_time_s"] > 0 and done["peak_memory_mb"] > 0
    assert set(done["stage_durations"]) == {
        "queue",
        "prepare",
        "denoise",
        "decode",
        "encode",
        "upload",
    }
    assert done["stage_durations"]["denoise"] > 0 and done["stage_durations"]["encode"] > 0

    resp = client.get(f"/v1/videos/{created['id']}/content")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "video/mp4"
    data = resp.content
    with av.open(io.BytesIO(data)) as container:
        vs = container.streams.video[0]
        assert vs.codec_context.name == "h264"
        assert vs.codec_context.pix_fmt == "yuv420p"
        frames = list(container.decode(video=0))
        assert len(frames) == 8
        assert (frames[0].width, frames[0].height) == (64, 48)
        assert container.streams.audio[0].codec_context.name == "aac"
    assert data.find(b"moov") < data.find(b"mdat"), "moov atom must precede mdat (faststart)"

    part = client.get(f"/v1/videos/{created['id']}/content", headers={"Range": "bytes=10-99"})
    assert part.status_code == 206
    assert part.content == data[10:100]
    assert part.headers["content-range"] == f"bytes 10-99/{len(data)}"
    outside = client.get(
        f"/v1/videos/{created['id']}/content", headers={"Range": f"bytes={len(data)}-"}
    )
    assert outside.status_code == 416
    # RFC 9110: a 416 says how long the representation is
    assert outside.headers["content-range"] == f"bytes */{len(data)}"

    thumb = client.get(f"/v1/videos/{created['id']}/content", params={"variant": "thumbnail"})
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(thumb.content)).size == (64, 48)

    redirect = client.get(f"/v1/videos/{created['id']}/content", params={"redirect": "true"})
    assert redirect.status_code == 302
    assert httpx.get(redirect.headers["location"]).content == data

    assert sorted(stack.objects("videos", created["id"])) == [
        f"videos/{created['id']}/output/1/spritesheet.jpg",
        f"videos/{created['id']}/output/1/thumbnail.jpg",
        f"videos/{created['id']}/output/1/video.mp4",
    ]


def test_multipart_with_string_values_like_the_benchmark_client(
    stack: Stack, client: httpx.Client
) -> None:
    fields = {
        "prompt": "a forest at night",
        "model": "reference/video",
        "width": "64",
        "height": "64",
        "num_frames": "5",
        "fps": "8",
        "num_inference_steps": "2",
        "guidance_scale": "7.5",
        "true_cfg_scale": "4.0",
        "seed": "42",
        "negative_prompt": "blurry",
        "vae_use_slicing": "True",
        "vae_use_tiling": "false",
        "n": "1",
        "extra_params": json.dumps({"motion": 2.0, "camera": "zoom"}),
    }
    resp = client.post("/v1/videos", data=fields)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["num_frames"], body["size"], body["seed"]) == (5, "64x64", 42)
    assert body["seconds"] == "0.625"
    assert stack.wait_for(client, body["id"])["status"] == "completed"


def test_image_to_video_starts_from_the_reference(stack: Stack, client: httpx.Client) -> None:
    image = np.zeros((48, 64, 3), dtype=np.uint8)
    image[:, :32] = (250, 20, 20)
    image[:, 32:] = (20, 20, 250)
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    data = {k: str(v) for k, v in SMALL.items()}
    resp = client.post(
        "/v1/videos",
        data={"prompt": "a calm scene", **data, "extra_params": json.dumps({"motion": 0.0})},
        # the declared MIME type is wrong on purpose: the content decides
        files={"input_reference": ("ref.bin", buf.getvalue(), "application/octet-stream")},
    )
    assert resp.status_code == 200, resp.text
    done = stack.wait_for(client, resp.json()["id"])
    assert done["status"] == "completed", done
    video = client.get(f"/v1/videos/{done['id']}/content").content
    with av.open(io.BytesIO(video)) as container:
        first = next(container.decode(video=0)).to_ndarray(format="rgb24").astype(int)
    assert np.abs(first - image.astype(int)).mean() < 40


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"size": "64x"}, 400, "size"),
        ({"size": "63x48"}, 400, "size"),
        ({"size": "99999x48"}, 400, "size"),
        ({"fps": 0}, 400, "fps"),
        ({"fps": -3}, 400, "fps"),
        ({"seconds": "-1"}, 400, "seconds"),
        ({"seconds": "abc"}, 400, "seconds"),
        ({"num_inference_steps": 0}, 400, "num_inference_steps"),
        ({"num_inference_steps": 201}, 400, "num_inference_steps"),
        ({"model": "no/such-model"}, 400, "model"),
        ({"n": 5}, 400, "n"),
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": "x" * 5000}, 400, "prompt"),
        ({"extra_params": {"bogus": 1}}, 400, "extra_params.bogus"),
        ({"extra_params": {"motion": "fast"}}, 400, "extra_params.motion"),
        ({"lora": {"name": "x"}}, 400, "lora"),
        ({"surprise": 1}, 400, "surprise"),
        ({"input_reference": {"image_url": "https://example.com/cat.png"}}, 400, "input_reference"),
        (
            {"input_reference": {"image_url": "data:image/png;base64,aGVsbG8="}},
            400,
            "input_reference",
        ),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    stack: Stack, client: httpx.Client, fields: dict[str, Any], status: int, param: str
) -> None:
    before = stack.count_jobs()
    resp = client.post("/v1/videos", json={"prompt": "p", **SMALL, **fields})
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    if param == "model":
        assert error["code"] == "model_not_found"
    assert stack.count_jobs() == before
    assert list(stack.tmp_dir.iterdir()) == []


def test_oversized_upload_is_413_and_changes_nothing(stack: Stack, client: httpx.Client) -> None:
    before = stack.count_jobs()
    blob = b"\x89PNG\r\n\x1a\n" + b"\0" * (21 * 1024 * 1024)
    resp = client.post(
        "/v1/videos",
        data={"prompt": "p"},
        files={"input_reference": ("big.png", blob, "image/png")},
    )
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "payload_too_large"
    assert stack.count_jobs() == before


def test_idempotency_key_is_scoped_per_key(stack: Stack, client: httpx.Client) -> None:
    headers = {"Idempotency-Key": "order-1234"}
    body = {"prompt": "idempotent", **SMALL}
    first = client.post("/v1/videos", json=body, headers=headers).json()
    again = client.post("/v1/videos", json=body, headers=headers).json()
    assert again["id"] == first["id"]
    with stack.client(stack.create_key("bob")) as bob:
        other = bob.post("/v1/videos", json=body, headers=headers).json()
    assert other["id"] != first["id"]
    stack.wait_for(client, first["id"])


def test_a_retried_create_puts_a_job_that_never_reached_the_broker_on_it(
    stack: Stack, client: httpx.Client
) -> None:
    """An API host that dies between storing a job and enqueueing it leaves a queued job
    with no message; the client's retry with the same Idempotency-Key enqueues it."""
    body = {"prompt": "stranded", **SMALL}
    first = _create(client)  # a job of this key, for its owner
    engine = make_engine(DatabaseSettings(url=stack.database_url))
    try:
        jobs = JobStore(make_sessionmaker(engine))
        owner = jobs.get(first["id"]).owner  # type: ignore[union-attr]
        spec = video_spec(
            prompt="stranded", width=64, height=48, num_frames=8, num_inference_steps=3
        )
        stranded = Job.new(spec, id=f"video_{uuid.uuid4().hex}", owner=owner, idempotency_key="k-1")
        jobs.create(stranded, idempotency_window_s=3600)  # stored; never enqueued
        again = client.post("/v1/videos", json=body, headers={"Idempotency-Key": "k-1"})
        assert again.status_code == 200 and again.json()["id"] == stranded.id
        assert stack.wait_for(client, stranded.id)["status"] == "completed"
    finally:
        engine.dispose()
    stack.wait_for(client, first["id"])


def test_jobs_are_invisible_to_other_keys(stack: Stack, client: httpx.Client) -> None:
    video = _create(client)
    vid = video["id"]
    stack.wait_for(client, vid)
    with stack.client(stack.create_key("mallory")) as other:
        assert_not_found(other, f"/v1/videos/{vid}", "/content?variant=thumbnail")
        listed = other.get("/v1/videos").json()
        assert vid not in [v["id"] for v in listed["data"]]
        assert other.get("/v1/videos", params={"after": vid}).status_code == 400
    assert client.get(f"/v1/videos/{vid}").json()["status"] == "completed"
    with stack.client() as anonymous:
        resp = anonymous.get(f"/v1/videos/{vid}")
        assert resp.status_code == 401
        assert resp.json()["error"]["type"] == "authentication_error"
    with stack.client("oq-not-a-real-key") as forged:
        assert forged.get("/v1/videos").status_code == 401


def test_list_pagination(stack: Stack) -> None:
    with stack.client(stack.create_key("lister")) as c:
        ids = [_create(c, prompt=f"clip {i}")["id"] for i in range(5)]
        page1 = c.get("/v1/videos", params={"limit": 2, "order": "asc"}).json()
        assert page1["object"] == "list" and page1["has_more"] is True
        assert [v["id"] for v in page1["data"]] == ids[:2]
        assert page1["first_id"] == ids[0] and page1["last_id"] == ids[1]
        page2 = c.get("/v1/videos", params={"limit": 2, "order": "asc", "after": ids[1]}).json()
        assert [v["id"] for v in page2["data"]] == ids[2:4]
        page3 = c.get("/v1/videos", params={"limit": 2, "order": "asc", "after": ids[3]}).json()
        assert [v["id"] for v in page3["data"]] == ids[4:] and page3["has_more"] is False
        desc = c.get("/v1/videos", params={"limit": 100}).json()
        assert [v["id"] for v in desc["data"]] == ids[::-1]
        assert c.get("/v1/videos", params={"limit": 101}).status_code == 422
        for vid in ids:
            stack.wait_for(c, vid)


def test_cancel_queued_job_and_queue_position(stack: Stack, client: httpx.Client) -> None:
    # A long job keeps the only worker busy so the next ones stay queued.
    blocker = _create(client, size="320x240", seconds="4", fps=24, num_inference_steps=200)
    stack.wait_for(client, blocker["id"], until=("in_progress",))
    second = _create(client)
    third = _create(client)
    # Positions count the queued jobs of the model that go first; the session's shared
    # stack may still hold one another module left queued (another key's, whose turns
    # interleave with this key's under fair share), so they are checked relative to
    # ``second``: ``third`` is behind it, and takes its place once it is cancelled.
    ahead = client.get(f"/v1/videos/{second['id']}").json()["queue_position"]
    assert ahead >= 0
    assert client.get(f"/v1/videos/{third['id']}").json()["queue_position"] > ahead

    cancelled = client.post(f"/v1/videos/{second['id']}/cancel")
    assert cancelled.status_code == 200
    body = cancelled.json()
    assert body["status"] == "failed" and body["error"]["code"] == "cancelled"
    assert client.get(f"/v1/videos/{third['id']}").json()["queue_position"] == ahead
    content = client.get(f"/v1/videos/{second['id']}/content")
    assert content.status_code == 404
    error = content.json()["error"]
    assert error["code"] == "job_cancelled", error  # never "available once completed"
    assert error["message"] == f"video {second['id']} was cancelled and has no content"

    # cancelling the running job stops it at the next step boundary
    running = client.post(f"/v1/videos/{blocker['id']}/cancel").json()
    assert running["status"] == "failed" and running["error"]["code"] == "cancelled"
    third_done = stack.wait_for(client, third["id"])
    assert third_done["status"] == "completed"
    # the cancelled ones never ran to completion and left nothing in S3
    for vid in (blocker["id"], second["id"]):
        final = client.get(f"/v1/videos/{vid}").json()
        assert final["status"] == "failed" and final["error"]["code"] == "cancelled"
        assert stack.objects("videos", vid) == []
    # cancelling a finished job is a no-op returning it
    assert client.post(f"/v1/videos/{third['id']}/cancel").json()["status"] == "completed"
    # None of the three left a temp dir (a job another module left queued on the shared
    # stack may be running by now: under fair share a cancelled job's message runs it).
    ours = (blocker["id"], second["id"], third["id"])
    assert [p for p in stack.tmp_dir.iterdir() if any(v in p.name for v in ours)] == []


def test_delete_removes_record_and_objects(stack: Stack, client: httpx.Client) -> None:
    video = _create(client)
    stack.wait_for(client, video["id"])
    assert stack.objects("videos", video["id"])
    resp = client.delete(f"/v1/videos/{video['id']}")
    assert resp.status_code == 200
    assert resp.json() == {"id": video["id"], "object": "video.deleted", "deleted": True}
    assert stack.objects("videos", video["id"]) == []
    assert client.get(f"/v1/videos/{video['id']}").status_code == 404
    assert client.delete(f"/v1/videos/{video['id']}").status_code == 404
    engine = create_engine(stack.database_url)
    with engine.connect() as conn:
        left = conn.execute(
            select(func.count()).select_from(Artifact).where(Artifact.job_id == video["id"])
        ).scalar_one()
    engine.dispose()
    assert left == 0


def test_sync_returns_the_mp4(stack: Stack, client: httpx.Client) -> None:
    resp = client.post("/v1/videos/sync", json={"prompt": "sync clip", **SMALL}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "video/mp4"
    assert resp.headers["x-request-id"].startswith("video_")
    assert float(resp.headers["x-inference-time-s"]) > 0
    with av.open(io.BytesIO(resp.content)) as container:
        assert len(list(container.decode(video=0))) == 8


def test_models_health_ready(stack: Stack, client: httpx.Client) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [
        "reference/video",
        "reference/world",
        "reference/audio",
        "reference/speech",
        "reference/voice",
    ]
    assert all(m["available"] and m["unavailable_reason"] is None for m in models["data"])
    assert httpx.get(stack.url + "/health").json()["status"] == "ok"
    ready = httpx.get(stack.url + "/ready").json()
    checks = {"database": "ok", "redis": "ok", "s3": "ok"}
    assert ready == {"status": "ok", "checks": checks, "unavailable_models": {}}


def test_openai_sdk_works_unchanged(stack: Stack, key: str, tmp_path: Any) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=stack.url + "/v1", api_key=key)
    video = client.videos.create_and_poll(
        prompt="a yellow kite in a blue sky",
        model="reference/video",
        seconds="4",  # type: ignore[arg-type]
        size="64x48",  # type: ignore[arg-type]
        extra_body={"fps": 4, "num_inference_steps": 2},
        poll_interval_ms=100,
    )
    assert video.status == "completed"
    assert video.progress == 100
    assert video.seconds == "4" and video.size == "64x48"
    assert client.videos.retrieve(video.id).id == video.id
    assert video.id in [v.id for v in client.videos.list(limit=100).data]
    content = client.videos.download_content(video.id)
    out = tmp_path / "sdk.mp4"
    content.write_to_file(out)
    with av.open(str(out)) as container:
        assert len(list(container.decode(video=0))) == 16
    thumb = client.videos.download_content(video.id, variant="thumbnail")
    assert thumb.content[:3] == b"\xff\xd8\xff"
    deleted = client.videos.delete(video.id)
    assert deleted.deleted is True
    import openai

    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)
    with pytest.raises(openai.BadRequestError) as info:
        client.videos.create(prompt="x", model="sora-2")
    assert info.value.code == "model_not_found"


def test_sync_timeout_cancels_and_unready_services_give_503(
    stack: Stack, key: str, tmp_path: Any
) -> None:
    # A second API process on the same services, with a 1 s sync timeout.
    impatient = stack.sibling(tmp_path, {"OMNIQ_SYNC_TIMEOUT_S": "1"})
    impatient.start(workers=0)
    try:
        with impatient.client(key) as c:
            t0 = time.monotonic()
            resp = c.post(
                "/v1/videos/sync",
                json={
                    "prompt": "too slow",
                    "size": "320x240",
                    "seconds": "4",
                    "num_inference_steps": 200,
                },
            )
            assert resp.status_code == 504, resp.text
            assert time.monotonic() - t0 < 10
            assert resp.json()["error"]["code"] == "timeout"
            vid = resp.json()["error"]["message"].split()[1]
            final = c.get(f"/v1/videos/{vid}").json()
            assert final["status"] == "failed" and final["error"]["code"] == "cancelled"
    finally:
        impatient.stop()
    broken = stack.sibling(tmp_path / "broken", {"OMNIQ_S3__BUCKET": "no-such-bucket-here"})
    broken.work.mkdir()
    broken.port = 0
    broken._spawn("api", "api", "--host", "127.0.0.1", "--port", str(_port(broken)))
    try:
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline:
            try:
                r = httpx.get(broken.url + "/ready", timeout=5)
                status = r.status_code
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert status == 503
        assert r.json()["checks"]["s3"].startswith("unavailable")
        assert httpx.get(broken.url + "/health").status_code == 200
    finally:
        broken.stop()


def _port(stack: Stack) -> int:
    from workers.runtime.processes import free_port

    stack.port = free_port()
    return stack.port


def test_sync_client_disconnect_cancels_the_job(stack: Stack, client: httpx.Client) -> None:
    slow = {"prompt": "abandoned", "size": "320x240", "seconds": "4", "num_inference_steps": 200}
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/videos/sync", json=slow, timeout=httpx.Timeout(30, read=1.5))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        mine = client.get("/v1/videos", params={"limit": 5}).json()["data"]
        job = next(v for v in mine if v["prompt"] == "abandoned")
        if job["status"] == "failed":
            break
        time.sleep(0.2)
    assert job["status"] == "failed" and job["error"]["code"] == "cancelled"
    assert stack.objects("videos", job["id"]) == []
