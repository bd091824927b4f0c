"""One job through a pipeline adapter, in process, as the executor drives it: ``prepare``,
every ``step``, a decode, and ``end`` whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from workers.pipelines.base import GenerationRequest, Media, Pipeline, StepState
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter


@contextmanager
def _stepped(adapter: Pipeline, request: GenerationRequest) -> Iterator[StepState]:
    """The job's state after its last step, for the caller to decode; ``end`` on exit."""
    state = adapter.prepare(request)
    try:
        while not state.done:
            adapter.step(state)
        yield state
    finally:
        adapter.end()


def run_job(adapter: Pipeline, request: GenerationRequest) -> Media:
    """One job: its decoded media."""
    with _stepped(adapter, request) as state:
        return adapter.decode(state)


def job_frames(adapter: DiffusersAdapter, request: GenerationRequest) -> np.ndarray:
    """One job on a diffusers adapter: its float frames (``decode_frames``)."""
    with _stepped(adapter, request) as state:
        return adapter.decode_frames(state)
