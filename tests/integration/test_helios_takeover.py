"""A Helios world session outlives its worker (issue 31 §5), end to end on CPU: a tiny
seeded HeliosPipeline from disk, two API replicas and two realtime worker processes on
one Redis. The worker running the session is SIGKILLed between two chunks (a failpoint
of its first placement only); meanwhile the client's socket drops and it resumes on the
other replica. That replica finds the worker's lease gone (the connection it names
closed with the process, long before its TTL could run out), places the session again,
and the other worker takes it over from its last checkpoint. The client gets every chunk
index exactly once, in order, one ``session.resumed``, and fMP4 bytes equal to an
uninterrupted in-process session's (its frames bit for bit: x264 is deterministic),
a prompt change sent before the kill included."""

from __future__ import annotations

import asyncio
import io
import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest
import redis.asyncio
from websockets.asyncio.client import ClientConnection, connect

from cli.embedded import EmbeddedS3
from models.catalog import FAMILY_SPECS
from storage.constants import session_lease_key
from tests.helpers import next_pair
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.unit.helios_fixtures import SEQ_LEN, SESSION_START, tiny_helios_pipeline
from workers.media.fmp4 import FragmentedMP4Writer
from workers.pipelines.base import WorldConfig
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "Helios/tiny"
CHUNKS = 4
KILLED_AT = 2  # the first worker dies once chunk 2 is made, before it is sent
START = {
    **SESSION_START,
    "model": MODEL,
    "num_frames": 33 * CHUNKS,
    "extra_params": {"persist": True},  # the taker stores the whole video, not its part
}
LOST_AFTER_S = 30.0  # the silence clock: the lease must find the dead worker long before
LEASE_S = 20.0  # its TTL: the lease's closed connection must tell long before that too


@pytest.fixture(scope="module")
def stack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    path = module_dir / "tiny_helios"
    tiny_helios_pipeline().save_pretrained(str(path))
    registry = module_dir / "models.toml"
    registry.write_text(
        f'[[model]]\nname = "{MODEL}"\nadapter = "diffusers.helios"\npath = "{path}"\n'
        f'dtype = "float32"\n[model.adapter_options]\nmax_sequence_length = {SEQ_LEN}\n'
        "[model.spec]\ndefault_size = [64, 64]\ndefault_steps = 2\n"
    )
    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_REALTIME__SLOTS": "1",
        "OMNIQ_REALTIME__LOST_AFTER_S": str(LOST_AFTER_S),
        "OMNIQ_REALTIME__WORKER_LEASE_S": str(LEASE_S),
    }
    with isolated_stack(module_dir, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=0, realtime_workers=2)
        yield st


async def _ws(st: Stack) -> ClientConnection:
    return await connect(st.url.replace("http://", "ws://") + "/v1/realtime/video", max_size=2**24)


def _uninterrupted(event_at: tuple[int, int]) -> list[bytes]:
    """The session in this process, never stopped, the prompt change queued once
    ``event_at = (chunk, steps)`` steps of that chunk had run (0: before its first; the
    change enters the chunk under way at its next step); its chunks encoded as the workers
    encode them: the first worker's writer up to the kill, then the taker's
    (``continuing``)."""
    adapter = HeliosWorldAdapter(pipe=tiny_helios_pipeline(), max_sequence_length=SEQ_LEN)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "__array_wrap__", DeprecationWarning)
        adapter.load("cpu")
    config = WorldConfig(
        prompt=str(START["prompt"]), width=64, height=64, num_frames=33 * CHUNKS, fps=24.0,
        seed=3, steps_per_chunk=2,
    )  # fmt: skip
    state = adapter.start(config)
    writer = FragmentedMP4Writer(64, 64, 24.0)
    transition = FAMILY_SPECS["diffusers.helios"].default_transition_chunks
    out = []
    for k in range(CHUNKS):
        if k == KILLED_AT:
            assert writer.init_segment is not None
            writer = FragmentedMP4Writer.continuing(
                64, 64, 24.0, init_segment=writer.init_segment, frames=33 * k, fragments=k
            )
        while not adapter.chunk_done(state):
            if (k, state.step_index) == event_at:
                adapter.interact(state, "a blue cube", None, transition, "dusk")
            adapter.step(state)
        out.append(writer.write_chunk(adapter.take_chunk(state)))
    return out


