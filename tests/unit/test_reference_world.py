"""The procedural ``reference/world`` streaming pipeline: chunks, camera, interactions."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from models.errors import DuplicateEventError
from tests.unit.reference_fixtures import loaded
from workers.pipelines.reference_world import (
    REFERENCE_WORLD,
    ReferenceWorldPipeline,
    WorldConfig,
    WorldState,
    chunk_frame_range,
    frames_for_chunks,
    num_chunks_for,
)

PROMPT = "a red ball over a green meadow"
HOLD: list[list[str]] = [[], [], []]


def _config(**overrides: Any) -> WorldConfig:
    fields: dict[str, Any] = {
        "prompt": PROMPT, "width": 64, "height": 48, "num_frames": 21, "fps": 16.0,
        "seed": 3, "steps_per_chunk": 2,
    }
    fields.update(overrides)
    return WorldConfig(**fields)


def _next_chunk(pipe: ReferenceWorldPipeline, state: WorldState) -> np.ndarray:
    while not pipe.chunk_done(state):
        pipe.step(state)
    return pipe.take_chunk(state)


def _run(config: WorldConfig) -> list[np.ndarray]:
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(config)
    return [_next_chunk(pipe, state) for _ in range(pipe.num_chunks(state))]


def _red(frame: np.ndarray) -> np.ndarray:
    f = frame.astype(int)
    return (f[..., 0] > 150) & (f[..., 1] < 90) & (f[..., 2] < 90)


@pytest.mark.parametrize(
    ("num_frames", "chunks", "total"),
    [(9, 1, 9), (20, 1, 9), (21, 2, 21), (33, 3, 33), (40, 3, 33), (189, 16, 189)],
)
def test_chunk_arithmetic(num_frames: int, chunks: int, total: int) -> None:
    assert num_chunks_for(num_frames) == chunks
    assert frames_for_chunks(chunks) == total
    assert chunk_frame_range(0) == (0, 9) and chunk_frame_range(1) == (9, 21)
    assert REFERENCE_WORLD.snap_frames(num_frames) >= total  # the spec's lattice: 9 + 12k


@pytest.mark.parametrize(("num_frames", "chunks"), [(9, 1), (33, 3), (45, 4)])
def test_chunk_counts_and_frame_counts(num_frames: int, chunks: int) -> None:
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(width=32, height=32, num_frames=num_frames))
    assert pipe.num_chunks(state) == chunks and state.num_frames == frames_for_chunks(chunks)
    sizes = []
    while not state.done:
        steps = 0
        while not pipe.chunk_done(state):
            pipe.step(state)
            steps += 1
        assert steps == state.steps_per_chunk == 2
        frames = pipe.take_chunk(state)
        assert frames.dtype == np.uint8 and frames.shape[1:] == (32, 32, 3)
        sizes.append(len(frames))
    assert sizes == [9] + [12] * (chunks - 1)
    assert sum(sizes) == num_frames
    with pytest.raises(RuntimeError):
        pipe.step(state)


def test_take_before_the_chunk_is_finished_raises() -> None:
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config())
    pipe.step(state)
    with pytest.raises(RuntimeError, match="not finished"):
        pipe.take_chunk(state)
    pipe.step(state)
    with pytest.raises(RuntimeError, match="take_chunk"):
        pipe.step(state)
    assert len(pipe.take_chunk(state)) == 9


def test_same_seed_is_bit_identical_and_seeds_differ() -> None:
    script = [[["w"], ["d"], []], [["a"], ["s"], ["w", "d"]]]
    a = np.concatenate(_run(_config(camera_action_script=script)))
    b = np.concatenate(_run(_config(camera_action_script=script)))
    c = np.concatenate(_run(_config(camera_action_script=script, seed=4)))
    assert np.array_equal(a, b)
    assert np.abs(a.astype(float) - c).mean() > 1.0


def test_steps_per_chunk_changes_the_cost_not_the_frames() -> None:
    one = np.concatenate(_run(_config(steps_per_chunk=1)))
    many = np.concatenate(_run(_config(steps_per_chunk=6, flow_shift=5.0)))
    assert np.array_equal(one, many)


def test_frames_are_a_moving_scene_continuous_across_chunks() -> None:
    frames = np.concatenate(_run(_config(num_frames=33))).astype(float)
    steps = np.abs(np.diff(frames, axis=0)).mean(axis=(1, 2, 3))
    assert steps.max() > 0.0  # something moves while the camera holds
    assert steps[8] < 3 * np.median(steps) + 1  # no jump from chunk 0 to chunk 1
    assert frames.std() > 20


@pytest.mark.parametrize(("key", "bigger"), [("w", True), ("s", False)])
def test_w_zooms_in_and_s_zooms_out(key: str, bigger: bool) -> None:
    config = _config(width=96, height=96, num_frames=9)
    hold = _run(config)[0][-1]
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(width=96, height=96, num_frames=9,
                               camera_action_script=[[[key], [key], [key]]]))
    moved = _next_chunk(pipe, state)[-1]
    zoom = math.exp(state.camera.log_zoom)
    assert (zoom > 1.2) if bigger else (zoom < 0.85)
    ratio = _red(moved).sum() / _red(hold).sum()  # the ball's apparent area
    assert ratio == pytest.approx(zoom**2, rel=0.15)


@pytest.mark.parametrize(("key", "direction"), [("d", -1), ("a", 1)])
def test_d_pans_right_so_the_scene_shifts_left(key: str, direction: int) -> None:
    hold = _run(_config(width=96, height=96, num_frames=9))[0][-1]
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(width=96, height=96, num_frames=9,
                               camera_action_script=[[[key], [key], [key]]]))
    moved = _next_chunk(pipe, state)[-1]
    shift_px = -state.camera.pan * 96  # the ball is on the ground: it moves with the terrain
    assert direction * shift_px > 15
    centre = lambda f: float(np.nonzero(_red(f))[1].mean())  # noqa: E731
    assert centre(moved) - centre(hold) == pytest.approx(shift_px, abs=1.5)


def test_script_runs_per_latent_frame_and_holds_after_it_ends() -> None:
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(num_frames=45, camera_action_script=[HOLD, [["d"], [], []]]))
    _next_chunk(pipe, state)
    assert state.camera.pan == 0.0
    _next_chunk(pipe, state)  # "d" during its first latent frame only (4 frames)
    pan_after_script = state.camera.pan
    assert pan_after_script > 0
    _next_chunk(pipe, state)
    _next_chunk(pipe, state)
    assert state.camera.pan - pan_after_script < 0.05  # inertia settles, then it holds


def test_camera_interaction_equals_the_same_script() -> None:
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(num_frames=33))
    chunks = [_next_chunk(pipe, state)]
    pipe.interact(state, None, "wd", 1, "turn")  # chunk 1 has not begun: from chunk 1
    chunks += [_next_chunk(pipe, state), _next_chunk(pipe, state)]
    wd = [["w", "d"]] * 3
    scripted = _run(_config(num_frames=33, camera_action_script=[HOLD, wd, wd]))
    assert np.array_equal(np.concatenate(chunks), np.concatenate(scripted))


def test_camera_block_interaction_repeats_in_every_later_chunk() -> None:
    block = [["w"], [], ["a", "s"]]
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(num_frames=45, camera_action_script=[HOLD, [["d"]] * 3]))
    chunks = [_next_chunk(pipe, state)]
    pipe.interact(state, None, block, 0, "block")  # replaces the script's "d" chunk too
    chunks += [_next_chunk(pipe, state) for _ in range(3)]
    scripted = _run(_config(num_frames=45, camera_action_script=[HOLD, block, block, block]))
    assert np.array_equal(np.concatenate(chunks), np.concatenate(scripted))


def _interacting_at(step: int, chunk: int, change: dict[str, Any], **config: Any) -> Any:
    """A session whose ``change`` (``interact``'s keywords) is sent once ``step`` steps of
    chunk ``chunk`` have run: its chunks and each chunk's events."""
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(**config))
    chunks, events = [], []
    for k in range(pipe.num_chunks(state)):
        for i in range(state.steps_per_chunk + 1):
            if (k, i) == (chunk, step):
                pipe.interact(state, **change)
            if i < state.steps_per_chunk:
                pipe.step(state)
        chunks.append(pipe.take_chunk(state))
        events.append(pipe.events_for_chunk(state))
    return chunks, events


