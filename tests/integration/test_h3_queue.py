"""MiniMax-H3 through the real queue, sent as vLLM-Omni's ComfyUI node sends it: a tiny
seeded H3 saved to disk, served under the node's names (``MiniMaxAI/MiniMax-H3`` for
t2va/fl2va, ``…/Ref2VA`` for ref2va), multipart bodies with every value a string,
``extra_params`` as JSON text. Each job's MP4 carries stereo AAC at 24 fps, its frames
match the adapter run in-process, and every refusal names its field and stores nothing."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from cli.embedded import EmbeddedS3
from models.catalog import FAMILY_SPECS
from models.job_specs import SamplerOptions
from tests.helpers import node_form
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.integration.test_bad_input import _refused
from tests.unit.h3_fixtures import h3_request, tiny_h3_lora, tiny_h3_pipe
from workers.media.mp4 import Mp4Writer
from workers.media.pixels import yuv420p
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

H3, REF = "MiniMaxAI/MiniMax-H3", "MiniMaxAI/MiniMax-H3/Ref2VA"
FAST = "MiniMaxAI/MiniMax-H3/FastH3"
# FastH3's schedule: 4 transformer evaluations, counted as such (what the node sends), no CFG
FAST_SPEC = "min_steps = 4\nmax_steps = 4\ndefault_steps = 4\nno_cfg = true\n"
SPEC = """[model.spec]
canvas_short_edge = 64
canvas_max_pixels = 8192
default_size = [64, 64]
"""


@pytest.fixture(scope="module")
def h3_stack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    path = module_dir / "tiny_h3"
    tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192).save_pretrained(
        str(path), overwrite_modular_index=True
    )
    loras = module_dir / "loras" / "style"
    loras.mkdir(parents=True)
    style = loras / "pytorch_lora_weights.safetensors"
    tiny_h3_lora(style, seed=3)
    # 40 times lora_B: a style the frames show (11.8 levels on average, 0.6 as made),
    # well beyond what the comparison of encoded frames tolerates (4)
    weights = load_file(str(style))
    save_file({k: v * 40 if "lora_B" in k else v for k, v in weights.items()}, str(style))
    fused = _fast_lora(module_dir)
    entries = [
        f'[[model]]\nname = "{H3}"\nadapter = "diffusers.minimax_h3"\npath = "{path}"\n'
        f'dtype = "float32"\n{SPEC}parameters = ["flow_shift", "lora"]\n',
        f'[[model]]\nname = "{REF}"\nadapter = "diffusers.minimax_h3"\npath = "{path}"\n'
        f'dtype = "float32"\n{SPEC}workflows = ["ref2va"]\n',
        f'[[model]]\nname = "{FAST}"\nadapter = "diffusers.minimax_h3"\npath = "{path}"\n'
        f'dtype = "float32"\n[model.adapter_options]\nsteps = "evaluations"\n'
        f'[model.adapter_options.fused_lora]\npath = "{fused["path"]}"\n'
        f'sha256 = "{fused["sha256"]}"\n{SPEC}{FAST_SPEC}',
    ]
    registry = module_dir / "models.toml"
    registry.write_text("\n".join(entries))
    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_LORA__ROOTS": str(loras.parent),
        "OMNIQ_LORA__MAX_RANK": "2",
    }
    with isolated_stack(module_dir, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=1)
        yield st


def _fast_lora(module_dir: Path) -> dict[str, str]:
    """FastH3's LoRA (a tiny one, lora_B × 40 so that the frames show it) and its
    sha256, as the registry entry pins it."""
    path = module_dir / "fasth3.safetensors"
    if not path.exists():
        tiny_h3_lora(path, seed=5)
        weights = load_file(str(path))
        save_file({k: v * 40 if "lora_B" in k else v for k, v in weights.items()}, str(path))
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _png(seed: int, size: tuple[int, int] = (64, 64)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=rate, layout="mono")
        t = np.arange(int(seconds * rate)) / rate
        samples = (0.3 * np.sin(2 * np.pi * 330 * t) * 32767).astype(np.int16)[None]
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = rate
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out.getvalue()


def _form(model: str, extra: dict[str, Any] | None = None, **fields: str) -> dict[str, str]:
    """The node's form for a 5 s H3 job of 3 steps (the node always sends a guidance
    scale; H3 ignores it)."""
    h3 = {"seconds": "5", "num_inference_steps": "3", "guidance_scale": "1.0"}
    return node_form(model, extra, **h3 | fields)


def _files(*parts: bytes, field: str = "input_references") -> list[tuple[str, Any]]:
    return [(field, (f"ref{i}", data, "application/octet-stream")) for i, data in enumerate(parts)]


def _run(stack: Stack, data: dict[str, str], files: list[tuple[str, Any]]) -> bytes:
    return _job(stack, data, files)[1]


def _job(
    stack: Stack, data: dict[str, str], files: list[tuple[str, Any]]
) -> tuple[dict[str, Any], bytes]:
    """The completed job object and its MP4."""
    with stack.client() as c:
        resp = c.post("/v1/videos", data=data, files=files or None)
        assert resp.status_code == 200, resp.text
        done = stack.wait_for(c, resp.json()["id"], timeout=300)
        assert done["status"] == "completed", (done, stack.log("w0")[-3000:])
        assert (done["fps"], done["num_frames"], done["has_audio"]) == (24, 124, True)
        return done, bytes(c.get(f"/v1/videos/{done['id']}/content").content)


def _denoise_steps(stack: Stack, job_id: str) -> tuple[int, set[int]]:
    """The last denoise step the job's progress events announced, and their ``num_steps``."""
    events = []
    with stack.client() as c, c.stream("GET", f"/v1/videos/{job_id}/events", timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "done":
                    break
    denoise = [e for e in events if e["type"] == "progress" and e["stage"] == "denoise"]
    return max(e["step"] for e in denoise), {e["num_steps"] for e in denoise}


def _decode(mp4: bytes) -> tuple[np.ndarray, int, str]:
    with av.open(io.BytesIO(mp4)) as container:
        audio = container.streams.audio[0]
        channels, codec = audio.codec_context.channels, audio.codec_context.name
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    return frames, channels, codec


def _in_process(
    request: GenerationRequest,
    workflows: list[str],
    lora: Path | None = None,
    fused: dict[str, str] | None = None,
) -> np.ndarray:
    update: dict[str, Any] = {"workflows": workflows}
    options: dict[str, Any] = {}
    if fused is not None:  # FastH3's entry
        update |= {"min_steps": 4, "max_steps": 4, "default_steps": 4, "no_cfg": True}
        options = {"fused_lora": fused, "steps": "evaluations"}
    spec = FAMILY_SPECS["diffusers.minimax_h3"].model_copy(update=update)
    pipe = tiny_h3_pipe(tiled=True, canvas_short_edge=64, canvas_max_pixels=8192)
    if lora is not None:  # diffusers' own loading, as a user of the pipeline would
        pipe.load_lora_weights(str(lora), adapter_name="style")
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=spec, **options)
    adapter.load("cpu")
    state = adapter.prepare(request)
    while not state.done:
        adapter.step(state)
    return adapter.decode(state).frames


