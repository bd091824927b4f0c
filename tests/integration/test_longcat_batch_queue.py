"""Concurrent speech jobs denoised as one batch by one real Celery worker
(``OMNIQ_WORKER__BATCH_SIZE=3``: workers/jobs/batcher.py): the tiny LongCat pipeline
(``longcat_fixtures``) saved to disk and served through the real queue, three
``POST /v1/audio/speech`` PCM streams sent at once.

Each job completes with its own stream (the PCM it stored, its own length and seed); the
worker ran them together, its steps batched three jobs at a time; a job of the same text
and seed sent alone afterwards streams the same audio to a PCM16 step (the numbers are
tests/unit/test_longcat_batch.py's). A one-second failpoint before each job's second
step lets the three meet in one batch whatever the order of their claims.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.unit.longcat_fixtures import tiny_longcat_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "tiny/longcat"
# Other lengths of clip and prompt, other seeds, one with a negative prompt.
REQUESTS: list[dict[str, Any]] = [
    {"input": "Hello there, friend.", "seed": 1},
    {"input": "The trains run on time today, and on other days too.", "seed": 2},
    {"input": "Hello there, friend.", "seed": 3},
]


@pytest.fixture(scope="module")
def lstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    path = module_dir / "tiny_longcat"
    pipe = tiny_longcat_pipeline()
    pipe.save_pretrained(path)
    pipe.scheduler.save_pretrained(path / "scheduler")  # its save_pretrained leaves it out
    registry = module_dir / "models.toml"
    registry.write_text(
        f'[[model]]\nname = "{MODEL}"\nadapter = "diffusers.longcat_audio"\n'
        f'path = "{path}"\ndtype = "float32"\n[model.spec]\ndefault_steps = 6\n'
    )
    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_MODELS": MODEL,
        "OMNIQ_WORKER__BATCH_SIZE": "3",
        "OMNIQ_WORKER__PREVIEW_EVERY": "0",
    }
    with isolated_stack(module_dir, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=1)
        yield st


def _speech(stack: Stack, body: dict[str, Any]) -> tuple[str, bytes]:
    """One speech request's PCM stream, read to its end: the job id and the bytes."""
    with stack.client(timeout=60) as client:
        fields = {"model": MODEL, "response_format": "pcm", **body}
        with client.stream("POST", "/v1/audio/speech", json=fields) as resp:
            assert resp.status_code == 200, resp.read()
            return resp.headers["x-request-id"], b"".join(resp.iter_bytes())


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.int32)


def test_three_jobs_share_one_worker_each_with_its_own_stream(lstack: Stack) -> None:
    assert "up to 3 jobs at once, their steps batched" in lstack.log("w0")
    lstack.set_failpoints({"step:1": "sleep:1"})
    try:
        with ThreadPoolExecutor(len(REQUESTS)) as pool:
            streams = list(pool.map(lambda body: _speech(lstack, body), REQUESTS))
    finally:
        lstack.set_failpoints({})
    with lstack.client(timeout=30) as client:
        jobs = [client.get(f"/v1/audio/generations/{job}").json() for job, _ in streams]
        for (job, pcm), row in zip(streams, jobs, strict=True):
            assert row["status"] == "completed" and row["step"] == 6
            content = client.get(f"/v1/audio/generations/{job}/content")
            assert content.status_code == 200 and content.content == pcm  # its own stream
    # Their runs overlapped on the one worker, and each was denoised with the others.
    assert max(r["started_at"] for r in jobs) < min(r["completed_at"] for r in jobs)
    log = lstack.log("w0")
    for job, _ in streams:
        found = re.search(rf"job {job}: denoised in batches of up to (\d+) jobs", log)
        assert found is not None and found.group(1) == "3", log
    first, longer, reseeded = (_pcm(pcm) for _, pcm in streams)
    assert len(longer) > len(first) == len(reseeded)  # each its own length
    assert np.abs(first - reseeded).max() > 1000  # and its own noise

    _, alone = _speech(lstack, REQUESTS[1])  # the same job, alone on the worker
    assert len(_pcm(alone)) == len(longer) and np.abs(_pcm(alone) - longer).max() <= 1
    log = lstack.log("w0")
    assert re.findall(r"denoised in batches of up to (\d+) jobs", log)[-1] == "1"
