"""The admission and liveness clock both realtime relays use."""

from __future__ import annotations

from models.session_bus import AcceptedOutput, KeepaliveOutput, ResponseAudioOutput
from realtime.worker_watch import WorkerWatch

ACCEPTED = AcceptedOutput(worker_id="w")
KEEPALIVE = KeepaliveOutput()


def test_no_worker_within_the_admission_timeout_is_resource_exhausted() -> None:
    w = WorkerWatch(admission_timeout_s=10, lost_after_s=3, now=0.0)
    assert w.verdict(9.9) is None
    w.heard([KEEPALIVE], 5.0)  # anything but "accepted" does not admit
    assert not w.admitted
    assert w.verdict(10.1) == ("resource_exhausted", "no worker slot is free")


def test_an_admitted_session_is_lost_only_after_silence() -> None:
    w = WorkerWatch(admission_timeout_s=10, lost_after_s=3, now=0.0)
    w.heard([ACCEPTED, ResponseAudioOutput(response_id="r1")], 1.0)
    assert w.admitted and w.verdict(3.9) is None  # 2.9 s of silence
    w.heard([], 3.5)  # an empty read is not news
    assert w.verdict(4.1) == ("worker_lost", "the worker running the session is gone")
    w.heard([KEEPALIVE], 4.2)
    assert w.verdict(7.1) is None
