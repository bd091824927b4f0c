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


def test_a_worker_whose_lease_ran_out_is_lost_at_once() -> None:
    """A worker with a lease is looked at once it is silent LEASE_SILENT_S, 0.5 s (then
    every LEASE_CHECK_EVERY_S, 0.25 s): its lease gone, it is lost long before
    ``lost_after_s``."""
    w = WorkerWatch(admission_timeout_s=10, lost_after_s=10, now=0.0)
    assert w.lease_check_due(5.0) is None  # not admitted
    w.heard([AcceptedOutput(worker_id="w", attempt=2, lease_s=3.0)], 1.0)
    assert w.lease_check_due(1.4) is None  # silent less than 0.5 s: a step under way
    assert w.lease_check_due(1.6) == 2  # the placement whose lease to look at
    assert w.lease_check_due(1.7) is None  # looked at 0.1 s ago
    assert w.lease_check_due(1.9) == 2  # 0.3 s ago: looked at again
    w.heard([KEEPALIVE], 2.0)
    assert w.lease_check_due(2.4) is None  # heard again: silent 0.4 s
    assert w.lease_check_due(2.6) == 2
    assert w.verdict(3.2) is None and w.lease_check_due(3.2) == 2
    w.lease_gone()
    assert w.verdict(3.3) == ("worker_lost", "the worker running the session is gone")
    assert w.lease_check_due(4.5) is None  # nothing more to look at


def test_a_short_lease_is_looked_at_after_a_third_of_its_ttl() -> None:
    w = WorkerWatch(admission_timeout_s=10, lost_after_s=10, now=0.0)
    w.heard([AcceptedOutput(worker_id="w", lease_s=0.6)], 1.0)
    assert w.lease_check_due(1.15) is None and w.lease_check_due(1.25) == 1


def test_a_worker_without_a_lease_is_lost_after_silence_only() -> None:
    w = WorkerWatch(admission_timeout_s=10, lost_after_s=3, now=0.0)
    w.heard([ACCEPTED], 1.0)
    assert w.lease_s is None and w.lease_check_due(3.9) is None


def test_a_takeover_no_worker_admits_is_worker_lost() -> None:
    w = WorkerWatch(admission_timeout_s=10, lost_after_s=3, now=0.0, taking_over=True)
    assert w.verdict(10.1) == ("worker_lost", "the worker running the session is gone")
