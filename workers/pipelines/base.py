"""The pipeline adapter interfaces: what the worker drives, one per kind of served model.

A served model's kind follows from its spec (``ModelSpec.kind``), and the registry
(``workers/pipelines/registry.py``) hands each caller an adapter of that kind's interface:

* ``job`` (:class:`Pipeline`): a video or audio clip for ``/v1/videos`` and
  ``/v1/audio/generations``, run by the step executor (``workers/jobs/executor.py``)::

      state = pipe.prepare(request)
      while state.step_index < state.num_steps:
          pipe.step(state)          # exactly one denoise step; advances state.step_index
          ...                       # executor: cancel check, progress, deadline, preview
      media = pipe.decode(state)

* ``world`` (:class:`WorldPipeline`): a steerable video stream for ``WS
  /v1/realtime/video``, run chunk by chunk by ``workers/sessions/world.py``.
* ``voice`` (:class:`VoicePipeline`): spoken answers to user turns for ``WS
  /v1/realtime``, run step by step by ``workers/sessions/voice.py``.

What an adapter can do beyond its kind's interface (serve per-request LoRA, warm up,
preview a job, stream its PCM or its decode, batch several jobs' steps, hand a world
session over to another worker, run a world chunk's last step again for an interaction,
hand a world chunk's frames out as they decode) is a capability: a ``Protocol`` at the end of
this module that its callers check with ``isinstance``.

An adapter is loaded once per worker process and shared by every job or session it runs,
so all per-request state (latents, scheduler copy, RNG, embeddings) lives in the state
object its first call returns, never on the adapter. A new model is one adapter module
against one of these classes (``docs/adapters.md``); nothing here or in the runners comes
from a reference pipeline.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, Self, TypeVar, runtime_checkable

import numpy as np

from models.catalog import ModelSpec
from models.job_specs import LoraSpec
from models.memory_plan import MemoryReport
from models.registry import ServedModel
from workers.media.frames import DecodeStream as DecodeStream
from workers.media.frames import Media as Media
from workers.media.frames import SupportsDecodeStream as SupportsDecodeStream
from workers.pipelines.request import GenerationRequest as GenerationRequest
from workers.pipelines.request import MediaReference as MediaReference

# Set by the executor around a long call (prepare, decode); adapters call ``checkpoint()``.
_checkpoint: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "omniq_checkpoint", default=None
)


def checkpoint() -> None:
    """A point inside a long adapter call where the job may stop (cancel, deadline).

    Adapters call it between the pieces of ``prepare`` and ``decode`` (render chunks, VAE
    blocks, text-encoder layers), so a cancel need not wait out the whole call. It raises
    the executor's stop exception when the job is no longer to run, and does nothing
    outside a job (tests, sessions)."""
    check = _checkpoint.get()
    if check is not None:
        check()


def checkpoint_check() -> Callable[[], None] | None:
    """The check ``checkpoint()`` runs in this context, or None outside a job's or a
    session's long call (a block hook then does nothing more: tests, a bare call)."""
    return _checkpoint.get()


@contextlib.contextmanager
def checkpoints(check: Callable[[], None]) -> Iterator[None]:
    """Make ``checkpoint()`` call ``check`` in this context (the executor's job thread)."""
    token = _checkpoint.set(check)
    try:
        yield
    finally:
        _checkpoint.reset(token)


# Set by the executor around each denoise step (and by a worker group's other ranks):
# why the job must stop now, or None. Asked before every block of the denoiser with the
# block's number in the step (from 1; asked again with the same number while waiting).
StopReason = Callable[[int], BaseException | None]
_step_stop: contextvars.ContextVar[StopReason | None] = contextvars.ContextVar(
    "omniq_step_stop", default=None
)


def step_stop() -> StopReason | None:
    """The stop question of the denoise step running in this context, or None outside one
    (a block hook then does nothing: sessions, tests, a bare ``step`` call)."""
    return _step_stop.get()


@contextlib.contextmanager
def step_stops(reason: StopReason) -> Iterator[None]:
    """Run one denoise step whose blocks may stop it: ``reason(block)`` answers, before
    each transformer block, the exception to stop with (cancel, deadline) or None. It must
    be cheap (a flag and a clock read): it runs some 30-60 times a step."""
    token = _step_stop.set(reason)
    try:
        yield
    finally:
        _step_stop.reset(token)


@contextlib.contextmanager
def outside_step() -> Iterator[None]:
    """Run code as outside a job: no stop question, no checkpoint (the block hooks do
    nothing). For work the step must not interrupt midway: a CUDA graph's capture, where
    the gates' pacing would wait on events a capturing stream refuses."""
    stop, check = _step_stop.set(None), _checkpoint.set(None)
    try:
        yield
    finally:
        _checkpoint.reset(check)
        _step_stop.reset(stop)


