"""Builders the unit and the integration tests share."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.job_specs import VideoSpec
from models.session_bus import WorldSessionConfig

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection


def video_spec(**overrides: Any) -> VideoSpec:
    """A valid video job spec, small (64x48, 8 frames at 16 fps, 2 steps, seed 1), with
    ``overrides`` in place of its fields."""
    fields: dict[str, Any] = {
        "model": "reference/video",
        "prompt": "p",
        "seed": 1,
        "num_inference_steps": 2,
        "width": 64,
        "height": 48,
        "fps": 16.0,
        "num_frames": 8,
    }
    return VideoSpec(**fields | overrides)


def world_session_config(**overrides: Any) -> WorldSessionConfig:
    """A valid world session config as the API places it, small (64x48, 33 frames at
    8 fps, seed 1, the reference world model), with ``overrides`` in place of its fields."""
    fields: dict[str, Any] = {
        "model": "reference/world",
        "owner": "local",
        "prompt": "p",
        "width": 64,
        "height": 48,
        "num_frames": 33,
        "fps": 8.0,
        "seed": 1,
    }
    return WorldSessionConfig(**fields | overrides)


def world_session_start(num_frames: int) -> dict[str, Any]:
    """A ``/v1/realtime/video`` ``session.start`` of the reference world model (96x96 at
    16 fps, seed 7) running ``num_frames`` frames."""
    return {
        "type": "session.start",
        "model": "reference/world",
        "prompt": "a red ball rolling down a hill",
        "width": 96,
        "height": 96,
        "num_frames": num_frames,
        "fps": 16,
        "seed": 7,
    }


def node_form(model: str, extra: dict[str, Any] | None = None, **fields: str) -> dict[str, str]:
    """``POST /v1/videos``'s form as the ComfyUI node sends it: every value a string,
    ``extra_params`` as JSON text; ``fields`` over what the node always sends (a prompt,
    seed 42, ``n`` 1, tiling off)."""
    base = {
        "model": model,
        "prompt": "a red ball",
        "seed": "42",
        "n": "1",
        "vae_use_tiling": "false",
    }
    if extra is not None:
        base["extra_params"] = json.dumps(extra)
    return {**base, **fields}


async def next_pair(ws: ClientConnection) -> tuple[dict[str, Any], bytes | None]:
    """``/v1/realtime/video``'s next text frame, with the binary frame after it if it
    announces a chunk (``video.chunk_metadata``, its ``byte_length`` checked)."""
    message = await asyncio.wait_for(ws.recv(), 60)
    assert isinstance(message, str), "expected a JSON text frame"
    event = dict(json.loads(message))
    if event["type"] != "video.chunk_metadata":
        return event, None
    data = await asyncio.wait_for(ws.recv(), 60)
    assert isinstance(data, bytes) and len(data) == event["byte_length"]
    return event, data


def tts_benchmark_body(**overrides: Any) -> dict[str, Any]:
    """vLLM-Omni's TTS benchmark body for a default-voice run (Qwen3-TTS-CustomVoice's
    config: voice Vivian, English) of the reference speech model, streaming raw PCM,
    seed 7; ``overrides`` in place of its fields."""
    body: dict[str, Any] = {
        "model": "reference/speech",
        "input": "Hello there. How are you today?",
        "stream": True,
        "stream_format": "audio",
        "response_format": "pcm",
        "voice": "Vivian",
        "language": "English",
        "task_type": "CustomVoice",
        "seed": 7,
    }
    return body | overrides


def write_failpoints(path: Path, points: dict[str, str]) -> None:
    """Replace the workers' failpoints file (``workers/common/failpoints.py``) at once: a worker
    reading it never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(points))
    tmp.replace(path)


def s3_settings(s3: Any) -> dict[str, str]:
    """``Settings.s3`` for an ``EmbeddedS3`` server."""
    return {
        "endpoint_url": s3.endpoint_url,
        "bucket": s3.bucket,
        "access_key_id": s3.access_key,
        "secret_access_key": s3.secret_key,
    }


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every absolute import in the module at ``path``,
    wherever it stands (a function body too)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found
