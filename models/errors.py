"""The one exception tree of omniqueue.

::

    OmniqueueError                    message, param, code
    ├── InvalidRequest                bad value           → HTTP 400, invalid_request_error
    │   └── ModelNotFound             unknown model       → 400, code model_not_found
    ├── PayloadTooLarge               a byte/pixel cap    → 413
    ├── AuthenticationError           missing/bad key     → 401
    ├── NotFound                      no such job (or not yours) → 404
    ├── NotReady                      content requested before completion → 404
    ├── Gone                          artifact expired    → 410
    ├── RangeNotSatisfiable           bad byte range      → 416
    ├── JobFailed                     /sync job failed    → by job error code
    ├── ServiceUnavailable            a backing service is down → 503, code
    │                                 storage_error (S3) or broker_error (Redis, down
    │                                 or not answering within its bounds)
    └── SyncTimeout                   /sync waited too long (job cancelled) → 504

Each transport maps it once: HTTP in ``api/errors.py`` (status + OpenAI error body),
jobs through ``models.db.ErrorCode``. Job event streams (SSE / WebSocket) end with an
``error`` event of code ``broker_error`` when the bus is lost (``api/job_stream.py``).
Unexpected exceptions never reach a client as text.
"""

from __future__ import annotations


class OmniqueueError(Exception):
    status_code = 500
    type = "server_error"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code


class InvalidRequest(OmniqueueError):
    status_code = 400
    type = "invalid_request_error"
    default_code = "invalid_value"


class ModelNotFound(InvalidRequest):
    default_code = "model_not_found"


class PayloadTooLarge(OmniqueueError):
    status_code = 413
    type = "invalid_request_error"
    default_code = "payload_too_large"


class AuthenticationError(OmniqueueError):
    status_code = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class NotFound(OmniqueueError):
    status_code = 404
    type = "invalid_request_error"
    default_code = "not_found"


class NotReady(NotFound):
    default_code = "not_ready"


class Gone(OmniqueueError):
    status_code = 410
    type = "invalid_request_error"
    default_code = "expired"


class ServiceUnavailable(OmniqueueError):
    status_code = 503
    type = "server_error"
    default_code = "service_unavailable"


class SyncTimeout(OmniqueueError):
    status_code = 504
    type = "server_error"
    default_code = "timeout"


class RangeNotSatisfiable(OmniqueueError):
    status_code = 416
    type = "invalid_request_error"
    default_code = "range_not_satisfiable"


class JobFailed(OmniqueueError):
    """A job awaited synchronously failed; the status follows its stable error code."""

    type = "server_error"
    _STATUS = {"invalid_request": 400, "cancelled": 409, "timeout": 504}

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message, code=code)
        self.status_code = self._STATUS.get(code, 500)
        if self.status_code < 500:
            self.type = "invalid_request_error"
