"""LTX-2's keyframe workflows against ``LTX2ImageToVideoPipeline.__call__`` and
``LTX2ConditionPipeline.__call__``, step-executed, video and audio.

Tiny seeded pipelines (tests/unit/ltx2_i2v_fixtures.py: every class over the same
weights), CPU, float32, offline. ``LTX2Adapter`` serving an entry's ``workflows`` runs
``i2v`` (a first frame, ``image=``) and ``flf2v`` (``conditions=`` a first frame at
index 0 and a last one at -1) one step at a time; its float frames and its audio equal
``pipe(...)``'s bit for bit, as test_diffusers_av.py holds them for ``t2v``. Unless a
case says otherwise, every guidance pass runs (CFG, STG on block 1, modality isolation,
rescale) and the keyframes go through diffusers' H.264 re-compression (CRF 33)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import (
    LTX2ConditionPipeline,
    LTX2ImageToVideoPipeline,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
)
from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
from PIL import Image

from api.references import keyframe_workflow
from api.validation import check_extra
from models.catalog import FAMILY_SPECS, ModelSpec
from models.errors import InvalidRequest
from models.job_specs import LoraSpec
from models.registry import WarmupShape
from tests.unit.diffusers_fixtures_av import LTX2_REQUEST
from tests.unit.lora_fixtures import write_lora
from tests.unit.ltx2_i2v_fixtures import CLASSES, tiny_ltx2_as
from tests.unit.video_workflows import (
    assert_keyframe_refusals,
    assert_refused,
    assert_takes_no_reference,
    blocks_asked_before_cancel,
    fresh_dynamo,
    keyframe,
    step_in_turn,
    warm_up_state,
    with_lora_alone,
)
from workers.pipelines.base import GenerationRequest, MediaReference
from workers.pipelines.diffusers.ltx2.adapter import LTX2Adapter
from workers.pipelines.diffusers.ltx2.state import LTX2ConditionState, LTX2ImageState
from workers.pipelines.diffusers.shared.compiled import graphs_made
from workers.pipelines.diffusers.shared.lora import LoraCache

SEQ_LEN = 32
ALL = ["t2v", "i2v", "flf2v"]
Output = tuple[np.ndarray, torch.Tensor]  # float frames, audio (channels × samples)


def _spec(workflows: list[str], **update: Any) -> Any:
    return FAMILY_SPECS["diffusers.ltx2"].model_copy(update={"workflows": workflows, **update})


def _adapter(workflows: list[str], pipe: Any = None, **kw: Any) -> LTX2Adapter:
    spec = kw.pop("spec", None) or _spec(workflows)
    owner = "flf2v" if "flf2v" in workflows else "i2v" if "i2v" in workflows else "t2v"
    pipe = pipe if pipe is not None else tiny_ltx2_as(CLASSES[owner])
    adapter = LTX2Adapter(pipe=pipe, spec=spec, max_sequence_length=SEQ_LEN, **kw)
    adapter.load("cpu")
    return adapter


def _request(workflow: str = "t2v", **overrides: Any) -> GenerationRequest:
    fields: dict[str, Any] = {
        "prompt": "a robot dancing",
        "negative_prompt": "blurry",
        "num_inference_steps": 2,
        "seed": 5,
        "guidance_scale": 3.0,
        "extra": {"stg_blocks": "1"},
        **LTX2_REQUEST,
    }
    if workflow != "t2v":
        fields["reference_image"] = keyframe(1)
    if workflow == "flf2v":
        fields["last_image"] = keyframe(2)
    fields.update(overrides)
    return GenerationRequest.video(**fields)


def _call(req: GenerationRequest, **kwargs: Any) -> Output:
    """``pipe(...)`` of the request's workflow's pipeline (a fresh tiny one: the same
    weights), as a user would call it; ``kwargs``: more ``__call__`` arguments."""
    workflow = (
        "t2v" if req.reference_image is None else "i2v" if req.last_image is None else "flf2v"
    )
    pipe = tiny_ltx2_as(CLASSES[workflow])
    crf = req.extra.get("image_crf")
    if workflow == "i2v":
        kwargs |= {"image": Image.fromarray(req.reference_image), "image_crf": crf}
    elif workflow == "flf2v":
        assert req.reference_image is not None and req.last_image is not None
        kwargs["conditions"] = [
            LTX2VideoCondition(frames=Image.fromarray(req.reference_image), index=0, crf=crf),
            LTX2VideoCondition(frames=Image.fromarray(req.last_image), index=-1, crf=crf),
        ]
    knobs = {k: v for k, v in req.extra.items() if k not in ("stg_blocks", "image_crf")}
    video, audio = pipe(
        prompt=req.prompt, negative_prompt=req.negative_prompt, height=req.height,
        width=req.width, num_frames=req.num_frames, frame_rate=req.fps,
        num_inference_steps=req.num_inference_steps, guidance_scale=req.guidance_scale,
        generator=torch.Generator().manual_seed(req.seed), max_sequence_length=SEQ_LEN,
        spatio_temporal_guidance_blocks=[1], output_type="np", return_dict=False,
        **knobs, **kwargs,
    )  # fmt: skip
    return video[0], audio[0]


def _run(adapter: LTX2Adapter, req: GenerationRequest) -> Output:
    state = adapter.prepare(req)
    try:
        while not state.done:
            adapter.step(state)
        return adapter.decode_frames(state), adapter.decode_audio(state)[0]
    finally:
        adapter.end()


def _assert_same(got: Output, want: Output) -> None:
    assert got[0].shape == (5, 32, 32, 3) and got[1].shape[0] == 2
    assert np.array_equal(got[0], want[0])
    assert torch.equal(got[1], want[1])


@pytest.fixture(scope="module")
def reference() -> dict[str, Output]:
    """``__call__``'s output of each workflow's default request."""
    return {workflow: _call(_request(workflow)) for workflow in ALL}


@pytest.mark.parametrize(("workflows", "workflow"), [(["i2v"], "i2v"), (ALL, "flf2v")])
def test_step_executed_equals_the_pipelines_own_call(
    workflows: list[str], workflow: str, reference: dict[str, Output]
) -> None:
    adapter = _adapter(workflows)
    got = _run(adapter, _request(workflow))
    _assert_same(got, reference[workflow])
    assert not np.array_equal(got[0], reference["t2v"][0])  # the keyframes act


@pytest.mark.parametrize("workflow", ["i2v", "flf2v"])
def test_without_cfg_and_without_re_compression(workflow: str) -> None:
    """No CFG batch (the mask is not doubled), STG and modality passes on the positive
    prompt alone, keyframes as sent (``image_crf`` 0)."""
    extra = {"stg_blocks": "1", "image_crf": 0, "audio_guidance_scale": 1.0}
    req = _request(workflow, guidance_scale=1.0, extra=extra)
    adapter = _adapter(ALL)
    state = adapter.prepare(req)
    assert not state.do_cfg and state.do_stg
    adapter.end()
    _assert_same(_run(adapter, req), _call(req))


def test_three_workflows_interleaved_on_one_adapter(reference: dict[str, Output]) -> None:
    """An entry serving all three loads ``LTX2ConditionPipeline``; its t2v and i2v jobs
    run ``LTX2Pipeline``'s and ``LTX2ImageToVideoPipeline``'s loops over its modules.
    Stepped in turn, each job equals its pipeline's own call."""
    adapter = _adapter(ALL)
    assert isinstance(adapter.pipe, LTX2ConditionPipeline)
    states = dict(zip(ALL, step_in_turn(adapter, [_request(w) for w in ALL]), strict=True))
    assert isinstance(states["i2v"], LTX2ImageState)
    assert isinstance(states["flf2v"], LTX2ConditionState)
    for workflow, s in states.items():
        got = adapter.decode_frames(s), adapter.decode_audio(s)[0]
        _assert_same(got, reference[workflow])
        preview = adapter.preview(s)
        assert preview is not None and preview.shape == (16, 16, 3)


