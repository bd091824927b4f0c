"""The pure parts of ``api/quotas.py``: which limit applies to a key, and the
``x-ratelimit-*`` headers as OpenAI writes them."""

from __future__ import annotations

import pytest
import redis.asyncio

from api.quotas import KeyLimits, Quotas, go_duration, ratelimit_headers
from models.db import ApiKey
from storage.settings import Settings


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (0.012, "12ms"),
        (0.9994, "999ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (59.25, "59.25s"),
        (60.0, "1m0s"),
        (360.0, "6m0s"),
        (61.2, "1m2s"),
        (3600.0, "1h0m0s"),
    ],
)
def test_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_headers_never_report_less_than_zero_remaining() -> None:
    assert ratelimit_headers(60, -1, 0.25) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "250ms",
    }


def test_a_keys_own_value_beats_the_default_and_none_follows_it() -> None:
    settings = Settings(  # type: ignore[call-arg]
        quotas={"creates_per_minute": 60, "max_active_jobs": 5, "max_sessions": 2},
        _env_file=None,
    )
    quotas = Quotas(settings, redis.asyncio.Redis())  # no command is sent here
    own = ApiKey(creates_per_minute=0, max_active_jobs=None, max_sessions=7)
    assert quotas.limits_for(own) == KeyLimits(0, 5, 7)
    assert quotas.limits_for(None) == KeyLimits(60, 5, 2)  # auth off: the defaults
