"""Audio jobs end to end: ``/v1/audio/generations``, ``/v1/audio/speech`` (with the OpenAI
SDK) and ``/v1/audio/generate`` against an API process, Redis, a Celery worker process,
PostgreSQL and S3; every artifact is decoded with PyAV."""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import httpx
import numpy as np
import pytest

from tests.integration.audio_stack import SMALL, AudioStack, create_audio
from tests.integration.stack import assert_not_found
from workers.media.audio import decode_audio

pytestmark = pytest.mark.integration

AAC_SLACK = 2048  # ADTS cannot signal the encoder's priming samples


@pytest.fixture(scope="module")
def stack(astack: AudioStack) -> AudioStack:
    """This module's stack is the one conftest's ``key`` and ``client`` use."""
    return astack


def _duration(data: bytes, fmt: str, rate: int, channels: int) -> float:
    if fmt == "pcm":
        assert len(data) % (2 * channels) == 0
        return len(data) / (2 * channels) / rate
    samples, decoded_rate = decode_audio(io.BytesIO(data))
    assert samples.shape[0] == channels
    return samples.shape[1] / decoded_rate


def test_every_format_end_to_end(astack: AudioStack, client: httpx.Client) -> None:
    formats = ["wav", "mp3", "flac", "opus", "aac", "pcm"]
    created = {fmt: create_audio(client, response_format=fmt, seed=5) for fmt in formats}
    for fmt, job in created.items():
        assert job["object"] == "audio" and job["status"] == "queued"
        assert job["seconds"] == "1" and job["seed"] == 5 and job["model"] == "reference/audio"
        assert job["id"].startswith("audio_")
        done = astack.wait_audio(client, job["id"])
        assert done["status"] == "completed", done
        assert done["progress"] == 100 and done["step"] == 3 and done["error"] is None
        assert set(done["stage_durations"]) >= {"denoise", "encode", "upload"}
        rate, channels = done["sample_rate"], done["channels"]
        assert (channels, rate) == (2, 24_000)
        resp = client.get(f"/v1/audio/generations/{job['id']}/content")
        assert resp.status_code == 200
        assert resp.headers["content-type"] == done["media_type"]
        seconds = _duration(resp.content, fmt, rate, channels)
        slack = AAC_SLACK / rate if fmt == "aac" else 0.0
        assert 1.0 <= seconds <= 1.0 + slack, (fmt, seconds)
        assert astack.objects("audios", job["id"]) == [f"audios/{job['id']}/output/1/audio.{fmt}"]
    assert {fmt: job["media_type"] for fmt, job in created.items()} == {
        "wav": "audio/wav",
        "mp3": "audio/mpeg",
        "flac": "audio/flac",
        "opus": "audio/ogg",
        "aac": "audio/aac",
        "pcm": "audio/pcm",
    }

    # Same seed, lossless formats: the same samples.
    wav, _ = decode_audio(
        io.BytesIO(client.get(f"/v1/audio/generations/{created['wav']['id']}/content").content)
    )
    pcm = client.get(f"/v1/audio/generations/{created['pcm']['id']}/content").content
    ints = np.frombuffer(pcm, dtype="<i2").reshape(-1, 2).T
    assert np.abs(ints / 32768.0 - wav).max() < 1e-4

    wid = created["wav"]["id"]
    data = client.get(f"/v1/audio/generations/{wid}/content").content
    part = client.get(f"/v1/audio/generations/{wid}/content", headers={"Range": "bytes=4-99"})
    assert part.status_code == 206 and part.content == data[4:100]
    assert part.headers["content-range"] == f"bytes 4-99/{len(data)}"
    bad = client.get(
        f"/v1/audio/generations/{wid}/content", headers={"Range": f"bytes={len(data)}-"}
    )
    assert bad.status_code == 416
    redirect = client.get(f"/v1/audio/generations/{wid}/content", params={"redirect": "true"})
    assert redirect.status_code == 302
    assert httpx.get(redirect.headers["location"]).content == data

    page = client.get("/v1/audio/generations", params={"limit": 4, "order": "asc"}).json()
    assert page["object"] == "list" and len(page["data"]) == 4 and page["has_more"]
    rest = client.get(
        "/v1/audio/generations", params={"after": page["last_id"], "order": "asc"}
    ).json()
    listed = [a["id"] for a in page["data"] + rest["data"]]
    assert [created[f]["id"] for f in formats] == [
        i for i in listed if i in {c["id"] for c in created.values()}
    ]
    assert all(v["object"] != "video" for v in rest["data"])
    assert client.get("/v1/videos").json()["data"] == []  # audio jobs are not videos