def test_a_session_outlives_its_worker_killed_between_chunks(stack: Stack, tmp_path: Path) -> None:
    replica_b = stack.sibling(tmp_path, {})
    replica_b.start(workers=0)
    stack.set_failpoints({f"session_chunk:{KILLED_AT}@attempt1": "kill"})

    broker = redis.asyncio.Redis.from_url(stack.redis_url)

    async def run() -> tuple[dict[int, bytes], list[dict[str, Any]], float, str]:
        got: dict[int, bytes] = {}
        seen: list[dict[str, Any]] = []  # every text frame of both sockets

        async def take(ws: ClientConnection) -> tuple[dict[str, Any], bytes | None]:
            event, data = await next_pair(ws)
            seen.append(event)
            if event["type"] == "video.chunk_metadata" and event["kind"] == "media":
                assert data is not None and event["generation_chunk_index"] not in got
                got[event["generation_chunk_index"]] = data
            return event, data

        a = await _ws(stack)
        await a.send(json.dumps(START))
        start, _ = await take(a)
        assert start["type"] == "video.start" and start["config"]["chunks"] == CHUNKS
        while not got:
            await take(a)
        change = {"event_id": "dusk", "event": {"prompt": "a blue cube"}}
        await a.send(json.dumps({"type": "session.interaction", "interaction": change}))
        while len(got) < KILLED_AT or not any(
            e["type"] == "session.interaction.queued" for e in seen
        ):
            await take(a)
        assert a.transport is not None
        a.transport.abort()  # the client's network drops too: no close handshake
        dropped = time.monotonic()

        b = await _ws(replica_b)
        resume = {
            "type": "session.resume",
            "session_id": start["session_id"],
            "resume_token": start["resume_token"],
            "last_generation_chunk_index": KILLED_AT - 1,
        }
        await b.send(json.dumps(resume))
        resumed, _ = await take(b)
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["next_generation_chunk_index"] == KILLED_AT
        init, data = await take(b)
        assert init["kind"] == "init" and data is not None and data[4:8] == b"ftyp"
        waited = 0.0
        while True:
            event, _ = await take(b)
            if event["type"] == "session.done":
                break
            assert event["type"] == "video.chunk_metadata", event
            if event["generation_chunk_index"] == KILLED_AT:
                waited = time.monotonic() - dropped
                # the dead worker's lease still had its TTL to run: its connection told
                lease = session_lease_key(start["session_id"], 1)
                assert await broker.pttl(lease) > 0
        await b.close()
        await broker.aclose()
        assert event["chunks"] == CHUNKS and event["stopped"] is False
        return got, seen, waited, event["artifact_id"]

    try:
        got, seen, waited, artifact_id = asyncio.run(run())
    finally:
        stack.set_failpoints({})
        replica_b.stop()
    logs = {name: stack.log(name) for name in ("rt0", "rt1")}
    killed = [n for n, log in logs.items() if f"session_chunk:{KILLED_AT}@attempt1: kill" in log]
    taker = [n for n, log in logs.items() if f"(attempt 2) from chunk {KILLED_AT}" in log]
    assert len(killed) == 1 and len(taker) == 1 and killed != taker, logs
    assert stack.procs[killed[0]].poll() is not None  # SIGKILLed

    assert sorted(got) == list(range(CHUNKS))  # every chunk once (each was checked new)
    assert [e["type"] for e in seen].count("session.resumed") == 1
    assert not any(e["type"] == "error" for e in seen), seen
    assert waited < LEASE_S / 2  # found dead by its lease's connection, no clock
    media = [e for e in seen if e["type"] == "video.chunk_metadata" and e["kind"] == "media"]
    started = [e["generation_chunk_index"] for e in media if "dusk" in e["started_event_ids"]]
    assert started in ([1], [2]), media  # the chunk under way when read, or the next
    # the bytes of a session that never stopped, the change entering its chunk before
    # the step where a worker read it (the first worker mid-chunk, or the taker before
    # its first step): the frames went on bit for bit
    entered = [(started[0], steps) for steps in range(2)]  # 2 steps a chunk
    candidates = [_uninterrupted(at) for at in entered]
    assert [got[k] for k in range(CHUNKS)] in candidates, "no chunk-and-step entry matches"
    with av.open(io.BytesIO(b"".join(got[k] for k in range(CHUNKS)))) as container:
        assert sum(1 for _ in container.decode(video=0)) == 33 * CHUNKS
    with stack.client() as client:
        stored = client.get(f"/v1/videos/{artifact_id}/content").content
    with av.open(io.BytesIO(stored)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 33 * CHUNKS
