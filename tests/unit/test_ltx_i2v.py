"""LTX-Video's image, first/last-frame and video workflows against the diffusers
pipelines' own ``__call__``, step-executed.

Tiny seeded pipelines (tests/unit/ltx_i2v_fixtures.py), CPU, float32, offline.
``LTXAdapter`` serving an entry's ``workflows`` loads ``LTXImageToVideoPipeline`` for
``["t2v", "i2v"]`` and ``LTXConditionPipeline`` for an entry with ``flf2v`` / ``v2v``;
every workflow, run one step at a time, gives exactly the frames of ``pipe(...)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from diffusers import LTXPipeline
from diffusers.pipelines.ltx.pipeline_ltx_condition import LTXVideoCondition
from PIL import Image

from api.references import keyframe_workflow
from models.catalog import FAMILY_SPECS, ModelSpec
from models.job_specs import LoraSpec
from tests.unit.diffusers_fixtures import TINY_SEQ_LEN
from tests.unit.job_steps import job_frames
from tests.unit.lora_fixtures import write_lora
from tests.unit.ltx_i2v_fixtures import WORKFLOWS, Kind, tiny_ltx
from tests.unit.test_diffusers_video import _run
from tests.unit.video_workflows import (
    TinyEntry,
    assert_keyframe_refusals,
    assert_refused,
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
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.ltx.adapter import LTXAdapter
from workers.pipelines.diffusers.ltx.state import LTXState
from workers.pipelines.diffusers.shared.lora import LoraCache

# LTXConditionPipeline.__call__ hands its timesteps tensor to the scheduler's np.array()
# (numpy 2 deprecates that for a tensor); the adapter passes an ndarray of the same values.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)
EXTRA = {"decode_timestep": 0.05, "decode_noise_scale": 0.025, "guidance_rescale": 0.3}
FPS = 25.0
LTX = TinyEntry(LTXAdapter, "diffusers.ltx", fps=FPS, steps=2, defaults={"extra": EXTRA})
_spec, _request = LTX.spec, LTX.request


def _adapter(pipe: Any, kind: Kind, **kw: Any) -> LTXAdapter:
    return LTX.adapter(pipe, kw.pop("workflows", WORKFLOWS[kind]), **kw)


def _call(pipe: Any, req: GenerationRequest) -> np.ndarray:
    """``pipe(...)`` with the request's settings and inputs, as a user would call it: an
    image-to-video pipeline takes ``image``; the condition pipeline ``conditions``."""
    kwargs: dict[str, Any] = {k: v for k, v in req.extra.items() if k != "strength"}
    kwargs["frame_rate"] = int(req.fps)
    first = None if req.reference_image is None else Image.fromarray(req.reference_image)
    if type(pipe).__name__ == "LTXImageToVideoPipeline":
        kwargs["image"] = first
    elif type(pipe).__name__ == "LTXConditionPipeline":
        conditions = []
        if first is not None:
            conditions.append(LTXVideoCondition(image=first, frame_index=0))
        if req.last_image is not None:
            last = Image.fromarray(req.last_image)
            conditions.append(LTXVideoCondition(image=last, frame_index=req.num_frames - 1))
        if req.references:
            source = req.references[0].frames
            assert source is not None
            clip = [Image.fromarray(f) for f in source[: req.num_frames]]
            strength = req.extra.get("strength", 1.0)
            conditions.append(LTXVideoCondition(video=clip, frame_index=0, strength=strength))
        kwargs["conditions"] = conditions or None
    return call_frames(pipe, req, **kwargs)


def _same(adapter: LTXAdapter, pipe: Any, req: GenerationRequest) -> None:
    frames, media = _run(adapter, req)
    assert media.frames.shape == (req.num_frames, 32, 32, 3)
    np.testing.assert_array_equal(frames, _call(pipe, req))


CASES: list[tuple[Kind, dict[str, Any]]] = [
    ("i2v", {"reference_image": keyframe(1)}),
    ("i2v", {"reference_image": keyframe(1), "guidance_scale": 1.0, "extra": {}}),  # no CFG
    ("condition", {}),  # t2v
    ("condition", {"reference_image": keyframe(1)}),
    ("condition", {"reference_image": keyframe(1), "last_image": keyframe(2)}),
    ("condition", {"references": [source_clip(FPS, 11)], "extra": {**EXTRA, "strength": 0.6}}),
    ("condition", {"references": [source_clip(FPS, 6)], "guidance_scale": 1.0, "extra": {}}),
]


@pytest.mark.parametrize(("kind", "overrides"), CASES)
def test_step_executed_equals_the_pipelines_own_call(kind: Kind, overrides: dict[str, Any]) -> None:
    pipe = tiny_ltx(kind)
    _same(_adapter(pipe, kind), pipe, _request(**overrides))


def test_an_image_entry_runs_t2v_with_ltx_pipelines_loop() -> None:
    """``["t2v", "i2v"]`` loads ``LTXImageToVideoPipeline``; a job without a keyframe runs
    ``LTXPipeline``'s loop over the same modules, and an i2v job after it its own."""
    pipe = tiny_ltx("i2v")
    adapter = _adapter(pipe, "i2v")
    text = LTXPipeline(
        scheduler=pipe.scheduler, vae=pipe.vae, text_encoder=pipe.text_encoder,
        tokenizer=pipe.tokenizer, transformer=pipe.transformer,
    )  # fmt: skip
    _same(adapter, text, _request())
    _same(adapter, pipe, _request(reference_image=keyframe(3), seed=9))


