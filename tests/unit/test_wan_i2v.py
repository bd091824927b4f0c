"""Wan's image and video workflows against ``WanImageToVideoPipeline.__call__`` and
``WanVideoToVideoPipeline.__call__``, step-executed.

Tiny seeded pipelines of each released layout (tests/unit/wan_i2v_fixtures.py: Wan 2.1
I2V with its CLIP image encoder, Wan 2.1 FLF2V, Wan 2.2 I2V A14B, Wan 2.2 TI2V-5B), CPU,
float32, offline. ``WanAdapter`` serving an entry's ``workflows`` runs ``i2v`` (a first
frame) and ``flf2v`` (first and last) one step at a time; its frames equal ``pipe(image=…,
last_image=…)``'s, as test_diffusers_video.py holds them for t2v. TI2V-5B's ``t2v`` jobs
equal ``WanPipeline`` over the same modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import WanPipeline, WanVideoToVideoPipeline
from PIL import Image

from models.job_specs import LoraSpec, SamplerOptions
from tests.unit.diffusers_fixtures import TINY_SEQ_LEN, tiny_wan_pipeline
from tests.unit.job_steps import job_frames
from tests.unit.lora_fixtures import FFN, SELF_ATTN, write_lora
from tests.unit.test_diffusers_video import _run
from tests.unit.video_workflows import (
    TinyEntry,
    assert_refused,
    assert_same_frames,
    assert_takes_no_reference,
    assert_tier_leaves_no_trace,
    blocks_asked_before_cancel,
    call_frames,
    fresh_dynamo,
    keyframe,
    source_clip,
    step_in_turn,
    warm_up_state,
    with_lora_alone,
)
from tests.unit.wan_i2v_fixtures import WORKFLOWS, Layout, tiny_wan_i2v_pipeline
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.shared.common import to_uint8
from workers.pipelines.diffusers.shared.compiled import graphs_made
from workers.pipelines.diffusers.shared.lora import LoraCache
from workers.pipelines.diffusers.wan.adapter import WanAdapter
from workers.pipelines.diffusers.wan.state import WanState

FPS = 16.0
WAN = TinyEntry(WanAdapter, "diffusers.wan", fps=FPS, steps=3)
_spec, _request = WAN.spec, WAN.request


def _adapter(pipe: Any, layout: Layout, **kw: Any) -> WanAdapter:
    return WAN.adapter(pipe, kw.pop("workflows", WORKFLOWS[layout]), **kw)


def _call(pipe: Any, req: GenerationRequest) -> np.ndarray:
    """``pipe(...)`` with the request's settings and keyframes, as a user would call it."""
    keyframes: dict[str, Any] = {}
    if req.reference_image is not None:
        keyframes["image"] = Image.fromarray(req.reference_image)
    if req.last_image is not None:
        keyframes["last_image"] = Image.fromarray(req.last_image)
    return call_frames(pipe, req, **keyframes)


CASES: list[tuple[Layout, str, dict[str, Any]]] = [
    ("2.1", "i2v", {}),
    ("flf2v", "flf2v", {}),
    ("2.2", "i2v", {"sampler": SamplerOptions(guidance_scale_2=2.5)}),
    ("2.2", "flf2v", {}),
    ("ti2v", "i2v", {}),
    ("2.1", "i2v", {"guidance_scale": 1.0, "num_inference_steps": 2}),  # no CFG
]


@pytest.mark.parametrize(("layout", "workflow", "overrides"), CASES)
def test_step_executed_equals_the_pipelines_own_call(
    layout: Layout, workflow: str, overrides: dict[str, Any]
) -> None:
    pipe = tiny_wan_i2v_pipeline(layout)
    last = keyframe(2) if workflow == "flf2v" else None
    req = _request(reference_image=keyframe(1), last_image=last, **overrides)
    frames, media = _run(_adapter(pipe, layout), req)
    assert media.frames.shape == (9, 32, 32, 3)
    assert_same_frames(frames, media, _call(pipe, req))


def test_ti2v_serves_t2v_with_wan_pipelines_loop() -> None:
    """TI2V-5B: one checkpoint, both workflows; a job without a keyframe runs
    ``WanPipeline``'s loop (its noise, its all-ones timestep mask) over the same modules."""
    pipe = tiny_wan_i2v_pipeline("ti2v")
    adapter = _adapter(pipe, "ti2v")
    req = _request()
    frames, media = _run(adapter, req)
    text = WanPipeline(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae,
        scheduler=pipe.scheduler, transformer=pipe.transformer, expand_timesteps=True,
    )  # fmt: skip
    assert_same_frames(frames, media, _call(text, req))
    image = _request(reference_image=keyframe(1))  # and an i2v job after it, on one adapter
    frames, media = _run(adapter, image)
    assert_same_frames(frames, media, _call(pipe, image))


