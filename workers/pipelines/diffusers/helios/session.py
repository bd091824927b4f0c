"""The per-session state of the Helios world adapter (``helios/adapter.py``) and its steering.

Everything a Helios session changes lives here, so one loaded ``HeliosPipeline`` serves
any number of sessions: the RNG, a private ``HeliosScheduler`` (its UniPC history is
state), the compressed history latents and the first-frame anchor, the chunk being
denoised, and the queued prompt changes with their text embeddings.

Prompt changes (``interact``) blend text embeddings, the only language input Helios has:
an event taking effect in chunk ``f`` with ``transition_chunks = n`` conditions chunk
``f + j`` (``j < n``) on ``lerp(before, new, (j + 1) / n)``, so the new prompt is whole in
the event's last chunk (``f + n - 1``, where ``events_for_chunk`` reports it completed),
as ``reference/world`` finishes its cross-fade on that chunk's last frame. ``n`` of 0 or 1
is a cut at chunk ``f``: a chunk's step is conditioned on one embedding, so there is
nothing finer to blend. Events blend in the order they were queued, each from what the
ones before it made.

The text embeddings are an input of every denoise step (the transformer's
``encoder_hidden_states``; diffusers' own loops let a ``callback_on_step_end`` replace
``prompt_embeds`` between two steps), so with the spec's ``interaction_at = "step"`` (the
family's default) an event queued while a step of the chunk under way is still to run
enters that chunk: ``f`` is that chunk, whose steps from the next one on (for the pyramid
pipeline, the next step of its stage or the first of the next stage) are conditioned on
the blend above, its earlier steps staying as they ran. Queued once the chunk's last step
has run, or with ``"chunk"``, it enters the next chunk, from its first step.

Between two chunks a session is :func:`session_snapshot`'s plain data (the adapter packs
it, ``snapshots.py``), from which :func:`restore_session` rebuilds it on another worker
to go on bit for bit: the history and the anchor, the RNG's state, the scheduler's
(UniPC's multistep history carries over from one chunk into the next, as in
``__call__``), the base prompt's embeddings and every queued event with its own and its
chunks (one that entered the chunk just taken, mid-chunk, included: the later chunks'
blends count from it). The embeddings are stored rather than encoded again from their
prompts: mostly zero padding, they compress to little, and the taker runs no text
encoder and depends on no encoder's determinism.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from models.model_spec import InteractionAt
from workers.pipelines.base import ChunkEvents, WorldConfig
from workers.pipelines.snapshots import object_state, set_object_state
from workers.pipelines.world_rules import (
    QueuedEvent,
    check_event_id,
    check_transition,
    enters_chunk_under_way,
    entry_chunk,
)

SNAPSHOT_VERSION = 1  # of session_snapshot's layout


@dataclass
class PromptEvent(QueuedEvent):
    """One ``interact`` call: the chunks it spans and its prompt's embeddings (encoded
    once, when it was queued; None for an event without a prompt)."""

    embeds: torch.Tensor | None

    def weight(self, chunk: int) -> float:
        """How much of the new prompt conditions ``chunk`` (0 before the event)."""
        if chunk < self.first_chunk:
            return 0.0
        span = max(1, self.transition_chunks)
        return min(1.0, (chunk - self.first_chunk + 1) / span)


@dataclass(kw_only=True)
class HeliosState:
    """One Helios session. Read ``chunk_index`` (the chunk being made), ``step_index``
    (its steps done), ``num_chunks``, ``steps_per_chunk``, ``prompt`` (the latest) and
    ``done``; the rest is the adapter's."""

    config: WorldConfig
    num_chunks: int
    steps_per_chunk: int
    guidance_scale: float
    do_cfg: bool
    generator: torch.Generator
    scheduler: Any  # this session's HeliosScheduler (set_timesteps at every chunk)
    sigmas: Any  # numpy: the unshifted schedule of every chunk
    mu: float  # the resolution-dependent shift of that schedule
    prompt: str
    prompt_embeds: torch.Tensor  # the embeddings the blends of later chunks start from
    negative_prompt_embeds: torch.Tensor | None
    history_latents: torch.Tensor  # the last sum(history_sizes) latent frames
    # The first-frame anchor (``latents_prefix``): the reference image's latents (I2V),
    # or None until the first chunk is made (then its first latent frame).
    image_latents: torch.Tensor | None
    chunk_index: int = 0
    step_index: int = 0
    events: list[PromptEvent] = field(default_factory=list)
    last_events: ChunkEvents | None = None
    # The chunk in progress (None between chunks).
    latents: torch.Tensor | None = None
    timesteps: torch.Tensor | None = None
    chunk_embeds: torch.Tensor | None = None
    history: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # short, mid, long
    # A HeliosPyramidPipeline session's place in the chunk's stages
    # (``helios_steps.PyramidStages``); None for HeliosPipeline.
    pyramid: Any = None

    @property
    def done(self) -> bool:
        """All chunks have been taken."""
        return self.chunk_index >= self.num_chunks

    @property
    def begun(self) -> bool:
        """A step of the current chunk has run."""
        return self.step_index > 0


