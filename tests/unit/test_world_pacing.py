"""The world session's pacing clock (``workers.sessions.world.Playback``): a chunk begins only
while at most ``lead`` chunks of video are ahead of the client's real-time playback."""

from __future__ import annotations

import pytest

from workers.sessions.world import Playback, lead_chunks


def test_nothing_waits_before_the_first_chunk_or_when_unpaced() -> None:
    assert Playback(16.0, 2).wait_s(5.0) == 0.0
    unpaced = Playback(16.0, 0)
    for _ in range(10):
        unpaced.sent(12, 0.0)
    assert unpaced.wait_s(0.0) == 0.0


def test_a_chunk_begins_once_at_most_lead_chunks_are_ahead_of_playback() -> None:
    p = Playback(16.0, 2)  # chunks of 12 frames: 0.75 s each
    p.sent(9, 10.0)  # chunk 0 (9 frames, 0.5625 s) out at t = 10: playback starts
    p.sent(12, 10.1)
    p.sent(12, 10.2)  # 2.0625 s of video sent by t = 10.2
    # ahead at t = 10.2: 2.0625 - 0.2 = 1.8625 s; the bound: 2 x 0.75 = 1.5 s
    assert p.wait_s(10.2) == pytest.approx(0.3625)
    assert p.wait_s(10.5625) == pytest.approx(0.0)
    assert p.wait_s(12.0) == 0.0  # the client ran dry: no wait at all


def test_a_session_may_ask_for_its_own_bound() -> None:
    assert lead_chunks(2, {}) == 2
    assert lead_chunks(2, {"max_chunks_ahead": None}) == 2
    assert lead_chunks(2, {"max_chunks_ahead": 0}) == 0
    assert lead_chunks(2, {"max_chunks_ahead": 5}) == 5
