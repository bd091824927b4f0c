"""A worker's status file (``OMNIQ_WORKER__STATUS_FILE``): the worker writes how its
start went (:class:`models.worker_status.WorkerStatus`), whole or not at all, and
``omniqueue up`` reads it (``cli/up_ready.py``) to know when its workers are ready and
why one stopped. A file from an earlier start never counts: ``up`` removes it before
each start of the worker."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from pydantic import ValidationError

from models.worker_status import WorkerStatus

log = logging.getLogger(__name__)


def write_status(path: Path | None, status: WorkerStatus) -> None:
    """Write ``status`` to ``path`` (nothing without one) through a temporary file, so a
    reader never sees half of it. A failure is logged, never raised: the worker serves
    all the same."""
    if path is None:
        return
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(status.model_dump_json())
        partial.replace(path)
    except OSError:
        log.warning("could not write the worker status file %s", path, exc_info=True)
        with contextlib.suppress(OSError):
            partial.unlink()


def read_status(path: Path) -> WorkerStatus | None:
    """What the worker wrote at ``path``; None while it has written nothing."""
    try:
        return WorkerStatus.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def clear_status(path: Path) -> None:
    """Forget an earlier start's word (before the worker starts again)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