def test_interleaved_workflows_equal_separate_runs() -> None:
    """Jobs of three workflows stepped in turn on one conditioned adapter: each as if
    alone (per-job scheduler and generator; the loop draws noise every step); the same
    seed and first frame with a last frame added gives another video."""
    adapter = _adapter(tiny_ltx("condition"), "condition")
    reqs = [
        _request(reference_image=keyframe(1)),
        _request(reference_image=keyframe(1), last_image=keyframe(4)),
        _request(seed=5),
    ]
    alone = [_run(adapter, r)[0] for r in reqs]
    for state, expected in zip(step_in_turn(adapter, reqs), alone, strict=True):
        np.testing.assert_array_equal(adapter.decode_frames(state), expected)
        assert adapter.preview(state) is not None
    # The last frame conditions the video: flf2v is not i2v of its first frame.
    assert np.abs(alone[0] - alone[1]).max() > 1e-3


@pytest.mark.parametrize(
    ("kind", "fields", "param"),
    [
        ("i2v", {"reference_image": keyframe(1), "last_image": keyframe(2)}, "input_references"),
        ("i2v", {"last_image": keyframe(2)}, "extra_params.frame_indices"),  # last only
        ("i2v", {"references": [source_clip(FPS)]}, "input_reference"),  # no v2v
        ("condition", {"references": [source_clip(FPS)], "extra": {"strength": 0.0}},
         "extra_params.strength"),
    ],
)  # fmt: skip
def test_a_workflow_the_model_does_not_serve_is_refused_naming_the_field(
    kind: Kind, fields: dict[str, Any], param: str
) -> None:
    adapter = _adapter(tiny_ltx(kind), kind)
    assert_refused(adapter, _request(**fields), param)


def test_an_image_only_entry_refuses_a_text_job_and_a_text_entry_a_keyframe() -> None:
    image_only = _adapter(tiny_ltx("i2v"), "i2v", workflows=["i2v"])
    assert_refused(image_only, _request(), "input_reference")
    text = LTXAdapter(pipe=tiny_ltx("t2v"), max_sequence_length=TINY_SEQ_LEN)
    text.load("cpu")
    assert text.workflows == ["t2v"]
    assert_takes_no_reference(text, _request(reference_image=keyframe(1)))


