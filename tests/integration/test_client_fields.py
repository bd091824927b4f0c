"""No field silently ignored (issue 32 §4, its "Done when" check): every field that
vLLM-Omni's clients send reaches the embedded stack and either acts (the job object or
the output shows it), is listed in the job's ``applied_params``, is one of the sampler
fields those clients always send and the model does not use (accepted, and absent from
``applied_params``), or is refused with a 400 naming it, nothing stored.

The field lists, from vllm-project/vllm-omni:

* the ComfyUI node, ``apps/ComfyUI-vLLM-Omni/comfyui_vllm_omni/utils/api_client.py``
  ``VLLMOmniClient.generate_video``: a multipart form of ``model``, ``prompt``,
  ``width``, ``height``, ``num_frames``, ``fps``, ``negative_prompt`` (when not empty),
  every key of its sampling params as a string, ``lora`` (JSON text), the ``frame`` as an
  ``input_reference`` file (``first_frame``/``last_frame`` are MiniMax-H3's only) and
  ``extra_params`` (JSON text). Its sampling params (``nodes.py``
  ``VLLMOmniDiffusionSampling``): ``n``, ``num_inference_steps``, ``guidance_scale``,
  ``true_cfg_scale``, ``vae_use_slicing``, ``seed``. Its TTS nodes (``VLLMOmniTTS``,
  ``generate_speech``): ``model``, ``input``, ``voice``, ``response_format``, ``speed``,
  plus ``VLLMOmniQwenTTSParams``: ``task_type``, ``language``, ``instructions``,
  ``max_new_tokens``.
* the diffusion benchmark, ``benchmarks/diffusion/backends.py``
  ``async_request_v1_videos``: a form of its ``--extra-body`` fields, then ``prompt``,
  ``width``, ``height``, ``num_frames``, ``num_inference_steps``, ``seed``, ``fps``, and
  an ``input_reference`` file for image-to-video (``diffusion_benchmark_serving.py``).
  The extra body here is the sampler fields the issue names (``guidance_scale``,
  ``true_cfg_scale``, ``flow_shift``, ``vae_use_slicing``, ``vae_use_tiling``).
* the TTS benchmark, ``vllm_omni/benchmarks/patch/patch.py``
  ``async_request_openai_audio_speech``: ``model``, ``input``, ``stream: true``,
  ``stream_format: "audio"``, ``response_format: "pcm"``, then its extra body:
  ``benchmarks/tts/model_configs.yaml`` (``default_voice``: ``voice``, ``language``,
  ``task_type``), ``bench_tts.py``'s ``--request-seed`` (``seed``) and ``--output-len``
  (``max_new_tokens``).

One stack, reference models only (``reference/video``, ``reference/speech``); what each
diffusers family applies of the same fields is ``tests/unit/test_applied_params.py``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from cli.embedded import EmbeddedS3
from tests.helpers import tts_benchmark_body
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.integration.test_bad_input import _refused

pytestmark = pytest.mark.integration

VIDEO = "reference/video"
SPEECH = "reference/speech"

# The node's form merged with the benchmark's (every value a string).
NODE_AND_BENCHMARK: dict[str, str] = {
    "model": VIDEO,
    "prompt": "a red ball on a lawn",
    "width": "32",
    "height": "32",
    "num_frames": "8",
    "fps": "8",
    "negative_prompt": "blurry",
    "n": "1",
    "num_inference_steps": "2",
    "guidance_scale": "7.5",
    "true_cfg_scale": "1.0",
    "vae_use_slicing": "False",
    "vae_use_tiling": "False",
    "flow_shift": "5.0",
    "seed": "42",
    "extra_params": json.dumps({"motion": 2.0}),
}
# What each field is for reference/video: shown by the job object, listed in
# applied_params, or sent always and not used by this model (then absent from it).
SHOWN = {
    "model": "model",
    "prompt": "prompt",
    "width": "size",
    "height": "size",
    "num_frames": "num_frames",
    "fps": "fps",
    "n": "n",
    "num_inference_steps": "num_inference_steps",
    "seed": "seed",
}
APPLIED = ["guidance_scale", "negative_prompt", "extra_params.motion"]
UNUSED = {"true_cfg_scale", "vae_use_slicing", "vae_use_tiling", "flow_shift"}

# The TTS benchmark's body for a default-voice run (Qwen3-TTS-CustomVoice's config).
TTS_BENCH = tts_benchmark_body(model=SPEECH)


@pytest.fixture(scope="module")
def fstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    with isolated_stack(module_dir, s3_server, redis_db=redis_db, extra_env={}) as st:
        st.start(workers=1)
        yield st


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _video(stack: Stack, c: httpx.Client, **post: Any) -> tuple[dict[str, Any], bytes]:
    resp = c.post("/v1/videos", **post)
    assert resp.status_code == 200, resp.text
    done = stack.wait_for(c, resp.json()["id"])
    assert done["status"] == "completed", (done, stack.log("w0")[-3000:])
    return done, c.get(f"/v1/videos/{done['id']}/content").content


def test_the_node_s_and_the_benchmark_s_video_fields(fstack: Stack) -> None:
    frame = [("input_reference", ("image.png", _png(1), "image/png"))]
    with fstack.client() as c:
        job, mp4 = _video(fstack, c, data=NODE_AND_BENCHMARK, files=frame)
        # Every field sent is accounted for, one way only.
        assert set(NODE_AND_BENCHMARK) - {"extra_params"} == set(SHOWN) | set(APPLIED[:2]) | UNUSED
        assert job["applied_params"] == APPLIED
        assert not UNUSED & set(job["applied_params"])
        shown = {name: job[field] for name, field in SHOWN.items()}
        assert shown == {
            "model": VIDEO,
            "prompt": NODE_AND_BENCHMARK["prompt"],
            "width": "32x32",
            "height": "32x32",
            "num_frames": 8,
            "fps": 8,
            "n": 1,
            "num_inference_steps": 2,
            "seed": 42,
        }
        # The frame acts: the same request without it is another video.
        _, text_only = _video(fstack, c, data=NODE_AND_BENCHMARK, files={"x": ("", b"")})
        assert text_only != mp4
        # The spritesheet: one JPEG of the 8 frames, 5 a row (32x32 tiles).
        sheet = c.get(f"/v1/videos/{job['id']}/content", params={"variant": "spritesheet"})
        assert sheet.status_code == 200 and sheet.headers["content-type"] == "image/jpeg"
        with Image.open(io.BytesIO(sheet.content)) as img:
            assert (img.format, img.size) == ("JPEG", (5 * 32, 2 * 32))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        # The node's LoRA input: reference/video takes no adapter.
        (
            {"lora": json.dumps({"local_path": None, "name": "s", "scale": 1.0, "int_id": 3})},
            "lora",
        ),
        ({"extra_params": json.dumps({"frame_indices": [0, -1]})}, "extra_params.frame_indices"),
        ({"num_frames": "0"}, "num_frames"),
    ],
)
def test_what_cannot_act_on_the_video_model_is_refused(
    fstack: Stack, fields: dict[str, str], param: str
) -> None:
    with fstack.client() as c:
        _refused(fstack, lambda: c.post("/v1/videos", data={**NODE_AND_BENCHMARK, **fields}), param)


def test_an_openai_file_id_reference_is_refused(fstack: Stack) -> None:
    body = {"model": VIDEO, "prompt": "x", "input_reference": {"file_id": "file-abc"}}
    with fstack.client() as c:
        _refused(fstack, lambda: c.post("/v1/videos", json=body), "input_reference.file_id")


def test_the_tts_benchmark_s_fields(fstack: Stack) -> None:
    with fstack.client() as c:
        with c.stream("POST", "/v1/audio/speech", json=TTS_BENCH) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"] == "audio/pcm"
            assert "content-length" not in resp.headers  # stream: sent as it is spoken
            english = resp.read()
            job_id = resp.headers["x-request-id"]
        job = fstack.wait_for(c, job_id, collection="audio/generations")
        assert job["status"] == "completed" and job["seed"] == 7
        assert job["applied_params"] == ["speed", "voice", "language"]
        # language acts: eSpeak NG's French voice says it otherwise.
        french = c.post("/v1/audio/speech", json={**TTS_BENCH, "language": "French"})
        assert french.status_code == 200 and french.content != english
        # stream=false: the same samples, sent whole once spoken.
        whole = c.post("/v1/audio/speech", json={**TTS_BENCH, "stream": False})
        assert whole.headers["content-length"] == str(len(english))
        assert whole.content == english
        # --output-len's max_new_tokens caps codec tokens: none here, so a 400.
        bench = {**TTS_BENCH, "max_new_tokens": 2048}
        _refused(fstack, lambda: c.post("/v1/audio/speech", json=bench), "max_new_tokens")
        wav = {**TTS_BENCH, "response_format": "wav"}
        _refused(fstack, lambda: c.post("/v1/audio/speech", json=wav), "stream")


def test_the_comfyui_tts_node_s_fields(fstack: Stack) -> None:
    node = {"model": SPEECH, "input": "Good morning to you.", "voice": "Vivian"}
    node |= {"response_format": "wav", "speed": 1.0}
    with fstack.client() as c:
        normal = c.post("/v1/audio/speech", json=node)
        faster = c.post("/v1/audio/speech", json={**node, "speed": 2.0})
        assert normal.status_code == faster.status_code == 200
        assert len(faster.content) < 0.7 * len(normal.content)  # speed acts
        job = c.get(f"/v1/audio/generations/{faster.headers['x-request-id']}").json()
        assert job["applied_params"] == ["speed", "voice"]
        # With the Qwen TTS params node: language acts, instructions "" asks nothing,
        # max_new_tokens cannot act.
        qwen = {"task_type": "CustomVoice", "language": "English", "instructions": ""}
        spoken = c.post("/v1/audio/speech", json={**node, **qwen})
        assert spoken.status_code == 200 and spoken.content == normal.content
        capped = {**node, **qwen, "max_new_tokens": 2048}
        _refused(fstack, lambda: c.post("/v1/audio/speech", json=capped), "max_new_tokens")
        told = {**node, **qwen, "instructions": "Speak with excitement"}
        _refused(fstack, lambda: c.post("/v1/audio/speech", json=told), "instructions")
