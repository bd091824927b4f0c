"""Wan's image workflows through the real queue, sent as vLLM-Omni's clients send them:
tiny seeded ``WanImageToVideoPipeline``s saved to disk and served by registry entries that
name their workflows (Wan 2.1 I2V with its CLIP image encoder: ``i2v``; Wan 2.2 I2V A14B:
``i2v`` and ``flf2v``), beside a text-to-video Wan. The ComfyUI node's multipart shapes
(``frame`` as ``input_reference``; ``first_frame`` + ``last_frame`` as two
``input_references`` with ``extra_params.frame_indices`` [0, -1]; every value a string)
and the benchmark client's image-to-video request run end to end; each MP4 decodes to the
right length and matches the adapter run in-process on the keyframes the API stored, and
every refusal names its field and stores nothing. An entry serving ``v2v`` restyles an
MP4 sent as ``input_reference``."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image

from api.inputs import reference_frame_png
from cli.embedded import EmbeddedS3
from models.catalog import FAMILY_SPECS
from storage.settings import LimitSettings
from tests.helpers import node_form
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.integration.test_bad_input import _refused
from tests.unit.diffusers_fixtures import TINY_SEQ_LEN, tiny_wan_entry, tiny_wan_pipeline
from tests.unit.wan_i2v_fixtures import WORKFLOWS, Layout, tiny_wan_i2v_entry, tiny_wan_i2v_pipeline
from workers.jobs.references import decode_reference
from workers.media.mp4 import encode_mp4
from workers.pipelines.base import GenerationRequest, Media
from workers.pipelines.diffusers.shared.common import to_uint8
from workers.pipelines.diffusers.wan.adapter import WanAdapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

I2V = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"  # layout "2.1": i2v
A14B = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"  # layout "2.2": i2v, flf2v
T2V = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
V2V = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers/V2V"  # the same checkpoint: t2v, v2v
LAYOUTS: dict[str, Layout] = {I2V: "2.1", A14B: "2.2"}


@pytest.fixture(scope="module")
def wstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    entries = [
        tiny_wan_i2v_entry(I2V, module_dir / "wan21_i2v", "2.1"),
        tiny_wan_i2v_entry(A14B, module_dir / "wan22_i2v", "2.2"),
        tiny_wan_entry(T2V, module_dir / "wan_t2v"),
        tiny_wan_entry(V2V, module_dir / "wan_t2v") + '[model.spec]\nworkflows = ["t2v", "v2v"]\n',
    ]
    registry = module_dir / "models.toml"
    registry.write_text("\n".join(entries))
    env = {"OMNIQ_MODEL_REGISTRY": str(registry)}
    with isolated_stack(module_dir, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=1)
        yield st


def _png(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    """A random keyframe of another size and aspect than the job's (the API fits it)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _form(model: str, extra: dict[str, Any] | None = None, **fields: str) -> dict[str, str]:
    """The node's form for a 9-frame 32x32 job at 16 fps, 2 steps, CFG 4."""
    tiny = {
        "width": "32",
        "height": "32",
        "num_frames": "9",
        "fps": "16",
        "num_inference_steps": "2",
        "guidance_scale": "4.0",
    }
    return node_form(model, extra, **tiny | fields)


def _files(*parts: bytes, field: str = "input_references") -> list[tuple[str, Any]]:
    return [(field, (f"frame{i}.png", data, "image/png")) for i, data in enumerate(parts)]


