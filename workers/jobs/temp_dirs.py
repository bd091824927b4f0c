"""The job temp directories of one worker process: made and removed by its job runs,
swept by its reconciler thread (one :class:`TempDirs` per worker, held by its context).

A run's directory is ``omniq-{job_id}-…`` under the worker's ``tmp_dir``. The run
removes it on every way out; a worker killed mid-job cannot, so every worker sweeps its
machine's directories (:meth:`TempDirs.sweep`) and leaves alone the ones its own runs
use now, even when their job ended elsewhere (a worker cut off and taken over, still
running its copy of the job).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from models.common import JobStatus
from storage.constants import ID_PREFIX
from storage.jobs import JobStore
from storage.settings import Settings

TEMP_PREFIX = "omniq-"


def temp_root(settings: Settings) -> Path:
    return Path(settings.worker.tmp_dir or tempfile.gettempdir())


class TempDirs:
    """The job temp directories under ``root``: the ones this process's runs use now
    (``live``), and the sweep of the others."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.live: set[Path] = set()  # never swept

    def make(self, job_id: str) -> Path:
        """A new directory for a run of ``job_id``, kept from the sweep until removed."""
        path = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{job_id}-", dir=self.root))
        self.live.add(path)
        return path

    def remove(self, path: Path) -> None:
        """The run ended: its directory goes, and the sweep no longer spares the name."""
        shutil.rmtree(path, ignore_errors=True)
        self.live.discard(path)

    def sweep(self, jobs: JobStore, unknown_after_s: float = 3600.0) -> int:
        """Remove job temp directories (``omniq-{job_id}-…``) no live job of this host
        needs: the job ended, or its worker on this host is no longer alive. A directory
        whose job this database does not know (deleted, or another deployment's sharing
        the temp dir) is removed only once it is older than ``unknown_after_s``. Session
        directories (``omniq-rtv_…``) belong to their session thread and are never swept."""
        host = socket.gethostname()
        removed = 0
        for path in self.root.glob(TEMP_PREFIX + "*"):
            if path in self.live:
                continue
            job_id = path.name[len(TEMP_PREFIX) :].rsplit("-", 1)[0]
            if not job_id.startswith(tuple(ID_PREFIX.values())):
                continue
            job = jobs.get(job_id)
            if job is None:
                try:
                    age = time.time() - path.stat().st_mtime
                except OSError:
                    continue
                if age < unknown_after_s:
                    continue
            elif job.status == JobStatus.IN_PROGRESS and job.worker_id:
                owner_host, _, rest = job.worker_id.partition(":")
                pid = rest.partition(":")[0]
                if owner_host != host or (pid.isdigit() and _alive(int(pid))):
                    continue
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
        return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
