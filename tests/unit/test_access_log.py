"""The access log formatter writes uvicorn's lines exactly (it only skips the copies)."""

from __future__ import annotations

import logging

import pytest
from uvicorn.config import LOGGING_CONFIG
from uvicorn.logging import AccessFormatter

from api.access_log import AccessLogFormatter, log_config

FMT = LOGGING_CONFIG["formatters"]["access"]["fmt"]


def _record(level: int, msg: str, args: tuple[object, ...]) -> logging.LogRecord:
    return logging.getLogger("uvicorn.access").makeRecord(
        "uvicorn.access", level, __file__, 1, msg, args, None
    )


@pytest.mark.parametrize("status", [200, 206, 302, 404, 422, 499, 503, 599])
@pytest.mark.parametrize("path", ["/v1/videos/video_1", "/v1/videos?limit=20&after=video_2"])
@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING])
def test_lines_match_uvicorns(status: int, path: str, version: str, level: int) -> None:
    args = ("127.0.0.1:50123", "GET", path, version, status)
    record = _record(level, '%s - "%s %s HTTP/%s" %d', args)
    ours = AccessLogFormatter(fmt=FMT, use_colors=False).format(record)
    assert ours == AccessFormatter(fmt=FMT, use_colors=False).format(record)
    assert record.args == args  # the record is left as it was


def test_colours_and_other_records_are_uvicorns() -> None:
    access = _record(logging.INFO, '%s - "%s %s HTTP/%s" %d', ("c:1", "GET", "/", "1.1", 200))
    coloured = AccessLogFormatter(fmt=FMT, use_colors=True).format(access)
    assert coloured == AccessFormatter(fmt=FMT, use_colors=True).format(access)
    other = _record(logging.INFO, "%s", ("something",))
    with pytest.raises(ValueError):  # uvicorn's own formatter cannot format it either
        AccessFormatter(fmt=FMT, use_colors=False).format(other)
    with pytest.raises(ValueError):
        AccessLogFormatter(fmt=FMT, use_colors=False).format(other)


def test_log_config_swaps_only_the_access_formatter() -> None:
    config = log_config()
    assert config["formatters"]["access"]["()"] == "api.access_log.AccessLogFormatter"
    assert LOGGING_CONFIG["formatters"]["access"]["()"] == "uvicorn.logging.AccessFormatter"
    rest = {k: v for k, v in config.items() if k != "formatters"}
    assert rest == {k: v for k, v in LOGGING_CONFIG.items() if k != "formatters"}