def test_an_interaction_during_a_chunk_enters_it_at_its_next_step() -> None:
    """With a step of chunk 1 left (3 steps a chunk: after its first or its second), a
    camera or prompt change enters chunk 1: reported started there, and chunk 1 is the one
    the change makes queued before its first step (the chunk is rendered again, its camera
    from where the chunk began), unlike the chunk made without it."""
    night = PROMPT + " at night"
    cases = [
        {"prompt": None, "camera": "d", "transition_chunks": 1, "event_id": "go"},
        {"prompt": night, "camera": None, "transition_chunks": 2, "event_id": "dusk"},
    ]
    for change in cases:
        at_start, start_events = _interacting_at(0, 1, change, num_frames=45, steps_per_chunk=3)
        alone = _run(_config(num_frames=45, steps_per_chunk=3))
        assert not np.array_equal(at_start[1], alone[1])
        for step in (1, 2):
            chunks, events = _interacting_at(step, 1, change, num_frames=45, steps_per_chunk=3)
            assert events == start_events
            assert events[1][0] == [change["event_id"]]
            for mine, theirs in zip(chunks, at_start, strict=True):
                np.testing.assert_array_equal(mine, theirs)
            np.testing.assert_array_equal(chunks[0], alone[0])


def test_an_interaction_after_a_chunk_s_last_step_waits_for_the_next_one() -> None:
    """Once chunk 0's last step has run (its frames made, not yet taken) no step of it is
    left to take a change: it enters chunk 1, as one sent between the chunks does."""
    change = {"prompt": None, "camera": "d", "transition_chunks": 1, "event_id": "late"}
    chunks, events = _interacting_at(2, 0, change, num_frames=33)
    assert events == [([], [], []), (["late"], ["late"], ["late"]), ([], [], [])]
    d = [["d"]] * 3
    scripted = _run(_config(num_frames=33, camera_action_script=[HOLD, d, d]))
    assert np.array_equal(np.concatenate(chunks), np.concatenate(scripted))
    between, _ = _interacting_at(0, 1, change, num_frames=33)
    assert np.array_equal(np.concatenate(chunks), np.concatenate(between))


