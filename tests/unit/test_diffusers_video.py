"""The diffusers video adapters (Wan, LTX, CogVideoX) against the pipelines' own __call__.

Tiny random-weight pipelines (tests/unit/diffusers_fixtures.py), CPU, float32, offline.
The adapters repeat the exact operation sequence of ``__call__``, so on one machine the
float frames are bit-identical to ``pipe(..., output_type="np")``; the comparison allows
1e-6 so that a harmless reassociation in a future diffusers would not fail it, and the
uint8 frames must then match exactly (or differ by one level at a rounding boundary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch
from diffusers import LTXPipeline, UniPCMultistepScheduler

from models.catalog import FAMILY_SPECS
from models.job_specs import SamplerOptions
from models.registry import ServedModel
from tests.unit.diffusers_fixtures import (
    TINY_SEQ_LEN,
    TINY_VIDEO,
    tiny_cogvideox_pipeline,
    tiny_ltx_pipeline,
    tiny_wan_pipeline,
)
from tests.unit.video_workflows import call_frames
from workers.pipelines.base import GenerationRequest, Media
from workers.pipelines.diffusers.cogvideox.adapter import CogVideoXAdapter
from workers.pipelines.diffusers.ltx.adapter import LTXAdapter
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import DiffusersState, to_uint8
from workers.pipelines.diffusers.wan.adapter import WanAdapter
from workers.pipelines.registry import ADAPTERS, build_adapter


@dataclass
class Case:
    """A tiny pipeline, its adapter class and the request settings used with it."""

    build: Callable[[], Any]
    adapter: type[DiffusersAdapter]
    fps: float
    options: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {
    "wan": Case(tiny_wan_pipeline, WanAdapter, 16.0),
    "wan2.2": Case(
        lambda: tiny_wan_pipeline(two_stage=True),
        WanAdapter,
        16.0,
        options={"guidance_scale_2": 2.5},
    ),
    "ltx": Case(
        tiny_ltx_pipeline,
        LTXAdapter,
        25.0,
        extra={"decode_timestep": 0.05, "decode_noise_scale": 0.025, "guidance_rescale": 0.3},
    ),
    "cogvideox": Case(
        tiny_cogvideox_pipeline, CogVideoXAdapter, 8.0, extra={"use_dynamic_cfg": True}
    ),
    "cogvideox-ddim": Case(lambda: tiny_cogvideox_pipeline(dpm=False), CogVideoXAdapter, 8.0),
    "cogvideox1.5": Case(lambda: tiny_cogvideox_pipeline(patch_size_t=2), CogVideoXAdapter, 8.0),
}
FAMILIES = ["wan", "ltx", "cogvideox"]


def _request(case: Case, **overrides: Any) -> GenerationRequest:
    """The case's request; ``options=`` (a dict) sets its sampler settings."""
    options = overrides.pop("options", case.options)
    fields: dict[str, Any] = {
        "fps": case.fps,
        "num_inference_steps": 3,
        "sampler": SamplerOptions(**options),
        "extra": dict(case.extra),
    }
    return GenerationRequest.video(**TINY_VIDEO | fields | overrides)


def _adapter(case: Case, pipe: Any) -> DiffusersAdapter:
    adapter = case.adapter(pipe=pipe, max_sequence_length=TINY_SEQ_LEN)
    adapter.load("cpu")
    return adapter


def _reference(pipe: Any, req: GenerationRequest) -> np.ndarray:
    """``pipe(...)`` with the request's settings, the way a user would call it."""
    fps = {"frame_rate": req.fps} if isinstance(pipe, LTXPipeline) else {}
    return call_frames(pipe, req, **req.extra, **fps)


def _run(adapter: DiffusersAdapter, req: GenerationRequest) -> tuple[np.ndarray, Media]:
    state = adapter.prepare(req)
    while not state.done:
        adapter.step(state)
    frames, media = adapter.decode_frames(state), adapter.decode(state)
    np.testing.assert_array_equal(media.frames, to_uint8(frames))  # decode is repeatable
    return frames, media


