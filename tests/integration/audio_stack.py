"""The audio API's integration stack: one API process, Redis, a Celery worker process,
PostgreSQL and S3, with API keys required (``test_audio_api.py``, ``test_speech_api.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack

SMALL: dict[str, Any] = {"seconds": 1.0, "num_inference_steps": 3}


class AudioStack(Stack):
    def wait_audio(
        self, client: httpx.Client, audio_id: str, until: tuple[str, ...] = ("completed", "failed")
    ) -> dict[str, Any]:
        return self.wait_for(client, audio_id, until=until, collection="audio/generations")


@contextmanager
def audio_stack(work: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[AudioStack]:
    """A module's stack: one worker, keys required, no failpoints."""
    with isolated_stack(
        work, s3_server, redis_db=redis_db, extra_env={}, cls=AudioStack, auth="required"
    ) as st:
        st.set_failpoints({})
        st.start(workers=1)
        yield st


def create_audio(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    """A small ``/v1/audio/generations`` job's created object."""
    body = {"prompt": "rain and drums at night", **SMALL, **fields}
    resp = client.post("/v1/audio/generations", json=body)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())
