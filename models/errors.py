"""The one exception tree of omniqueue, and the stable codes a failed job carries.

::

    Exception
    ├── OmniqueueError                message, param, code; its message is ours, safe to show
    │   ├── InvalidRequest            bad value           → HTTP 400, invalid_request_error
    │   │   ├── ModelNotFound         unknown model       → 400, code model_not_found
    │   │   ├── InvalidJobInput       (also a ValueError) a pipeline refuses the request on
    │   │   │                         purpose; its message names the parameter → job /
    │   │   │                         session code ``invalid_request``
    │   │   │   ├── DuplicateEventError  a reused interaction ``event_id`` (every world
    │   │   │   │                     model: ``workers/pipelines/world_rules.py``)
    │   │   │   └── InvalidLora       a job's LoRA adapter does not fit the model (or
    │   │   │                         cannot be read) → job code ``invalid_lora``
    │   │   │   Realtime client mistakes (each also a ValueError), sent as an ``error``
    │   │   │   event naming ``param`` with ``code``; the session goes on unless it
    │   │   │   cannot start:
    │   │   ├── JsonInputError        a message that is not JSON we can carry
    │   │   ├── SessionConfigError    a ``session.update`` that cannot apply
    │   │   ├── ItemError             a conversation item that cannot be created
    │   │   └── StartRejected         a video ``session.start`` that cannot be served
    │   ├── PayloadTooLarge           a byte/pixel cap    → 413
    │   ├── AuthenticationError       missing/bad key     → 401
    │   ├── RateLimited               a key's quota is used up → 429, code
    │   │   │                         rate_limit_exceeded, param names the quota; with
    │   │   │                         Retry-After (HTTP) / close 1013 (realtime)
    │   │   └── QueueFull             a model's queue is at its bound → 429, code
    │   │                             queue_full, param model, with Retry-After
    │   ├── NotFound                  no such job (or not yours) → 404
    │   │   └── NotReady              content requested before completion → 404
    │   ├── Gone                      artifact expired    → 410
    │   ├── RangeNotSatisfiable       bad byte range      → 416
    │   ├── JobFailed                 /sync job failed    → by job error code
    │   ├── ServiceUnavailable        a backing service is down → 503, code
    │   │   │                         storage_error (S3) or broker_error (Redis, down
    │   │   │                         or not answering within its bounds)
    │   │   └── ModelUnavailable      no live worker can load the model → 503, code
    │   │                             model_unavailable, param model; the reason names
    │   │                             the path and what is missing (job code
    │   │                             ``model_unavailable`` for a job queued for it)
    │   ├── SyncTimeout               /sync waited too long (job cancelled) → 504
    │   └── ProtocolError             the relay or worker drove a world session
    │                                 illegally (a bug) → ``internal_error``
    │                                 (``realtime/video_protocol.py``)
    │
    │   Failures of our own services and of a job run. Their text is for logs only: a
    │   client sees the code and a fixed message.
    ├── StorageError                  the object store failed   → job code storage_error
    │   └── ObjectMissing             no such object (expired, deleted, never written)
    ├── UploadAborted                 an upload stopped because the job is no longer ours
    ├── BusUnavailable                Redis down or stalled     → job code broker_error
    ├── URLFetchError                 a reference URL refused or unreachable (the API
    │                                 answers 400 with its own message)
    ├── JobLost                       the job is no longer ours (cancelled, deleted, taken
    │                                 over)                     → ``cancelled``, as the
    │                                 canceller already recorded it
    ├── SessionTakenOver              a world session's worker was presumed dead and another
    │                                 took the session over: it ends without a word
    │                                 (``workers/sessions/world_checkpoint.py``)
    └── JobTimedOut                   the job passed its deadline → job code timeout

Not in the tree, on purpose: control flow that never leaves its module (``ClientGone``
in ``api/sync_wait.py``, ``_Stop`` in ``workers/sessions/voice.py``), the test-only
``InjectedFault`` (``workers/common/failpoints.py``, an unclassified error by design), a
malformed model registry at startup (``CatalogError``) and the CLI's exit paths.

Each transport maps it once: HTTP in ``api/errors.py`` (status + OpenAI error body);
jobs and worker sessions through ``workers.common.failures.classify`` (exception → stable
:class:`ErrorCode` + safe message): the executor and both session runners call it, so a
``ValueError`` of numpy, PIL, PyAV or torch, or a server misconfiguration, is an
``internal_error`` with a fixed message, and only :class:`InvalidJobInput` is an
``invalid_request`` whose message reaches the client. Job event streams (SSE / WebSocket)
end with an ``error`` event of code ``broker_error`` when the bus is lost
(``api/job_stream.py``). Unexpected exceptions never reach a client as text; they are
logged whole.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """The stable ``error.code`` of a failed job (and of a worker session's ``failed``)."""

    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    WORKER_LOST = "worker_lost"
    OOM = "oom"  # the device (or host) ran out of memory
    INVALID_REQUEST = "invalid_request"
    INVALID_LORA = "invalid_lora"  # the job's LoRA adapter does not fit the model
    STORAGE_ERROR = "storage_error"
    BROKER_ERROR = "broker_error"
    INTERNAL_ERROR = "internal_error"
    EXPIRED = "expired"
    TTL_EXPIRED = "ttl_expired"  # still queued when its ttl passed; it never ran
    # still queued when every worker of its model had failed to load it; it never ran
    MODEL_UNAVAILABLE = "model_unavailable"
    OUTPUT_INVALID = (
        "output_invalid"  # the encoded file broke its contract (workers/jobs/output_check.py)
    )


class OmniqueueError(Exception):
    status_code = 500
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code

    @property
    def type(self) -> str:
        """The OpenAI error ``type`` of the status: ``server_error`` for a 5xx, else
        ``invalid_request_error``; a class whose status OpenAI types otherwise names it."""
        return "server_error" if self.status_code >= 500 else "invalid_request_error"


class InvalidRequest(OmniqueueError):
    status_code = 400
    default_code = "invalid_value"


class ModelNotFound(InvalidRequest):
    default_code = "model_not_found"


class InvalidJobInput(InvalidRequest, ValueError):
    """A pipeline cannot honour the request, on purpose: the message is ours and names the
    parameter, so it reaches the client (job / session code ``invalid_request``).

    Also a ``ValueError``, so callers that validate with ``except ValueError`` still work;
    the reverse does not hold: a bare ``ValueError`` is never taken for bad input."""

    default_code = "invalid_request"


class DuplicateEventError(InvalidJobInput):
    """A world session's ``interact`` got an ``event_id`` the session has already used."""


class InvalidLora(InvalidJobInput):
    """A job's LoRA adapter cannot be applied to its model: unreadable, a format or
    component we do not load, a layer the model lacks or of another shape, a rank above
    the worker's slot. Raised before denoise, with nothing of it left in the pipe (job
    code ``invalid_lora``; its message is ours)."""

    default_code = "invalid_lora"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="lora")