def _assert_same(frames: np.ndarray, media: Media, ref: np.ndarray) -> None:
    np.testing.assert_allclose(frames, ref, rtol=0, atol=1e-6)
    assert media.frames.dtype == np.uint8 and media.frames.shape == ref.shape
    diff = np.abs(media.frames.astype(int) - to_uint8(ref).astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.999


def _scheduler_snapshot(scheduler: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in vars(scheduler).items():
        if isinstance(value, torch.Tensor):
            out[key] = value.clone()
        elif isinstance(value, list):
            out[key] = [v.clone() if isinstance(v, torch.Tensor) else v for v in value]
        else:
            out[key] = value
    return out


def _assert_snapshot_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), key
        elif isinstance(x, list):
            assert len(x) == len(y), key
            for u, v in zip(x, y, strict=True):
                assert torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v, key
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y), key
        else:
            assert x == y, key


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_pipelines_own_call(name: str) -> None:
    case = CASES[name]
    pipe = case.build()
    req = _request(case)
    frames, media = _run(_adapter(case, pipe), req)
    assert frames.shape == (9, 32, 32, 3) and media.fps == case.fps
    _assert_same(frames, media, _reference(pipe, req))


@pytest.mark.parametrize("name", FAMILIES)
def test_default_guidance_and_no_negative_prompt(name: str) -> None:
    """guidance_scale None → the pipeline's __call__ default; negative_prompt None → ""."""
    case = CASES[name]
    pipe = case.build()
    req = _request(case, guidance_scale=None, negative_prompt=None, seed=11)
    frames, media = _run(_adapter(case, pipe), req)
    _assert_same(frames, media, _reference(pipe, req))


@pytest.mark.parametrize("name", FAMILIES)
def test_without_guidance(name: str) -> None:
    """guidance_scale <= 1 turns classifier-free guidance off, as in __call__."""
    case = CASES[name]
    pipe = case.build()
    req = _request(case, guidance_scale=1.0)
    adapter = _adapter(case, pipe)
    state = adapter.prepare(req)
    assert isinstance(state, DiffusersState) and not state.do_cfg
    frames, media = _run(adapter, req)
    _assert_same(frames, media, _reference(pipe, req))


@pytest.mark.parametrize("name", ["wan2.2", "ltx", "cogvideox"])
def test_interleaved_jobs_equal_separate_runs(name: str) -> None:
    case = CASES[name]
    pipe = case.build()
    adapter = _adapter(case, pipe)
    req_a = _request(case, seed=1)
    req_b = _request(
        case,
        seed=2,
        prompt="blue kite",
        negative_prompt=None,
        guidance_scale=6.0,
        num_inference_steps=4,
    )
    alone_a, alone_b = _run(adapter, req_a)[0], _run(adapter, req_b)[0]
    assert not np.array_equal(alone_a, alone_b)

    state_a, state_b = adapter.prepare(req_a), adapter.prepare(req_b)
    while not (state_a.done and state_b.done):
        for state in (state_a, state_b):
            if not state.done:
                adapter.step(state)
    np.testing.assert_array_equal(adapter.decode_frames(state_b), alone_b)
    np.testing.assert_array_equal(adapter.decode_frames(state_a), alone_a)


@pytest.mark.parametrize("name", ["wan", "ltx", "cogvideox"])
def test_stopping_early_leaves_the_shared_pipe_unchanged(name: str) -> None:
    case = CASES[name]
    pipe = case.build()
    adapter = _adapter(case, pipe)
    before = _scheduler_snapshot(pipe.scheduler)
    state = adapter.prepare(_request(case, num_inference_steps=5))
    for _ in range(2):
        adapter.step(state)
    assert state.step_index == 2 and not state.done
    assert adapter.preview(state) is not None
    del state  # cancelled: the executor just drops the state
    _assert_snapshot_equal(before, _scheduler_snapshot(pipe.scheduler))
    assert not hasattr(pipe, "_guidance_scale")  # __call__ state is never written
    req = _request(case)
    frames, media = _run(adapter, req)
    _assert_same(frames, media, _reference(pipe, req))