def _close(video: np.ndarray, expected: np.ndarray, tmp: Path) -> None:
    """The same frames: ``expected`` encoded the same way (yuv420p made as the worker
    makes it from H3's frames on the device, ``workers.media.pixels``) decodes (nearly)
    identically. x264's frame threads make its decisions timing-dependent, so a small
    mean difference is allowed; another seed differs by ~50 levels."""
    reference = tmp / "reference.mp4"
    with Mp4Writer(reference, 24.0) as mp4:
        mp4.write_planes(yuv420p(torch.from_numpy(expected)).numpy())
    with av.open(str(reference)) as container:
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert video.shape == decoded.shape == (124, 64, 64, 3)
    assert np.abs(video.astype(int) - decoded.astype(int)).mean() < 4


def _request(**kw: Any) -> GenerationRequest:
    return h3_request(**kw)


def test_t2va_with_an_aspect_ratio_and_both_shifts(h3_stack: Stack, tmp_path: Path) -> None:
    extra = {"task": "t2va", "aspect_ratio": "1:1", "audio_flow_shift": 2.0}
    mp4 = _run(h3_stack, _form(H3, extra, flow_shift="5.0"), [])
    video, channels, codec = _decode(mp4)
    assert (channels, codec) == (2, "aac")
    expected = _in_process(
        _request(
            sampler=SamplerOptions(flow_shift=5.0),
            extra={"task": "t2va", "audio_flow_shift": 2.0},
        ),
        ["t2va", "fl2va"],
    )
    _close(video, expected, tmp_path)