class JsonInputError(InvalidRequest, ValueError):
    """A realtime client message that is not JSON the system can carry (too deep, huge
    integers, ``NaN``, lone surrogates); ``param`` names the place when it can."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param=param)


class SessionConfigError(InvalidRequest, ValueError):
    """A realtime ``session.update`` that cannot apply; ``code`` is the OpenAI one."""

    param: str
    code: str

    def __init__(self, param: str, message: str, code: str) -> None:
        super().__init__(message, param=param, code=code)


class ItemError(InvalidRequest, ValueError):
    """A client's item that cannot enter the conversation (mapped to an ``error`` event)."""

    param: str
    code: str

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message, param=param, code=code)


class StartRejected(InvalidRequest, ValueError):
    """A realtime video ``session.start`` that cannot be served, with its ``error.code``
    (a ``models.realtime_video.VideoErrorCode``)."""

    code: str

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message, param=param, code=code)


class PayloadTooLarge(OmniqueueError):
    status_code = 413
    default_code = "payload_too_large"


class AuthenticationError(OmniqueueError):
    status_code = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class RateLimited(OmniqueueError):
    """A key's quota (``param``: ``creates_per_minute``, ``max_active_jobs``,
    ``max_sessions``) is used up; ``headers`` go on the 429 (``Retry-After`` and the
    ``x-ratelimit-*`` ones). ``type`` is what OpenAI sends for a request-rate 429."""

    status_code = 429
    type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, param: str, headers: dict[str, str]) -> None:
        super().__init__(message, param=param)
        self.headers = headers