@pytest.mark.parametrize(
    ("kind", "workflows", "error"),
    [
        ("i2v", ["t2v", "i2v", "t2va"], "not t2va"),
        ("t2v", ["t2v", "i2v"], "LTXImageToVideoPipeline"),  # the wrong class
        ("i2v", ["i2v", "flf2v"], "LTXConditionPipeline"),
    ],
)
def test_load_refuses_what_the_pipeline_cannot_run(
    kind: Kind, workflows: list[str], error: str
) -> None:
    adapter = LTXAdapter(pipe=tiny_ltx(kind), spec=_spec(workflows))
    with pytest.raises((ValueError, TypeError), match=error):
        adapter.load("cpu")


def test_a_conditioned_entry_refuses_a_resolution_shifting_scheduler() -> None:
    """An LTX-Video 0.9.0/0.9.1 scheduler (use_dynamic_shifting) cannot take
    LTXConditionPipeline's schedule: load says so, naming the model."""
    pipe = tiny_ltx("condition")
    pipe.scheduler = tiny_ltx("t2v").scheduler
    spec = _spec(["t2v", "flf2v"], name="ltx-0.9.1")
    with pytest.raises(ValueError, match=r"ltx-0\.9\.1: .*use_dynamic_shifting"):
        LTXAdapter(pipe=pipe, spec=spec).load("cpu")


@pytest.mark.parametrize(("workflow", "loop"), [("flf2v", "condition"), ("v2v", "condition")])
def test_warm_up_prepares_a_job_of_the_entrys_first_workflow(workflow: str, loop: str) -> None:
    adapter = _adapter(tiny_ltx("condition"), "condition", workflows=[workflow])
    state = warm_up_state(adapter)
    assert isinstance(state, LTXState) and state.workflow == workflow and state.loop == loop
    assert state.conditioning_mask is not None


def test_compiled_blocks_give_the_eager_frames_on_the_conditioned_loop() -> None:
    """The transformer's blocks compiled (dynamo's eager backend): flf2v frames (per-token
    timesteps, video coordinates, extra tokens) equal the eager adapter's; then a t2v and
    an i2v job (the same latents, timesteps per sample or per token) each compile at
    prepare, never while they denoise."""
    with fresh_dynamo():
        req = _request(reference_image=keyframe(1), last_image=keyframe(2))
        eager = _adapter(tiny_ltx("condition"), "condition")
        compiled = _adapter(
            tiny_ltx("condition"), "condition", compile="blocks", compile_backend="eager"
        )
        np.testing.assert_array_equal(job_frames(compiled, req), job_frames(eager, req))
        assert compiled.last_recompiles == 0
        for other in (_request(), _request(reference_image=keyframe(1))):
            job_frames(compiled, other)
            assert compiled.last_recompiles == 0


@pytest.mark.parametrize("kind", ["i2v", "condition"])
def test_cancel_inside_an_image_step_lands_between_blocks(kind: Kind) -> None:
    """The tiny transformer has one block: the gate before it stops the step."""
    adapter = _adapter(tiny_ltx(kind), kind)
    state = adapter.prepare(_request(reference_image=keyframe(1)))
    assert blocks_asked_before_cancel(adapter, state, 1) == [1] and state.step_index == 0


def test_a_cache_tier_on_an_image_job_leaves_the_next_job_as_a_fresh_adapters() -> None:
    def condition() -> LTXAdapter:
        return _adapter(tiny_ltx("condition"), "condition")

    job: dict[str, Any] = {"reference_image": keyframe(1), "num_inference_steps": 6}
    assert_tier_leaves_no_trace(
        condition(), condition, _request(**job), _request(**job, quality="fast")
    )


