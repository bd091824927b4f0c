"""A Helios world session end to end (issue 31): a tiny seeded HeliosPipeline saved to
disk and served by a registry entry, ``WS /v1/realtime/video`` through the API, Redis
Streams and a realtime worker process. The session's rules are the model's (33-frame
chunks, no camera), its frames are the adapter's run in-process, and a prompt sent
mid-session takes effect in a chunk the client has not had yet (the one under way, from
its next step, or the next), blended over the model's default two."""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from websockets.sync.client import ClientConnection, connect

from cli.embedded import EmbeddedS3
from models.catalog import FAMILY_SPECS
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.unit.helios_fixtures import SEQ_LEN, SESSION_START, tiny_helios_pipeline
from workers.media.fmp4 import FragmentedMP4Writer
from workers.pipelines.base import WorldConfig
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "Helios/tiny"
ONE = "Helios/tiny-one-session"  # the same, with max_sessions = 1
START = {**SESSION_START, "model": MODEL, "num_frames": 66}  # two chunks of 33


@pytest.fixture(scope="module")
def hstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    path = module_dir / "tiny_helios"
    tiny_helios_pipeline().save_pretrained(str(path))
    registry = module_dir / "models.toml"
    # the same tiny model twice: as many sessions as keep real time (measured by the
    # worker's start-up probe at the spec's defaults, here 64x64 and 2 steps), and one
    entry = (
        '[[model]]\nname = "{}"\nadapter = "diffusers.helios"\npath = "{}"\n'
        'dtype = "float32"\n{}[model.adapter_options]\nmax_sequence_length = {}\n'
        "[model.spec]\ndefault_size = [64, 64]\ndefault_steps = 2\n"
    )
    registry.write_text(
        entry.format(MODEL, path, "", SEQ_LEN)
        + entry.format(ONE, path, "max_sessions = 1\n", SEQ_LEN)
    )
    env = {"OMNIQ_MODEL_REGISTRY": str(registry), "OMNIQ_REALTIME__SLOTS": "2"}
    with isolated_stack(module_dir, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=0, realtime_workers=1)
        yield st


def _ws(st: Stack) -> ClientConnection:
    return connect(st.url.replace("http://", "ws://") + "/v1/realtime/video", max_size=2**24)


def _json(ws: ClientConnection, timeout: float = 120) -> dict[str, Any]:
    message = ws.recv(timeout=timeout)
    assert isinstance(message, str), "expected a JSON text frame"
    return dict(json.loads(message))


def _session(ws: ClientConnection) -> tuple[dict[str, Any], list[dict[str, Any]], bytes]:
    """After ``session.start``: video.start, the chunks' metadata, their fMP4 bytes."""
    start = _json(ws)
    assert start["type"] == "video.start", start
    metas, blobs = [], []
    while (meta := _json(ws))["type"] != "session.done":
        assert meta["type"] == "video.chunk_metadata", meta
        blob = ws.recv(timeout=60)
        assert isinstance(blob, bytes)
        metas.append(meta)
        blobs.append(blob)
    return start, metas, b"".join(blobs)


def _pictures(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _in_process(prompts: list[str | None]) -> np.ndarray:
    """The same session in this process, ``prompts[k]`` sent (blended over the model's
    default) before chunk k; encoded as the worker encodes, decoded back."""
    adapter = HeliosWorldAdapter(pipe=tiny_helios_pipeline(), max_sequence_length=SEQ_LEN)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "__array_wrap__", DeprecationWarning)
        adapter.load("cpu")
    config = WorldConfig(
        prompt=str(START["prompt"]), width=64, height=64, num_frames=66, fps=24.0, seed=3,
        steps_per_chunk=2,
    )  # fmt: skip
    state = adapter.start(config)
    writer = FragmentedMP4Writer(64, 64, 24.0)
    data = b""
    transition = FAMILY_SPECS["diffusers.helios"].default_transition_chunks
    for k in range(adapter.num_chunks(state)):
        if prompts[k] is not None:
            adapter.interact(state, prompts[k], None, transition, f"e{k}")
        while not adapter.chunk_done(state):
            adapter.step(state)
        data += writer.write_chunk(adapter.take_chunk(state))
    return _pictures(data + writer.close())


