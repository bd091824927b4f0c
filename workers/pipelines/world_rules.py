"""What every world model refuses the same way (``WorldPipeline.start`` and ``interact``),
and the chunks an interaction is active in: one copy for ``reference/world`` and the
diffusers world adapters, so a session gets the same error, naming the same field, and
the same timing, whatever model serves it.

Where an interaction enters (:func:`entry_chunk`): a model whose spec says
``interaction_at = "step"`` takes it into the chunk under way, whose denoise steps still
to run are conditioned on it, as long as one is left; otherwise (that chunk's last step
has run, or the model says ``"chunk"``) it enters the first chunk not yet begun. Either
way it is *started* in exactly one chunk, the one it entered, and *active* and
*completed* count from there (:meth:`QueuedEvent.queued`, :func:`events_in_chunk`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

from models.catalog import ModelSpec
from models.errors import DuplicateEventError, InvalidJobInput
from models.model_spec import InteractionAt
from workers.pipelines.base import ChunkEvents


@dataclass
class QueuedEvent:
    """One ``interact`` call's place in its session (each model adds what it carries)."""

    event_id: str
    first_chunk: int  # the chunk it takes effect in (``entry_chunk`` when queued)
    last_chunk: int  # the chunk its transition ends in
    transition_chunks: int

    @classmethod
    def queued(cls, event_id: str, first_chunk: int, transition_chunks: int, **fields: Any) -> Self:
        """An event queued now, with its own ``fields``: from chunk ``first_chunk`` (see
        :func:`entry_chunk`), ``max(1, transition_chunks)`` chunks active. One whose first
        chunk is past the session's last never shows up."""
        last = first_chunk + max(1, transition_chunks) - 1
        return cls(event_id, first_chunk, last, transition_chunks, **fields)


def check_prompt(prompt: Any, field: str = "prompt") -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidJobInput(f"{field} must be a non-empty string")


def check_size(spec: ModelSpec, width: int, height: int) -> None:
    """``width`` and ``height`` on the model's size lattice, within its bounds."""
    for name, value, top in (("width", width, spec.max_width), ("height", height, spec.max_height)):
        if not spec.min_size <= value <= top or value % spec.size_multiple:
            raise InvalidJobInput(
                f"{name} must be a multiple of {spec.size_multiple} in "
                f"[{spec.min_size}, {top}], got {value}"
            )


def check_event_id(event_id: Any, used: Iterable[str]) -> None:
    """A non-empty ``event_id`` this session has not used yet."""
    if not isinstance(event_id, str) or not event_id:
        raise InvalidJobInput("event_id must be a non-empty string")
    if event_id in set(used):
        raise DuplicateEventError(f"event_id {event_id!r} was already used in this session")


def check_transition(transition_chunks: Any, done: bool) -> None:
    """A whole ``transition_chunks`` ≥ 0, for a session still running."""
    if (
        isinstance(transition_chunks, bool)
        or not isinstance(transition_chunks, int)
        or transition_chunks < 0
    ):
        raise InvalidJobInput(
            f"transition_chunks must be an integer >= 0, got {transition_chunks!r}"
        )
    if done:
        raise RuntimeError("the session has finished")


def events_in_chunk(events: Sequence[QueuedEvent], chunk: int) -> ChunkEvents:
    """(started, active, completed) event ids of ``chunk``, in queue order."""
    return (
        [e.event_id for e in events if e.first_chunk == chunk],
        [e.event_id for e in events if e.first_chunk <= chunk <= e.last_chunk],
        [e.event_id for e in events if e.last_chunk == chunk],
    )


class ChunkedSession(Protocol):
    """What a world pipeline's state shares with every other: the chunk being made, the
    steps done in it (of ``steps_per_chunk``), its queued events and the events of the
    chunk taken last."""

    chunk_index: int
    step_index: int
    steps_per_chunk: int
    last_events: ChunkEvents | None

    @property
    def events(self) -> Sequence[QueuedEvent]: ...


def entry_chunk(state: ChunkedSession, at: InteractionAt) -> int:
    """The chunk an interaction queued now enters: the chunk under way if none of its
    steps has run, or (``at == "step"``) if one of its steps is still to run, which the
    interaction then conditions; else the chunk after it."""
    if state.step_index == 0:
        return state.chunk_index
    if at == "step" and state.step_index < state.steps_per_chunk:
        return state.chunk_index
    return state.chunk_index + 1


def enters_chunk_under_way(state: ChunkedSession, event: QueuedEvent) -> bool:
    """``event`` entered the chunk under way after a step of it ran: the adapter
    conditions that chunk's remaining steps on it now."""
    return event.first_chunk == state.chunk_index and state.step_index > 0


def end_chunk(state: ChunkedSession) -> None:
    """The chunk under way was taken (``take_chunk``): its events are recorded and the
    next chunk begins, at step 0."""
    state.last_events = events_in_chunk(state.events, state.chunk_index)
    state.chunk_index += 1
    state.step_index = 0


def last_chunk_events(state: ChunkedSession) -> ChunkEvents:
    """(started, active, completed) event ids of the chunk taken last (copies)."""
    if state.last_events is None:
        raise RuntimeError("no chunk has been taken yet")
    started, active, completed = state.last_events
    return list(started), list(active), list(completed)
