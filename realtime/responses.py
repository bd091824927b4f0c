"""One model response of a voice session, as the protocol tracks it, and how its
end reads on the wire (``response.done``'s status, details and usage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import models.realtime as wire
from realtime.input_audio import BYTES_PER_MS

FinalStatus = Literal["completed", "cancelled", "failed"]


@dataclass
class ResponseRun:
    id: str
    item_id: str
    output_index: int
    in_conversation: bool
    metadata: dict[str, str] | None
    transcript: str = ""
    audio_bytes: int = 0
    cancel_reason: Literal["turn_detected", "client_cancelled"] | None = None
    muted: bool = False  # later audio deltas are dropped (interrupted, cleared, truncated)
    cancel_deadline: float | None = None
    started_at: float = 0.0
    played_ms: int | None = None  # duplex playback.ack


def final_status(
    run: ResponseRun, worker_status: str, message: str | None
) -> tuple[FinalStatus, wire.StatusDetails | None]:
    """A cancel asked for wins over what the worker reports; anything but ``completed``
    from the worker is a failure with its code."""
    if run.cancel_reason is not None:
        return "cancelled", wire.StatusDetails(type="cancelled", reason=run.cancel_reason)
    if worker_status == "completed":
        return "completed", None
    error = wire.StatusError(
        type="server_error", code=worker_status, message=message or "the model failed"
    )
    return "failed", wire.StatusDetails(type="failed", error=error)


def usage(run: ResponseRun) -> wire.Usage:
    """omniqueue does not tokenize audio: one "token" is 100 ms of output audio."""
    tokens = -(-(run.audio_bytes // BYTES_PER_MS) // 100)
    return wire.Usage(
        total_tokens=tokens,
        output_tokens=tokens,
        output_token_details={"text_tokens": 0, "audio_tokens": tokens},
    )