@dataclass
class StepState:
    """Base of every per-request state; adapters subclass it."""

    num_steps: int
    step_index: int = 0

    @property
    def done(self) -> bool:
        return self.step_index >= self.num_steps


# --- what every adapter declares ----------------------------------------------------------


class Adapter(abc.ABC):
    """The contract every adapter has, whatever its kind: how the registry builds it and
    loads it. What an adapter can do beyond its interface is a capability below
    (:class:`SupportsWarmUp`, :class:`SupportsLoRA`, …), a ``Protocol`` its callers check
    with ``isinstance``; :class:`~workers.pipelines.registry.PipelineRegistry` uses nothing
    else (no ``getattr``, no signature reading)."""

    spec: ModelSpec

    @classmethod
    def build(cls, model: ServedModel) -> Self:
        """The adapter of a registry entry, not loaded yet. By default
        ``cls(path=…, dtype=…, spec=…, **adapter_options)``."""
        make: Any = cls  # subclasses define the constructor this calls
        built: Self = make(
            path=model.path, dtype=model.dtype, spec=model.spec, **model.adapter_options
        )
        return built

    @abc.abstractmethod
    def load(self, device: str) -> None:
        """Load weights onto ``device`` (called once per worker process)."""


class NoWeights:
    """Mixed in before the interface by adapters without weights (the built-in reference
    models): built from ``adapter_options`` alone."""

    @classmethod
    def build(cls, model: ServedModel) -> Self:
        return cls(**model.adapter_options)


# --- job: a clip, one denoise step at a time ---------------------------------------------


class Pipeline(Adapter):
    """A diffusion pipeline run one denoise step at a time."""

    @abc.abstractmethod
    def prepare(self, request: GenerationRequest) -> StepState:
        """Encode the prompt, draw the initial noise; return the per-request state."""

    @abc.abstractmethod
    def step(self, state: StepState) -> None:
        """Run exactly one denoise step and advance ``state.step_index``."""

    @abc.abstractmethod
    def decode(self, state: StepState) -> Media:
        """Turn the final latents into frames (and audio)."""

    def end(self) -> None:
        """The job ended, whichever way (completed, cancelled, failed, lost): let go of
        what it held outside its state (a worker group's other ranks drop theirs)."""
        return None


# --- world: a steerable video stream, one chunk at a time --------------------------------

StateT = TypeVar("StateT")  # an adapter's own per-session (world) or per-response (voice) state
ActionBlock = Sequence[Sequence[str]]  # one chunk: three per-latent-frame action lists
ActionScript = Sequence[ActionBlock]
# Event ids of one chunk: (started in it, active in it, completed in it).
ChunkEvents = tuple[list[str], list[str], list[str]]


@dataclass
class WorldConfig:
    """What a session starts from (``session.start`` after the server resolved it)."""

    prompt: str
    width: int
    height: int
    num_frames: int  # the adapter may round it down to its chunk lattice
    fps: float
    seed: int
    negative_prompt: str | None = None
    # One entry per chunk, each three per-latent-frame lists of "w"/"a"/"s"/"d";
    # None, or fewer entries than chunks: the camera holds where the script has none.
    camera_action_script: ActionScript | None = None
    reference_image: np.ndarray | None = None  # uint8 height×width×3: the first frame
    steps_per_chunk: int = 4
    flow_shift: float = 3.0  # shift of the sigma schedule
    # ``session.start.extra_params`` as the client sent them (keys beyond the ones above
    # are the adapter's own; it ignores or refuses what it does not know).
    extra: dict[str, Any] = field(default_factory=dict)