def queue_event(
    state: HeliosState,
    event_id: str,
    transition_chunks: int,
    embeds: torch.Tensor | None,
    at: InteractionAt,
) -> None:
    """Queue an interaction from the chunk ``entry_chunk`` gives it (the rules of every
    world model); one that enters the chunk under way conditions its remaining steps."""
    first = entry_chunk(state, at)
    event = PromptEvent.queued(event_id, first, transition_chunks, embeds=embeds)
    state.events.append(event)
    # The chunk under way's embeddings are taken once it has begun: after a step of it
    # (``enters_chunk_under_way``), or at its first step, stopped in the transformer to
    # run again with this event (``restarts_step`` where the chunk has one step).
    begun = first == state.chunk_index and state.chunk_embeds is not None
    if embeds is not None and (enters_chunk_under_way(state, event) or begun):
        state.chunk_embeds = chunk_embeddings(state, first)


def check_event(state: HeliosState, event_id: Any, transition_chunks: Any) -> None:
    """Refuse what every world model refuses (``world_rules``): an empty or reused
    ``event_id``, a negative or non-integer ``transition_chunks``, a finished session."""
    check_event_id(event_id, (e.event_id for e in state.events))
    check_transition(transition_chunks, state.done)


def chunk_embeddings(state: HeliosState, chunk: int) -> torch.Tensor:
    """The text embeddings that condition ``chunk`` (see the module doc).

    An event whose new prompt is whole by ``chunk`` stays whole (weights only grow) and
    hides every event before it, so it becomes ``prompt_embeds`` and the blend of a long
    session runs over the few events still in transition."""
    embeds = state.prompt_embeds
    settled = -1
    for i, event in enumerate(state.events):
        if event.embeds is None:
            continue
        w = event.weight(chunk)
        if w >= 1.0:  # the new prompt's own embeddings, not a lerp rounding to them
            embeds, settled = event.embeds, i
        elif w > 0.0:
            embeds = torch.lerp(embeds, event.embeds, w)
    if settled >= 0:
        state.prompt_embeds = state.events[settled].embeds  # type: ignore[assignment]
        for event in state.events[: settled + 1]:
            event.embeds = None
    return embeds


def session_snapshot(state: HeliosState) -> dict[str, Any]:
    """What a session between chunks is beyond its config, as plain data."""
    if state.begun or state.latents is not None:
        raise RuntimeError(
            f"chunk {state.chunk_index} is under way: snapshots are taken between chunks"
        )
    return {
        "version": SNAPSHOT_VERSION,
        "chunk_index": state.chunk_index,
        "prompt": state.prompt,
        "prompt_embeds": state.prompt_embeds,
        "negative_prompt_embeds": state.negative_prompt_embeds,
        "history_latents": state.history_latents,
        "image_latents": state.image_latents,
        "generator": state.generator.get_state(),
        "scheduler": object_state(state.scheduler, skip=("_internal_dict",)),
        "events": [
            (e.event_id, e.first_chunk, e.last_chunk, e.transition_chunks, e.embeds)
            for e in state.events
        ],
        "last_events": state.last_events,
    }


def restore_session(state: HeliosState, saved: dict[str, Any]) -> None:
    """Put what :func:`session_snapshot` saved on ``state``, a session just built from the
    same config (its own scheduler copy and generator): it goes on from there."""
    if saved.get("version") != SNAPSHOT_VERSION:
        raise ValueError(
            f"a Helios snapshot of version {saved.get('version')!r}, not {SNAPSHOT_VERSION}"
        )
    history = saved["history_latents"]
    if history.shape != state.history_latents.shape:
        raise ValueError(
            f"the snapshot's history {tuple(history.shape)} is not this session's "
            f"{tuple(state.history_latents.shape)}"
        )
    state.chunk_index = int(saved["chunk_index"])
    state.prompt = saved["prompt"]
    state.prompt_embeds = saved["prompt_embeds"]
    state.negative_prompt_embeds = saved["negative_prompt_embeds"]
    state.history_latents = history
    state.image_latents = saved["image_latents"]
    state.generator.set_state(saved["generator"])
    set_object_state(state.scheduler, saved["scheduler"])
    state.events = [PromptEvent(*event) for event in saved["events"]]
    state.last_events = saved["last_events"]