def test_interleaved_workflows_equal_separate_runs() -> None:
    """Jobs of both workflows stepped in turn on one adapter: each as if alone."""
    pipe = tiny_wan_i2v_pipeline("2.2")
    adapter = _adapter(pipe, "2.2")
    reqs = [
        _request(reference_image=keyframe(1)),
        _request(reference_image=keyframe(3), last_image=keyframe(4), seed=9),
    ]
    alone = [_run(adapter, r)[0] for r in reqs]
    for state, expected in zip(step_in_turn(adapter, reqs), alone, strict=True):
        np.testing.assert_array_equal(adapter.decode_frames(state), expected)


@pytest.mark.parametrize("layout", ["2.1", "ti2v"])
def test_decode_stream_is_the_whole_decode(layout: Layout) -> None:
    """Chunk by chunk, TI2V-5B's first frame (the keyframe's latents) put back first."""
    adapter = _adapter(tiny_wan_i2v_pipeline(layout), layout)
    state = adapter.prepare(_request(reference_image=keyframe(1)))
    while not state.done:
        adapter.step(state)
    stream = adapter.decode_stream(state)
    assert stream is not None
    chunks = np.concatenate([np.asarray(c) for c in stream.chunks])
    np.testing.assert_array_equal(chunks, to_uint8(adapter.decode_frames(state)))


@pytest.mark.parametrize(
    ("layout", "fields", "param"),
    [
        ("2.1", {"last_image": keyframe(2)}, "extra_params.frame_indices"),  # last only
        ("2.1", {"reference_image": keyframe(1), "last_image": keyframe(2)}, "input_references"),
        ("2.1", {}, "input_reference"),  # an I2V checkpoint serves no t2v
        ("ti2v", {"reference_image": keyframe(1), "last_image": keyframe(2)}, "input_references"),
    ],
)
def test_a_workflow_the_model_does_not_serve_is_refused_naming_the_field(
    layout: Layout, fields: dict[str, Any], param: str
) -> None:
    adapter = _adapter(tiny_wan_i2v_pipeline(layout), layout)
    assert_refused(adapter, _request(**fields), param)


def test_a_text_to_video_entry_still_refuses_a_keyframe() -> None:
    adapter = WanAdapter(pipe=tiny_wan_pipeline(), max_sequence_length=TINY_SEQ_LEN)
    adapter.load("cpu")
    assert adapter.workflows == ["t2v"]
    assert_takes_no_reference(adapter, _request(reference_image=keyframe(1)))


@pytest.mark.parametrize(
    ("layout", "workflows", "error"),
    [
        ("2.1", ["t2v", "i2v"], "t2v needs a text-to-video transformer"),
        ("2.1", ["i2v", "flf2v"], "flf2v needs a first/last-frame transformer"),
        ("flf2v", ["i2v", "flf2v"], "serve flf2v"),
        ("ti2v", ["i2v", "flf2v"], "conditions on a first frame only"),
        ("2.2", ["i2v", "v2v"], "v2v needs a text-to-video transformer"),
        ("2.2", ["i2v", "t2va"], "not t2va"),
    ],
)
def test_load_refuses_workflows_the_checkpoint_cannot_serve(
    layout: Layout, workflows: list[str], error: str
) -> None:
    pipe = tiny_wan_i2v_pipeline(layout)
    adapter = WanAdapter(pipe=pipe, spec=_spec(workflows), max_sequence_length=TINY_SEQ_LEN)
    with pytest.raises(ValueError, match=error):
        adapter.load("cpu")


def test_an_image_entry_refuses_a_text_to_video_pipeline() -> None:
    adapter = WanAdapter(pipe=tiny_wan_pipeline(), spec=_spec(["i2v"]))
    with pytest.raises(TypeError, match="WanImageToVideoPipeline"):
        adapter.load("cpu")