class QueueFull(RateLimited):
    """A model's queue is at its bound (``OMNIQ_QUEUE__MAX_DEPTH``): 429 ``queue_full``,
    ``param`` ``model``, ``Retry-After`` from the measured drain rate."""

    default_code = "queue_full"


class NotFound(OmniqueueError):
    status_code = 404
    default_code = "not_found"


class NotReady(NotFound):
    default_code = "not_ready"


class Gone(OmniqueueError):
    status_code = 410
    default_code = "expired"


class ServiceUnavailable(OmniqueueError):
    status_code = 503
    default_code = "service_unavailable"


class ModelUnavailable(ServiceUnavailable):
    """No live worker can load the model: the workers that tried recorded why
    (``storage/worker_presence.py``) and none serves it. Its message names the model and
    the workers' reasons (a path, what is missing), which are ours by construction
    (``workers/pipelines/load_failure.py``)."""

    default_code = "model_unavailable"

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(model_unavailable_message(model, reason), param="model")


def must_be_within(name: str, low: float, high: float, unit: str = "") -> str:
    """``NAME must be between LOW and HIGH``, or ``NAME must be LOW`` where the range holds
    one value (a model whose steps are fixed: "between 4 and 4" read as a puzzle); every
    message built from a minimum and a maximum says it so. ``unit`` follows the number."""
    if low == high:
        return f"{name} must be {_number(low)}{unit}"
    return f"{name} must be between {_number(low)} and {_number(high)}{unit}"


def _number(value: float) -> str:
    """A bound as people write it: whole numbers whole (48000, not 4.8e+04)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def model_unavailable_message(model: str, reason: str) -> str:
    """The message of a create refused, and of a queued job failed, for ``model``."""
    return f"no live worker can load model {model!r}: {reason}"


class SyncTimeout(OmniqueueError):
    status_code = 504
    default_code = "timeout"


class RangeNotSatisfiable(OmniqueueError):
    status_code = 416
    default_code = "range_not_satisfiable"

    def __init__(self, message: str, *, size: int, param: str | None = "Range"):
        super().__init__(message, param=param)
        self.size = size  # the object's length, for ``Content-Range: bytes */size``


class JobFailed(OmniqueueError):
    """A job awaited synchronously failed; the status follows its stable error code."""

    _STATUS = {
        "invalid_request": 400,
        "invalid_lora": 400,
        "cancelled": 409,
        "ttl_expired": 503,
        "model_unavailable": 503,
        "timeout": 504,
    }

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message, code=code)
        self.status_code = self._STATUS.get(code, 500)


class OutputInvalid(Exception):
    """The encoded artifact does not keep the job's output contract (codec, size, rate,
    duration, channels, silence); the message says which, and is ours by construction."""


class StorageError(Exception):
    """The object store failed (after botocore's own retries)."""


class ObjectMissing(StorageError):
    """The object is not in the bucket (expired, deleted, or never written)."""


class UploadAborted(Exception):
    """An upload was stopped by its ``should_continue`` callback; nothing is left behind."""


class BusUnavailable(Exception):
    """Redis did not answer a bounded bus call (down, refusing, or stalled)."""


class URLFetchError(Exception):
    """A reference URL was refused or could not be fetched; the text says why (for logs
    only: the API answers with its own message)."""


class JobLost(Exception):
    """The job is no longer ours: cancelled, deleted or taken over."""


class WorkerStopping(JobLost):
    """The worker is shutting down (SIGTERM, Ctrl-C of ``up``): the job stops here and
    goes back to the queue, for the next worker to run from the start."""


class SessionTakenOver(Exception):
    """The world session is another worker's now (its checkpoint's fence moved on): this
    worker ends it and sends nothing more."""


class JobTimedOut(Exception):
    """The job passed its deadline; the message says which (it is ours)."""
