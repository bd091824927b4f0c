"""The API tier in a process of its own: ``python -m tests.integration.api_tier_probe``.

Builds the app from the ``OMNIQ_*`` environment (``create_app()``, as ``omniqueue api``
does), serves one of each kind of request through it — a video job with an image
reference up to its content and event stream, an audio job, a voice session whose turn
the server VAD detects, a world session — and prints one JSON object: the status
of each step and the top-level packages the process imported. Nothing is imported before
``api.app`` that the API itself would not import, so the package list is the API tier's.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import wave
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from api.app import create_app

SPEECH = Path(__file__).parents[1] / "fixtures" / "speech" / "hello.wav"
# an 8x8 PNG: decoded, resized and re-encoded by the API's input handling
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAFElEQVR4nGM8ISfHgA0wYRUdtBIA0MoBFD5j"
    "qJkAAAAASUVORK5CYII="
)


def _wait(client: TestClient, path: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(path).json()
        if body["status"] in ("completed", "failed"):
            return body
        time.sleep(0.1)
    raise TimeoutError(path)


def _video_job(client: TestClient) -> dict[str, Any]:
    body = {
        "prompt": "a red ball",
        "size": "64x48",
        "seconds": "0.5",
        "fps": 16,
        "num_inference_steps": 3,
        "input_reference": "data:image/png;base64," + PNG,
    }
    created = client.post("/v1/videos", json=body)
    created.raise_for_status()
    video_id = created.json()["id"]
    done = _wait(client, f"/v1/videos/{video_id}")
    content = client.get(f"/v1/videos/{video_id}/content")
    events = client.get(f"/v1/videos/{video_id}/events")
    data = [line[5:] for line in events.text.splitlines() if line.startswith("data:")]
    kinds = [json.loads(item)["type"] for item in data]
    return {
        "status": done["status"],
        "content": [content.status_code, content.content[4:8].decode(errors="replace")],
        "events_last": kinds[-1] if kinds else None,
        "list": client.get("/v1/videos").status_code,
    }


def _audio_job(client: TestClient) -> dict[str, Any]:
    body = {"prompt": "rain", "seconds": 1.0, "num_inference_steps": 3, "response_format": "mp3"}
    created = client.post("/v1/audio/generations", json=body)
    created.raise_for_status()
    audio_id = created.json()["id"]
    done = _wait(client, f"/v1/audio/generations/{audio_id}")
    content = client.get(f"/v1/audio/generations/{audio_id}/content")
    return {"status": done["status"], "content": content.status_code}


def _voice_session(client: TestClient) -> list[str]:
    """A spoken turn (server VAD) answered up to ``response.done``: the event types seen."""
    with wave.open(str(SPEECH)) as w:
        pcm = w.readframes(w.getnframes())
    seen: list[str] = []
    with client.websocket_connect("/v1/realtime?model=reference/voice") as ws:
        for i in range(0, len(pcm), 4800):
            chunk = base64.b64encode(pcm[i : i + 4800]).decode()
            ws.send_text(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        while not seen or seen[-1] not in ("response.done", "error"):
            seen.append(json.loads(ws.receive_text())["type"])
    return seen


def _world_session(client: TestClient) -> list[str]:
    start = {
        "type": "session.start",
        "model": "reference/world",
        "prompt": "a red ball",
        "width": 64,
        "height": 64,
        "num_frames": 9,
        "fps": 16,
    }
    seen: list[str] = []
    with client.websocket_connect("/v1/realtime/video") as ws:
        ws.send_text(json.dumps(start))
        while not seen or seen[-1] not in ("session.done", "error"):
            message = ws.receive()
            if message.get("text") is not None:
                seen.append(json.loads(message["text"])["type"])
            elif message.get("bytes") is not None:
                seen.append("bytes")
    return seen


def main() -> None:
    with TestClient(create_app()) as client:
        out: dict[str, Any] = {
            "health": client.get("/health").status_code,
            "ready": client.get("/ready").status_code,
            "models": client.get("/v1/models").status_code,
            "video_job": _video_job(client),
            "audio_job": _audio_job(client),
            "voice_session": _voice_session(client),
            "world_session": _world_session(client),
        }
    out["packages"] = sorted({name.split(".")[0] for name in sys.modules})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
