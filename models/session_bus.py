"""What the API and a worker say to each other about a realtime session, and how the API
places it: the only messages that cross that process boundary.

A session has two Redis Streams (``storage/constants.py``); each entry is one of these
models as JSON in its ``event`` field, plus raw bytes in ``data`` where a message carries
media (never base64 in the JSON)::

    oq:session:{id}:in   API → worker   SessionCommand
        keepalive                        both kinds; the first one creates the stream
        respond {response_id, turn}      voice; data: the user turn's PCM16 (or none)
        cancel {response_id, reason}     voice
        interaction {event_id, …}        world
        reference_image                  world; data: PNG fitted to the session size
        stop {reason}                    both kinds

    oq:session:{id}:out  worker → API   SessionOutput
        accepted {worker_id, attempt, lease_s}  a worker took the slot (admission)
        keepalive                        the worker is alive
        started                          world: the rollout began
        chunk {kind, …}                  world; data: one fMP4 fragment
        audio {response_id, …}           voice; data: PCM16 of one or more steps
        response_finished {…}            voice
        failed {code, message}           the message is safe to show the client
        finished {stopped, artifact_id}  the session ended on the worker

Placement is a Celery task whose one argument is a :data:`TaskPayload` as JSON: a
:class:`JobTask` (the job's row holds the rest) or a :class:`SessionTask` with the
session's config, one model per kind (:data:`SessionConfig`). A world session whose
worker died is placed again from its :class:`WorldCheckpoint`.

Parse with the module-level adapters (``COMMANDS``, ``OUTPUTS``, ``TASKS``): one
``validate_json`` per stream entry, no model rebuilt per message. Names end in
``Command`` / ``Output`` (the stream direction is the role) rather than ``Event``, which
the client-facing protocols use.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

# ------------------------------------------------------------------ commands (API → worker)


class KeepaliveCommand(BaseModel):
    """The API is still there (the worker stops a session it stops hearing from)."""

    type: Literal["keepalive"] = "keepalive"


class VoiceTurnSpec(BaseModel):
    """What a voice response answers, beside the turn's audio (in the entry's data)."""

    text: str | None = None
    voice: str = "alloy"
    speed: float = 1.0
    instructions: str | None = None


class RespondCommand(BaseModel):
    """Generate a response to ``turn``; the entry's data holds the turn's PCM16."""

    type: Literal["respond"] = "respond"
    response_id: str
    turn: VoiceTurnSpec


class CancelCommand(BaseModel):
    """Stop a response at the next model step (system-class)."""

    type: Literal["cancel"] = "cancel"
    response_id: str
    reason: str


class InteractionCommand(BaseModel):
    """A prompt or camera change of a world session, applied from a later chunk."""

    type: Literal["interaction"] = "interaction"
    event_id: str
    prompt: str | None = None
    camera: str | None = None  # the w/a/s/d keys held, e.g. "wd"
    transition_chunks: int | None = None  # None: the model's default transition


class ReferenceImageCommand(BaseModel):
    """The first frame of a world session; the entry's data holds it as PNG."""

    type: Literal["reference_image"] = "reference_image"


class StopCommand(BaseModel):
    """End the session at the next step boundary and free its slot (system-class)."""

    type: Literal["stop"] = "stop"
    reason: str | None = None


# ------------------------------------------------------------------ outputs (worker → API)


class AcceptedOutput(BaseModel):
    """A worker took the session on one of its slots (placement ``attempt``: more than 1
    when it takes over a world session whose worker died). With ``lease_s`` it holds the
    session's lease of that attempt (``workers/sessions/lease.py``) while its process
    lives, renewed within ``lease_s``."""

    type: Literal["accepted"] = "accepted"
    worker_id: str
    attempt: int = 1
    lease_s: float | None = None


class KeepaliveOutput(BaseModel):
    """The worker is still there (the API ends a session whose worker falls silent)."""

    type: Literal["keepalive"] = "keepalive"


class StartedOutput(BaseModel):
    """A world session's rollout began."""

    type: Literal["started"] = "started"


class ChunkOutput(BaseModel):
    """One fMP4 fragment of a world session (the entry's data): a media chunk, or the
    trailer after the last one."""

    type: Literal["chunk"] = "chunk"
    kind: Literal["media", "trailer"]
    produced_at: float  # the worker's wall clock
    generation_chunk_index: int | None = None  # media only: 0, 1, 2…
    num_frames: int = 0
    started_event_ids: list[str] = Field(default_factory=list)
    active_event_ids: list[str] = Field(default_factory=list)
    completed_event_ids: list[str] = Field(default_factory=list)