def test_fl2va_first_and_last_keyframes(h3_stack: Stack, tmp_path: Path) -> None:
    first, last = _png(1), _png(2)
    mp4 = _run(h3_stack, _form(H3, {"frame_indices": [0, -1]}), _files(first, last))
    video, _, _ = _decode(mp4)
    decoded = [np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in (first, last)]
    expected = _in_process(_request(reference_image=decoded[0], last_image=decoded[1]), ["fl2va"])
    _close(video, expected, tmp_path)


def test_fl2va_one_keyframe_as_input_reference_anchored_last(h3_stack: Stack) -> None:
    files = _files(_png(3), field="input_reference")
    _run(h3_stack, _form(H3, {"task": "fl2va", "frame_indices": [-1]}), files)


def test_ref2va_image_and_audio_on_the_ref_deployment(h3_stack: Stack) -> None:
    mp4 = _run(h3_stack, _form(REF, {"task": "ref2va"}), _files(_png(4), _wav()))
    video, channels, _ = _decode(mp4)
    assert channels == 2 and video.shape == (124, 64, 64, 3)


def test_fasth3_runs_the_node_s_fasth3_request(
    h3_stack: Stack, module_dir: Path, tmp_path: Path
) -> None:
    """FastH3 as a deployment: its LoRA fused at start-up against the pinned sha256, and
    the node's FastH3 request (``num_inference_steps=4``: evaluations) run as 4
    transformer evaluations (its progress events' steps); the frames are the adapter's
    with the same LoRA fused, and not the plain model's."""
    form = _form(FAST, {"task": "t2va"}, num_inference_steps="4")
    done, mp4 = _job(h3_stack, form, [])
    assert done["step"] == 4 and _denoise_steps(h3_stack, done["id"]) == (4, {4})
    video, channels, _ = _decode(mp4)
    assert channels == 2
    request = _request(num_inference_steps=4, extra={"task": "t2va"})
    expected = _in_process(request, ["t2va", "fl2va"], fused=_fast_lora(module_dir))
    _close(video, expected, tmp_path)
    # the base entry (sigma points) at the same schedule, without the LoRA
    plain = _in_process(_request(num_inference_steps=5, extra={"task": "t2va"}), ["t2va", "fl2va"])
    assert np.abs(plain.astype(int) - expected.astype(int)).mean() > 8  # the LoRA shows


def test_fasth3_refuses_another_schedule_naming_the_field(h3_stack: Stack) -> None:
    with h3_stack.client() as c:
        for steps in ("3", "5", "8"):  # 5: the Turbo count of a base H3 server
            form = _form(FAST, num_inference_steps=steps)
            _refused(h3_stack, lambda f=form: c.post("/v1/videos", data=f), "num_inference_steps")
        form = _form(FAST, num_inference_steps="4", guidance_scale="4.5")
        _refused(h3_stack, lambda: c.post("/v1/videos", data=form), "guidance_scale")


