"""CogVideoX's image and video workflows against ``CogVideoXImageToVideoPipeline.__call__``
and ``CogVideoXVideoToVideoPipeline.__call__``, step-executed.

Tiny seeded pipelines (tests/unit/cogvideox_i2v_fixtures.py: the CogVideoX-5b-I2V layout
with its learned positional embeddings, the CogVideoX 1.5 I2V layout with ``ofs``,
``patch_size_t`` and ``invert_scale_latents``; tests/unit/diffusers_fixtures.py's
text-to-video ones for v2v), CPU, float32, offline. ``CogVideoXAdapter`` serving an
entry's ``workflows`` runs each one step at a time; its frames are bit-equal
(``np.array_equal``) to the pipeline's own call's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import CogVideoXPipeline, CogVideoXVideoToVideoPipeline
from PIL import Image

from api.references import keyframe_workflow
from models.catalog import FAMILY_SPECS, ModelSpec
from models.job_specs import LoraSpec
from tests.unit.cogvideox_i2v_fixtures import Layout, tiny_cogvideox_i2v_pipeline
from tests.unit.diffusers_fixtures import TINY_SEQ_LEN, tiny_cogvideox_pipeline
from tests.unit.job_steps import job_frames
from tests.unit.lora_fixtures import write_lora
from tests.unit.test_diffusers_video import _run
from tests.unit.video_workflows import (
    TinyEntry,
    assert_keyframe_refusals,
    assert_refused,
    assert_same_frames,
    assert_takes_no_reference,
    assert_tier_leaves_no_trace,
    blocks_asked_before_cancel,
    fresh_dynamo,
    keyframe,
    source_clip,
    warm_up_state,
    with_lora_alone,
)
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.cogvideox.adapter import CogVideoXAdapter
from workers.pipelines.diffusers.cogvideox.state import CogVideoXState
from workers.pipelines.diffusers.shared.compiled import graphs_made
from workers.pipelines.diffusers.shared.lora import LoraCache

FPS = 8.0
COGVIDEOX = TinyEntry(CogVideoXAdapter, "diffusers.cogvideox", fps=FPS, steps=2)
_spec, _adapter, _request = COGVIDEOX.spec, COGVIDEOX.adapter, COGVIDEOX.request


def _call(pipe: Any, req: GenerationRequest, **kwargs: Any) -> np.ndarray:
    """``pipe(...)`` with the request's settings, as a user would call it."""
    pipe.set_progress_bar_config(disable=True)
    frames: np.ndarray = pipe(
        prompt=req.prompt, negative_prompt=req.negative_prompt, height=req.height,
        width=req.width, num_inference_steps=req.num_inference_steps,
        guidance_scale=req.guidance_scale, generator=torch.Generator().manual_seed(req.seed),
        output_type="np", max_sequence_length=TINY_SEQ_LEN, **req.extra, **kwargs,
    ).frames[0]  # fmt: skip
    return frames


I2V_CASES: list[tuple[Layout, bool, dict[str, Any]]] = [
    ("1.0", True, {"extra": {"use_dynamic_cfg": True}}),
    ("1.0", False, {"guidance_scale": 1.0}),  # DDIM, no CFG
    ("1.5", True, {}),  # ofs, padding latent frame, invert_scale_latents
]


@pytest.mark.parametrize(("layout", "dpm", "overrides"), I2V_CASES)
def test_i2v_equals_the_image_to_video_pipelines_own_call(
    layout: Layout, dpm: bool, overrides: dict[str, Any]
) -> None:
    pipe = tiny_cogvideox_i2v_pipeline(layout, dpm=dpm)
    req = _request(reference_image=keyframe(1), **overrides)
    adapter = _adapter(pipe, ["i2v"])
    frames, media = _run(adapter, req)
    assert media.frames.shape == (9, 32, 32, 3)
    image = Image.fromarray(keyframe(1))
    assert_same_frames(frames, media, _call(pipe, req, image=image, num_frames=9))


