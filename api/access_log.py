"""uvicorn's access log lines, formatted without copying each record twice.

uvicorn's :class:`~uvicorn.logging.AccessFormatter` copies every record (``copy.copy``
of a ``LogRecord``, twice: once more in its base class) and looks the status phrase up
in :class:`http.HTTPStatus` per line: ~15 µs of a status read's ~550 µs. Without colours
(the log is a file or a pipe) :class:`AccessLogFormatter` writes the same line from one
dict; with colours, or a record that is not uvicorn's access line, it is uvicorn's.
"""

from __future__ import annotations

import copy
import http
import logging
from typing import Any

from uvicorn.config import LOGGING_CONFIG
from uvicorn.logging import AccessFormatter

_PHRASES = {status.value: f"{status.value} {status.phrase}" for status in http.HTTPStatus}


class AccessLogFormatter(AccessFormatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        args = record.args
        if self.use_colors or not isinstance(args, tuple) or len(args) != 5:
            return super().formatMessage(record)
        if not isinstance(self._style, logging.PercentStyle):
            return super().formatMessage(record)
        client_addr, method, full_path, http_version, status_code = args
        code = int(status_code)  # type: ignore[call-overload]
        levelname = record.levelname
        values = record.__dict__.copy()
        values["levelprefix"] = levelname + ":" + " " * (8 - len(levelname))
        values["client_addr"] = client_addr
        values["request_line"] = f"{method} {full_path} HTTP/{http_version}"
        values["status_code"] = _PHRASES.get(code) or f"{code} "
        return self._fmt % values  # type: ignore[operator]


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration with :class:`AccessLogFormatter`."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["access"]["()"] = f"{__name__}.{AccessLogFormatter.__name__}"
    return config