@pytest.mark.parametrize(
    ("workflows", "workflow", "fields", "param"),
    [
        (["i2v"], "t2v", {}, "input_reference"),  # an image-only entry needs a keyframe
        (["t2v", "i2v"], "flf2v", {}, "input_references"),
        (ALL, "t2v", {"last_image": keyframe(2)}, "extra_params.frame_indices"),  # last only
        (ALL, "t2v", {"references": [MediaReference(kind="image")]}, "input_references"),
        (ALL, "flf2v", {"num_frames": 1}, "num_frames"),  # no latent frame for the last
        (ALL, "t2v", {"extra": {"image_crf": 0}}, "extra_params.image_crf"),  # no keyframe
    ],
)
def test_a_job_the_entry_cannot_serve_is_refused_naming_the_field(
    workflows: list[str], workflow: str, fields: dict[str, Any], param: str
) -> None:
    adapter = _adapter(workflows)
    assert_refused(adapter, _request(workflow, **fields), param)


def test_a_text_to_video_entry_still_refuses_a_keyframe() -> None:
    adapter = _adapter(["t2v"])
    assert isinstance(adapter.pipe, LTX2Pipeline)
    assert_takes_no_reference(adapter, _request("i2v"))


def test_load_refuses_what_the_components_cannot_run() -> None:
    with pytest.raises(ValueError, match="not v2v"):
        _adapter(["t2v", "v2v"], pipe=tiny_ltx2_as(LTX2Pipeline))
    patched = tiny_ltx2_as(LTX2ImageToVideoPipeline)
    patched.transformer = LTX2VideoTransformer3DModel.from_config(
        {**patched.transformer.config, "patch_size": 2}
    )
    with pytest.raises(ValueError, match="patch_size 1"):
        _adapter(["i2v"], pipe=patched)
    with pytest.raises(TypeError, match="LTX2ConditionPipeline"):  # flf2v loads its class
        _adapter(["t2v", "flf2v"], pipe=tiny_ltx2_as(LTX2ImageToVideoPipeline))


