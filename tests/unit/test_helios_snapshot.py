"""A Helios session outlives its worker (issue 31 §5): ``snapshot`` between two chunks,
``restore`` in a fresh adapter (another pipeline object, as another worker loads it), and
the session goes on bit for bit as if it had never stopped, a prompt change in flight
included. Tiny random-weight Helios (``helios_fixtures.py``), CPU, float32."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.unit.helios_fixtures import (
    SEQ_LEN,
    SIZE,
    tiny_helios_pipeline,
    tiny_helios_pyramid_pipeline,
)
from workers.pipelines.base import SupportsSnapshot, WorldConfig
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.helios.session import HeliosState
from workers.pipelines.reference_world import ReferenceWorldPipeline
from workers.pipelines.snapshots import _ON_DEVICE as SNAPSHOT_DEVICE_MARK
from workers.pipelines.snapshots import pack, to_host, unpack

CHUNK = 33
IMAGE = np.random.default_rng(1).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)


def _adapter(pyramid: str | None = None) -> HeliosWorldAdapter:
    """A loaded adapter on a pipeline of its own (the same seeded weights each time)."""
    pipe = (
        tiny_helios_pipeline()
        if pyramid is None
        else tiny_helios_pyramid_pipeline(distilled=pyramid == "distilled")
    )
    adapter = HeliosWorldAdapter(pipe=pipe, dtype="float32", max_sequence_length=SEQ_LEN)
    adapter.load("cpu")
    return adapter


def _config(chunks: int, **over: Any) -> WorldConfig:
    values: dict[str, Any] = {
        "prompt": "a red ball",
        "width": SIZE,
        "height": SIZE,
        "num_frames": chunks * CHUNK,
        "fps": 24.0,
        "seed": 3,
        "steps_per_chunk": 2,
    }
    values.update(over)
    return WorldConfig(**values)


def _chunk(adapter: HeliosWorldAdapter, state: HeliosState) -> tuple[np.ndarray, Any]:
    while not adapter.chunk_done(state):
        adapter.step(state)
    return adapter.take_chunk(state), adapter.events_for_chunk(state)


@pytest.mark.parametrize(
    ("pyramid", "steps", "after", "events"),
    [
        (None, 2, 1, [(["e1"], ["e1"], []), ([], ["e1"], ["e1"]), ([], [], [])]),
        ("distilled", 3, 2, [(["e1"], ["e1"], []), ([], ["e1"], ["e1"]), ([], [], [])]),
        (None, 2, 2, [([], [], []), (["e1"], ["e1"], []), ([], ["e1"], ["e1"])]),
    ],
    ids=["entered-mid-chunk", "entered-at-the-last-pyramid-stage", "queued-after-the-last-step"],
)
def test_a_restored_session_goes_on_bit_for_bit_with_a_prompt_change_in_flight(
    pyramid: str | None, steps: int, after: int, events: list[Any]
) -> None:
    """Three chunks; a new prompt blended over two chunks is sent once ``after`` steps of
    chunk 0 have run. With a step left it entered chunk 0 (for the distilled pyramid, at
    its last stage), which reports it started; sent after chunk 0's last step it waits,
    queued, for chunk 1. Taken over after chunk 0 or after chunk 1 (the blend half-way, or
    whole), a fresh adapter makes the rest of the chunks and their events exactly as the
    session that never stopped."""
    extra = {} if pyramid is None else {"guidance_scale": 1.0}
    config = _config(3, steps_per_chunk=steps, extra=extra)
    adapter = _adapter(pyramid)
    state = adapter.start(config)
    for _ in range(after):
        adapter.step(state)
    adapter.interact(state, "a blue cube", None, 2, "e1")
    with pytest.raises(RuntimeError, match="between chunks"):
        adapter.snapshot(state)  # a chunk under way
    chunks, snapshots = [], []
    for _ in range(3):
        chunks.append(_chunk(adapter, state))
        snapshots.append(adapter.snapshot(state))
    assert [got for _, got in chunks] == events
    for k in (1, 2):
        data = snapshots[k - 1]
        assert isinstance(data, bytes) and len(data) < 2_000_000
        taker = _adapter(pyramid)
        restored = taker.restore(config, data)
        assert (restored.chunk_index, restored.step_index) == (k, 0)
        assert restored.prompt == "a blue cube"
        for frames, got_events in chunks[k:]:
            got, taken = _chunk(taker, restored)
            np.testing.assert_array_equal(got, frames)
            assert taken == got_events
        assert restored.done


def test_an_interaction_that_entered_mid_chunk_is_in_that_chunk_s_snapshot() -> None:
    """The snapshot of the chunk a prompt change entered after its first step holds the
    event as it stands there (from that chunk, its own embeddings, the blend's base), so
    its restore packs back to the very same bytes, and the chunk after it is conditioned
    as in the session that never stopped: half-way through the change's blend, unlike the
    same session with the change sent a chunk later."""
    config = _config(2)
    adapter = _adapter()
    state = adapter.start(config)
    adapter.step(state)
    adapter.interact(state, "a blue cube", None, 2, "e1")
    _, events = _chunk(adapter, state)
    assert events == (["e1"], ["e1"], [])
    data = adapter.snapshot(state)
    saved = unpack(data, "cpu")
    [(event_id, first, last, transition, embeds)] = saved["events"]
    assert (event_id, first, last, transition) == ("e1", 0, 1, 2) and embeds is not None
    restored = _adapter().restore(config, data)
    assert adapter.snapshot(restored) == data
    expected, _ = _chunk(adapter, state)
    got, got_events = _chunk(adapter, restored)
    np.testing.assert_array_equal(got, expected)
    assert got_events == ([], ["e1"], ["e1"])
    later = adapter.start(config)
    _chunk(adapter, later)
    adapter.interact(later, "a blue cube", None, 2, "e1")
    assert not np.array_equal(_chunk(adapter, later)[0], expected)


@pytest.mark.parametrize(
    ("pyramid", "extra", "i2v"),
    [
        (None, {}, True),
        ("distilled", {"guidance_scale": 1.0}, False),
        ("mid", {"guidance_scale": 5.0, "pyramid_num_inference_steps_list": [2, 1, 1]}, False),
    ],
    ids=["base-i2v", "distilled-t2v", "mid-cfg-t2v"],
)
def test_every_helios_shape_is_restored_bit_for_bit(
    pyramid: str | None, extra: dict[str, Any], i2v: bool
) -> None:
    """I2V (the reference image's latents are the anchor: the taker gets no image), the
    distilled pyramid (DMD) and Helios-Mid's (UniPC stages, CFG: the negative prompt's
    embeddings and the scheduler's multistep history travel too)."""
    steps = sum(extra.get("pyramid_num_inference_steps_list", [1, 1, 1])) if pyramid else 2
    over: dict[str, Any] = {"steps_per_chunk": steps, "extra": extra}
    adapter = _adapter(pyramid)
    state = adapter.start(_config(2, reference_image=IMAGE if i2v else None, **over))
    _chunk(adapter, state)
    data = adapter.snapshot(state)
    assert data is not None
    expected, _ = _chunk(adapter, state)
    taker = _adapter(pyramid)
    got, _ = _chunk(taker, taker.restore(_config(2, **over), data))
    np.testing.assert_array_equal(got, expected)


def test_a_snapshot_of_another_layout_or_session_is_refused() -> None:
    adapter = _adapter()
    state = adapter.start(_config(2))
    _chunk(adapter, state)
    data = adapter.snapshot(state)
    assert data is not None
    wrong = unpack(data, "cpu") | {"version": 99}
    with pytest.raises(ValueError, match="version 99"):
        adapter.restore(_config(2), pack(wrong))
    with pytest.raises(ValueError, match="history"):
        adapter.restore(_config(2, width=2 * SIZE), data)  # another session's size


def test_a_model_without_snapshots_cannot_be_taken_over() -> None:
    """Taking over is a capability (``SupportsSnapshot``): Helios has it, ``reference/world``
    has neither ``snapshot`` nor ``restore``."""
    assert isinstance(HeliosWorldAdapter(pipe=object()), SupportsSnapshot)
    pipe = ReferenceWorldPipeline()
    assert not isinstance(pipe, SupportsSnapshot)
    assert not hasattr(pipe, "snapshot") and not hasattr(pipe, "restore")


def test_a_snapshot_captured_at_a_chunk_and_packed_later_is_the_snapshot_of_that_chunk() -> None:
    """The delivery lane packs a chunk's checkpoint while the device already makes the
    next chunk (``capture_snapshot``): what it packs is the session as it was at the
    chunk, whatever the next chunk changed meanwhile, and a fresh adapter goes on from it
    exactly as from the plain snapshot."""
    adapter = _adapter()
    state = adapter.start(_config(3))
    _chunk(adapter, state)
    later = adapter.capture_snapshot(state)
    now = adapter.snapshot(state)
    adapter.interact(state, "a blue cube", None, 1, "e1")
    following = _chunk(adapter, state)  # the session moves on before the packing
    packed = later()
    saved_now, saved_later = unpack(now, "cpu"), unpack(packed, "cpu")
    assert saved_later.keys() == saved_now.keys()
    assert pack(saved_later) == pack(saved_now)
    taker = _adapter()
    resumed = taker.restore(_config(3), packed)
    frames, events = _chunk(taker, resumed)
    assert events == ([], [], [])  # the prompt change came after the capture
    plain = _adapter()  # the session as it would have gone on without the change
    alone = plain.start(_config(3))
    _chunk(plain, alone)
    assert np.array_equal(frames, _chunk(plain, alone)[0])
    assert following[1] == (["e1"], ["e1"], ["e1"])


def test_to_host_marks_what_was_on_a_device_and_unpack_puts_it_there() -> None:
    tensor = torch.arange(6.0)
    data = {"a": [tensor, (1, "x")], "b": {SNAPSHOT_DEVICE_MARK: tensor}}
    host = to_host(data)
    tensor += 1  # the copy does not follow
    assert torch.equal(host["a"][0], torch.arange(6.0)) and host["a"][1] == (1, "x")
    back = unpack(pack(host), "cpu")
    assert torch.equal(back["b"], torch.arange(6.0))  # a marked tensor, unwrapped