class WorldPipeline(Adapter, Generic[StateT]):
    """A world model streamed in chunks, steered between them (``WS /v1/realtime/video``).

    The session runner owns the loop and checks stop, stall and deadlines between calls::

        state = pipe.start(config)
        for _ in range(pipe.num_chunks(state)):
            while not pipe.chunk_done(state):
                pipe.step(state)                        # one denoise step of this chunk
            frames = pipe.take_chunk(state)             # uint8 T×H×W×3
            started, active, completed = pipe.events_for_chunk(state)
            data = pipe.snapshot(state)                 # a SupportsSnapshot model's

    ``interact`` may come at any point between those calls. Raise ``ValueError`` for a
    config (``start``) or an interaction the model refuses: the runner fails the session
    as ``invalid_request`` or ignores the interaction, respectively. A worker that takes
    over a session whose worker died (a :class:`SupportsSnapshot` model's) begins with
    ``state = pipe.restore(config, data)``.
    """

    @abc.abstractmethod
    def start(self, config: WorldConfig) -> StateT:
        """Check the config and return the session's state (cheap: render nothing yet)."""

    @abc.abstractmethod
    def num_chunks(self, state: StateT) -> int:
        """How many chunks the session has."""

    @abc.abstractmethod
    def chunk_done(self, state: StateT) -> bool:
        """All steps of the current chunk have run: ``take_chunk`` may be called."""

    @abc.abstractmethod
    def step(self, state: StateT) -> None:
        """Run one denoise step of the current chunk."""

    @abc.abstractmethod
    def take_chunk(self, state: StateT) -> np.ndarray:
        """The finished chunk's frames (uint8 T×H×W×3); move on to the next chunk."""

    @abc.abstractmethod
    def events_for_chunk(self, state: StateT) -> ChunkEvents:
        """Ids of the interactions started, active and completed in the chunk
        ``take_chunk`` returned last."""

    @abc.abstractmethod
    def interact(
        self,
        state: StateT,
        prompt: str | None,
        camera: str | ActionBlock | None,
        transition_chunks: int,
        event_id: str,
    ) -> None:
        """Queue a prompt and/or camera change, blended in over ``transition_chunks``
        chunks (0: a cut); None keeps that part. It enters the first chunk not yet begun,
        or, where the spec says ``interaction_at = "step"``, the chunk under way while one
        of its steps is left, whose remaining steps it then conditions
        (``world_rules.entry_chunk``); the chunk it entered reports it started. A
        :class:`SupportsStepRestart` pipeline's runner may also abort the chunk's last
        step to call this, then run that step again, which the interaction conditions."""


# --- voice: spoken answers, one audio step at a time --------------------------------------


@dataclass
class VoiceTurn:
    """The user turn a response answers."""

    pcm16: bytes  # the user's audio of that turn (PCM16 LE mono at the pipeline's rate), or b""
    text: str | None  # the user's text (input_text), if any
    voice: str  # OpenAI voice name
    speed: float  # 0.25-1.5
    instructions: str | None


@dataclass
class VoiceChunk:
    """One step of a response: its audio and, when a word starts in it, transcript text."""

    pcm16: bytes
    text: str | None = None


class VoicePipeline(Adapter, Generic[StateT]):
    """A voice model answering one user turn at a time, one audio step at a time.

    The voice session runner owns the loop; a cancel (barge-in, ``response.cancel``)
    lands within one step::

        state = pipe.start_response(turn)
        while not pipe.done(state):
            chunk = pipe.step(state)   # step_ms of PCM16 (the last step may be shorter)
            ...                        # runner: drain commands, pace to real time, publish
    """

    sample_rate: int = 24000  # of the PCM16 in and out
    step_ms: int = 40

    @abc.abstractmethod
    def start_response(self, turn: VoiceTurn) -> StateT:
        """Plan the answer to ``turn``; return the per-response state."""

    @abc.abstractmethod
    def step(self, state: StateT) -> VoiceChunk:
        """Produce the next ``step_ms`` of audio (+ transcript delta)."""

    @abc.abstractmethod
    def done(self, state: StateT) -> bool:
        """Whether the response has no more audio."""


AnyPipeline = Pipeline | WorldPipeline[Any] | VoicePipeline[Any]


# --- capabilities: what an adapter can do beyond its interface ----------------------------
#
# Each is a Protocol its callers check with ``isinstance`` (an adapter has the capability
# when it has the methods): nothing here names an implementation, and an adapter without a
# capability has no method for it, neither a default nor one that only refuses.


class LoraSlot(Protocol):
    """Per-request LoRA as the registry hands it to an adapter (the diffusers families'
    LoRA cache): a slot put into the loaded pipe once, a job's adapter copied into it for
    the job (None: the base model), parked again when the job ends."""

    def install(self, pipe: Any) -> None: ...

    def activate(self, pipe: Any, lora: LoraSpec | None) -> None: ...

    def release(self, pipe: Any) -> None: ...


@runtime_checkable
class SupportsLoRA(Protocol):
    """Serves per-request LoRA: the registry calls ``use_lora`` before ``load`` for a model
    whose spec ``supports_lora`` (a model that lists ``lora`` with an adapter without it
    does not start)."""

    def use_lora(self, cache: LoraSlot) -> None: ...


@runtime_checkable
class SupportsWarmUp(Protocol):
    """Primes what the first request would otherwise pay for (compiled blocks for the
    registry's ``warmup`` shapes): the registry calls ``warm_up`` once loaded, before the
    worker takes work."""

    def warm_up(self) -> None: ...


@runtime_checkable
class SupportsMemoryPlan(Protocol):
    """Applies a registry entry's memory plan (``quantization``, ``offload``) at ``load``;
    ``memory_report`` says what it did (the FP8 layers, the bytes saved), which the worker
    logs and publishes for ``/v1/models``. A model with a plan whose adapter is not one is
    refused at load."""

    def memory_report(self) -> MemoryReport | None: ...


