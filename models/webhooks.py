"""Wire schemas of webhooks: the event a receiver gets, the signing secret, and the
``webhook_url`` / ``webhook_events`` fields of every job create request.

Events follow OpenAI's video webhooks (``UnwrapWebhookEvent`` in its SDK): a thin
envelope naming the job, never the job itself, so a receiver fetches the current state
with its own key::

    {"object": "event", "id": "evt_…", "type": "video.completed",
     "created_at": 1764460000, "data": {"id": "video_…"}}

Signing is the Standard Webhooks scheme (``webhook-id``, ``webhook-timestamp``,
``webhook-signature`` headers); see ``docs/webhooks.md``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# Every event type, by job kind; a job emits exactly one, when it ends.
EVENT_TYPES: dict[str, tuple[str, ...]] = {
    kind: (f"{kind}.completed", f"{kind}.failed", f"{kind}.cancelled")
    for kind in ("video", "audio")
}
ALL_EVENT_TYPES: tuple[str, ...] = tuple(t for types in EVENT_TYPES.values() for t in types)
SECRET_PREFIX = "whsec_"
# The longest destination URL taken (what the tables store).
MAX_URL_LENGTH = 2048


def _split_events(value: Any) -> Any:
    """``webhook_events`` as a list; multipart sends one string (``a,b`` or a JSON list)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            import json

            try:
                return json.loads(text)
            except ValueError:
                return value  # pydantic refuses it, naming the field
        return [item.strip() for item in text.split(",") if item.strip()]
    return value


# The create fields (``models/videos.py``, ``models/audio.py``): checked in
# ``api/validation.py`` (:func:`api.validation.resolve_webhook`).
WebhookUrl = Annotated[
    str | None,
    Field(description="Where to POST the job's signed terminal event (docs/webhooks.md)."),
]
WebhookEvents = Annotated[
    list[str] | None,
    BeforeValidator(_split_events),
    Field(description="The event types to send there; default: all of the job's kind."),
]


class WebhookFields(BaseModel):
    """``webhook_url`` and ``webhook_events``: every job create body takes them, so each
    inherits them from here (``models.common.JobRequestOptions`` adds the rest)."""

    webhook_url: WebhookUrl = None
    webhook_events: WebhookEvents = None


class JobWebhook(BaseModel):
    """A job's own destination, as its create request gave it (part of the job's spec)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    # The event types to send; None: all of the job's kind.
    events: tuple[str, ...] | None = None


class WebhookEventData(BaseModel):
    id: str


class WebhookEvent(BaseModel):
    """The body of one webhook request (the same bytes on every attempt)."""

    object: Literal["event"] = "event"
    id: str
    type: str
    created_at: int
    data: WebhookEventData


class WebhookSecret(BaseModel):
    """``GET /v1/webhooks/secret``: the caller's signing secret."""

    key: str


def event_type(kind: str, status: str, error_code: str | None) -> str:
    """The event of a job of ``kind`` that ended in ``status`` (``failed`` with code
    ``cancelled`` is a cancel)."""
    if status == "completed":
        return f"{kind}.completed"
    return f"{kind}.cancelled" if error_code == "cancelled" else f"{kind}.failed"