def test_models_lists_each_deployment_s_workflows(h3_stack: Stack) -> None:
    with h3_stack.client() as c:
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert models[H3]["workflows"] == ["t2va", "fl2va"]
    assert models[REF]["workflows"] == ["ref2va"]
    assert (models[H3]["loras"], models[REF]["loras"]) == (["style"], None)
    assert models[H3]["attention"] == {"blocks": "sdpa", "token_refiner": "sdpa"}


def test_t2va_with_a_per_request_lora_as_the_node_sends_it(
    h3_stack: Stack, module_dir: Path, tmp_path: Path
) -> None:
    node = {"local_path": None, "name": "style", "scale": 1.0, "int_id": None}
    mp4 = _run(h3_stack, _form(H3, {"task": "t2va"}, lora=json.dumps(node)), [])
    video, channels, _ = _decode(mp4)
    assert channels == 2
    style = module_dir / "loras" / "style" / "pytorch_lora_weights.safetensors"
    _close(video, _in_process(_request(), ["t2va", "fl2va"], lora=style), tmp_path)
    with pytest.raises(AssertionError):  # and not the model without it
        _close(video, _in_process(_request(), ["t2va", "fl2va"]), tmp_path)


@pytest.mark.parametrize(
    ("model", "extra", "fields", "parts", "param"),
    [
        (H3, {"task": "ref2va"}, {}, ("png",), "extra_params.task"),
        (REF, {"task": "t2va"}, {}, (), "extra_params.task"),
        (H3, {"frame_indices": [0]}, {}, ("png", "png"), "extra_params.frame_indices"),
        (H3, {"frame_indices": [1]}, {}, ("png",), "extra_params.frame_indices"),
        (H3, {}, {}, ("png", "png", "png"), "input_references"),
        (H3, {}, {}, ("wav",), "input_references[0]"),
        (H3, {"task": "t2va"}, {}, ("png",), "input_references"),
        (REF, {}, {}, ("wav",), "input_references"),
        (REF, {}, {}, ("png", "wav", "wav", "wav", "wav"), "input_references"),
        (REF, {}, {}, ("png",) * 10, "input_references"),
        (REF, {}, {}, ("junk",), "input_references[0]"),
        (H3, {"aspect_ratio": "16:9"}, {"size": "64x64"}, (), "size"),
        (H3, {"aspect_ratio": "2:1"}, {}, (), "extra_params.aspect_ratio"),
        (H3, {"frame_indices": "0"}, {}, ("png",), "extra_params.frame_indices"),
        (H3, {}, {"seconds": "16"}, (), "seconds"),
        (H3, {}, {"fps": "12"}, (), "fps"),
    ],
)
def test_refusals_name_the_field_and_store_nothing(
    h3_stack: Stack,
    model: str,
    extra: dict[str, Any],
    fields: dict[str, str],
    parts: tuple[str, ...],
    param: str,
) -> None:
    made = {"png": _png(5), "wav": _wav(), "junk": b"not media at all"}
    files = _files(*(made[p] for p in parts))
    with h3_stack.client() as c:
        _refused(
            h3_stack,
            lambda: c.post("/v1/videos", data=_form(model, extra, **fields), files=files or None),
            param,
        )


def test_latent_mask_editing_is_refused_naming_source_video(h3_stack: Stack) -> None:
    """Not in diffusers' H3 blocks: refused, never run as a plain generation."""
    video = _files(_wav(), field="source_video")
    with h3_stack.client() as c:
        _refused(
            h3_stack, lambda: c.post("/v1/videos", data=_form(H3), files=video), "source_video"
        )
        masked = _form(H3, {"task": "t2va"}, audio_noise_mask="[1, 0]")
        _refused(h3_stack, lambda: c.post("/v1/videos", data=masked), "source_video")
        body = {"model": H3, "prompt": "p", "extra_params": {"source_audio": "x"}}
        _refused(h3_stack, lambda: c.post("/v1/videos", json=body), "source_video")