@pytest.mark.parametrize("name", FAMILIES)
def test_save_pretrained_then_load_from_path(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    pipe = case.build()
    pipe.save_pretrained(tmp_path)
    loaded = case.adapter(path=str(tmp_path), dtype="float32", max_sequence_length=TINY_SEQ_LEN)
    loaded.load("cpu")
    assert loaded.pipe is not pipe and loaded.spec == FAMILY_SPECS[case.adapter.family]
    req = _request(case)
    frames, media = _run(loaded, req)
    np.testing.assert_array_equal(frames, _run(_adapter(case, pipe), req)[0])
    assert media.frames.shape == (9, 32, 32, 3)


def test_cogvideox_sequence_length_defaults_to_the_transformers(tmp_path: Path) -> None:
    pipe = tiny_cogvideox_pipeline()
    pipe.save_pretrained(tmp_path)
    adapter = CogVideoXAdapter(path=str(tmp_path), dtype="float32")
    adapter.load("cpu")
    req = _request(CASES["cogvideox"])
    np.testing.assert_array_equal(_run(adapter, req)[0], _reference(pipe, req))


def test_wan_two_stage_uses_both_transformers() -> None:
    case = CASES["wan2.2"]
    adapter = _adapter(case, case.build())
    state = adapter.prepare(_request(case))
    t = state.timesteps
    assert (t >= 875).any() and (t < 875).any()


def test_wan_boundary_ratio_option_overrides_the_config() -> None:
    case = CASES["wan2.2"]
    pipe = case.build()
    req = _request(case, options={"boundary_ratio": 0.5, "guidance_scale_2": 3.0})
    frames, media = _run(_adapter(case, pipe), req)
    assert pipe.config.boundary_ratio == 0.875
    pipe.register_to_config(boundary_ratio=0.5)
    _assert_same(frames, media, _reference(pipe, req))


def test_wan_flow_shift_builds_a_job_scheduler() -> None:
    case = CASES["wan"]
    pipe = case.build()
    req = _request(case, options={"flow_shift": 5.0})
    frames, media = _run(_adapter(case, pipe), req)
    assert pipe.scheduler.config.flow_shift == 3.0  # shared scheduler untouched
    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=5.0)
    _assert_same(frames, media, _reference(pipe, req))
    assert not np.array_equal(frames, _run(_adapter(case, case.build()), _request(case))[0])


def test_wan_rejects_two_stage_options_on_a_single_transformer() -> None:
    case = CASES["wan"]
    adapter = _adapter(case, case.build())
    with pytest.raises(ValueError, match="guidance_scale_2"):
        adapter.prepare(_request(case, options={"guidance_scale_2": 2.0}))
    with pytest.raises(ValueError, match="transformer_2"):
        adapter.prepare(_request(case, options={"boundary_ratio": 0.9}))


@pytest.mark.parametrize("name", FAMILIES)
def test_vae_options_apply_to_one_decode_only(name: str) -> None:
    case = CASES[name]
    pipe = case.build()
    adapter = _adapter(case, pipe)
    plain = _run(adapter, _request(case))[0]
    tiled = _run(
        adapter, _request(case, options={"vae_use_tiling": True, "vae_use_slicing": True})
    )[0]
    assert pipe.vae.use_tiling is False and pipe.vae.use_slicing is False
    np.testing.assert_allclose(tiled, plain, atol=1e-5)  # tiny frames fit in one tile


@pytest.mark.parametrize("name", FAMILIES)
def test_preview_is_a_small_grey_image(name: str) -> None:
    case = CASES[name]
    adapter = _adapter(case, case.build())
    state = adapter.prepare(_request(case))
    adapter.step(state)
    preview = adapter.preview(state)
    assert preview is not None and preview.dtype == np.uint8
    assert preview.ndim == 3 and preview.shape[2] == 3 and preview.shape[0] <= 32
    assert np.array_equal(preview[..., 0], preview[..., 2])


@pytest.mark.parametrize("name", FAMILIES)
def test_rejects_a_reference_image_and_bad_sizes(name: str) -> None:
    case = CASES[name]
    adapter = _adapter(case, case.build())
    image = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(ValueError, match="input_reference"):
        adapter.prepare(_request(case, reference_image=image))
    with pytest.raises(ValueError, match="divisible"):
        adapter.prepare(_request(case, width=36))