def _v2v_call(pipe: Any, req: GenerationRequest) -> np.ndarray:
    """``CogVideoXVideoToVideoPipeline`` over a fresh copy of ``pipe``'s modules."""
    v2v = CogVideoXVideoToVideoPipeline(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae,
        transformer=pipe.transformer, scheduler=pipe.scheduler,
    )  # fmt: skip
    source = req.references[0].frames
    assert source is not None
    video = [Image.fromarray(f) for f in source[: req.num_frames]]
    return _call(v2v, req, video=video)


@pytest.mark.parametrize(
    ("patch_size_t", "num_frames", "extra"),
    [(None, 9, {"strength": 0.6, "use_dynamic_cfg": True}), (2, 5, {})],
)
def test_v2v_equals_the_video_to_video_pipelines_own_call(
    patch_size_t: int | None, num_frames: int, extra: dict[str, Any]
) -> None:
    """``t2v`` and ``v2v`` on one text-to-video checkpoint (CogVideoX 5b, 1.5); a v2v job
    equals ``CogVideoXVideoToVideoPipeline(video=…, strength=…)`` over the same modules
    (strength absent: its default 0.8), and a t2v job after it ``CogVideoXPipeline``'s."""
    adapter = _adapter(tiny_cogvideox_pipeline(patch_size_t=patch_size_t), ["t2v", "v2v"])
    req = _request(
        references=[source_clip(FPS, 11)], num_frames=num_frames, num_inference_steps=4, extra=extra
    )
    frames, media = _run(adapter, req)
    # 1.5: two latent frames (__call__ pads none) decode to 8 frames, as diffusers' do.
    assert media.frames.shape == (9 if patch_size_t is None else 8, 32, 32, 3)
    assert_same_frames(
        frames, media, _v2v_call(tiny_cogvideox_pipeline(patch_size_t=patch_size_t), req)
    )
    t2v = _request(num_frames=num_frames)
    frames, media = _run(adapter, t2v)
    reference = tiny_cogvideox_pipeline(patch_size_t=patch_size_t)
    assert_same_frames(frames, media, _call(reference, t2v, num_frames=num_frames))


FIRST = {"reference_image": keyframe(1)}
BOTH = {**FIRST, "last_image": keyframe(2)}
CLIP = {"references": [source_clip(FPS)]}


@pytest.mark.parametrize(
    ("pipe", "workflows", "fields", "param"),
    [
        ("i2v", ["i2v"], {}, "input_reference"),  # an I2V checkpoint serves no t2v
        ("i2v", ["i2v"], {"last_image": keyframe(2)}, "extra_params.frame_indices"),
        ("i2v", ["i2v"], BOTH, "input_references"),  # no flf2v
        ("i2v", ["i2v"], CLIP, "input_reference"),  # no v2v
        ("i2v", ["i2v"], {**FIRST, "width": 48}, "size"),  # learned positional embeddings
        ("i2v", ["i2v"], {**FIRST, "extra": {"strength": 0.5}}, "extra_params.strength"),
        ("t2v", ["t2v", "v2v"], FIRST, "input_reference"),
        ("t2v", ["t2v", "v2v"], {"references": [source_clip(FPS, 5)]}, "input_reference"),  # short
        ("t2v", ["t2v", "v2v"], {**CLIP, "extra": {"strength": 0.1}}, "extra_params.strength"),
        ("t2v1.5", ["v2v"], CLIP, "num_frames"),  # 3 latent frames, patch_size_t 2
    ],
)
def test_a_job_the_entry_does_not_serve_is_refused_naming_the_field(
    pipe: str, workflows: list[str], fields: dict[str, Any], param: str
) -> None:
    build = {
        "i2v": tiny_cogvideox_i2v_pipeline,
        "t2v": tiny_cogvideox_pipeline,
        "t2v1.5": lambda: tiny_cogvideox_pipeline(patch_size_t=2),
    }[pipe]
    adapter = _adapter(build(), workflows)
    assert_refused(adapter, _request(**fields), param)


def test_a_text_to_video_entry_still_refuses_an_input_reference() -> None:
    adapter = _adapter(tiny_cogvideox_pipeline(), ["t2v"])
    assert_takes_no_reference(
        adapter, _request(reference_image=keyframe(1)), _request(references=[source_clip(FPS)])
    )


