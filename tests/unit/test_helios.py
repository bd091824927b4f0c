"""The Helios world adapter (``workers/pipelines/diffusers/helios/adapter.py``) against diffusers'
own ``HeliosPipeline``: a tiny random-weight Helios (``helios_fixtures.py``), CPU,
float32, offline. A session's frames must be the pipeline's, bit for bit; sessions must
not see each other; steering must touch only the steps after it (the chunk under way's
from its next step, or the next chunk's once the last step has run)."""

from __future__ import annotations

import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import HeliosPipeline
from PIL import Image

from models.catalog import FAMILY_SPECS
from models.errors import DuplicateEventError
from models.realtime_video_start import StartLimits
from models.registry import ServedModel
from tests.unit.helios_fixtures import (
    SEQ_LEN,
    SIZE,
    tiny_helios_pipeline,
    tiny_helios_pyramid_pipeline,
)
from tests.unit.test_checkpoints import BlockStop, Stop
from workers.pipelines.base import WorldConfig, step_stops
from workers.pipelines.diffusers.helios import adapter as helios_module
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.helios.session import (
    HeliosState,
    chunk_embeddings,
    queue_event,
)
from workers.pipelines.diffusers.shared.common import to_uint8
from workers.pipelines.registry import build_adapter

STEPS = 2  # per chunk
CHUNK = 33  # pixel frames per chunk
FRAMES = 2 * CHUNK  # two chunks
IMAGE = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def pipe() -> HeliosPipeline:
    return tiny_helios_pipeline()


@pytest.fixture(scope="module")
def adapter(pipe: HeliosPipeline) -> HeliosWorldAdapter:
    built = HeliosWorldAdapter(pipe=pipe, dtype="float32", max_sequence_length=SEQ_LEN)
    built.load("cpu")
    return built


def _config(**over: Any) -> WorldConfig:
    values: dict[str, Any] = {
        "prompt": "a red ball",
        "width": SIZE,
        "height": SIZE,
        "num_frames": FRAMES,
        "fps": 24.0,
        "seed": 3,
        "steps_per_chunk": STEPS,
    }
    values.update(over)
    return WorldConfig(**values)


def _run(adapter: HeliosWorldAdapter, state: HeliosState) -> list[np.ndarray]:
    chunks = []
    for _ in range(adapter.num_chunks(state)):
        while not adapter.chunk_done(state):
            adapter.step(state)
        chunks.append(adapter.take_chunk(state))
    return chunks


_SOLO: dict[str, list[np.ndarray]] = {}


def _solo(adapter: HeliosWorldAdapter, name: str, **over: Any) -> list[np.ndarray]:
    """The chunks of a session run alone (cached: several tests compare with them)."""
    if name not in _SOLO:
        _SOLO[name] = _run(adapter, adapter.start(_config(**over)))
    return _SOLO[name]


def _reference(pipe: Any, frames: int, i2v: bool, **kwargs: Any) -> np.ndarray:
    """``pipe(...)``'s video for a session's prompt, size and seed (``image=`` for I2V)."""
    keyframe = {"image": Image.fromarray(IMAGE)} if i2v else {}
    out = pipe(
        "a red ball",
        num_frames=frames,
        height=SIZE,
        width=SIZE,
        generator=torch.Generator().manual_seed(3),
        output_type="np",
        max_sequence_length=SEQ_LEN,
        **keyframe,
        **kwargs,
    )
    return to_uint8(out.frames[0])


@pytest.mark.parametrize(("i2v", "chunks"), [(False, 3), (True, 2)], ids=["t2v", "i2v"])
def test_session_frames_are_helios_pipelines_bit_for_bit(
    pipe: HeliosPipeline, adapter: HeliosWorldAdapter, i2v: bool, chunks: int
) -> None:
    """Chunks of 33 frames, step by step, equal ``HeliosPipeline(...)``'s video (``image=``
    for I2V); by T2V's third chunk the history is full and read from its end. ``__call__``
    trims its end to 4k + 1 frames (97 of 99, 65 of 66); a session hands out its last
    chunk whole, so it has those decoded frames more."""
    frames = chunks * CHUNK
    over: dict[str, Any] = {"reference_image": IMAGE} if i2v else {}
    name = "i2v" if i2v else "t2v"
    got_chunks = _solo(
        adapter, name if chunks == 2 else f"{name}-{chunks}", num_frames=frames, **over
    )
    assert [c.shape for c in got_chunks] == [(CHUNK, SIZE, SIZE, 3)] * chunks
    assert all(c.dtype == np.uint8 for c in got_chunks)
    expected = _reference(pipe, frames, i2v, num_inference_steps=STEPS)
    got = np.concatenate(got_chunks)
    assert len(expected) == (frames - 1) // 4 * 4 + 1 == len(got) - (chunks - 1) % 4
    np.testing.assert_array_equal(got[: len(expected)], expected)


