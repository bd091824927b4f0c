"""What an API replica keeps in Redis so that any replica can take a duplex ``/v1/realtime``
session over (``session.resume`` after its replica died): the protocol state a
:class:`realtime.audio_protocol.VoiceSessionProtocol` is rebuilt from, and where the relay of
the worker's outputs stood.

Not on the client wire: written by one API replica, read by another. Clock values are
wall-clock epoch seconds (monotonic clocks do not cross processes). Audio is not in the
snapshot: each content part's PCM16 lives beside it (``storage/session_state.py``), and
the snapshot says how many bytes of it belong to the conversation.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from models.realtime import ConversationItem, RealtimeSession
from models.realtime_video import VideoConfig

SNAPSHOT_VERSION = 1


class ItemState(BaseModel):
    item: ConversationItem
    # content index → bytes of PCM16 kept for it
    audio: dict[int, int] = Field(default_factory=dict)


class ResponseState(BaseModel):
    """The response in flight (``realtime.responses.ResponseRun``)."""

    id: str
    item_id: str
    output_index: int
    in_conversation: bool
    metadata: dict[str, str] | None = None
    transcript: str = ""
    audio_bytes: int = 0
    cancel_reason: Literal["turn_detected", "client_cancelled"] | None = None
    muted: bool = False
    cancel_deadline: float | None = None  # wall clock
    started_at: float = 0.0  # wall clock
    played_ms: int | None = None


class VoiceSessionSnapshot(BaseModel):
    version: Literal[1] = 1  # SNAPSHOT_VERSION
    session_id: str
    owner: str  # the API key owner: only they may resume
    model: str
    state: Literal["open", "detached", "closed"]
    resume_token: str
    session: RealtimeSession
    last_seq: int  # the last server_event_seq given out (and logged)
    responses: int = 0
    expires_at: float | None = None  # wall clock: max_session_s
    idle_deadline: float | None = None  # wall clock: turn_detection.idle_timeout_ms
    input_position: int = 0  # bytes of input audio appended so far
    items: list[ItemState] = Field(default_factory=list)  # conversation order
    active: ResponseState | None = None
    # The relay: placed on a worker, the worker admitted it, last ``out`` entry applied.
    placed: bool = False
    worker_admitted: bool = False
    out_cursor: str = "0-0"


class WorldSessionSnapshot(BaseModel):
    """A streaming ``/v1/realtime/video`` session, stored once ``video.start`` is due: the
    chunks themselves are in the session's ``out`` stream, so this is all another replica
    needs to resume it."""

    version: Literal[1] = 1
    session_id: str
    owner: str
    model: str
    resume_token: str
    config: VideoConfig
    default_transition: int | None = None
    event_ids: list[str] = Field(default_factory=list)  # interactions so far
    expires_at: float | None = None  # wall clock: max_session_s