def _close(video: np.ndarray, expected: np.ndarray) -> None:
    assert video.shape == expected.shape == (66, 64, 64, 3)
    assert np.abs(video.astype(int) - expected.astype(int)).mean() < 3


def test_a_session_streams_the_model_s_chunks_as_the_adapter_makes_them(hstack: Stack) -> None:
    with _ws(hstack) as ws:
        ws.send(json.dumps(START))
        start, metas, data = _session(ws)
    assert start["config"] == {
        "width": 64,
        "height": 64,
        "fps": 24.0,
        "num_frames": 66,
        "chunks": 2,
        "num_inference_steps": 2,  # the start's, run by the worker as each chunk's steps
    }
    media = [m for m in metas if m["kind"] == "media"]
    assert [m["num_frames"] for m in media] == [33, 33]  # the model's chunk, not 9/12
    _close(_pictures(data), _in_process([None, None]))


def test_a_prompt_sent_mid_session_steers_from_the_next_chunk(hstack: Stack) -> None:
    with _ws(hstack) as ws:
        ws.send(json.dumps({**START, "num_frames": 132}))  # four chunks
        assert _json(ws)["type"] == "video.start"
        first = _json(ws)  # chunk 0 is made; the prompt reaches the worker after it
        assert first["type"] == "video.chunk_metadata"
        ws.recv(timeout=60)
        event = {"event_id": "dusk", "event": {"prompt": "a blue cube"}}
        ws.send(json.dumps({"type": "session.interaction", "interaction": event}))
        metas = [first]
        while (meta := _json(ws))["type"] != "session.done":
            if meta["type"] == "video.chunk_metadata":
                ws.recv(timeout=60)
                metas.append(meta)
    media = [m for m in metas if m["kind"] == "media"]
    started = [m["generation_chunk_index"] for m in media if "dusk" in m["started_event_ids"]]
    completed = [m["generation_chunk_index"] for m in media if "dusk" in m["completed_event_ids"]]
    # from the chunk under way when it arrived, while a step of it was left, else the next
    # (1 or 2), blended over two chunks
    assert started in ([1], [2]) and completed == [started[0] + 1]


def test_a_camera_script_is_refused_naming_it(hstack: Stack) -> None:
    script = [[["w"], ["w"], ["w"]]] * 2
    with _ws(hstack) as ws:
        ws.send(json.dumps({**START, "extra_params": {"camera_action_script": script}}))
        error = _json(ws)
    assert error["type"] == "error" and error["param"] == "extra_params.camera_action_script"


def test_a_session_past_the_model_s_capacity_is_refused_at_once_naming_it(
    hstack: Stack,
) -> None:
    """With as many sessions as the model keeps in real time already running (here the
    entry's max_sessions, 1), the next is refused by the worker with
    ``resource_exhausted`` naming why, not queued behind it nor served slowly; once the
    first ends, a session starts again."""
    # ten chunks, paced at real time from the first: the first session lasts ~12 s
    start = {**START, "model": ONE, "num_frames": 330}
    with _ws(hstack) as first:
        first.send(json.dumps(start))
        assert _json(first)["type"] == "video.start"
        with _ws(hstack) as second:
            second.send(json.dumps(start))
            error = _json(second, timeout=30)
        assert (error["type"], error["code"]) == ("error", "resource_exhausted"), error
        assert f"{ONE} runs 1 session on this worker, its max_sessions" in error["message"]
        first.send(json.dumps({"type": "session.stop"}))
        while not (isinstance(m := first.recv(timeout=60), str) and '"session.done"' in m):
            pass  # the chunks made meanwhile
    with _ws(hstack) as again:
        again.send(json.dumps({**start, "num_frames": 33}))
        assert _json(again)["type"] == "video.start"