def test_events_end_with_done_and_carry_the_pcm(astack: AudioStack, client: httpx.Client) -> None:
    job = create_audio(client, response_format="pcm", seconds=0.5, sample_rate=16_000, channels=1)
    events: list[dict[str, Any]] = []
    with client.stream("GET", f"/v1/audio/generations/{job['id']}/events", timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "done":
                    break
    types = [e["type"] for e in events]
    assert types[0] == "status" and types[-1] == "done" and events[-1]["status"] == "completed"
    assert "progress" in types
    chunks = [e for e in events if e["type"] == "chunk"]
    assert chunks and [c["seq"] for c in chunks] == list(range(len(chunks)))
    streamed = b"".join(base64.b64decode(c["data_b64"]) for c in chunks)
    stored = client.get(f"/v1/audio/generations/{job['id']}/content")
    assert stored.headers["x-sample-rate"] == "16000" and stored.headers["x-channels"] == "1"
    assert streamed == stored.content and len(streamed) == 2 * 8000


def test_websocket_stream_sends_pcm_as_binary_frames(
    astack: AudioStack, client: httpx.Client, key: str
) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    job = create_audio(client, response_format="pcm", seconds=0.5, sample_rate=16_000, channels=1)
    url = astack.url.replace("http://", "ws://") + f"/v1/audio/generations/{job['id']}/stream"
    events, blobs = [], []
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        while True:
            event = json.loads(ws.recv(timeout=60))
            events.append(event)
            if "byte_length" in event:
                blob = ws.recv(timeout=60)
                assert isinstance(blob, bytes) and len(blob) == event["byte_length"]
                blobs.append(blob)
            if event["type"] == "done":
                break
    assert events[-1]["status"] == "completed"
    stored = client.get(f"/v1/audio/generations/{job['id']}/content")
    assert b"".join(blobs) == stored.content and len(stored.content) == 2 * 8000
    with pytest.raises(InvalidStatus), connect(url):  # no key: refused before accept
        pass


def test_multipart_and_idempotency(astack: AudioStack, client: httpx.Client) -> None:
    fields = {
        "prompt": "ocean waves",
        "seconds": "0.5",
        "num_inference_steps": "2",
        "seed": "9",
        "guidance_scale": "7.5",
        "response_format": "flac",
        "extra_params": json.dumps({"bpm": 90}),
    }
    headers = {"Idempotency-Key": "audio-order-1"}
    first = client.post("/v1/audio/generations", data=fields, headers=headers)
    assert first.status_code == 200, first.text
    again = client.post("/v1/audio/generations", data=fields, headers=headers)
    assert again.json()["id"] == first.json()["id"]
    assert astack.wait_audio(client, first.json()["id"])["status"] == "completed"


def test_an_idempotency_key_of_one_kind_does_not_answer_the_other(
    astack: AudioStack, client: httpx.Client
) -> None:
    """A key first used for a video job: an audio create with it is a 400 naming the
    header (it used to be a 500: the audio answer was built from the video job), and the
    reverse; neither stores a job."""
    headers = {"Idempotency-Key": "kinds-order-7"}
    video = client.post(
        "/v1/videos", json={"prompt": "a kite", "size": "64x48", "seconds": "1"}, headers=headers
    )
    assert video.status_code == 200, video.text
    audios_before = client.get("/v1/audio/generations", params={"limit": 100}).json()["data"]
    audio = client.post("/v1/audio/generations", json={"prompt": "rain"}, headers=headers)
    assert audio.status_code == 400, audio.text
    error = audio.json()["error"]
    assert error["param"] == "Idempotency-Key" and error["code"] == "idempotency_key_reused"
    assert client.get("/v1/audio/generations", params={"limit": 100}).json()["data"] == (
        audios_before
    )

    headers = {"Idempotency-Key": "kinds-order-8"}
    first = client.post("/v1/audio/generations", json={"prompt": "rain"}, headers=headers)
    assert first.status_code == 200, first.text
    again = client.post(
        "/v1/videos", json={"prompt": "a kite", "size": "64x48", "seconds": "1"}, headers=headers
    )
    assert again.status_code == 400 and again.json()["error"]["param"] == "Idempotency-Key"
    assert astack.wait_for(client, video.json()["id"])["status"] == "completed"
    assert astack.wait_audio(client, first.json()["id"])["status"] == "completed"


def test_cancel_and_delete_leave_nothing(astack: AudioStack, client: httpx.Client) -> None:
    astack.set_failpoints({"step:1": "pause"})
    try:
        job = create_audio(client, prompt="cancel me")
        astack.wait_audio(client, job["id"], until=("in_progress",))
        cancelled = client.post(f"/v1/audio/generations/{job['id']}/cancel")
        assert cancelled.status_code == 200
        body = cancelled.json()
        assert body["status"] == "failed" and body["error"]["code"] == "cancelled"
        assert client.get(f"/v1/audio/generations/{job['id']}/content").status_code == 404

        doomed = create_audio(client, prompt="delete me")
        astack.wait_audio(client, doomed["id"], until=("in_progress",))
        deleted = client.delete(f"/v1/audio/generations/{doomed['id']}")
        assert deleted.status_code == 200
        assert deleted.json() == {"id": doomed["id"], "object": "audio.deleted", "deleted": True}
        assert client.delete(f"/v1/audio/generations/{doomed['id']}").status_code == 404
        assert client.get(f"/v1/audio/generations/{doomed['id']}").status_code == 404
    finally:
        astack.set_failpoints({})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and list(astack.tmp_dir.iterdir()):
        time.sleep(0.1)
    assert list(astack.tmp_dir.iterdir()) == []
    assert (
        astack.objects("audios", job["id"]) == [] and astack.objects("audios", doomed["id"]) == []
    )
    # A finished job's cancel is a no-op; deleting it removes the row and the object.
    done = astack.wait_audio(client, create_audio(client, prompt="finished")["id"])
    assert client.post(f"/v1/audio/generations/{done['id']}/cancel").json()["status"] == "completed"
    before = astack.count_jobs()
    assert client.delete(f"/v1/audio/generations/{done['id']}").status_code == 200
    assert astack.count_jobs() == before - 1 and astack.objects("audios", done["id"]) == []


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/audio/generations", {"response_format": "ogg"}, "response_format"),
        ("/v1/audio/generations", {"seconds": 0}, "seconds"),
        ("/v1/audio/generations", {"seconds": 61}, "seconds"),
        ("/v1/audio/generations", {"seconds": "abc"}, "seconds"),
        ("/v1/audio/generations", {"model": "reference/video"}, "model"),
        ("/v1/audio/generations", {"model": "no/such-model"}, "model"),
        ("/v1/audio/generations", {"prompt": ""}, "prompt"),
        ("/v1/audio/generations", {"num_inference_steps": 0}, "num_inference_steps"),
        ("/v1/audio/generations", {"response_format": "opus", "sample_rate": 44100}, "sample_rate"),
        ("/v1/audio/generations", {"channels": 3}, "channels"),
        ("/v1/audio/generations", {"extra_params": {"bogus": 1}}, "extra_params.bogus"),
        ("/v1/audio/generations", {"extra_params": {"bpm": 1000}}, "extra_params.bpm"),
        ("/v1/audio/generations", {"surprise": 1}, "surprise"),
        ("/v1/audio/speech", {"input": "hi", "voice": "alloy", "speed": 4.5}, "speed"),
        ("/v1/audio/speech", {"input": "hi", "voice": "alloy", "speed": 0.1}, "speed"),
        ("/v1/audio/speech", {"input": "", "voice": "alloy"}, "input"),
        ("/v1/audio/speech", {"input": "  ", "voice": "alloy"}, "input"),
        ("/v1/audio/speech", {"input": "hi", "response_format": "ogg"}, "response_format"),
        ("/v1/audio/speech", {"input": "hi", "stream_format": "sse"}, "stream_format"),
        ("/v1/audio/speech", {"input": "hi", "model": "reference/video"}, "model"),
        ("/v1/audio/generate", {"input": "hi", "audio_length": -1}, "audio_length"),
        ("/v1/audio/generate", {"input": "hi", "audio_start": 2}, "audio_start"),
        ("/v1/audio/generate", {"input": ""}, "input"),
        ("/v1/videos", {"prompt": "hi", "model": "reference/audio"}, "model"),
    ],
)
def test_bad_input_is_refused_and_stores_nothing(
    astack: AudioStack, client: httpx.Client, path: str, fields: dict[str, Any], param: str
) -> None:
    before = astack.count_jobs()
    body = {"prompt": "p", **SMALL, **fields} if path == "/v1/audio/generations" else fields
    resp = client.post(path, json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert error["message"]
    if param == "model":
        assert "audio" in error["message"] or "not served" in error["message"]
    assert astack.count_jobs() == before
    assert list(astack.tmp_dir.iterdir()) == []


def test_jobs_are_invisible_to_other_keys(astack: AudioStack, client: httpx.Client) -> None:
    aid = create_audio(client, prompt="private")["id"]
    astack.wait_audio(client, aid)
    with astack.client(astack.create_key("mallory")) as other:
        for resp in assert_not_found(other, f"/v1/audio/generations/{aid}", "/events"):
            assert resp.json()["error"]["param"] == "audio_id"
        assert aid not in [a["id"] for a in other.get("/v1/audio/generations").json()["data"]]
    with astack.client() as anonymous:
        assert anonymous.get(f"/v1/audio/generations/{aid}").status_code == 401
        assert anonymous.post("/v1/audio/speech", json={"input": "x"}).status_code == 401
    assert client.get(f"/v1/audio/generations/{aid}").json()["status"] == "completed"


def test_models_list_audio_and_video_keeps_its_default(
    astack: AudioStack, client: httpx.Client
) -> None:
    models = {m["id"]: m["modality"] for m in client.get("/v1/models").json()["data"]}
    assert models["reference/audio"] == "audio" and models["reference/video"] == "video"
    video = client.post(
        "/v1/videos", json={"prompt": "default model", "size": "32x32", "num_frames": 2}
    )
    assert video.status_code == 200 and video.json()["model"] == "reference/video"
    assert client.delete(f"/v1/videos/{video.json()['id']}").status_code == 200
