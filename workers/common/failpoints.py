"""Named fault-injection points, for tests of cancel and failure handling.

The technique of etcd's gofail and TiKV's fail-rs: the executor calls
``failpoints.hit("encode", …)`` at fixed places; normally that does nothing. With
``OMNIQ_WORKER__FAILPOINTS_FILE`` set (tests only), the JSON object in that file maps
point names to actions, re-read at every hit so a running worker can be steered:

    {"encode": "pause", "step:2": "raise", "upload": "kill"}

Points of a job: ``prepare``, ``step:<i>`` (before step i, from 0), ``block:<i>:<b>``
(inside step i, before the denoiser's block b, from 1: diffusers adapters), ``decode``,
``encode``, ``upload``, ``upload_part`` (before each part of a multipart upload),
``complete`` (just before the final UPDATE). ``name@attempt<N>`` fires only on the job's
N-th attempt, ``name@<job id>`` only for that job, ``name@<job id>@attempt<N>`` both. Of a
world session: ``session_chunk:<i>`` (chunk i is made, before it is sent).

Actions: ``pause`` (block while the job is still ours, at most 120 s — a stage long
enough to cancel during), ``hold`` (block until the file no longer maps the point to
``hold``, at most 120 s: a test releases it the moment its scenario allows, where a
``sleep`` would have to outlast the slowest case), ``sleep:<seconds>``, ``raise``
(RuntimeError), ``oom`` (``torch.OutOfMemoryError``), ``value`` (a bare ValueError, as
numpy, PIL or PyAV raise one), ``invalid`` (``InvalidJobInput``: the pipeline refuses the
request on purpose), ``kill`` (SIGKILL this process).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch

from models.errors import InvalidJobInput

PAUSE_LIMIT_S = 120.0

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` action."""


class Failpoints:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None

    def _actions(self) -> dict[str, str]:
        if self.path is None:
            return {}
        try:
            actions = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in actions.items() if v}

    def hit(
        self, name: str, still_owned: Callable[[], bool], attempt: int = 1, job_id: str = ""
    ) -> None:
        keys = [name, f"{name}@attempt{attempt}"]
        if job_id:
            keys += [f"{name}@{job_id}", f"{name}@{job_id}@attempt{attempt}"]
        actions = self._actions()
        key = next((k for k in reversed(keys) if k in actions), None)  # the most specific
        if key is None:
            return
        action = actions[key]
        log.info("failpoint %s: %s", key, action)  # tests wait for this line
        if action == "pause":
            deadline = time.monotonic() + PAUSE_LIMIT_S
            while still_owned() and time.monotonic() < deadline:
                time.sleep(0.01)
        elif action == "hold":
            deadline = time.monotonic() + PAUSE_LIMIT_S
            while self._actions().get(key) == "hold" and time.monotonic() < deadline:
                time.sleep(0.05)
        elif action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))
        elif action == "raise":
            raise InjectedFault(f"failpoint {name}")
        elif action == "oom":
            raise torch.OutOfMemoryError(f"failpoint {name}")
        elif action == "value":
            raise ValueError(f"failpoint {name}: secret detail of a library")
        elif action == "invalid":
            raise InvalidJobInput(f"failpoint {name}: the request cannot be honoured")
        elif action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
