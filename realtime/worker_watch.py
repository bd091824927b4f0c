"""The API's view of the worker running a session, as a clock (sans-I/O): a session not
admitted by a worker within the admission timeout has no slot (``resource_exhausted``);
an admitted one whose worker is dead lost it (``worker_lost``). Dead means its lease is
gone (``storage/session_lease.py``: run out, or the connection it names closed; the
caller looks at it when :meth:`lease_check_due` says, and reports :meth:`lease_gone`),
or, for a worker alive but stuck or one without a lease, silent for ``lost_after_s``. A
session being taken over by another worker (``taking_over``) that no worker admits in
time lost its worker too.

World and voice sessions share it, and the words they use when the API loses the broker
(Redis/Valkey) mid-session: ``error`` ``broker_error``, then close 1011."""

from __future__ import annotations

from collections.abc import Sequence

from models.session_bus import AcceptedOutput, SessionOutput

BROKER_ERROR = "broker_error"
BROKER_ERROR_MESSAGE = "the message broker (Redis) is unreachable; the session cannot go on"
WORKER_LOST = "worker_lost"
WORKER_LOST_MESSAGE = "the worker running the session is gone"
# How often a silent worker's lease is looked at, at most (a third of its TTL where that
# is shorter). The lease runs out within a TTL of the worker's death; looking only every
# third of the TTL (1 s with the 3 s default) added up to 1 s more to a takeover's gap
# (the death was seen 3.6 s after a SIGKILL, of a 5.4 s gap, on an H100); every 0.25 s
# adds at most 0.25 s, for one look (a GET and a CLIENT LIST ID) per silent session each
# time.
LEASE_CHECK_EVERY_S = 0.25
# How long a worker is silent before its lease is looked at, at most (a third of its TTL
# where that is shorter). A lease bound to its connection shows a dead process at once,
# so the wait for this silence is most of the time to see it: 0.5 s, half a keep-alive
# interval, against the 1 s (a third of the 3 s TTL) that ran before the connection was
# named. A live worker is silent that long between two keep-alives, so a session is
# looked at about twice a second; a false "gone" also needs its lease's connection
# dropped since its last renew (storage/session_lease.py says why that is safe).
LEASE_SILENT_S = 0.5


class WorkerWatch:
    def __init__(
        self,
        admission_timeout_s: float,
        lost_after_s: float,
        now: float,
        *,
        taking_over: bool = False,
    ) -> None:
        self.admitted = False
        self.attempt = 1  # the placement of the admitted worker
        self.lease_s: float | None = None  # its lease's TTL; None: it holds none
        self._taking_over = taking_over
        self._admit_by = now + admission_timeout_s
        self._lost_after_s = lost_after_s
        self._heard = self._lease_checked = now
        self._lease_gone = False

    def heard(self, outputs: Sequence[SessionOutput], now: float) -> None:
        """These outputs arrived from the worker (``accepted`` admits the session)."""
        if not outputs:
            return
        self._heard = now
        for output in outputs:
            if isinstance(output, AcceptedOutput):
                self.admitted = True
                self.attempt, self.lease_s = output.attempt, output.lease_s

    def lease_check_due(self, now: float) -> int | None:
        """The placement whose lease the caller is to look at now, or None: the worker
        has been silent ``LEASE_SILENT_S`` (a busy step, or a dead process), or a third
        of its lease's TTL if shorter, and it was not looked at for
        ``LEASE_CHECK_EVERY_S`` (or that silence, if shorter)."""
        if not self.admitted or self.lease_s is None or self._lease_gone:
            return None
        silent = min(self.lease_s / 3, LEASE_SILENT_S)
        every = min(silent, LEASE_CHECK_EVERY_S)
        if now - self._heard < silent or now - self._lease_checked < every:
            return None
        self._lease_checked = now
        return self.attempt

    def lease_gone(self) -> None:
        """The worker's lease ran out, or its connection closed: its process is gone."""
        self._lease_gone = True

    def verdict(self, now: float) -> tuple[str, str] | None:
        """``(code, message)`` when the session must end for want of its worker."""
        if not self.admitted and now > self._admit_by:
            if self._taking_over:
                return WORKER_LOST, WORKER_LOST_MESSAGE
            return "resource_exhausted", "no worker slot is free"
        if self.admitted and (self._lease_gone or now - self._heard > self._lost_after_s):
            return WORKER_LOST, WORKER_LOST_MESSAGE
        return None
