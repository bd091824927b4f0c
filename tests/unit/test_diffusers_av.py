"""LTX-2 (video + audio) and Stable Audio (audio) adapters against their own pipelines.

Tiny random-weight pipelines (``diffusers_fixtures_av``), CPU, float32, offline. Every
comparison is exact (``torch.equal`` / ``np.array_equal``, tolerance 0): the adapters call
the same modules with the same inputs in the same order as ``__call__`` (same batched CFG,
same float32 guidance arithmetic, same scheduler class on a copy, noise drawn from a CPU
generator in the same order), so within one process the CPU kernels return identical bits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.catalog import FAMILY_SPECS
from tests.unit.diffusers_fixtures_av import (
    LTX2_REQUEST,
    STABLE_AUDIO_REQUEST,
    tiny_ltx2_pipeline,
    tiny_stable_audio_pipeline,
)
from workers.pipelines.base import GenerationRequest, Media, Pipeline, StepState
from workers.pipelines.diffusers.ltx2 import adapter as ltx2_module
from workers.pipelines.diffusers.ltx2.adapter import LTX2Adapter
from workers.pipelines.diffusers.stable_audio import adapter as stable_audio_module
from workers.pipelines.diffusers.stable_audio.adapter import StableAudioAdapter

SEQ_LEN = 32  # LTX-2 prompt tokens (``__call__`` default 1024; shorter keeps the test fast)
# STG on block 1 (the default block 28 does not exist in the 2-layer tiny transformer), so
# the CFG, STG and modality-isolation passes all change the result.
LTX2_EXTRA = {"stg_blocks": "1"}
LTX2_KWARGS = {"spatio_temporal_guidance_blocks": [1]}


def _run(adapter: Pipeline, state: StepState) -> Media:
    while not state.done:
        adapter.step(state)
    return adapter.decode(state)


def _same(a: Any, b: Any) -> bool:
    """Deep equality of scheduler attributes (tensors, arrays, containers)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def _snapshot(pipe: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    weights = {
        f"{name}.{key}": value.clone()
        for name, module in pipe.components.items()
        if isinstance(module, torch.nn.Module)
        for key, value in module.state_dict().items()
    }
    return copy.deepcopy(vars(pipe.scheduler)), weights


def _assert_unchanged(pipe: Any, snap: tuple[dict[str, Any], dict[str, torch.Tensor]]) -> None:
    scheduler, weights = _snapshot(pipe)
    assert _same(scheduler, snap[0]), "the shared scheduler was modified"
    assert weights.keys() == snap[1].keys()
    assert all(torch.equal(weights[k], snap[1][k]) for k in weights)


# --------------------------------------------------------------------------- Stable Audio


def _sa_request(**kw: Any) -> GenerationRequest:
    base: dict[str, Any] = dict(
        prompt="a hammer hitting a wooden surface", num_inference_steps=4, seed=3,
        guidance_scale=6.0, **STABLE_AUDIO_REQUEST,
    )
    return GenerationRequest.audio(**(base | kw))


def _sa_reference(pipe: Any, req: GenerationRequest, end: float | None = None) -> torch.Tensor:
    out = pipe(
        req.prompt, negative_prompt=req.negative_prompt or None,
        audio_end_in_s=req.duration_s if end is None else end,
        num_inference_steps=req.num_inference_steps, guidance_scale=req.guidance_scale,
        generator=torch.Generator().manual_seed(req.seed), output_type="pt",
    )
    audio: torch.Tensor = out.audios[0]
    return audio


@pytest.fixture(scope="module")
def sa_pipe() -> Any:
    return tiny_stable_audio_pipeline()


@pytest.fixture()
def sa(sa_pipe: Any) -> StableAudioAdapter:
    adapter = StableAudioAdapter(pipe=sa_pipe)
    adapter.load("cpu")
    return adapter


def _check_sa(media: Media, ref: torch.Tensor, sample_rate: int) -> None:
    assert media.frames.shape == (0, 0, 0, 3) and media.frames.dtype == np.uint8
    assert media.audio is not None and media.audio.dtype == np.float32
    assert media.sample_rate == sample_rate
    assert torch.equal(torch.from_numpy(media.audio), ref)


@pytest.mark.parametrize(
    ("negative_prompt", "guidance_scale"),
    [(None, 6.0), ("muffled noise", 6.0), (None, 1.0)],
    ids=["cfg-zero-uncond", "cfg-negative", "no-cfg"],
)
def test_stable_audio_equals_pipeline(
    sa: StableAudioAdapter, sa_pipe: Any, negative_prompt: str | None, guidance_scale: float
) -> None:
    req = _sa_request(negative_prompt=negative_prompt, guidance_scale=guidance_scale)
    ref = _sa_reference(sa_pipe, req)
    state = sa.prepare(req)
    assert state.num_steps == req.num_inference_steps
    media = _run(sa, state)
    assert media.audio is not None and media.audio.shape == (2, 12)  # 1.5 s at 8 Hz, stereo
    _check_sa(media, ref, 8)


def test_stable_audio_extra_duration(sa: StableAudioAdapter, sa_pipe: Any) -> None:
    req = _sa_request(extra={"audio_end_in_s": 2.5})
    media = _run(sa, sa.prepare(req))
    _check_sa(media, _sa_reference(sa_pipe, req, end=2.5), 8)
    assert media.audio is not None and media.audio.shape == (2, 20)
    with pytest.raises(ValueError, match="maximum possible length"):
        sa.prepare(_sa_request(extra={"audio_end_in_s": 4.5}))


def test_stable_audio_interleaved_jobs(sa: StableAudioAdapter, sa_pipe: Any) -> None:
    a = _sa_request()
    b = _sa_request(prompt="rain on a tin roof", seed=11, negative_prompt="speech")
    ref_a, ref_b = _sa_reference(sa_pipe, a), _sa_reference(sa_pipe, b)
    sa_a, sa_b = sa.prepare(a), sa.prepare(b)
    while not (sa_a.done and sa_b.done):
        for state in (sa_a, sa_b):
            if not state.done:
                sa.step(state)
    _check_sa(sa.decode(sa_b), ref_b, 8)
    _check_sa(sa.decode(sa_a), ref_a, 8)


def test_stable_audio_stop_early_leaves_pipe_unchanged(
    sa: StableAudioAdapter, sa_pipe: Any
) -> None:
    req = _sa_request()
    ref = _sa_reference(sa_pipe, req)
    snap = _snapshot(sa_pipe)
    abandoned = sa.prepare(_sa_request(seed=99))
    for _ in range(2):
        sa.step(abandoned)
    assert abandoned.step_index == 2 and not abandoned.done
    _assert_unchanged(sa_pipe, snap)
    _check_sa(_run(sa, sa.prepare(req)), ref, 8)


def test_stable_audio_save_and_load(sa_pipe: Any, tmp_path: Path) -> None:
    sa_pipe.save_pretrained(tmp_path)
    adapter = StableAudioAdapter(path=str(tmp_path), dtype="float32")
    adapter.load("cpu")
    assert adapter.pipe is not sa_pipe
    req = _sa_request()
    _check_sa(_run(adapter, adapter.prepare(req)), _sa_reference(sa_pipe, req), 8)


# --------------------------------------------------------------------------- LTX-2


def _ltx2_request(**kw: Any) -> GenerationRequest:
    base: dict[str, Any] = dict(
        prompt="a robot dancing", negative_prompt="blurry", num_inference_steps=3, seed=5,
        guidance_scale=3.0, extra=dict(LTX2_EXTRA), **LTX2_REQUEST,
    )
    return GenerationRequest.video(**(base | kw))


def _ltx2_reference(
    pipe: Any, req: GenerationRequest, **kw: Any
) -> tuple[np.ndarray, torch.Tensor]:
    video, audio = pipe(
        req.prompt, negative_prompt=req.negative_prompt, height=req.height, width=req.width,
        num_frames=req.num_frames, frame_rate=req.fps,
        num_inference_steps=req.num_inference_steps, guidance_scale=req.guidance_scale,
        generator=torch.Generator().manual_seed(req.seed), max_sequence_length=SEQ_LEN,
        output_type="np", return_dict=False, **(LTX2_KWARGS | kw),
    )
    return video[0], audio[0]


@pytest.fixture(scope="module")
def ltx2_pipe() -> Any:
    return tiny_ltx2_pipeline()


@pytest.fixture(scope="module")
def ltx2_ref(ltx2_pipe: Any) -> tuple[np.ndarray, torch.Tensor]:
    return _ltx2_reference(ltx2_pipe, _ltx2_request())


@pytest.fixture()
def ltx2(ltx2_pipe: Any) -> LTX2Adapter:
    adapter = LTX2Adapter(pipe=ltx2_pipe, max_sequence_length=SEQ_LEN)
    adapter.load("cpu")
    return adapter


def _check_ltx2(media: Media, ref: tuple[np.ndarray, torch.Tensor]) -> None:
    video, audio = ref
    uint8 = (video * 255).round().astype(np.uint8)  # diffusers' numpy_to_pil rounding
    assert media.frames.dtype == np.uint8 and media.frames.shape == (5, 32, 32, 3)
    assert np.array_equal(media.frames, uint8)
    assert media.audio is not None and media.audio.dtype == np.float32
    assert media.audio.shape == tuple(audio.shape) and media.audio.shape[0] == 2
    assert torch.equal(torch.from_numpy(media.audio), audio)
    assert media.sample_rate == 16000 and media.fps == 25.0


def test_ltx2_equals_pipeline(
    ltx2: LTX2Adapter, ltx2_ref: tuple[np.ndarray, torch.Tensor]
) -> None:
    state = ltx2.prepare(_ltx2_request())
    assert state.num_steps == 3 and state.do_cfg and state.do_stg and state.do_modality
    while not state.done:
        ltx2.step(state)
        preview = ltx2.preview(state)
        assert preview is not None and preview.shape == (16, 16, 3)
    assert np.array_equal(ltx2.decode_frames(state), ltx2_ref[0])  # floats, before rounding
    _check_ltx2(ltx2.decode(state), ltx2_ref)


_GUIDANCE: list[tuple[float, dict[str, Any], dict[str, Any]]] = [
    # CFG only (video 4.0, audio 7.0 default), no STG / modality pass, no rescale.
    (4.0, {"stg_blocks": "", "stg_scale": 0.0, "audio_stg_scale": 0.0, "modality_scale": 1.0,
           "audio_modality_scale": 1.0, "guidance_rescale": 0.0, "audio_guidance_rescale": 0.0},
     {"spatio_temporal_guidance_blocks": None, "stg_scale": 0.0, "audio_stg_scale": 0.0,
      "modality_scale": 1.0, "audio_modality_scale": 1.0, "guidance_rescale": 0.0,
      "audio_guidance_rescale": 0.0}),
    # No CFG at all: STG and modality passes on the unbatched prompt, legacy cross timestep.
    (1.0, {"stg_blocks": "0", "audio_guidance_scale": 1.0, "use_cross_timestep": False},
     {"spatio_temporal_guidance_blocks": [0], "audio_guidance_scale": 1.0,
      "use_cross_timestep": False}),
]


@pytest.mark.parametrize(("scale", "extra", "kwargs"), _GUIDANCE, ids=["cfg-only", "no-cfg"])
def test_ltx2_guidance_variants_equal_pipeline(
    ltx2: LTX2Adapter, ltx2_pipe: Any, scale: float, extra: dict[str, Any],
    kwargs: dict[str, Any],
) -> None:
    req = _ltx2_request(guidance_scale=scale, extra=extra, num_inference_steps=2)
    ref = _ltx2_reference(ltx2_pipe, req, **kwargs)
    _check_ltx2(_run(ltx2, ltx2.prepare(req)), ref)


def test_ltx2_decode_noise_interleaved_equals_pipeline() -> None:
    """A timestep-conditioned VAE: __call__ draws decode noise from the generator after
    the loop, so each job's generator must still be its own at decode time."""
    pipe = tiny_ltx2_pipeline(timestep_conditioning=True)
    adapter = LTX2Adapter(pipe=pipe, max_sequence_length=SEQ_LEN)
    adapter.load("cpu")
    extra = {"decode_timestep": 0.05, "decode_noise_scale": 0.025}
    off = {"stg_blocks": "", "stg_scale": 0.0, "audio_stg_scale": 0.0, "modality_scale": 1.0,
           "audio_modality_scale": 1.0}
    kwargs = {"spatio_temporal_guidance_blocks": None, **{k: v for k, v in off.items()
                                                         if k != "stg_blocks"}}
    reqs = [
        _ltx2_request(num_inference_steps=2, extra=extra | off),
        _ltx2_request(num_inference_steps=2, extra=extra | off, seed=6, prompt="a red ball"),
    ]
    refs = [_ltx2_reference(pipe, req, **extra, **kwargs) for req in reqs]
    states = [adapter.prepare(req) for req in reqs]
    for _ in range(2):
        for state in states:
            adapter.step(state)
    for state, ref in zip(reversed(states), reversed(refs), strict=True):
        _check_ltx2(adapter.decode(state), ref)


def test_ltx2_interleaved_jobs(
    ltx2: LTX2Adapter, ltx2_pipe: Any, ltx2_ref: tuple[np.ndarray, torch.Tensor]
) -> None:
    other = _ltx2_request(prompt="a red ball", negative_prompt="", seed=8)
    ref_other = _ltx2_reference(ltx2_pipe, other)
    a, b = ltx2.prepare(_ltx2_request()), ltx2.prepare(other)
    while not (a.done and b.done):
        for state in (b, a):
            if not state.done:
                ltx2.step(state)
    _check_ltx2(ltx2.decode(a), ltx2_ref)
    _check_ltx2(ltx2.decode(b), ref_other)


def test_ltx2_stop_early_leaves_pipe_unchanged(
    ltx2: LTX2Adapter, ltx2_pipe: Any, ltx2_ref: tuple[np.ndarray, torch.Tensor]
) -> None:
    snap = _snapshot(ltx2_pipe)
    padding_side = ltx2_pipe.tokenizer.padding_side
    abandoned = ltx2.prepare(_ltx2_request(seed=42, prompt="a storm"))
    ltx2.step(abandoned)
    assert abandoned.step_index == 1 and not abandoned.done
    _assert_unchanged(ltx2_pipe, snap)
    assert ltx2_pipe.tokenizer.padding_side == padding_side
    _check_ltx2(_run(ltx2, ltx2.prepare(_ltx2_request())), ltx2_ref)


def test_ltx2_save_and_load(
    ltx2_pipe: Any, ltx2_ref: tuple[np.ndarray, torch.Tensor], tmp_path: Path
) -> None:
    ltx2_pipe.save_pretrained(tmp_path)
    adapter = LTX2Adapter(path=str(tmp_path), dtype="float32", max_sequence_length=SEQ_LEN)
    adapter.load("cpu")
    assert adapter.pipe is not ltx2_pipe
    _check_ltx2(_run(adapter, adapter.prepare(_ltx2_request())), ltx2_ref)


@pytest.mark.parametrize(
    ("adapter_cls", "make"),
    [(LTX2Adapter, tiny_ltx2_pipeline), (StableAudioAdapter, tiny_stable_audio_pipeline)],
)
def test_fixtures_are_deterministic(adapter_cls: Any, make: Callable[[], Any]) -> None:
    before = torch.random.get_rng_state()
    a, b = make().transformer.state_dict(), make().transformer.state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)  # global RNG untouched
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert adapter_cls(pipe=object()).spec.name == adapter_cls.family


