"""The API tier imports no torch (docs/architecture.md, rule 1): an API process that
has served a video job (with an image reference), an audio job, a voice session through
the server VAD and a world session, against real services and real workers,
has not imported torch or any other part of the GPU stack."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import REPO, Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# What only workers need (the `worker` and `diffusers` extras); silero_vad's wheel is torch.
GPU_STACK = {"torch", "torchaudio", "diffusers", "transformers", "accelerate", "silero_vad"}


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, redis_db: int
) -> Iterator[Stack]:
    """A job worker and a realtime worker on services of their own; no API process."""
    work = Path(tmp_path_factory.mktemp("api-tier"))
    env = {"OMNIQ_REALTIME__ADMISSION_TIMEOUT_S": "30", "OMNIQ_REALTIME__LOST_AFTER_S": "30"}
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start_worker("w0")
        st._spawn("rt0", "worker", "--realtime", "--name", "rt0")
        st.wait_workers(2)
        yield st


def test_api_serves_every_kind_of_request_without_torch(workers: Stack) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.api_tier_probe"],
        cwd=REPO,
        env=workers.env(),
        capture_output=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    out: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert (out["health"], out["ready"], out["models"]) == (200, 200, 200)
    video = out["video_job"]
    assert video["status"] == "completed" and video["content"] == [200, "ftyp"], video
    assert video["events_last"] == "done" and video["list"] == 200
    assert out["audio_job"] == {"status": "completed", "content": 200}
    voice = out["voice_session"]
    assert "input_audio_buffer.speech_started" in voice and voice[-1] == "response.done", voice
    session = out["world_session"]
    assert "bytes" in session and session[-1] == "session.done", session
    packages = set(out["packages"])
    assert "onnxruntime" in packages  # the server VAD ran, on its ONNX weights
    assert not packages & GPU_STACK, sorted(packages & GPU_STACK)