@pytest.mark.parametrize(
    ("image", "workflows", "error"),
    [
        (True, ["i2v", "flf2v"], "no first/last-frame CogVideoX pipeline"),
        (False, ["t2v", "flf2v"], "no first/last-frame CogVideoX pipeline"),
        (True, ["t2va"], "not t2va"),
        (True, ["i2v", "t2v"], "serves i2v only, not t2v"),
        (False, ["v2v"], "v2v needs a text-to-video transformer"),
        (False, ["t2v"], "t2v needs a text-to-video transformer"),
    ],
)
def test_load_refuses_workflows_the_checkpoint_cannot_serve(
    image: bool, workflows: list[str], error: str
) -> None:
    """flf2v names the model before anything loads; t2v and v2v on an image-to-video
    transformer (here a text-to-video pipeline over its modules) are refused."""
    pipe: Any = tiny_cogvideox_i2v_pipeline()
    if not image:
        pipe = CogVideoXPipeline(**pipe.components)
    spec = FAMILY_SPECS["diffusers.cogvideox"]
    spec = spec.model_construct(**{**spec.__dict__, "workflows": workflows, "name": "cog-i2v"})
    adapter = CogVideoXAdapter(pipe=pipe, spec=spec, max_sequence_length=TINY_SEQ_LEN)
    with pytest.raises(ValueError, match=f"cog-i2v: .*{error}"):
        adapter.load("cpu")


def test_i2v_on_a_text_to_video_transformer_is_refused() -> None:
    from diffusers import CogVideoXImageToVideoPipeline

    text = tiny_cogvideox_pipeline()
    adapter = CogVideoXAdapter(pipe=CogVideoXImageToVideoPipeline(**text.components),
                               spec=_spec(["i2v"]))  # fmt: skip
    with pytest.raises(ValueError, match="i2v needs an image-to-video transformer"):
        adapter.load("cpu")
    with pytest.raises(TypeError, match="CogVideoXImageToVideoPipeline"):
        CogVideoXAdapter(pipe=text, spec=_spec(["i2v"])).load("cpu")


def test_saved_i2v_checkpoint_loads_from_its_path(tmp_path: Path) -> None:
    pipe = tiny_cogvideox_i2v_pipeline("1.5")
    pipe.save_pretrained(tmp_path)
    adapter = CogVideoXAdapter(
        str(tmp_path), dtype="float32", spec=_spec(["i2v"]), max_sequence_length=TINY_SEQ_LEN
    )
    adapter.load("cpu")
    req = _request(reference_image=keyframe(1))
    frames, media = _run(adapter, req)
    assert_same_frames(
        frames, media, _call(pipe, req, image=Image.fromarray(keyframe(1)), num_frames=9)
    )


@pytest.mark.parametrize(("workflows", "workflow"), [(["i2v"], "i2v"), (["v2v", "t2v"], "v2v")])
def test_warm_up_prepares_a_job_of_the_entrys_first_workflow(
    workflows: list[str], workflow: str
) -> None:
    pipe = tiny_cogvideox_i2v_pipeline() if workflow == "i2v" else tiny_cogvideox_pipeline()
    adapter = _adapter(pipe, workflows)
    state = warm_up_state(adapter)
    assert isinstance(state, CogVideoXState) and state.workflow == workflow
    assert (state.image_latents is not None) == (workflow == "i2v")


def test_compiled_blocks_give_the_eager_frames_on_the_i2v_loop() -> None:
    """The 1.5 I2V transformer's blocks compiled (dynamo's eager backend): frames equal
    the eager adapter's; a second job of the shape compiles nothing."""
    with fresh_dynamo():
        eager = _adapter(tiny_cogvideox_i2v_pipeline("1.5"), ["i2v"])
        compiled = _adapter(
            tiny_cogvideox_i2v_pipeline("1.5"), ["i2v"], compile="blocks", compile_backend="eager"
        )
        req = _request(reference_image=keyframe(1))
        np.testing.assert_array_equal(job_frames(compiled, req), job_frames(eager, req))
        before = graphs_made()
        job_frames(compiled, _request(reference_image=keyframe(3), seed=9))
        assert graphs_made() == before and compiled.last_recompiles == 0