@pytest.mark.parametrize(
    ("family", "module"),
    [("diffusers.ltx2", ltx2_module), ("diffusers.stable_audio", stable_audio_module)],
)
def test_spec_declares_the_extras_the_adapter_reads(family: str, module: Any) -> None:
    assert set(FAMILY_SPECS[family].extra_params) == set(module.EXTRA_PARAMS)


def test_ltx2_bad_stg_blocks(ltx2: LTX2Adapter) -> None:
    with pytest.raises(ValueError, match="comma-separated integers"):
        ltx2.prepare(_ltx2_request(extra={"stg_blocks": "28;29"}))
    with pytest.raises(ValueError, match="STG"):  # check_inputs: STG scale without blocks
        ltx2.prepare(_ltx2_request(extra={"stg_blocks": ""}))


def test_wrong_state_and_reference_image_rejected(
    sa: StableAudioAdapter, ltx2: LTX2Adapter
) -> None:
    with pytest.raises(TypeError):
        ltx2.step(StepState(num_steps=1))
    with pytest.raises(TypeError):
        sa.decode(StepState(num_steps=1))
    image = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(ValueError, match="input_reference"):
        ltx2.prepare(_ltx2_request(reference_image=image))
    with pytest.raises(ValueError, match="input_reference"):
        sa.prepare(replace(_sa_request(), reference_image=image))  # no audio job has one
