"""Wire schemas shared by every protocol: the OpenAI error body, the model list, and
what every job kind (video, audio) shares: its status and its error."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


# Numbers of request fields: pydantic's lax mode would read ``true`` as 1; strings
# (multipart values) still parse, ASCII digits only.
Int = Annotated[int, BeforeValidator(_not_bool)]
Number = Annotated[float, BeforeValidator(_not_bool)]


class JobStatus(enum.StrEnum):
    """A job's state, on the wire and in its row (any kind); ``cancelled`` is ``failed``
    with ``error.code`` ``cancelled``."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


class JobError(BaseModel):
    """Why a job failed: a stable ``code`` (``models.errors.ErrorCode``) and a message
    safe to show (never the text of an unexpected exception)."""

    code: str
    message: str


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "omniqueue"
    modality: str = "video"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = {}