def _run(stack: Stack, **post: Any) -> np.ndarray:
    """Create, wait, fetch: the decoded MP4's frames (9 of 32x32 at 16 fps)."""
    with stack.client() as c:
        resp = c.post("/v1/videos", **post)
        assert resp.status_code == 200, resp.text
        done = stack.wait_for(c, resp.json()["id"], timeout=180)
        assert done["status"] == "completed", (done, stack.log("w0")[-3000:])
        assert (done["num_frames"], done["fps"], done["size"]) == (9, 16, "32x32")
        mp4 = bytes(c.get(f"/v1/videos/{done['id']}/content").content)
    with av.open(io.BytesIO(mp4)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert frames.shape == (9, 32, 32, 3)
    return frames


def _fitted(png: bytes) -> np.ndarray:
    """The keyframe as the API stores it for a 32x32 job (cover, centre crop)."""
    fitted = reference_frame_png(png, 32, 32, LimitSettings(), "input_reference")
    return np.asarray(Image.open(io.BytesIO(fitted)).convert("RGB"))


def _in_process(model: str, first: bytes, last: bytes | None = None) -> np.ndarray:
    layout = LAYOUTS[model]
    spec = FAMILY_SPECS["diffusers.wan"].model_copy(update={"workflows": WORKFLOWS[layout]})
    adapter = WanAdapter(
        pipe=tiny_wan_i2v_pipeline(layout), spec=spec, max_sequence_length=TINY_SEQ_LEN
    )
    adapter.load("cpu")
    request = GenerationRequest.video(
        prompt="a red ball", width=32, height=32, num_frames=9, fps=16.0,
        num_inference_steps=2, seed=42, guidance_scale=4.0,
        reference_image=_fitted(first), last_image=None if last is None else _fitted(last),
    )  # fmt: skip
    state = adapter.prepare(request)
    while not state.done:
        adapter.step(state)
    return to_uint8(adapter.decode_frames(state))


def _close(video: np.ndarray, expected: np.ndarray, tmp: Path) -> None:
    """Encoded the same way, the frames decode (nearly) identically (x264's frame threads
    make its decisions timing-dependent; another seed differs by ~50 levels)."""
    reference = tmp / "reference.mp4"
    encode_mp4(Media(frames=expected, fps=16.0), reference)
    with av.open(str(reference)) as container:
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert np.abs(video.astype(int) - decoded.astype(int)).mean() < 4


def test_node_frame_as_input_reference_runs_i2v_with_the_image_encoder(
    wstack: Stack, tmp_path: Path
) -> None:
    first = _png(1)
    video = _run(wstack, data=_form(I2V), files=_files(first, field="input_reference"))
    _close(video, _in_process(I2V, first), tmp_path)


def test_node_first_and_last_frame_run_flf2v(wstack: Stack, tmp_path: Path) -> None:
    first, last = _png(2), _png(3)
    form = _form(A14B, {"frame_indices": [0, -1]})
    video = _run(wstack, data=form, files=_files(first, last))
    _close(video, _in_process(A14B, first, last), tmp_path)


def test_benchmark_image_to_video_request_and_a_data_url(wstack: Stack, tmp_path: Path) -> None:
    """The benchmark client's i2v request (multipart, ``size`` and ``seconds``), and the
    same keyframe as a JSON data URL: one job each, the same frames."""
    first = _png(4)
    fields = {"model": A14B, "prompt": "a red ball", "size": "32x32", "seconds": "0.5625"}
    fields |= {"fps": "16", "num_inference_steps": "2", "seed": "42", "guidance_scale": "4.0"}
    video = _run(wstack, data=fields, files=_files(first, field="input_reference"))
    url = "data:image/png;base64," + base64.b64encode(first).decode()
    again = _run(wstack, json={**fields, "input_reference": url})
    expected = _in_process(A14B, first)
    _close(video, expected, tmp_path)
    _close(again, expected, tmp_path)


def _mp4(frames: int = 9, size: tuple[int, int] = (48, 40)) -> bytes:
    rng = np.random.default_rng(5)
    video = rng.integers(0, 256, (frames, size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for frame in video:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))
    return out.getvalue()


def test_v2v_restyles_a_source_video(wstack: Stack, tmp_path: Path) -> None:
    """One MP4 as ``input_reference`` on an entry that serves ``v2v``: the worker decodes
    it, and the job equals the adapter in-process on the same decoded frames."""
    source = _mp4()
    form = _form(V2V, {"strength": 0.7}, num_inference_steps="3")
    video = _run(wstack, data=form, files=_files(source, field="input_reference"))
    decoded = decode_reference("video", source, "input_reference")
    spec = FAMILY_SPECS["diffusers.wan"].model_copy(update={"workflows": ["t2v", "v2v"]})
    adapter = WanAdapter(pipe=tiny_wan_pipeline(), spec=spec, max_sequence_length=TINY_SEQ_LEN)
    adapter.load("cpu")
    request = GenerationRequest.video(
        prompt="a red ball", width=32, height=32, num_frames=9, fps=16.0,
        num_inference_steps=3, seed=42, guidance_scale=4.0, extra={"strength": 0.7},
        references=[decoded],
    )  # fmt: skip
    state = adapter.prepare(request)
    while not state.done:
        adapter.step(state)
    assert state.num_steps == 2  # int(3 * 0.7) of the schedule's steps
    _close(video, to_uint8(adapter.decode_frames(state)), tmp_path)


def test_models_lists_each_entry_s_workflows(wstack: Stack) -> None:
    with wstack.client() as c:
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert [models[m]["workflows"] for m in (I2V, A14B, T2V, V2V)] == [
        ["i2v"],
        ["i2v", "flf2v"],
        ["t2v"],
        ["t2v", "v2v"],
    ]
    image_input = [models[m]["limits"]["supports_image_input"] for m in (I2V, A14B, T2V, V2V)]
    assert image_input == [True, True, False, True]


@pytest.mark.parametrize(
    ("model", "extra", "parts", "field", "param"),
    [
        (T2V, None, 1, "input_reference", "input_reference"),  # a text-to-video model
        (T2V, None, 2, "input_references", "input_references"),
        (T2V, {"frame_indices": [0]}, 0, "input_references", "extra_params.frame_indices"),
        (I2V, None, 0, "input_references", "input_reference"),  # i2v needs its keyframe
        (I2V, {"frame_indices": [0, -1]}, 2, "input_references", "input_references"),
        (A14B, {"frame_indices": [-1]}, 1, "input_reference", "extra_params.frame_indices"),
        (A14B, {"frame_indices": [0]}, 2, "input_references", "extra_params.frame_indices"),
        (A14B, {"frame_indices": [0, 1]}, 2, "input_references", "extra_params.frame_indices"),
        (A14B, None, 3, "input_references", "input_references"),
        (A14B, {"task": "i2v"}, 1, "input_reference", "extra_params.task"),
        (A14B, {"strength": 0.5}, 1, "input_reference", "extra_params.strength"),
        (V2V, {"strength": 0.5}, 1, "input_reference", "extra_params.strength"),  # an image
        (V2V, None, 1, "input_reference", "input_reference"),  # an image: no i2v here
        (T2V, None, -1, "input_reference", "input_reference"),  # an MP4 to a t2v model
        (V2V, None, -2, "input_references", "input_references"),  # two MP4s
        (V2V, {"strength": 0}, -1, "input_reference", "extra_params.strength"),  # keeps none
    ],
)
def test_refusals_name_the_field_and_store_nothing(
    wstack: Stack,
    model: str,
    extra: dict[str, Any] | None,
    parts: int,
    field: str,
    param: str,
) -> None:
    made = [_mp4()] * -parts if parts < 0 else [_png(10 + i) for i in range(parts)]
    files = _files(*made, field=field)
    with wstack.client() as c:
        _refused(
            wstack,
            lambda: c.post("/v1/videos", data=_form(model, extra), files=files or None),
            param,
        )


def test_an_unreadable_keyframe_is_refused_naming_it(wstack: Stack) -> None:
    files = _files(_png(20), b"not an image at all")
    with wstack.client() as c:
        error = _refused(
            wstack,
            lambda: c.post("/v1/videos", data=_form(A14B), files=files),
            "input_references[1]",
        )
    assert "PNG, JPEG, WebP" in error["message"]