def test_saved_checkpoint_loads_from_its_path(tmp_path: Path) -> None:
    pipe = tiny_wan_i2v_pipeline("flf2v")
    pipe.save_pretrained(tmp_path / "flf2v")
    adapter = WanAdapter(
        str(tmp_path / "flf2v"), dtype="float32", spec=_spec(WORKFLOWS["flf2v"]),
        max_sequence_length=TINY_SEQ_LEN,
    )  # fmt: skip
    adapter.load("cpu")
    req = _request(reference_image=keyframe(1), last_image=keyframe(2))
    frames, media = _run(adapter, req)
    assert_same_frames(frames, media, _call(pipe, req))


@pytest.mark.parametrize(("layout", "workflow"), [("2.1", "i2v"), ("flf2v", "flf2v")])
def test_warm_up_prepares_an_image_job_for_an_image_only_entry(
    layout: Layout, workflow: str
) -> None:
    adapter = _adapter(tiny_wan_i2v_pipeline(layout), layout)
    state = warm_up_state(adapter)
    assert isinstance(state, WanState) and state.workflow == workflow
    assert state.image_embeds is not None and state.condition is not None


def test_warm_up_prepares_a_v2v_job_for_a_v2v_only_entry() -> None:
    adapter = WanAdapter(pipe=tiny_wan_pipeline(), spec=_spec(["v2v"]))
    adapter.load("cpu")
    state = warm_up_state(adapter)
    assert isinstance(state, WanState) and state.workflow == "v2v"


def test_compiled_blocks_give_the_eager_frames_on_both_image_loops() -> None:
    """Wan 2.2 I2V A14B's two transformers compiled (dynamo's eager backend): i2v and
    flf2v frames equal the eager adapter's; a second job of a shape compiles nothing."""
    with fresh_dynamo():
        eager = _adapter(tiny_wan_i2v_pipeline("2.2"), "2.2")
        compiled = _adapter(
            tiny_wan_i2v_pipeline("2.2"), "2.2", compile="blocks", compile_backend="eager"
        )
        reqs = [
            _request(reference_image=keyframe(1)),
            _request(reference_image=keyframe(1), last_image=keyframe(2)),
        ]
        for req in reqs:
            np.testing.assert_array_equal(job_frames(compiled, req), job_frames(eager, req))
        before = graphs_made()
        job_frames(compiled, reqs[1])
        assert graphs_made() == before and compiled.last_recompiles == 0


def test_cancel_inside_an_image_step_lands_before_the_next_block() -> None:
    adapter = _adapter(tiny_wan_i2v_pipeline("2.1"), "2.1")
    state = adapter.prepare(_request(reference_image=keyframe(1)))
    assert blocks_asked_before_cancel(adapter, state, 2) == [1, 2] and state.step_index == 0


def test_a_cache_tier_on_an_image_job_leaves_the_next_job_as_a_fresh_adapters() -> None:
    def ti2v() -> WanAdapter:
        return _adapter(tiny_wan_i2v_pipeline("ti2v"), "ti2v")

    job: dict[str, Any] = {"reference_image": keyframe(1), "num_inference_steps": 6}
    assert_tier_leaves_no_trace(ti2v(), ti2v, _request(**job), _request(**job, quality="fast"))


def test_lora_on_an_image_job_matches_a_fresh_pipe_with_it_alone(tmp_path: Path) -> None:
    """Wan 2.1 I2V with a per-request LoRA: the frames of diffusers' own
    ``load_lora_weights`` + ``set_adapters`` on a fresh pipe."""
    path = write_lora(tmp_path / "a", SELF_ATTN + FFN, rank=4, seed=1)
    adapter = WanAdapter(
        pipe=tiny_wan_i2v_pipeline("2.1"), spec=_spec(["i2v"]), max_sequence_length=TINY_SEQ_LEN
    )
    adapter.use_lora(LoraCache(max_rank=4))
    adapter.load("cpu")
    lora = LoraSpec(name="a", path=str(path), scale=1.0)
    got = job_frames(adapter, _request(reference_image=keyframe(1), lora=lora))
    fresh = with_lora_alone(tiny_wan_i2v_pipeline("2.1"), path)
    want = job_frames(_adapter(fresh, "2.1"), _request(reference_image=keyframe(1)))
    np.testing.assert_array_equal(got, want)
    base = job_frames(adapter, _request(reference_image=keyframe(1)))  # parked slot
    assert np.abs(got - base).max() > 0.01


