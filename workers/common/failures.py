"""What a client learns when a job or a worker session fails: :func:`classify`.

The executor and both session runners (``workers/sessions/world.py``,
``workers/sessions/voice.py``) map every exception through this one function to a stable
code (``models.errors.ErrorCode``) and a message safe to show. Only an exception whose
text is ours by construction keeps its text: :class:`~models.errors.InvalidJobInput` (a
pipeline refusing the request on purpose; its message names the parameter) and
:class:`~models.errors.JobTimedOut`. Anything else, in particular the ``ValueError`` of
numpy, PIL, PyAV, torch or a misconfigured server, becomes a fixed message; the caller
logs the exception whole.

================================================  ===================  ================
exception                                         code                 message
================================================  ===================  ================
``InvalidLora``                                   ``invalid_lora``     its own
``InvalidJobInput`` (or any ``InvalidRequest``)   ``invalid_request``  its own
``JobTimedOut``                                   ``timeout``          its own
``OutputInvalid``                                 ``output_invalid``   its own
``torch.OutOfMemoryError``, ``MemoryError``       ``oom``              fixed
``StorageError``                                  ``storage_error``    fixed
``BusUnavailable``, a Redis error                 ``broker_error``     fixed
anything else                                     ``internal_error``   fixed
================================================  ===================  ================

``JobLost`` and ``UploadAborted`` are not failures (the job was cancelled, deleted or
taken over, and whoever did that recorded it); callers handle them before classifying.
"""

from __future__ import annotations

import logging

import redis.exceptions
import torch

from models.errors import (
    BusUnavailable,
    ErrorCode,
    InvalidLora,
    InvalidRequest,
    JobTimedOut,
    OutputInvalid,
    StorageError,
)

MAX_MESSAGE_CHARS = 500

INTERNAL_ERROR_MESSAGE = "internal error"
SAFE_MESSAGES = {
    ErrorCode.OOM: "the device ran out of memory",
    ErrorCode.STORAGE_ERROR: "object storage failed",
    ErrorCode.BROKER_ERROR: "the message broker failed",
    ErrorCode.INTERNAL_ERROR: INTERNAL_ERROR_MESSAGE,
}


def classify(exc: BaseException) -> tuple[ErrorCode, str]:
    """The stable code of ``exc`` and a message a client may see."""
    if isinstance(exc, InvalidLora):
        return ErrorCode.INVALID_LORA, exc.message[:MAX_MESSAGE_CHARS]
    if isinstance(exc, InvalidRequest):
        return ErrorCode.INVALID_REQUEST, exc.message[:MAX_MESSAGE_CHARS]
    if isinstance(exc, JobTimedOut):
        return ErrorCode.TIMEOUT, (str(exc) or "the job passed its deadline")[:MAX_MESSAGE_CHARS]
    if isinstance(exc, OutputInvalid):
        return ErrorCode.OUTPUT_INVALID, str(exc)[:MAX_MESSAGE_CHARS]
    code = _code(exc)
    return code, SAFE_MESSAGES[code]


def log_level(code: ErrorCode) -> int:
    """How loud a failure of this code is logged: an internal error is a bug (logged with
    its traceback as an error); the others are expected outcomes."""
    return logging.ERROR if code == ErrorCode.INTERNAL_ERROR else logging.WARNING


def _code(exc: BaseException) -> ErrorCode:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return ErrorCode.OOM
    if isinstance(exc, StorageError):
        return ErrorCode.STORAGE_ERROR
    if isinstance(exc, BusUnavailable | redis.exceptions.RedisError):
        return ErrorCode.BROKER_ERROR
    return ErrorCode.INTERNAL_ERROR


__all__ = ["INTERNAL_ERROR_MESSAGE", "classify", "log_level"]