def test_a_text_to_video_checkpoint_loads_for_every_workflow(
    tmp_path: Path, reference: dict[str, Output]
) -> None:
    """LTX-2's checkpoints name ``LTX2Pipeline`` in their model_index; an entry serving
    ``flf2v`` loads one as ``LTX2ConditionPipeline``."""
    tiny_ltx2_as(LTX2Pipeline).save_pretrained(tmp_path)
    adapter = LTX2Adapter(
        str(tmp_path), dtype="float32", spec=_spec(ALL), max_sequence_length=SEQ_LEN
    )
    adapter.load("cpu")
    assert isinstance(adapter.pipe, LTX2ConditionPipeline)
    _assert_same(_run(adapter, _request("flf2v")), reference["flf2v"])


@pytest.mark.parametrize(
    ("workflow", "state_class"), [("i2v", LTX2ImageState), ("flf2v", LTX2ConditionState)]
)
def test_warm_up_prepares_an_image_job_for_an_image_only_entry(
    workflow: str, state_class: type
) -> None:
    adapter = _adapter([workflow])
    assert isinstance(warm_up_state(adapter, num_frames=5), state_class)


def test_compiled_blocks_give_the_eager_output_and_compile_in_prepare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocks compiled (dynamo's eager backend), CFG only (one graph a loop, to stay
    cheap): a t2v job, then an i2v job of the same latent shape, equal the eager adapter's;
    the i2v job compiles in its own ``prepare`` (a state class per loop: its per-token
    timestep is another graph), so nothing compiles while either denoises. Load makes
    room in dynamo's recompile limit for 3 graphs per workflow and shape (the full
    guidance's passes; 8 by default would fail the ninth). The trial step that compiles
    leaves the job's audio scheduler where it was."""
    monkeypatch.setattr(torch._dynamo.config, "cache_size_limit", 8)
    with fresh_dynamo():
        shapes = [WarmupShape(width=32, height=32, num_frames=5)]
        compiled = _adapter(ALL, compile="blocks", compile_backend="eager", warmup=shapes)
        assert torch._dynamo.config.recompile_limit >= 3 * 3 * 3  # cache_size_limit's new name
        eager = _adapter(ALL)
        off = {"stg_blocks": "", "stg_scale": 0.0, "audio_stg_scale": 0.0,
               "modality_scale": 1.0, "audio_modality_scale": 1.0}  # fmt: skip
        for workflow in ("t2v", "i2v"):
            req = _request(workflow, extra=off)
            before = graphs_made()
            _assert_same(_run(compiled, req), _run(eager, req))  # audio too: its scheduler
            assert graphs_made() > before and compiled.last_recompiles == 0


