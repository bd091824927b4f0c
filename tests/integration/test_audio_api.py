"""Audio jobs end to end: ``/v1/audio/generations``, ``/v1/audio/speech`` (with the OpenAI
SDK) and ``/v1/audio/generate`` against an API process, Redis, a Celery worker process,
PostgreSQL and S3; every artifact is decoded with PyAV."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai import BadRequestError, OpenAI

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack, assert_not_found
from tests.speech_measures import median_f0, syllabic_peak_hz
from workers.media.audio import decode_audio

pytestmark = pytest.mark.integration

SMALL: dict[str, Any] = {"seconds": 1.0, "num_inference_steps": 3}
AAC_SLACK = 2048  # ADTS cannot signal the encoder's priming samples


class AudioStack(Stack):
    def wait_audio(
        self, client: httpx.Client, audio_id: str, until: tuple[str, ...] = ("completed", "failed")
    ) -> dict[str, Any]:
        return self.wait_for(client, audio_id, until=until, collection="audio/generations")


@pytest.fixture(scope="module")
def astack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[AudioStack]:
    work = module_dir
    with isolated_stack(
        work, s3_server, redis_db=redis_db, extra_env={}, cls=AudioStack, auth="required"
    ) as st:
        st.set_failpoints({})
        st.start(workers=1)
        yield st


@pytest.fixture(scope="module")
def stack(astack: AudioStack) -> AudioStack:
    """This module's stack is the one conftest's ``key`` and ``client`` use."""
    return astack


def _create(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"prompt": "rain and drums at night", **SMALL, **fields}
    resp = client.post("/v1/audio/generations", json=body)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _duration(data: bytes, fmt: str, rate: int, channels: int) -> float:
    if fmt == "pcm":
        assert len(data) % (2 * channels) == 0
        return len(data) / (2 * channels) / rate
    samples, decoded_rate = decode_audio(io.BytesIO(data))
    assert samples.shape[0] == channels
    return samples.shape[1] / decoded_rate


def test_every_format_end_to_end(astack: AudioStack, client: httpx.Client) -> None:
    formats = ["wav", "mp3", "flac", "opus", "aac", "pcm"]
    created = {fmt: _create(client, response_format=fmt, seed=5) for fmt in formats}
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
    job = _create(client, response_format="pcm", seconds=0.5, sample_rate=16_000, channels=1)
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

    job = _create(client, response_format="pcm", seconds=0.5, sample_rate=16_000, channels=1)
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
        job = _create(client, prompt="cancel me")
        astack.wait_audio(client, job["id"], until=("in_progress",))
        cancelled = client.post(f"/v1/audio/generations/{job['id']}/cancel")
        assert cancelled.status_code == 200
        body = cancelled.json()
        assert body["status"] == "failed" and body["error"]["code"] == "cancelled"
        assert client.get(f"/v1/audio/generations/{job['id']}/content").status_code == 404

        doomed = _create(client, prompt="delete me")
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
    done = astack.wait_audio(client, _create(client, prompt="finished")["id"])
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
    aid = _create(client, prompt="private")["id"]
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


def test_openai_sdk_speech(astack: AudioStack, key: str) -> None:
    sdk = OpenAI(base_url=astack.url + "/v1", api_key=key, max_retries=0, timeout=60)
    text = "hello from the reference model"  # 5 words: (0.3 + 5 * 0.4) / speed seconds
    wav = sdk.audio.speech.create(
        model="reference/audio", voice="alloy", input=text, response_format="wav", speed=1.15
    )
    samples, rate = decode_audio(io.BytesIO(wav.content))
    assert (samples.shape[0], rate) == (1, 24_000)  # OpenAI's TTS shape: mono 24 kHz
    assert samples.shape[1] == 48_000  # 2.3 s / 1.15

    mp3 = sdk.audio.speech.create(model="reference/audio", voice="nova", input=text)
    samples, rate = decode_audio(io.BytesIO(mp3.read()))
    assert rate == 24_000 and samples.shape[1] == round(2.3 * 24_000)

    with sdk.audio.speech.with_streaming_response.create(
        model="reference/audio",
        voice={"id": "voice_1234"},
        input=text,
        instructions="speak softly",
        response_format="pcm",
    ) as resp:
        assert resp.headers["content-type"] == "audio/pcm"
        pieces = list(resp.iter_bytes())
    pcm = b"".join(pieces)
    assert len(pcm) == 2 * round(2.3 * 24_000)
    assert np.abs(np.frombuffer(pcm, dtype="<i2")).max() > 10_000  # not silence


def test_speech_sse_stream(astack: AudioStack, client: httpx.Client) -> None:
    body = {
        "input": "one two three",
        "voice": "echo",
        "response_format": "pcm",
        "stream_format": "sse",
    }
    events = []
    with client.stream("POST", "/v1/audio/speech", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["type"] == "speech.audio.done"
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    # reference/speech (the default) speaks the three words: about a second
    assert 2 * 0.5 * 24_000 < len(pcm) < 2 * 2.0 * 24_000
    assert np.abs(np.frombuffer(pcm, dtype="<i2")).max() > 5_000


SPEECH_TEXT = "Hello there, this is the built in speech model. It speaks every word of its input."


def _speech(client: httpx.Client, text: str, **fields: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """``POST /v1/audio/speech`` without ``model``: the decoded mono samples and the job."""
    resp = client.post("/v1/audio/speech", json={"input": text, **fields}, timeout=60)
    assert resp.status_code == 200, resp.text
    samples, rate = decode_audio(io.BytesIO(resp.content))
    assert (samples.shape[0], rate) == (1, 24_000)
    job = client.get(f"/v1/audio/generations/{resp.headers['x-request-id']}").json()
    return samples[0], job


def test_speech_speaks_the_input(astack: AudioStack, client: httpx.Client) -> None:
    """The default speech model is reference/speech (eSpeak NG from the speech extra,
    nothing installed by hand): its clip is as long as the words take, its loudness has
    the syllable rhythm, the same text gives the same samples, the voice sets the pitch;
    /v1/audio/generations keeps reference/audio."""
    long, job = _speech(client, SPEECH_TEXT, voice="echo", response_format="wav")
    assert job["model"] == "reference/speech" and job["status"] == "completed"
    short, _ = _speech(client, "Hello there.", voice="echo", response_format="wav")
    assert 3.0 < len(long) / 24_000 < 9.0 and len(short) < len(long) / 3
    peak, share = syllabic_peak_hz(long, 24_000)
    assert 2 <= peak <= 8 and share > 0.5, (peak, share)
    again, _ = _speech(client, SPEECH_TEXT, voice="echo", response_format="wav")
    assert np.array_equal(again, long)
    nova, _ = _speech(client, SPEECH_TEXT, voice="nova", response_format="wav")
    assert median_f0(nova, 24_000) > 1.3 * median_f0(long, 24_000)
    mp3, _ = _speech(client, SPEECH_TEXT, voice="echo")  # OpenAI's default format
    assert abs(len(mp3) - len(long)) < 0.05 * 24_000
    music = _create(client)
    assert music["model"] == "reference/audio"
    assert astack.wait_audio(client, music["id"])["status"] == "completed"


def test_speech_pcm_streams_while_the_job_speaks(astack: AudioStack, client: httpx.Client) -> None:
    """The first PCM bytes arrive while the job is still in its step loop: paused before
    its second phrase, the first one has been streamed (leaving cancels the job)."""
    astack.set_failpoints({"step:1": "pause"})
    try:
        body = {"input": SPEECH_TEXT, "voice": "echo", "response_format": "pcm"}
        with client.stream("POST", "/v1/audio/speech", json=body, timeout=30) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"] == "audio/pcm"
            job_id = resp.headers["x-request-id"]
            pieces, first = resp.iter_bytes(), b""  # not left (that would disconnect)
            while len(first) < 2 * 9_600:  # 0.4 s of the first phrase, "Hello there,"
                first += next(pieces)
            job = client.get(f"/v1/audio/generations/{job_id}").json()
            assert job["status"] == "in_progress" and job["stage"] == "denoise", job
            assert job["progress"] < 85
            assert np.abs(np.frombuffer(first[: len(first) // 2 * 2], "<i2")).max() > 5_000
    finally:
        astack.set_failpoints({})
    job = astack.wait_audio(client, job_id)
    assert job["status"] == "failed" and job["error"]["code"] == "cancelled", job


# vLLM-Omni's examples/online_serving/qwen3_tts/openai_speech_client.py builds this body
# (CustomVoice with an emotion instruction, --language given); only "model" differs: its
# Qwen3-TTS name is not served here. Its --max-new-tokens caps codec tokens, which no
# model here has: refused below (issue 32 §4: no field silently ignored).
SPEECH = "reference/speech"
VLLM_OMNI_TTS_BODY: dict[str, Any] = {
    "model": "reference/audio",
    "input": "I'm so happy!",
    "voice": "Vivian",
    "response_format": "wav",
    "instructions": "Speak with excitement",
    "task_type": "CustomVoice",
    "language": "English",
}
# Every other field of vLLM-Omni's OpenAICreateSpeechRequest, at a value that asks for
# nothing this model cannot do.
VLLM_OMNI_HARMLESS: dict[str, Any] = {
    "sample_rate": 24_000,
    "speed": None,
    "stream": False,
    "stream_format": "audio",
    "seed": 7,
    "ref_audio": None,
    "ref_text": None,
    "ref_audio_2": None,
    "ambient_sound": None,
    "duration_seconds": 1.25,
    "x_vector_only_mode": False,
    "speaker_embedding": None,
    "initial_codec_chunk_frames": 0,
    "non_streaming_mode": True,
    "extra_params": {"bpm": 90},
    "word_timestamps": False,
}


def test_vllm_omni_tts_client_body_is_served(astack: AudioStack, client: httpx.Client) -> None:
    resp = client.post("/v1/audio/speech", json=VLLM_OMNI_TTS_BODY, timeout=120)
    assert resp.status_code == 200, resp.text
    samples, rate = decode_audio(io.BytesIO(resp.content))
    assert (samples.shape[0], rate) == (1, 24_000)
    assert samples.shape[1] == round((0.3 + 0.4 * 4) * 24_000)  # 4 words; the hints change nothing

    body = {**VLLM_OMNI_TTS_BODY, **VLLM_OMNI_HARMLESS}
    body.pop("voice")
    body["speaker"] = "Vivian"  # vLLM-Omni's alias of voice
    resp = client.post("/v1/audio/speech", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    samples, rate = decode_audio(io.BytesIO(resp.content))
    assert samples.shape[1] == round(1.25 * 24_000)  # duration_seconds is honoured
    job = client.get(f"/v1/audio/generations/{resp.headers['x-request-id']}").json()
    assert job["status"] == "completed" and job["seed"] == 7


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "task_type": "Base",
                "ref_audio": "data:audio/wav;base64,UklGRg==",
                "ref_text": "This is the reference transcript",
                "x_vector_only_mode": True,
            },
            "task_type",
        ),  # the client example's voice-clone body
        ({"task_type": "VoiceDesign"}, "task_type"),
        ({"task_type": "Cloned"}, "task_type"),
        ({"ref_audio": "https://example.com/reference.wav"}, "ref_audio"),
        ({"ref_audio": ["data:audio/wav;base64,UklGRg=="]}, "ref_audio"),
        ({"ref_text": "a transcript"}, "ref_text"),
        ({"ref_audio_2": "data:audio/wav;base64,UklGRg=="}, "ref_audio_2"),
        ({"speaker_embedding": [0.1, 0.2]}, "speaker_embedding"),
        ({"x_vector_only_mode": True}, "x_vector_only_mode"),
        ({"ambient_sound": "ocean waves"}, "ambient_sound"),
        ({"word_timestamps": True}, "word_timestamps"),
        ({"max_new_tokens": 2048}, "max_new_tokens"),  # no codec tokens to cap
        ({"language": "Chinese"}, "language"),  # reference/audio reads English words
        ({"stream": True}, "stream"),  # a PCM stream, asked for with response_format wav
        ({"model": SPEECH, "instructions": "whisper"}, "instructions"),
        ({"model": SPEECH, "instructions": None, "duration_seconds": 2}, "duration_seconds"),
        ({"model": SPEECH, "instructions": None, "language": "Klingon"}, "language"),
        ({"initial_codec_chunk_frames": 4}, "initial_codec_chunk_frames"),  # no codec
        ({"non_streaming_mode": False}, "non_streaming_mode"),  # the text is taken whole
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"max_new_tokens": 2**63}, "max_new_tokens"),
        ({"initial_codec_chunk_frames": -1}, "initial_codec_chunk_frames"),
        ({"duration_seconds": 0}, "duration_seconds"),
        ({"duration_seconds": 61}, "duration_seconds"),
        ({"extra_params": {"bogus": 1}}, "extra_params.bogus"),
        ({"speaker": "Ryan"}, "speaker"),  # together with voice
        ({"language": 5}, "language"),
        ({"model": "reference/video", "ref_audio": "data:audio/wav;base64,UklGRg=="}, "model"),
    ],
)
def test_vllm_omni_speech_fields_the_model_cannot_honour_are_refused(
    astack: AudioStack, client: httpx.Client, fields: dict[str, Any], param: str
) -> None:
    before = astack.count_jobs()
    resp = client.post("/v1/audio/speech", json={**VLLM_OMNI_TTS_BODY, **fields})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert astack.count_jobs() == before


def test_openai_sdk_speech_with_vllm_omni_extra_body(astack: AudioStack, key: str) -> None:
    sdk = OpenAI(base_url=astack.url + "/v1", api_key=key, max_retries=0, timeout=60)
    wav = sdk.audio.speech.create(
        model="reference/audio",
        voice="alloy",
        input="hello there",
        response_format="wav",
        extra_body={
            "language": "Auto",
            "task_type": "CustomVoice",
            "duration_seconds": 0.75,
        },
    )
    samples, rate = decode_audio(io.BytesIO(wav.content))
    assert (samples.shape[0], rate, samples.shape[1]) == (1, 24_000, 18_000)
    with pytest.raises(BadRequestError) as refused:
        sdk.audio.speech.create(
            model="reference/audio",
            voice="alloy",
            input="clone me",
            extra_body={"ref_audio": "https://example.com/reference.wav", "ref_text": "hi"},
        )
    assert refused.value.param == "ref_audio" and "ref_audio" in refused.value.message


def test_generate_sync_like_vllm_omni(astack: AudioStack, client: httpx.Client) -> None:
    body = {
        "input": "a warm pad",
        "audio_length": 1.5,
        "num_inference_steps": 4,
        "guidance_scale": 7.0,
        "negative_prompt": "noise",
        "seed": 3,
        "response_format": "flac",
    }
    resp = client.post("/v1/audio/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "audio/flac"
    samples, rate = decode_audio(io.BytesIO(resp.content))
    assert samples.shape[1] / rate == 1.5
    job = client.get(f"/v1/audio/generations/{resp.headers['x-request-id']}").json()
    assert job["status"] == "completed" and job["seed"] == 3 and job["seconds"] == "1.5"
    again = client.post("/v1/audio/generate", json=body, timeout=120)
    assert again.content == resp.content  # deterministic per seed


def test_sync_client_disconnect_cancels_the_job(astack: AudioStack, client: httpx.Client) -> None:
    astack.set_failpoints({"step:1": "pause"})
    try:
        with pytest.raises(httpx.ReadTimeout):
            client.post(
                "/v1/audio/generate",
                json={"input": "abandoned generate"},
                timeout=httpx.Timeout(30, read=1.5),
            )
        with (
            pytest.raises(httpx.ReadTimeout),
            client.stream(
                "POST",
                "/v1/audio/speech",
                json={"input": "abandoned speech, for nobody", "response_format": "pcm"},
                timeout=httpx.Timeout(30, read=1.5),
            ) as resp,
        ):
            resp.read()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            mine = client.get("/v1/audio/generations", params={"limit": 5}).json()["data"]
            abandoned = [a for a in mine if a["prompt"].startswith("abandoned")]
            if len(abandoned) == 2 and all(a["status"] == "failed" for a in abandoned):
                break
            time.sleep(0.2)
    finally:
        astack.set_failpoints({})
    assert len(abandoned) == 2
    for job in abandoned:
        assert job["status"] == "failed" and job["error"]["code"] == "cancelled", job
        assert astack.objects("audios", job["id"]) == []
