"""Wire schemas of ``WS /v1/realtime``: the OpenAI Realtime API (GA), plus the duplex
extension of ``docs/protocols/realtime-audio.md``.

OpenAI fields first, omniqueue extensions after. Client events are parsed leniently
(unknown fields are ignored, as the OpenAI server does for forward compatibility), but
every value omniqueue acts on is typed; anything it cannot honour is refused with an
``error`` event naming the ``param``. ``session.update``'s session object is the
exception: an unknown key there is refused by name (``realtime/session_config.py``),
since a dropped setting (``turn_detection``) silently changes the session. Server
events are built from the models below and checked in the tests against the OpenAI SDK's
own types (``openai.types.realtime``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")
SAMPLE_RATE = 24000


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --------------------------------------------------------------------------- session


class AudioFormat(_Wire):
    type: str = "audio/pcm"
    rate: int | None = SAMPLE_RATE


class TurnDetection(_Wire):
    type: str = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = Field(None, ge=5_000, le=30_000)


class SessionAudioInput(_Wire):
    format: AudioFormat = Field(default_factory=AudioFormat)
    turn_detection: TurnDetection | None = Field(default_factory=TurnDetection)
    transcription: dict[str, Any] | None = None
    noise_reduction: dict[str, Any] | None = None


class SessionAudioOutput(_Wire):
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: str = "alloy"
    speed: float = Field(1.0, ge=0.25, le=1.5)


class SessionAudio(_Wire):
    input: SessionAudioInput = Field(default_factory=SessionAudioInput)
    output: SessionAudioOutput = Field(default_factory=SessionAudioOutput)


class Capabilities(_Wire):
    supports_barge_in: bool = True
    supports_playback_ack: bool = True
    supports_session_resume: bool = True


class RealtimeSession(_Wire):
    """The session object of ``session.created`` / ``session.updated``."""

    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str
    model: str
    output_modalities: list[str] = Field(default_factory=lambda: ["audio"])
    instructions: str = ""
    audio: SessionAudio = Field(default_factory=SessionAudio)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str = "auto"
    max_output_tokens: int | Literal["inf"] = "inf"
    # Duplex extension (absent in plain /v1/realtime sessions).
    capabilities: Capabilities | None = None
    resume_token: str | None = None


# --------------------------------------------------------------------------- items


class ContentPart(_Wire):
    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None  # base64 PCM16
    transcript: str | None = None


class ConversationItem(_Wire):
    id: str | None = None
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["message", "function_call", "function_call_output"] = "message"
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] = Field(default_factory=list)
    # function_call / function_call_output
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


# --------------------------------------------------------------------------- responses


class StatusError(_Wire):
    type: str
    code: str | None = None
    message: str | None = None


class StatusDetails(_Wire):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: (
        Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None
    ) = None
    error: StatusError | None = None


class Usage(_Wire):
    """omniqueue does not tokenize audio: one "token" is 100 ms of audio (docs/api.md)."""

    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: dict[str, int] = Field(
        default_factory=lambda: {"text_tokens": 0, "audio_tokens": 0, "cached_tokens": 0}
    )
    output_token_details: dict[str, int] = Field(
        default_factory=lambda: {"text_tokens": 0, "audio_tokens": 0}
    )


class RealtimeResponse(_Wire):
    object: Literal["realtime.response"] = "realtime.response"
    id: str
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]
    status_details: StatusDetails | None = None
    output: list[ConversationItem] = Field(default_factory=list)
    conversation_id: str | None = None
    output_modalities: list[str] = Field(default_factory=lambda: ["audio"])
    audio: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    usage: Usage | None = None


class ResponseOverrides(_Wire):
    """``response.create {response}``: per-response overrides."""

    instructions: str | None = None
    conversation: str = "auto"
    output_modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    input: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    max_output_tokens: int | Literal["inf"] | None = None


# --------------------------------------------------------------------------- client events


class ClientEvent(_Wire):
    type: str
    event_id: str | None = None


class SessionUpdateEvent(ClientEvent):
    type: Literal["session.update"]
    session: dict[str, Any]


class InputAudioBufferAppendEvent(ClientEvent):
    type: Literal["input_audio_buffer.append"]
    audio: str


class InputAudioBufferCommitEvent(ClientEvent):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClearEvent(ClientEvent):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreateEvent(ClientEvent):
    type: Literal["conversation.item.create"]
    item: ConversationItem
    previous_item_id: str | None = None


class _ItemRefEvent(ClientEvent):
    """A client event about one conversation item, named by ``item_id``."""

    item_id: str


class ConversationItemRetrieveEvent(_ItemRefEvent):
    type: Literal["conversation.item.retrieve"]


class ConversationItemDeleteEvent(_ItemRefEvent):
    type: Literal["conversation.item.delete"]


class ConversationItemTruncateEvent(_ItemRefEvent):
    type: Literal["conversation.item.truncate"]
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseCreateEvent(ClientEvent):
    type: Literal["response.create"]
    response: ResponseOverrides | None = None


class ResponseCancelEvent(ClientEvent):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioBufferClearEvent(ClientEvent):
    type: Literal["output_audio_buffer.clear"]


# Duplex extension.
class SessionHeartbeatEvent(ClientEvent):
    type: Literal["session.heartbeat"]


class SessionCloseEvent(ClientEvent):
    type: Literal["session.close"]
    reason: str | None = None


class SessionResumeEvent(ClientEvent):
    type: Literal["session.resume"]
    session_id: str
    resume_token: str
    last_received_server_event_seq: int = Field(ge=0)


class PlaybackAckEvent(ClientEvent):
    type: Literal["playback.ack"]
    played_ms: int = Field(ge=0)
    response_id: str | None = None
    item_id: str | None = None


CLIENT_EVENTS: dict[str, type[ClientEvent]] = {
    cls.model_fields["type"].annotation.__args__[0]: cls  # type: ignore[union-attr]
    for cls in (
        SessionUpdateEvent,
        InputAudioBufferAppendEvent,
        InputAudioBufferCommitEvent,
        InputAudioBufferClearEvent,
        ConversationItemCreateEvent,
        ConversationItemRetrieveEvent,
        ConversationItemDeleteEvent,
        ConversationItemTruncateEvent,
        ResponseCreateEvent,
        ResponseCancelEvent,
        OutputAudioBufferClearEvent,
        SessionHeartbeatEvent,
        SessionCloseEvent,
        SessionResumeEvent,
        PlaybackAckEvent,
    )
}
DUPLEX_ONLY = frozenset({"session.heartbeat", "session.close", "session.resume", "playback.ack"})


# --------------------------------------------------------------------------- server events


class ServerEvent(BaseModel):
    type: str
    event_id: str = ""
    # Duplex extension: the resume cursor (absent outside duplex sessions).
    server_event_seq: int | None = None


class RealtimeError(BaseModel):
    type: str = "invalid_request_error"
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None  # the client event that caused it


class ErrorEvent(ServerEvent):
    type: Literal["error"] = "error"
    error: RealtimeError


# Server events that come in pairs (created/updated, added/done) carry the same payload:
# each pair shares a base that declares it, and each event names only its ``type``.


class _SessionPayload(ServerEvent):
    session: RealtimeSession


class SessionCreatedEvent(_SessionPayload):
    type: Literal["session.created"] = "session.created"


class SessionUpdatedEvent(_SessionPayload):
    type: Literal["session.updated"] = "session.updated"


class InputAudioBufferCommittedEvent(ServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    previous_item_id: str | None = None
    item_id: str


class InputAudioBufferClearedEvent(ServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class SpeechStartedEvent(ServerEvent):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class SpeechStoppedEvent(ServerEvent):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class TimeoutTriggeredEvent(ServerEvent):
    type: Literal["input_audio_buffer.timeout_triggered"] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class _ItemPayload(ServerEvent):
    previous_item_id: str | None = None
    item: ConversationItem


class ItemAddedEvent(_ItemPayload):
    type: Literal["conversation.item.added"] = "conversation.item.added"


class ItemDoneEvent(_ItemPayload):
    type: Literal["conversation.item.done"] = "conversation.item.done"


class ItemRetrievedEvent(ServerEvent):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: ConversationItem


class ItemDeletedEvent(ServerEvent):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class ItemTruncatedEvent(ServerEvent):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class _ResponsePayload(ServerEvent):
    response: RealtimeResponse


class ResponseCreatedEvent(_ResponsePayload):
    type: Literal["response.created"] = "response.created"


class ResponseDoneEvent(_ResponsePayload):
    type: Literal["response.done"] = "response.done"


class _OutputItemPayload(ServerEvent):
    response_id: str
    output_index: int
    item: ConversationItem


class OutputItemAddedEvent(_OutputItemPayload):
    type: Literal["response.output_item.added"] = "response.output_item.added"


class OutputItemDoneEvent(_OutputItemPayload):
    type: Literal["response.output_item.done"] = "response.output_item.done"


class _PartRef(ServerEvent):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


class _PartPayload(_PartRef):
    part: ContentPart


class ContentPartAddedEvent(_PartPayload):
    type: Literal["response.content_part.added"] = "response.content_part.added"


class ContentPartDoneEvent(_PartPayload):
    type: Literal["response.content_part.done"] = "response.content_part.done"


class AudioDeltaEvent(_PartRef):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str
    # Extension: server wall clock (Unix seconds) when the worker produced this audio.
    produced_at: float | None = None


class AudioDoneEvent(_PartRef):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class TranscriptDeltaEvent(_PartRef):
    type: Literal["response.output_audio_transcript.delta"] = (
        "response.output_audio_transcript.delta"
    )
    delta: str


class TranscriptDoneEvent(_PartRef):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class OutputAudioBufferClearedEvent(ServerEvent):
    type: Literal["output_audio_buffer.cleared"] = "output_audio_buffer.cleared"
    response_id: str


# Duplex extension.
class HeartbeatAckEvent(ServerEvent):
    type: Literal["session.heartbeat_ack"] = "session.heartbeat_ack"


class SessionClosedEvent(ServerEvent):
    type: Literal["session.closed"] = "session.closed"
    reason: str


class SessionResumedEvent(ServerEvent):
    type: Literal["session.resumed"] = "session.resumed"
    session_id: str
    replayed: int
    last_server_event_seq: int


class ResyncRequiredEvent(ServerEvent):
    type: Literal["session.resync_required"] = "session.resync_required"
    session_id: str
    reason: str


class PlaybackAcknowledgedEvent(ServerEvent):
    type: Literal["playback.acknowledged"] = "playback.acknowledged"
    played_ms: int
    response_id: str | None = None
    item_id: str | None = None