def test_cancel_inside_an_image_step_lands_before_the_next_block() -> None:
    adapter = _adapter(ALL)
    state = adapter.prepare(_request("flf2v"))
    assert blocks_asked_before_cancel(adapter, state, 2) == [1, 2] and state.step_index == 0


def test_lora_on_an_image_job_matches_a_fresh_pipe_with_it_alone(
    tmp_path: Path, reference: dict[str, Output]
) -> None:
    """An LTX-2 entry that lists ``lora``: an i2v job with a per-request adapter equals
    diffusers' own ``load_lora_weights`` + ``set_adapters`` on a fresh pipe."""
    pipe = tiny_ltx2_as(LTX2ImageToVideoPipeline)
    targets = [
        name
        for name, module in pipe.transformer.named_modules()
        if isinstance(module, torch.nn.Linear) and ".attn1." in name
    ]
    path = write_lora(tmp_path / "a", targets, rank=4, seed=1, transformer=pipe.transformer)
    parameters = [*FAMILY_SPECS["diffusers.ltx2"].parameters, "lora"]
    adapter = LTX2Adapter(
        pipe=pipe, spec=_spec(["i2v"], parameters=parameters), max_sequence_length=SEQ_LEN
    )
    adapter.use_lora(LoraCache(max_rank=4))
    adapter.load("cpu")
    got = _run(adapter, _request("i2v", lora=LoraSpec(name="a", path=str(path), scale=1.0)))
    fresh = with_lora_alone(tiny_ltx2_as(LTX2ImageToVideoPipeline), path)
    _assert_same(got, _run(_adapter(["i2v"], pipe=fresh), _request("i2v")))
    assert np.abs(got[0] - reference["i2v"][0]).max() > 0.01
    _assert_same(_run(adapter, _request("i2v")), reference["i2v"])  # the slot parked


def test_the_api_maps_an_ltx2_entrys_inputs_to_its_workflows() -> None:
    """The generic keyframe wire (api/references.py) and extra_params checks on LTX-2
    entries: what each takes, and what it refuses naming the field, before anything is
    stored."""
    family = FAMILY_SPECS["diffusers.ltx2"].model_dump()
    assert family["workflows"] == ["t2v"] and not family["supports_image_input"]
    text = ModelSpec.model_validate(family)
    image = ModelSpec.model_validate({**family, "workflows": ["t2v", "i2v"]})
    full = ModelSpec.model_validate({**family, "workflows": ALL})
    assert image.supports_image_input and full.supports_image_input
    assert keyframe_workflow(image, {}, 1) == ("i2v", [0])
    assert keyframe_workflow(full, {}, 2) == ("flf2v", [0, -1])
    assert keyframe_workflow(full, {"frame_indices": [0]}, 1) == ("i2v", [0])
    assert check_extra({"image_crf": 18, "frame_indices": [0, -1]}, full)["image_crf"] == 18
    refusals = [
        (text, {}, 1, "input_reference"),
        (image, {}, 2, "input_references"),
        (full, {"frame_indices": [-1]}, 1, "extra_params.frame_indices"),
        (full, {"strength": 0.5}, 1, "extra_params.strength"),  # no v2v on LTX-2
    ]
    assert_keyframe_refusals(refusals)
    with pytest.raises(InvalidRequest) as err:
        check_extra({"image_crf": 52}, full)
    assert err.value.param == "extra_params.image_crf"