@pytest.mark.parametrize(
    ("distilled", "guidance", "steps", "i2v"),
    [(True, 1.0, [1, 1, 1], False), (True, 1.0, [1, 1, 1], True), (False, 5.0, [2, 1, 1], False)],
    ids=["distilled-t2v", "distilled-i2v", "mid-cfg-t2v"],
)
def test_pyramid_session_frames_are_helios_pyramid_pipelines_bit_for_bit(
    distilled: bool, guidance: float, steps: list[int], i2v: bool
) -> None:
    """The same for ``HeliosPyramidPipeline``: Helios-Distilled's shape (DMD, three
    stages of one step, no CFG, the issue's benchmark) and Helios-Mid's (UniPC stages,
    CFG); each stage's steps are session steps, its upsampling rides on its first."""
    pipe = tiny_helios_pyramid_pipeline(distilled=distilled)
    adapter = HeliosWorldAdapter(pipe=pipe, dtype="float32", max_sequence_length=SEQ_LEN)
    adapter.load("cpu")
    extra = {"guidance_scale": guidance, "pyramid_num_inference_steps_list": steps}
    over: dict[str, Any] = {"reference_image": IMAGE} if i2v else {}
    state = adapter.start(_config(steps_per_chunk=sum(steps), extra=extra, **over))
    got = np.concatenate(_run(adapter, state))
    expected = _reference(
        pipe, FRAMES, i2v, guidance_scale=guidance, pyramid_num_inference_steps_list=steps
    )
    assert len(got) == FRAMES and len(expected) == FRAMES - 1
    np.testing.assert_array_equal(got[: len(expected)], expected)
    # Without the list, steps_per_chunk is shared evenly by the stages.
    even = adapter.start(_config(steps_per_chunk=6))
    assert even.pyramid.steps == [2, 2, 2] and even.steps_per_chunk == 6
    with pytest.raises(ValueError, match="multiple of 3"):
        adapter.start(_config(steps_per_chunk=4))
    with pytest.raises(ValueError, match="pyramid_num_inference_steps_list"):
        adapter.start(_config(extra={"pyramid_num_inference_steps_list": [1, 1]}))


def test_interleaved_sessions_equal_each_run_alone(adapter: HeliosWorldAdapter) -> None:
    """Two sessions (T2V and I2V) stepped in turn on one adapter make the frames each
    makes alone: nothing of a session lives on the shared pipe or its scheduler."""
    a = adapter.start(_config())
    b = adapter.start(_config(reference_image=IMAGE))
    got: dict[str, list[np.ndarray]] = {"t2v": [], "i2v": []}
    while not (a.done and b.done):
        for name, state in (("t2v", a), ("i2v", b)):
            if state.done:
                continue
            if adapter.chunk_done(state):
                got[name].append(adapter.take_chunk(state))
            else:
                adapter.step(state)
    for name, over in (("t2v", {}), ("i2v", {"reference_image": IMAGE})):
        alone = _solo(adapter, name, **over)
        for mine, theirs in zip(got[name], alone, strict=True):
            np.testing.assert_array_equal(mine, theirs)


def _steered(
    adapter: HeliosWorldAdapter, config: WorldConfig, at: tuple[int, int], transition: int
) -> tuple[list[np.ndarray], list[Any], HeliosState]:
    """A session whose prompt changes to "a blue cube" (over ``transition`` chunks) once
    ``at = (chunk, steps)`` steps of that chunk have run (``steps`` may be all of them:
    the chunk made, not yet taken): its chunks, their events, its state."""
    state = adapter.start(config)
    chunks, events = [], []
    for k in range(adapter.num_chunks(state)):
        for i in range(state.steps_per_chunk + 1):
            if (k, i) == at:
                adapter.interact(state, "a blue cube", None, transition, "e1")
            if i < state.steps_per_chunk:
                adapter.step(state)
        chunks.append(adapter.take_chunk(state))
        events.append(adapter.events_for_chunk(state))
    return chunks, events, state


