"""Job events: what watchers of a job receive over SSE (``/events``) and WebSocket
(``/stream``). Every event from the bus carries its stream id as its ``id`` on the wire;
:class:`StreamErrorEvent` is made by the API and has none."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from models.common import JobError, JobStatus


class StatusEvent(BaseModel):
    type: Literal["status"] = "status"
    status: JobStatus
    queue_position: int | None = None
    estimated_start_at: int | None = None


class ProgressEvent(BaseModel):
    type: Literal["progress"] = "progress"
    progress: int
    step: int
    num_steps: int
    stage: str


class PreviewEvent(BaseModel):
    """A small JPEG of the current estimate (base64 over SSE and in this model)."""

    type: Literal["preview"] = "preview"
    step: int
    width: int
    height: int
    jpeg_b64: str


class ChunkEvent(BaseModel):
    """An fMP4 fragment of a model that streams frames; over WS the bytes follow as one
    binary frame, over SSE they are in ``data_b64``."""

    type: Literal["chunk"] = "chunk"
    seq: int
    byte_length: int
    num_frames: int
    data_b64: str | None = None


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    status: JobStatus
    error: JobError | None = None


class StreamErrorEvent(BaseModel):
    """The stream ends without ``done``: the event bus did not answer (``broker_error``,
    ``api/job_stream.py``), or, in a speech SSE stream, the job failed after audio had
    been sent (``api/audio_sync.py``)."""

    type: Literal["error"] = "error"
    error: JobError


JobEvent = Annotated[
    StatusEvent | ProgressEvent | PreviewEvent | ChunkEvent | DoneEvent | StreamErrorEvent,
    Field(discriminator="type"),
]
