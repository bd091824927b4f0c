"""Speech end to end: ``/v1/audio/speech`` (with the OpenAI SDK, SSE and streamed PCM, as
vLLM-Omni's TTS clients send it) and ``/v1/audio/generate`` against an API process, Redis,
a Celery worker process, PostgreSQL and S3; every artifact is decoded with PyAV."""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import httpx
import numpy as np
import pytest
from openai import BadRequestError, OpenAI

from tests.integration.audio_stack import AudioStack, create_audio
from tests.speech_measures import median_f0, syllabic_peak_hz
from workers.media.audio import decode_audio

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(astack: AudioStack) -> AudioStack:
    """This module's stack is the one conftest's ``key`` and ``client`` use."""
    return astack


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
    music = create_audio(client)
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