@torch.no_grad()  # as ``interact`` (the text encoder's kernels differ with autograd on)
def _encoded(pipe: Any, prompt: str) -> torch.Tensor:
    """``prompt``'s embeddings as ``interact`` encodes them."""
    embeds, _ = pipe.encode_prompt(
        prompt=prompt,
        do_classifier_free_guidance=False,
        max_sequence_length=SEQ_LEN,
        device=pipe._execution_device,
    )
    return embeds.to(pipe.transformer.dtype)


def test_a_prompt_change_enters_the_chunk_under_way_at_its_next_step(
    adapter: HeliosWorldAdapter,
) -> None:
    """Sent after chunk 0's first of two steps, a new prompt blended over two chunks
    conditions chunk 0's second step on the embeddings half-way and chunk 1 on the new
    prompt's own; it is reported started in chunk 0, active in both, completed in chunk 1.
    Chunk 0 differs from the unsteered session's; chunk 2 is the new prompt's."""
    alone = _solo(adapter, "t2v-3", num_frames=3 * CHUNK)
    state = adapter.start(_config(num_frames=3 * CHUNK))
    old = state.prompt_embeds
    adapter.step(state)
    first_step = state.chunk_embeds
    adapter.interact(state, "a blue cube", None, 2, "e1")
    new = state.events[0].embeds
    assert new is not None and state.events[0].first_chunk == 0
    assert first_step is old
    torch.testing.assert_close(state.chunk_embeds, torch.lerp(old, new, 0.5))
    reported = []
    for k in range(3):
        while not adapter.chunk_done(state):
            adapter.step(state)
            if k == 1:
                assert state.chunk_embeds is new
        frames = adapter.take_chunk(state)
        assert not np.array_equal(frames, alone[k])
        reported.append(adapter.events_for_chunk(state))
    assert reported == [(["e1"], ["e1"], []), ([], ["e1"], ["e1"]), ([], [], [])]
    assert state.prompt == "a blue cube"


def test_a_prompt_change_after_a_chunk_s_last_step_enters_the_next_chunk(
    adapter: HeliosWorldAdapter,
) -> None:
    """Sent once chunk 0's last step has run (its latents made, not yet decoded), the
    change has no step of chunk 0 left: it enters chunk 1 from its first step, exactly as
    one sent between the two chunks, and chunk 0 is the unsteered session's."""
    config = _config(num_frames=3 * CHUNK)
    chunks, events, _ = _steered(adapter, config, (0, STEPS), 2)
    assert events == [([], [], []), (["e1"], ["e1"], []), ([], ["e1"], ["e1"])]
    np.testing.assert_array_equal(chunks[0], _solo(adapter, "t2v-3", num_frames=3 * CHUNK)[0])
    between, _, _ = _steered(adapter, config, (1, 0), 2)
    for mine, theirs in zip(chunks, between, strict=True):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize(
    ("pyramid", "steps", "at", "transition"),
    [(None, [2], (1, 1), 2), ([1, 1, 1], [1, 1, 1], (0, 2), 0), ([1, 1, 1], [1, 1, 1], (1, 1), 2)],
    ids=["base-blend-mid-chunk", "distilled-cut-at-stage-3", "distilled-blend-at-stage-2"],
)
def test_a_prompt_change_mid_chunk_is_diffusers_call_with_the_embeddings_swapped_there(
    pipe: Any,
    adapter: HeliosWorldAdapter,
    pyramid: list[int] | None,
    steps: list[int],
    at: tuple[int, int],
    transition: int,
) -> None:
    """A change entering chunk ``c`` after ``s`` of its steps makes the video that
    diffusers' own ``__call__`` makes when its ``callback_on_step_end`` replaces
    ``prompt_embeds`` from that step on (by the blend of each chunk): bit for bit, for
    ``HeliosPipeline`` (a step boundary) and the distilled ``HeliosPyramidPipeline`` (a
    stage boundary), and unlike the unsteered session's."""
    extra: dict[str, Any] = {}
    if pyramid is not None:
        pipe = tiny_helios_pyramid_pipeline(distilled=True)
        adapter = HeliosWorldAdapter(pipe=pipe, dtype="float32", max_sequence_length=SEQ_LEN)
        adapter.load("cpu")
        extra = {"guidance_scale": 1.0, "pyramid_num_inference_steps_list": pyramid}
    per_chunk, chunks = sum(steps), 3 if pyramid is None else 2
    config = _config(num_frames=chunks * CHUNK, steps_per_chunk=per_chunk, extra=extra)
    got, events, state = _steered(adapter, config, at, transition)
    c, s = at
    assert events[c][0] == ["e1"] and state.events[0].first_chunk == c
    old = adapter.start(config).prompt_embeds
    new = _encoded(pipe, "a blue cube")

    def embeds_at(step: int) -> torch.Tensor:  # the embeddings of global step ``step``
        chunk, i = divmod(step, per_chunk)
        if (chunk, i) < (c, s):
            return old
        w = min(1.0, (chunk - c + 1) / max(1, transition))
        return new if w >= 1.0 else torch.lerp(old, new, w)

    calls = iter(range(chunks * per_chunk))

    def swap(_pipe: Any, _i: int, _t: Any, _kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"prompt_embeds": embeds_at(next(calls) + 1)}

    kwargs: dict[str, Any] = {"callback_on_step_end": swap}
    if pyramid is None:
        kwargs["num_inference_steps"] = per_chunk
    else:
        kwargs |= {"guidance_scale": 1.0, "pyramid_num_inference_steps_list": pyramid}
    expected = _reference(pipe, chunks * CHUNK, False, **kwargs)
    video = np.concatenate(got)
    np.testing.assert_array_equal(video[: len(expected)], expected)
    plain = np.concatenate(_run(adapter, adapter.start(config)))
    assert not np.array_equal(video, plain)