def test_registry_of_adapters_and_construction_errors() -> None:
    for family, cls in [
        ("diffusers.wan", WanAdapter),
        ("diffusers.ltx", LTXAdapter),
        ("diffusers.cogvideox", CogVideoXAdapter),
    ]:
        served = ServedModel(name="m", adapter=family, path="/w", spec=FAMILY_SPECS[family])
        assert type(build_adapter(served)) is cls
    assert {a for a in ADAPTERS if not a.startswith("reference.")} == set(FAMILY_SPECS)
    with pytest.raises(ValueError, match="path or a pipe"):
        WanAdapter()
    with pytest.raises(ValueError, match="dtype"):
        WanAdapter("/nowhere", dtype="int8")
    with pytest.raises(TypeError, match="WanPipeline"):
        WanAdapter(pipe=tiny_ltx_pipeline()).load("cpu")
    with pytest.raises(RuntimeError, match="load"):
        WanAdapter("/nowhere").prepare(_request(CASES["wan"]))


def test_job_scheduler_copies_and_flow_shift() -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    from workers.pipelines.diffusers.shared.common import job_scheduler

    unipc = tiny_wan_pipeline().scheduler
    copy = job_scheduler(unipc)
    assert copy is not unipc and copy.config == unipc.config
    assert job_scheduler(unipc, 5.0).config.flow_shift == 5.0
    euler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    assert job_scheduler(euler, 7.0).config.shift == 7.0 and euler.config.shift == 3.0
    with pytest.raises(ValueError, match="flow_shift has no effect"):
        job_scheduler(tiny_ltx_pipeline().scheduler, 2.0)


def test_family_specs_declare_what_the_adapters_read() -> None:
    wan, ltx, cog = (FAMILY_SPECS[f"diffusers.{n}"] for n in ("wan", "ltx", "cogvideox"))
    # Wan 2.1 by default; Wan 2.2 registry entries add guidance_scale_2 and boundary_ratio
    assert "flow_shift" in wan.parameters
    assert not {"guidance_scale_2", "boundary_ratio"} & set(wan.parameters)
    for spec in (wan, ltx, cog):
        assert {"guidance_scale", "vae_use_tiling", "vae_use_slicing"} <= set(spec.parameters)
        assert not spec.supports_image_input
    # LTX's workflow extras (keyframe anchors, v2v's strength) are test_ltx_i2v.py's
    assert set(ltx.extra_params) == set(CASES["ltx"].extra) | {"frame_indices", "strength"}
    # CogVideoX's workflow extras (i2v's keyframe anchor, v2v's strength): test_cogvideox_i2v.py
    assert set(cog.extra_params) == set(CASES["cogvideox"].extra) | {"frame_indices", "strength"}


def test_wan_decode_stream_is_the_whole_decode_chunk_by_chunk(tmp_path: Path) -> None:
    """Wan's decode streamed one latent frame at a time gives exactly the frames of the
    whole decode (1 frame, then 4 per latent frame), and the MP4 written from the stream
    while it decodes has every frame; with tiling asked for, there is no stream."""
    from workers.media.mp4 import decode_streamed

    case = CASES["wan"]
    adapter = _adapter(case, case.build())
    req = _request(case)
    state: Any = adapter.prepare(req)
    while not state.done:
        adapter.step(state)
    whole = adapter.decode(state).frames
    stream = adapter.decode_stream(state)
    assert stream is not None and stream.audio is None  # Wan is silent
    chunks = list(stream.chunks)
    assert [len(c) for c in chunks] == [1] + [4] * (len(chunks) - 1)
    np.testing.assert_array_equal(np.concatenate(chunks), whole)
    streamed = decode_streamed(adapter, state, req.fps, tmp_path)
    assert streamed is not None and not streamed.has_audio
    np.testing.assert_array_equal(streamed.middle, whole[len(whole) // 2])
    with av.open(str(tmp_path / "video.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == len(whole)
    tiled = _request(case, options={"vae_use_tiling": True})
    state.request = tiled
    assert adapter.decode_stream(state) is None
