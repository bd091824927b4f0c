"""A world chunk is encoded as it decodes (``SupportsChunkStream``; the delivery lane's
streams, ``workers/sessions/delivery.py``), through the real session runner on real Redis
with a tiny Helios on the CPU: the lane encodes a chunk's first frames while the VAE still
decodes its last latent frame; a stop that lands inside a chunk's decode, after the lane
has encoded some of its frames, ends the session with none of that chunk sent. With
``OMNIQ_REALTIME__STREAM_CHUNK_DECODE`` off, each chunk is decoded whole and handed over
in one piece, and the session's bytes are the streamed session's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

from models.session_bus import ChunkOutput, FinishedOutput, StopCommand, WorldSessionConfig
from tests.helpers import world_session_config
from tests.integration.test_third_party_adapters import Api
from tests.unit.helios_fixtures import SEQ_LEN, SESSION_START, tiny_helios_pipeline
from workers.media.fmp4 import FragmentedMP4Writer
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.sessions import world as world_module
from workers.sessions.turns import SessionStop
from workers.sessions.world import WorldSessionRunner

pytestmark = pytest.mark.integration

LATENT_FRAMES = 9  # a chunk's: the VAE decoder runs once per latent frame
WAIT_S = 10.0


class Encoded(NamedTuple):
    thread: str
    frames: int


class _Session:
    """The runner over a tiny Helios whose VAE decoder calls ``on_decode(n)`` before its
    ``n``-th run (from 0, over the session), and whose writers record every piece they
    encode; the session's stop follower is kept."""

    def __init__(
        self, api: Api, monkeypatch: pytest.MonkeyPatch, on_decode: Callable[[int], None]
    ) -> None:
        self.api, self.follower = api, None
        self.encoded: list[Encoded] = []
        adapter = HeliosWorldAdapter(pipe=tiny_helios_pipeline(), max_sequence_length=SEQ_LEN)
        adapter.load("cpu")
        runs = iter(range(10**6))
        adapter._loaded().vae.decoder.register_forward_pre_hook(
            lambda module, args: on_decode(next(runs))
        )
        monkeypatch.setattr(api.registry, "world", lambda name: adapter)
        add_frames = FragmentedMP4Writer.add_frames
        session = self

        def recorded(writer: FragmentedMP4Writer, frames: np.ndarray) -> None:
            add_frames(writer, frames)
            session.encoded.append(Encoded(threading.current_thread().name, len(frames)))

        monkeypatch.setattr(FragmentedMP4Writer, "add_frames", recorded)

        class Followed(SessionStop):
            def __init__(self, bus: Any, key: str) -> None:
                super().__init__(bus, key)
                session.follower = self

        monkeypatch.setattr(world_module, "SessionStop", Followed)

    def wait_encoded(self, pieces: int) -> bool:
        """Wait until the lane has encoded ``pieces`` pieces in all."""
        deadline = time.monotonic() + WAIT_S
        while len(self.encoded) < pieces:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def run(self, chunks: int, streamed: bool = True) -> list[tuple[ChunkOutput, bytes]]:
        start = {k: v for k, v in SESSION_START.items() if k != "type"}
        start |= {"num_frames": 33 * chunks, "extra_params": {"max_chunks_ahead": 0}}
        config: WorldSessionConfig = world_session_config(**start)
        realtime = self.api.settings.realtime.model_copy(update={"stream_chunk_decode": streamed})
        settings = self.api.settings.model_copy(update={"realtime": realtime})
        runner = WorldSessionRunner(settings, self.api.registry, self.api.bus, "w")
        out = self.api.run_to_end(lambda: runner.run(self.api.id, config))
        assert out[-1].event.type == "finished"
        self.finished = out[-1].event
        media = [(e.event, e.data or b"") for e in out if isinstance(e.event, ChunkOutput)]
        return [(chunk, data) for chunk, data in media if chunk.kind == "media"]


def test_the_lane_encodes_a_chunk_while_its_decode_goes_on(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the last latent frame of chunk 0 decodes, the lane has encoded its first
    piece (1 frame), on the lane's thread; the chunks come whole and in order."""
    seen: list[bool] = []

    def on_decode(run: int) -> None:
        if run == LATENT_FRAMES - 1:  # chunk 0's last latent frame
            seen.append(session.wait_encoded(1))

    session = _Session(Api(redis_url), monkeypatch, on_decode)
    media = session.run(chunks=2)
    assert session.api.outcome == "completed"
    assert seen == [True]
    assert session.encoded[0] == Encoded(session.encoded[0].thread, 1)
    assert session.encoded[0].thread.startswith("deliver-")
    assert [e.frames for e in session.encoded] == ([1] + [4] * 8) * 2
    assert [(c.generation_chunk_index, c.num_frames) for c, _ in media] == [(0, 33), (1, 33)]


def test_a_stop_inside_a_chunk_s_decode_sends_none_of_it(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client stops while chunk 1 decodes, once the lane has encoded two of its
    pieces: the next cancel point in the decoder ends the session; chunk 0 is the only
    chunk sent, and nothing follows ``finished``."""

    def on_decode(run: int) -> None:
        if run == LATENT_FRAMES + 2:  # chunk 1's third latent frame
            assert session.wait_encoded(LATENT_FRAMES + 2)
            session.api.send(StopCommand(reason="client"))
            deadline = time.monotonic() + WAIT_S
            while not (session.follower and session.follower.is_set()):
                assert time.monotonic() < deadline, "the follower never saw the stop"
                time.sleep(0.002)

    session = _Session(Api(redis_url), monkeypatch, on_decode)
    media = session.run(chunks=4)
    assert session.api.outcome == "stopped"
    assert session.finished == FinishedOutput(stopped=True, artifact_id=None)
    assert [c.generation_chunk_index for c, _ in media] == [0]
    assert len(session.encoded) >= LATENT_FRAMES + 2  # chunk 1 was partly encoded, unsent


def test_with_the_streamed_decode_off_a_chunk_is_handed_over_whole_and_the_bytes_agree(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off: the lane encodes nothing of a chunk before its decode has ended (each chunk is
    one 33-frame piece, encoded on the lane's thread), and every chunk's bytes are those
    of the same session streamed."""
    early: list[int] = []

    def on_decode(run: int) -> None:
        if run % LATENT_FRAMES == LATENT_FRAMES - 1:  # a chunk's last latent frame
            early.append(len(session.encoded))

    session = _Session(Api(redis_url), monkeypatch, on_decode)
    whole = session.run(chunks=2, streamed=False)
    assert session.api.outcome == "completed"
    assert early[0] == 0 and early[1] <= 1  # none of a chunk before its decode ends
    assert [e.frames for e in session.encoded] == [33, 33]
    assert all(e.thread.startswith("deliver-") for e in session.encoded)
    streamed = _Session(Api(redis_url), monkeypatch, lambda run: None).run(chunks=2)
    assert [data for _, data in whole] == [data for _, data in streamed]
    assert [c.num_frames for c, _ in whole] == [33, 33]