def test_interaction_rules(adapter: HeliosWorldAdapter) -> None:
    """Before a chunk's first step the change is that chunk's; a camera is refused
    naming it (at start too); an event id is used once; the rest as reference/world."""
    state = adapter.start(_config())
    adapter.interact(state, "a blue cube", None, 2, "e1")
    assert (state.events[0].first_chunk, state.events[0].last_chunk) == (0, 1)
    with pytest.raises(ValueError, match="camera"):
        adapter.interact(state, None, "w", 0, "e2")
    with pytest.raises(ValueError, match="camera"):
        adapter.interact(state, "a cat", [["w"], [], []], 0, "e3")
    with pytest.raises(DuplicateEventError):
        adapter.interact(state, "a cat", None, 0, "e1")
    with pytest.raises(ValueError, match="transition_chunks"):
        adapter.interact(state, "a cat", None, -1, "e4")
    with pytest.raises(ValueError, match="prompt"):
        adapter.interact(state, "  ", None, 0, "e5")
    with pytest.raises(ValueError, match="camera_action_script"):
        adapter.start(_config(camera_action_script=[[["w"], [], []]]))


def test_prompt_embeddings_blend_linearly_over_the_transition() -> None:
    """An event over n chunks conditions its j-th chunk on lerp(old, new, (j + 1) / n),
    its last on the new embeddings exactly; one settled event replaces the base."""
    old, new, newer = torch.zeros(1, 2, 3), torch.ones(1, 2, 3), torch.full((1, 2, 3), 3.0)
    state: Any = types.SimpleNamespace(
        prompt_embeds=old, events=[], chunk_index=0, step_index=0, chunk_embeds=None
    )
    state.chunk_index = 1
    queue_event(state, "e1", 4, new, "step")
    assert chunk_embeddings(state, 0) is old
    for chunk, w in ((1, 0.25), (2, 0.5), (3, 0.75)):
        torch.testing.assert_close(chunk_embeddings(state, chunk), torch.full_like(old, w))
    state.chunk_index = 3
    queue_event(state, "e2", 0, newer, "step")  # a cut in chunk 3, over e1's blend
    assert chunk_embeddings(state, 3) is newer
    assert state.prompt_embeds is newer and all(e.embeds is None for e in state.events)
    assert chunk_embeddings(state, 4) is newer