def test_a_spec_with_interaction_at_chunk_keeps_a_change_for_the_next_chunk() -> None:
    """A registry entry may set ``interaction_at = "chunk"``: a change sent during a
    chunk then waits for the next one, as any model's did before."""
    pipe = loaded(ReferenceWorldPipeline)
    pipe.spec = REFERENCE_WORLD.model_copy(update={"interaction_at": "chunk"})
    state = pipe.start(_config(num_frames=33))
    pipe.step(state)  # chunk 0 has begun
    pipe.interact(state, None, "d", 1, "late")
    chunks = [_next_chunk(pipe, state)]
    assert pipe.events_for_chunk(state) == ([], [], [])
    chunks += [_next_chunk(pipe, state), _next_chunk(pipe, state)]
    d = [["d"]] * 3
    scripted = _run(_config(num_frames=33, camera_action_script=[HOLD, d, d]))
    assert np.array_equal(np.concatenate(chunks), np.concatenate(scripted))
    assert REFERENCE_WORLD.interaction_at == "step"


def test_prompt_interaction_fades_over_transition_chunks() -> None:
    night = PROMPT + " at night"
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(num_frames=57))  # 5 chunks
    events = []
    chunks = [_next_chunk(pipe, state)]
    events.append(pipe.events_for_chunk(state))
    pipe.interact(state, night, None, 3, "dusk")  # chunks 1..3 fade, chunk 3 ends fully night
    for _ in range(4):
        chunks.append(_next_chunk(pipe, state))
        events.append(pipe.events_for_chunk(state))
    day_run, night_run = _run(_config(num_frames=57)), _run(_config(num_frames=57, prompt=night))

    assert np.array_equal(chunks[0], day_run[0])  # unchanged before it takes effect
    brightness = [float(c.mean()) for c in chunks]
    assert all(a > b + 2 for a, b in itertools.pairwise(brightness[:4]))
    frame_means = np.concatenate(chunks[1:4]).astype(float).mean(axis=(1, 2, 3))
    assert np.all(np.diff(frame_means) < 0.5)  # it darkens frame by frame
    assert np.array_equal(chunks[3][-1], night_run[3][-1])  # fully night at the end
    assert np.array_equal(chunks[4], night_run[4])
    assert not np.array_equal(chunks[2], night_run[2])
    assert state.prompt == night
    assert events == [
        ([], [], []),
        (["dusk"], ["dusk"], []),
        ([], ["dusk"], []),
        ([], ["dusk"], ["dusk"]),
        ([], [], []),
    ]


def test_prompt_cut_and_overlapping_events() -> None:
    night, red_sky = PROMPT + " at night", PROMPT + " under a pink sky"
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(num_frames=45))  # 4 chunks
    _next_chunk(pipe, state)
    pipe.interact(state, night, None, 0, "cut")
    cut = _next_chunk(pipe, state)
    assert np.array_equal(cut, _run(_config(num_frames=45, prompt=night))[1])
    assert pipe.events_for_chunk(state) == (["cut"], ["cut"], ["cut"])
    pipe.interact(state, red_sky, None, 2, "sky")
    pipe.interact(state, None, "d", 0, "go")
    _next_chunk(pipe, state)
    assert pipe.events_for_chunk(state) == (["sky", "go"], ["sky", "go"], ["go"])
    last = _next_chunk(pipe, state)
    assert pipe.events_for_chunk(state) == ([], ["sky"], ["sky"])
    assert state.done
    assert np.array_equal(last[-1], _run(_config(
        num_frames=45, prompt=red_sky, camera_action_script=[HOLD, HOLD, [["d"]] * 3, [["d"]] * 3],
    ))[3][-1])