def test_lora_on_a_conditioned_job_matches_a_fresh_pipe_with_it_alone(tmp_path: Path) -> None:
    """A per-request LoRA on an flf2v job: the frames of diffusers' own
    ``load_lora_weights`` + ``set_adapters`` on a fresh ``LTXConditionPipeline``."""
    block = "transformer_blocks.0"
    targets = [f"{block}.attn1.{p}" for p in ("to_q", "to_k", "to_v", "to_out.0")]
    targets += [f"{block}.ff.net.0.proj", f"{block}.ff.net.2"]
    pipe = tiny_ltx("condition")
    path = write_lora(tmp_path / "a", targets, rank=4, seed=1, transformer=pipe.transformer)
    adapter = LTXAdapter(
        pipe=pipe, spec=_spec(WORKFLOWS["condition"]), max_sequence_length=TINY_SEQ_LEN
    )
    adapter.use_lora(LoraCache(max_rank=4))
    adapter.load("cpu")
    keys: dict[str, Any] = {"reference_image": keyframe(1), "last_image": keyframe(2)}
    req = _request(**keys, num_inference_steps=2)
    lora = LoraSpec(name="a", path=str(path), scale=1.0)
    got = job_frames(adapter, _request(**keys, num_inference_steps=2, lora=lora))
    fresh = with_lora_alone(tiny_ltx("condition"), path)
    np.testing.assert_array_equal(got, job_frames(_adapter(fresh, "condition"), req))
    base = job_frames(adapter, req)  # the parked slot: the base model
    assert np.abs(got - base).max() > 0.01


def test_a_checkpoint_saved_as_ltx_pipeline_loads_for_its_workflows(tmp_path: Path) -> None:
    """A checkpoint whose model_index names ``LTXPipeline`` loads, from its path, as the
    class the entry's workflows pick (here ``LTXConditionPipeline``: the same five
    components), and its flf2v job equals that pipeline's ``__call__``."""
    tiny = tiny_ltx("condition")
    LTXPipeline(
        scheduler=tiny.scheduler, vae=tiny.vae, text_encoder=tiny.text_encoder,
        tokenizer=tiny.tokenizer, transformer=tiny.transformer,
    ).save_pretrained(tmp_path)  # fmt: skip
    adapter = LTXAdapter(
        str(tmp_path), dtype="float32", spec=_spec(["t2v", "flf2v"]),
        max_sequence_length=TINY_SEQ_LEN,
    )  # fmt: skip
    adapter.load("cpu")
    assert type(adapter.pipe).__name__ == "LTXConditionPipeline"
    req = _request(reference_image=keyframe(1), last_image=keyframe(2))
    _same(adapter, tiny, req)


def test_the_api_maps_an_ltx_entrys_inputs_to_its_workflows() -> None:
    """The generic keyframe wire (api/references.py) on LTX entries: what each entry takes,
    and what it refuses naming the field, before anything is stored."""
    family = FAMILY_SPECS["diffusers.ltx"].model_dump()
    assert family["workflows"] == ["t2v"] and not family["supports_image_input"]
    text = ModelSpec.model_validate(family)
    image = ModelSpec.model_validate({**family, "workflows": ["t2v", "i2v"]})
    full = ModelSpec.model_validate({**family, "workflows": WORKFLOWS["condition"]})
    assert image.supports_image_input and full.supports_image_input
    assert keyframe_workflow(image, {}, 1) == ("i2v", [0])
    assert keyframe_workflow(full, {}, 2) == ("flf2v", [0, -1])
    assert keyframe_workflow(full, {"strength": 0.5}, 1, video=True) == ("v2v", [])
    refusals = [
        (text, {}, 1, "input_reference"),
        (image, {}, 2, "input_references"),  # LTXImageToVideoPipeline has no last frame
        (full, {"frame_indices": [-1]}, 1, "extra_params.frame_indices"),
        (full, {"strength": 0.5}, 1, "extra_params.strength"),  # strength is v2v's
    ]
    assert_keyframe_refusals(refusals)
