"""The audio API modules' stack (``test_audio_api.py``, ``test_speech_api.py``; conftest's
``astack``: one API process, Redis, a Celery worker process, PostgreSQL and S3, API keys
required) and what they share."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.stack import Stack

SMALL: dict[str, Any] = {"seconds": 1.0, "num_inference_steps": 3}


class AudioStack(Stack):
    def wait_audio(
        self, client: httpx.Client, audio_id: str, until: tuple[str, ...] = ("completed", "failed")
    ) -> dict[str, Any]:
        return self.wait_for(client, audio_id, until=until, collection="audio/generations")


def create_audio(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    """A small ``/v1/audio/generations`` job's created object."""
    body = {"prompt": "rain and drums at night", **SMALL, **fields}
    resp = client.post("/v1/audio/generations", json=body)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())