def test_interaction_checks() -> None:
    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config())
    pipe.interact(state, "a blue box", None, 1, "e1")
    with pytest.raises(DuplicateEventError, match="e1"):
        pipe.interact(state, "a green box", None, 1, "e1")
    for camera in ("x", [["w"], ["w"]], [["w"], ["up"], []], {"yaw": 0.1}, [[["w"]], [], []]):
        with pytest.raises(ValueError, match="camera"):
            pipe.interact(state, None, camera, 1, "e2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="transition_chunks"):
        pipe.interact(state, None, "w", -1, "e3")
    with pytest.raises(ValueError, match="prompt"):
        pipe.interact(state, " ", None, 1, "e4")
    with pytest.raises(ValueError, match="event_id"):
        pipe.interact(state, None, "w", 1, "")
    with pytest.raises(RuntimeError, match="no chunk"):
        pipe.events_for_chunk(state)


def test_interleaved_sessions_match_separate_runs() -> None:
    pipe = loaded(ReferenceWorldPipeline)
    script = [[["d"], ["d"], ["w"]], HOLD, [["s"], ["a"], []]]
    configs = [_config(num_frames=33, camera_action_script=script),
               _config(num_frames=33, seed=9, prompt="a blue box flying over the desert")]
    states = [pipe.start(c) for c in configs]
    out: list[list[np.ndarray]] = [[], []]
    for i in range(3):
        if i == 1:
            pipe.interact(states[1], "a blue box flying over the desert at night", "a", 1, "x")
        while not all(pipe.chunk_done(s) for s in states):
            for s in states:
                if not pipe.chunk_done(s):
                    pipe.step(s)
        for n, s in enumerate(states):
            out[n].append(pipe.take_chunk(s))
    assert np.array_equal(np.concatenate(out[0]), np.concatenate(_run(configs[0])))

    alone = pipe.start(configs[1])
    separate = [_next_chunk(pipe, alone)]
    pipe.interact(alone, "a blue box flying over the desert at night", "a", 1, "x")
    separate += [_next_chunk(pipe, alone), _next_chunk(pipe, alone)]
    assert np.array_equal(np.concatenate(out[1]), np.concatenate(separate))


def test_reference_image_is_frame_zero_and_pans_with_the_camera() -> None:
    h, w = 48, 64
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.stack([xx * 4, yy * 5, (xx + yy) * 2], axis=-1).clip(0, 255).astype(np.uint8)
    image.setflags(write=False)
    frames = _run(_config(reference_image=image, camera_action_script=[[["d"]] * 3]))[0]
    assert np.abs(frames[0].astype(float) - image).mean() < 1.0
    # The red channel is a left-to-right ramp: panning right raises it.
    assert frames[-1][..., 0].astype(float).mean() > image[..., 0].mean() + 5


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("w", "must be a list with one entry per chunk"),
        ([[["w"], ["w"]]], r"camera_action_script\[0\] must be a list of 3"),
        ([HOLD, [["w"], ["w"], ["w"], ["w"]]], r"camera_action_script\[1\] must be a list of 3"),
        ([["w", "w", "w"]], r"camera_action_script\[0\]\[0\] must be a list of actions"),
        ([[["w"], ["x"], []]], r"camera_action_script\[0\]\[1\] has unknown action 'x'"),
        ([[["W"], [], []]], "unknown action 'W'"),
        ([HOLD, HOLD, HOLD], "has 3 entries but the session has 2 chunks"),
        ([None], r"camera_action_script\[0\] must be a list of 3"),
    ],
)
def test_bad_action_script_names_the_problem(script: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loaded(ReferenceWorldPipeline).start(_config(camera_action_script=script))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"width": 72}, "width must be a multiple of 16"),
        ({"height": 8}, "height"),
        ({"num_frames": 8}, "num_frames"),
        ({"fps": 0.0}, "fps"),
        ({"steps_per_chunk": 0}, "steps_per_chunk"),
        ({"prompt": ""}, "prompt"),
        ({"reference_image": np.zeros((48, 64, 3), dtype=np.float32)}, "reference_image"),
    ],
)
def test_bad_config_raises(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loaded(ReferenceWorldPipeline).start(_config(**overrides))


def test_a_prompt_change_without_transition_chunks_blends_over_the_model_s_default() -> None:
    """Neither the interaction nor the start said: the model's default_transition_chunks
    (a blend over one chunk for reference/world, as the protocol doc says), not a cut."""
    from models.session_bus import InteractionCommand
    from workers.sessions.world import WorldSessionRunner

    pipe = loaded(ReferenceWorldPipeline)
    state = pipe.start(_config(num_frames=45))
    assert REFERENCE_WORLD.default_transition_chunks == 1
    WorldSessionRunner._interact(pipe, state, InteractionCommand(event_id="e1", prompt="snow"))
    cut = InteractionCommand(event_id="e2", prompt="night", transition_chunks=0)
    WorldSessionRunner._interact(pipe, state, cut)
    assert [e.transition_chunks for e in state.events] == [1, 0]
