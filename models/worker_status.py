"""How a worker's start went, as it tells ``omniqueue up`` (``OMNIQ_WORKER__STATUS_FILE``,
written by ``workers/runtime/status_file.py``): ready, with the models it serves and the
reasons of those it could not load; or stopped, having loaded none. ``up`` says the
stack is up once every worker is ready or stopped, and names each reason."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class WorkerStatus(BaseModel):
    # ``ready``: it takes jobs (or sessions) now; ``stopped``: it loaded no model and exits.
    state: Literal["ready", "stopped"]
    # The models it serves (``ready``).
    models: list[str] = Field(default_factory=list)
    # Model → why it could not be loaded (one line, ``workers/pipelines/load_failure.py``).
    failed: dict[str, str] = Field(default_factory=dict)