class ResponseAudioOutput(BaseModel):
    """One step of a voice response: PCM16 in the entry's data, its transcript text."""

    type: Literal["audio"] = "audio"
    response_id: str
    produced_at: float | None = None  # the worker's wall clock
    text: str | None = None


class ResponseFinishedOutput(BaseModel):
    """A voice response ended (``completed``, ``cancelled`` or ``failed``)."""

    type: Literal["response_finished"] = "response_finished"
    response_id: str
    status: str
    audio_ms: int = 0
    transcript: str = ""


class FailedOutput(BaseModel):
    """The session failed on the worker; ``message`` is safe to show the client."""

    type: Literal["failed"] = "failed"
    code: str
    message: str


class FinishedOutput(BaseModel):
    """The session ended on the worker and its slot is free."""

    type: Literal["finished"] = "finished"
    stopped: bool = False
    artifact_id: str | None = None  # a world session persisted to S3


# ------------------------------------------------------------------ placement (Celery)


class VoiceSessionConfig(BaseModel):
    """A ``WS /v1/realtime`` session: the voice model answers turns."""

    kind: Literal["voice"] = "voice"
    model: str
    owner: str
    sample_rate: int = 24000


class WorldSessionConfig(BaseModel):
    """A ``WS /v1/realtime/video`` session, as the API resolved its ``session.start``."""

    kind: Literal["world"] = "world"
    model: str
    owner: str
    prompt: str
    negative_prompt: str | None = None
    width: int
    height: int
    num_frames: int
    fps: float
    seed: int
    # denoise steps of each chunk (None: the world pipeline's own default)
    num_inference_steps: int | None = None
    # ``session.start.extra_params`` as sent (keys beyond the known ones are the model's)
    extra_params: dict[str, Any] = Field(default_factory=dict)


SessionConfig = Annotated[VoiceSessionConfig | WorldSessionConfig, Field(discriminator="kind")]


class JobTask(BaseModel):
    """Run a stored job (its row holds everything else). Under fair share the worker
    may run another queued job of ``model`` instead (``storage/fair_share.py``): the
    model travels with the message, so even one whose job was deleted runs the next."""

    kind: Literal["job"] = "job"
    job_id: str
    model: str


class SessionTask(BaseModel):
    """Start a realtime session on a free slot of the model's realtime queue; from its
    checkpoint when ``attempt`` > 1 (a world session whose worker died, taken over)."""

    kind: Literal["session"] = "session"
    session_id: str
    config: SessionConfig
    attempt: int = 1  # the placement: 1, then one more per takeover


class WorldCheckpoint(BaseModel):
    """Where a world session stood after the last chunk its worker sent: stored with that
    chunk (``storage/session_checkpoint.py``), beside the init segment of its fMP4 stream
    and the pipeline's snapshot of its state, for the worker that takes it over. The API
    re-places the session with ``config``."""

    config: WorldSessionConfig
    chunks: int  # media chunks sent: the taker makes chunk ``chunks`` next
    frames: int  # frames in the fMP4 fragments sent
    fragments: int  # fMP4 fragments sent
    commands_after: str  # the last ``in`` stream entry applied: the taker reads on from it


# ------------------------------------------------------------------ unions and their parsers

SessionCommand = Annotated[
    KeepaliveCommand
    | RespondCommand
    | CancelCommand
    | InteractionCommand
    | ReferenceImageCommand
    | StopCommand,
    Field(discriminator="type"),
]

SessionOutput = Annotated[
    AcceptedOutput
    | KeepaliveOutput
    | StartedOutput
    | ChunkOutput
    | ResponseAudioOutput
    | ResponseFinishedOutput
    | FailedOutput
    | FinishedOutput,
    Field(discriminator="type"),
]

TaskPayload = Annotated[JobTask | SessionTask, Field(discriminator="kind")]

COMMANDS: TypeAdapter[SessionCommand] = TypeAdapter(SessionCommand)
OUTPUTS: TypeAdapter[SessionOutput] = TypeAdapter(SessionOutput)
TASKS: TypeAdapter[TaskPayload] = TypeAdapter(TaskPayload)