@pytest.mark.parametrize("strength", [0.6, None])
def test_v2v_equals_the_video_to_video_pipelines_own_call(strength: float | None) -> None:
    """``t2v`` and ``v2v`` on one text-to-video checkpoint; a v2v job equals
    ``WanVideoToVideoPipeline(video=…, strength=…)`` over the same modules."""
    pipe = tiny_wan_pipeline()
    adapter = WanAdapter(pipe=pipe, spec=_spec(["t2v", "v2v"]), max_sequence_length=TINY_SEQ_LEN)
    adapter.load("cpu")
    extra = {} if strength is None else {"strength": strength}
    req = _request(references=[source_clip(FPS, 11)], num_inference_steps=5, extra=extra)
    frames, media = _run(adapter, req)
    reference = tiny_wan_pipeline()
    v2v = WanVideoToVideoPipeline(
        tokenizer=reference.tokenizer, text_encoder=reference.text_encoder,
        transformer=reference.transformer, vae=reference.vae, scheduler=reference.scheduler,
    )  # fmt: skip
    v2v.set_progress_bar_config(disable=True)
    source = req.references[0].frames
    assert source is not None
    out = v2v(
        video=[Image.fromarray(f) for f in source[:9]], prompt=req.prompt,
        negative_prompt=req.negative_prompt, height=32, width=32, num_inference_steps=5,
        guidance_scale=4.0, generator=torch.Generator().manual_seed(7), output_type="np",
        max_sequence_length=TINY_SEQ_LEN, **extra,
    )  # fmt: skip
    assert_same_frames(frames, media, out.frames[0])
    assert media.frames.shape == (9, 32, 32, 3)
    t2v = _request()  # and a text job on the same adapter, as WanPipeline runs it
    frames, media = _run(adapter, t2v)
    assert_same_frames(frames, media, _call(tiny_wan_pipeline(), t2v))


@pytest.mark.parametrize(
    ("workflows", "fields", "param"),
    [
        (["t2v", "v2v"], {"references": [source_clip(FPS, 5)]}, "input_reference"),  # too short
        (["t2v", "v2v"], {"extra": {"strength": 0.1}}, "extra_params.strength"),
        (["t2v", "v2v"], {"sampler": SamplerOptions(guidance_scale_2=2.0)}, "guidance_scale_2"),
    ],
)
def test_v2v_refusals_name_the_field(
    workflows: list[str], fields: dict[str, Any], param: str
) -> None:
    adapter = WanAdapter(
        pipe=tiny_wan_pipeline(), spec=_spec(workflows), max_sequence_length=TINY_SEQ_LEN
    )
    adapter.load("cpu")
    fields = {"references": [source_clip(FPS)], **fields}
    assert_refused(adapter, _request(**fields), param)


def test_v2v_needs_one_text_to_video_transformer() -> None:
    two = WanAdapter(pipe=tiny_wan_pipeline(two_stage=True), spec=_spec(["t2v", "v2v"]))
    with pytest.raises(ValueError, match="v2v runs WanVideoToVideoPipeline"):
        two.load("cpu")
    ti2v = WanAdapter(pipe=tiny_wan_i2v_pipeline("ti2v"), spec=_spec(["i2v", "v2v"]))
    with pytest.raises(ValueError, match="v2v runs WanVideoToVideoPipeline"):
        ti2v.load("cpu")
    text = WanAdapter(pipe=tiny_wan_pipeline(), max_sequence_length=TINY_SEQ_LEN)
    text.load("cpu")  # a t2v-only entry refuses a source video
    assert_takes_no_reference(text, _request(references=[source_clip(FPS)]))


def test_a_ti2v_checkpoint_saved_as_wan_pipeline_serves_both_workflows(tmp_path: Path) -> None:
    """TI2V-5B's Diffusers checkpoint names ``WanPipeline`` in its model_index; an entry
    serving ``i2v`` loads it as ``WanImageToVideoPipeline`` (no image encoder)."""
    tiny = tiny_wan_i2v_pipeline("ti2v")
    WanPipeline(
        tokenizer=tiny.tokenizer, text_encoder=tiny.text_encoder, vae=tiny.vae,
        scheduler=tiny.scheduler, transformer=tiny.transformer, expand_timesteps=True,
    ).save_pretrained(tmp_path)  # fmt: skip
    adapter = WanAdapter(
        str(tmp_path), dtype="float32", spec=_spec(["t2v", "i2v"]),
        max_sequence_length=TINY_SEQ_LEN,
    )  # fmt: skip
    adapter.load("cpu")
    assert adapter.pipe.image_encoder is None and adapter.pipe.config.expand_timesteps
    req = _request(reference_image=keyframe(1))
    frames, media = _run(adapter, req)
    assert_same_frames(frames, media, _call(tiny, req))