def test_denoiser_blocks_are_cancel_points(adapter: HeliosWorldAdapter) -> None:
    """A step asks the stop question before each transformer block (2 blocks x the CFG
    pair); a stop at block 2 ends the step there without counting it, and the session
    carried on makes the frames of one never stopped."""
    state = adapter.start(_config())
    asked = BlockStop()
    with step_stops(asked):
        adapter.step(state)
    assert asked.asked == [1, 2, 3, 4] and state.step_index == 1
    stopper = BlockStop(stop_at=2)
    with step_stops(stopper), pytest.raises(Stop):
        adapter.step(state)
    assert stopper.asked == [1, 2] and state.step_index == 1
    rest = _run(adapter, state)
    for mine, theirs in zip(rest, _solo(adapter, "t2v"), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_spec_rules_a_session_as_the_adapter_runs_it(adapter: HeliosWorldAdapter) -> None:
    """The family spec is a world model with Helios's lattice (33 frames a chunk, each
    chunk whole), its default size and length, no camera, the extras the adapter reads;
    the registry builds the adapter from it."""
    spec = FAMILY_SPECS["diffusers.helios"]
    assert spec.kind == "world" and not spec.camera_control
    limits = StartLimits.of(spec)
    assert (limits.lattice.first, limits.lattice.every) == (CHUNK, CHUNK)
    assert (limits.default_width, limits.default_height) == (640, 384)
    assert limits.default_num_frames == 132 and not limits.camera_control
    assert set(spec.extra_params) == set(helios_module.EXTRA_PARAMS)
    state = adapter.start(_config(num_frames=3 * CHUNK - 1))  # rounded down
    assert adapter.num_chunks(state) == 2 and limits.lattice.chunks_for_frames(98) == 2
    served = ServedModel(name="h", adapter="diffusers.helios", path="/w", spec=spec)
    assert type(build_adapter(served)) is HeliosWorldAdapter


def test_bad_configs_and_pipes_are_refused(adapter: HeliosWorldAdapter) -> None:
    with pytest.raises(ValueError, match="width"):
        adapter.start(_config(width=SIZE + 8))
    with pytest.raises(ValueError, match="num_frames"):
        adapter.start(_config(num_frames=CHUNK - 1))
    with pytest.raises(ValueError, match="reference_image"):
        adapter.start(_config(reference_image=IMAGE[:8]))
    with pytest.raises(ValueError, match="path or a pipe"):
        HeliosWorldAdapter()
    with pytest.raises(TypeError, match="HeliosPyramidPipeline"):
        HeliosWorldAdapter(pipe=object()).load("cpu")
    with pytest.raises(RuntimeError, match="load"):
        HeliosWorldAdapter("/nowhere").start(_config())


def test_loads_either_pipeline_from_a_local_path(tmp_path: Path) -> None:
    """``path``: ``model_index.json`` picks the pipeline class, loaded offline in the
    entry's dtype; a session starts on it."""
    for name, saved in (
        ("base", tiny_helios_pipeline()),
        ("pyramid", tiny_helios_pyramid_pipeline(distilled=True)),
    ):
        saved.save_pretrained(tmp_path / name)
        adapter = HeliosWorldAdapter(
            str(tmp_path / name), dtype="float32", max_sequence_length=SEQ_LEN
        )
        with warnings.catch_warnings():  # HeliosScheduler.__init__: np.linspace of tensors
            warnings.filterwarnings("ignore", "__array_wrap__", DeprecationWarning)
            adapter.load("cpu")
        assert type(adapter.pipe) is type(saved)
        state = adapter.start(_config(steps_per_chunk=3))
        assert adapter.num_chunks(state) == 2 and (state.pyramid is None) == (name == "base")


def test_warm_up_runs_every_pyramid_stage_of_a_warmup_shape() -> None:
    """A pyramid checkpoint's warm-up runs one step of each stage (each stage's latents
    have a size of its own, so each compiles), with the stages' own step list: the
    3-stage scheduler refuses a session of 2 steps."""
    from models.registry import WarmupShape

    built = HeliosWorldAdapter(
        pipe=tiny_helios_pyramid_pipeline(distilled=True),
        max_sequence_length=SEQ_LEN,
        compile="blocks",
        compile_backend="eager",  # torch.compile's cheapest backend: the graphs, no codegen
        warmup=[WarmupShape(width=SIZE, height=SIZE, num_frames=CHUNK)],
    )
    built.load("cpu")
    stepped: list[int] = []
    step = built.step

    def counted(state: HeliosState) -> None:
        stepped.append(state.step_index)
        step(state)

    built.step = counted  # type: ignore[method-assign]
    built.warm_up()
    stages = int(built.pipe.scheduler.config.stages)
    assert stepped == list(range(stages)) and built.compiler.last_made > 0