def test_cancel_inside_an_i2v_step_lands_before_the_next_block() -> None:
    adapter = _adapter(tiny_cogvideox_i2v_pipeline(num_layers=2), ["i2v"])
    state = adapter.prepare(_request(reference_image=keyframe(1)))
    before = state.latents.clone()
    assert blocks_asked_before_cancel(adapter, state, 2) == [1, 2] and state.step_index == 0
    assert torch.equal(state.latents, before)


def test_a_cache_tier_on_a_v2v_job_leaves_the_next_job_as_a_fresh_adapters() -> None:
    def adapter() -> CogVideoXAdapter:
        return _adapter(tiny_cogvideox_pipeline(), ["t2v", "v2v"])

    job: dict[str, Any] = {
        "references": [source_clip(FPS)],
        "num_inference_steps": 6,
        "extra": {"strength": 1.0},
    }
    assert_tier_leaves_no_trace(
        adapter(), adapter, _request(**job), _request(**job, quality="fast")
    )


def test_lora_on_an_i2v_job_matches_a_fresh_pipe_with_it_alone(tmp_path: Path) -> None:
    """CogVideoX-5b-I2V with a per-request LoRA: the frames of diffusers' own
    ``load_lora_weights`` + ``set_adapters`` on a fresh pipe."""
    transformer = tiny_cogvideox_i2v_pipeline().transformer
    targets = [  # the blocks' attention projections
        name
        for name, _ in transformer.named_modules()
        if name.startswith("transformer_blocks.") and name.endswith(("to_q", "to_k", "to_v"))
    ]
    path = write_lora(tmp_path / "a", targets, rank=4, seed=1, transformer=transformer)
    adapter = CogVideoXAdapter(
        pipe=tiny_cogvideox_i2v_pipeline(), spec=_spec(["i2v"]), max_sequence_length=TINY_SEQ_LEN
    )
    adapter.use_lora(LoraCache(max_rank=4))
    adapter.load("cpu")
    lora = LoraSpec(name="a", path=str(path), scale=1.0)
    got = job_frames(adapter, _request(reference_image=keyframe(1), lora=lora))
    fresh = with_lora_alone(tiny_cogvideox_i2v_pipeline(), path)
    want = job_frames(_adapter(fresh, ["i2v"]), _request(reference_image=keyframe(1)))
    np.testing.assert_array_equal(got, want)
    base = job_frames(adapter, _request(reference_image=keyframe(1)))  # parked slot
    assert np.abs(got - base).max() > 0.01


def test_the_api_maps_vllm_omnis_wire_to_the_entrys_workflows() -> None:
    """api/references.py for CogVideoX entries (validated as the registry builds them):
    one keyframe is i2v, one source video v2v; two keyframes (flf2v) and a workflow the
    entry does not serve are 400s naming the field, before anything is stored."""
    family = FAMILY_SPECS["diffusers.cogvideox"].model_dump()
    i2v = ModelSpec.model_validate({**family, "workflows": ["i2v"]})
    v2v = ModelSpec.model_validate({**family, "workflows": ["t2v", "v2v"]})
    assert i2v.supports_image_input and v2v.supports_image_input
    assert not FAMILY_SPECS["diffusers.cogvideox"].supports_image_input
    assert keyframe_workflow(i2v, {}, 1) == ("i2v", [0])
    assert keyframe_workflow(v2v, {}, 1, video=True) == ("v2v", [])
    assert keyframe_workflow(v2v, {}, 0) == ("t2v", [])
    refusals = [
        (i2v, {}, 2, "input_references"),  # no first/last-frame pipeline
        (i2v, {}, 0, "input_reference"),  # an I2V checkpoint serves no t2v
        (i2v, {"frame_indices": [-1]}, 1, "extra_params.frame_indices"),
        (v2v, {}, 1, "input_reference"),  # a keyframe to a t2v + v2v entry
        (i2v, {"strength": 0.5}, 1, "extra_params.strength"),
    ]
    assert_keyframe_refusals(refusals)
