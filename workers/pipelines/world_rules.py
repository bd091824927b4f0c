"""What every world model refuses the same way (``WorldPipeline.start`` and ``interact``):
one copy for ``reference/world`` and the diffusers world adapters, so a session gets the
same error, naming the same field, whatever model serves it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from models.catalog import ModelSpec
from models.errors import DuplicateEventError, InvalidJobInput


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
