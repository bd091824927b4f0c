"""The API's view of the worker running a session, as a clock (sans-I/O): a session not
admitted by a worker within the admission timeout has no slot (``resource_exhausted``);
an admitted one whose worker stays silent for ``lost_after_s`` lost it (``worker_lost``).
World and voice sessions share it, and the words they use when the API loses the broker
(Redis/Valkey) mid-session: ``error`` ``broker_error``, then close 1011."""

from __future__ import annotations

from collections.abc import Sequence

from models.session_bus import AcceptedOutput, SessionOutput

BROKER_ERROR = "broker_error"
BROKER_ERROR_MESSAGE = "the message broker (Redis) is unreachable; the session cannot go on"


class WorkerWatch:
    def __init__(self, admission_timeout_s: float, lost_after_s: float, now: float) -> None:
        self.admitted = False
        self._admit_by = now + admission_timeout_s
        self._lost_after_s = lost_after_s
        self._heard = now

    def heard(self, outputs: Sequence[SessionOutput], now: float) -> None:
        """These outputs arrived from the worker (``accepted`` admits the session)."""
        if outputs:
            self._heard = now
            self.admitted = self.admitted or any(isinstance(o, AcceptedOutput) for o in outputs)

    def verdict(self, now: float) -> tuple[str, str] | None:
        """``(code, message)`` when the session must end for want of its worker."""
        if not self.admitted and now > self._admit_by:
            return "resource_exhausted", "no worker slot is free"
        if self.admitted and now - self._heard > self._lost_after_s:
            return "worker_lost", "the worker running the session is gone"
        return None