@runtime_checkable
class SupportsPreview(Protocol):
    """A job adapter with a cheap estimate of the current result between steps (the
    executor's ``preview`` events)."""

    def preview(self, state: StepState) -> np.ndarray | None:
        """A uint8 H×W×3 estimate, or None when there is none at this step."""
        ...


@runtime_checkable
class SupportsAudioPieces(Protocol):
    """A job adapter whose steps make the clip piece by piece (``reference/speech``: a
    phrase per step). The executor calls ``take_audio`` after every step of a job that
    streams PCM and publishes what it gets at once; the adapter's ``decode`` audio must be
    exactly these pieces joined."""

    def take_audio(self, state: StepState) -> tuple[np.ndarray, int] | None:
        """The audio made since the last call as float32 (channels, n) and its sample
        rate; None when this step made none."""
        ...


@runtime_checkable
class SupportsStepBatch(Protocol):
    """A job adapter whose denoise step can run for several jobs at once, as one batched
    model call (continuous batching: a worker with ``OMNIQ_WORKER__BATCH_SIZE`` above 1
    runs that many of the model's jobs together, ``workers/jobs/batcher.py``). Each job
    keeps its own state, seed, scheduler and loop; only the model's forward is shared, so
    a batched job's output may differ from the same job alone in the last bits (the
    adapter documents its bound)."""

    def step_batch(self, states: Sequence[StepState]) -> None:
        """One denoise step of each of ``states`` (each at its own step; one state or
        several), advancing each one's ``step_index``; what ``step`` of each would do, up
        to rounding."""
        ...

    def warm_up_batch(self, size: int) -> None:
        """Prime ``step_batch`` for up to ``size`` jobs (compiled blocks at a batch of
        several), once, before the worker takes jobs."""
        ...


@runtime_checkable
class SupportsSnapshot(Protocol):
    """A world pipeline whose sessions outlive their worker: the runner stores a snapshot
    with every chunk it sends (``workers/sessions/world_checkpoint.py``), and a worker that
    takes a session over goes on from the last one. Without it a session whose worker
    dies ends."""

    def snapshot(self, state: Any) -> bytes:
        """The session between two chunks (after ``take_chunk``, before the next ``step``)
        as bytes from which :meth:`restore` on another worker goes on bit for bit
        (``snapshots.pack``)."""
        ...

    def restore(self, config: WorldConfig, data: bytes) -> Any:
        """The session :meth:`snapshot` made, on this adapter: ``config`` is the one the
        session started from, ``reference_image`` left out (it is in the state)."""
        ...


@runtime_checkable
class SupportsSnapshotLater(Protocol):
    """A :class:`SupportsSnapshot` model whose snapshot is taken in two halves, so that the
    costly one runs off the device's thread: :meth:`capture_snapshot` on it, between
    chunks (references and device-to-host copies: a millisecond), and the callable it
    returns on the session's delivery lane (the packing: serialise and compress). The
    callable's bytes are what :meth:`SupportsSnapshot.snapshot` would have returned then."""

    def capture_snapshot(self, state: Any) -> Callable[[], bytes]: ...


@runtime_checkable
class SupportsStepRestart(Protocol):
    """A world pipeline whose chunk's last denoise step, stopped at a block gate, leaves
    the session as it was before the step (what the step consumed before its forward,
    the chunk's noise, a stage's renoising, is kept and not drawn again), so the step may
    run again. The runner then restarts it when an interaction arrives while it runs
    (``workers/sessions/world.py``): the interaction enters that chunk, conditioning the
    step run again, instead of the next one; the chunk is the one it would have made
    with the interaction read just before that step."""

    def restarts_step(self, state: Any) -> bool:
        """Whether the step of ``state`` in flight (asked from inside it, at a block
        gate) is its chunk's last and would run again, an interaction read then entering
        its chunk (False where the spec's ``interaction_at`` is ``"chunk"``)."""
        ...


@runtime_checkable
class SupportsChunkStream(Protocol):
    """A world pipeline whose chunk leaves the device as it decodes: the session's
    delivery lane encodes each piece while the next decodes (``workers/sessions/world.py``),
    so only the last piece's encode follows the decode."""

    def stream_chunk(self, state: Any) -> Iterator[np.ndarray]:
        """``take_chunk`` in pieces: the session moves on to the next chunk at the call;
        the iterator decodes and yields uint8 T×H×W×3 pieces which, concatenated, are
        ``take_chunk``'s frames bit for bit. Read it to its end within the device's turn
        (the decoder is the worker's); a stop at a cancel point inside it ends it."""
        ...
