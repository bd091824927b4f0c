"""A real out-of-memory inside a denoise step, on CPU: a job that asks for more memory than
any machine has fails ``oom`` within that step, nothing of it stays referenced, and the
worker runs the next job (issue 23). The allocation is real (numpy's, in the step of
``tests/integration/attention_pipeline.py``), not a failpoint; the failpoint test of the
same path is ``test_cancel_faults.py::test_out_of_memory_fails_with_oom``, and the GPU run,
under ``OMNIQ_WORKER__MEMORY_FRACTION``, is ``benchmarks/gpu/oom.py``.

Through the queue: a real API and Celery worker on PostgreSQL, Redis and S3. In process:
the executor on SQLite and the same S3, where a test can hold weak references to the
failed step's tensors and hold every log record (as pytest's own log capture does, and
with it each failure's traceback) while it checks them.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.embedded import EmbeddedS3
from migrations.runner import upgrade
from models.catalog import ModelSpec
from models.db import Job
from models.job_specs import VideoSpec
from models.registry import ServedModel
from storage.artifacts import ArtifactStore, make_s3_client
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.settings import Settings
from tests.helpers import s3_settings
from tests.integration.attention_pipeline import AttentionPipeline
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from workers.jobs.executor import StepExecutor
from workers.pipelines.registry import PipelineRegistry

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "test/attention"
ADAPTER = "tests.integration.attention_pipeline:AttentionPipeline"
SMALL = {"size": "64x48", "num_frames": 8, "fps": 16, "num_inference_steps": 5}
LARGE = {"size": "1280x720", "num_frames": 81, "fps": 16, "num_inference_steps": 5}
OOM_LINE = re.compile(
    r"job (\S+): out of memory in (step \d+ of \d+|stage \w+) at (\d+\.\d+); failed at (\d+\.\d+)"
)


# ---- through the queue ------------------------------------------------------------------


@pytest.fixture(scope="module")
def ostack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    registry = module_dir / "models.toml"
    registry.write_text(f'[[model]]\nname = "{MODEL}"\nadapter = "{ADAPTER}"\n')
    env = {"OMNIQ_MODEL_REGISTRY": str(registry), "OMNIQ_WORKER__PREVIEW_EVERY": "0"}
    with isolated_stack(module_dir, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=1)
        yield st


def _create(client: httpx.Client, shape: dict[str, Any]) -> str:
    resp = client.post("/v1/videos", json={"model": MODEL, "prompt": "a ball", **shape})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def test_a_job_too_large_for_memory_fails_oom_and_the_worker_goes_on(ostack: Stack) -> None:
    with ostack.client_without_failpoints() as client:
        assert ostack.wait_for(client, _create(client, SMALL))["status"] == "completed"
        vid = _create(client, LARGE)
        final = ostack.wait_for(client, vid)
        assert final["status"] == "failed"
        assert final["error"] == {"code": "oom", "message": "the device ran out of memory"}
        assert final["progress"] < 100
        (line,) = [m for m in OOM_LINE.finditer(ostack.log("w0")) if m.group(1) == vid]
        assert line.group(2) == "step 1 of 5"  # the first step's first block asked for it
        assert float(line.group(3)) <= float(line.group(4))
        assert client.get(f"/v1/videos/{vid}").json()["status"] == "failed"  # and stays so
        nxt = ostack.wait_for(client, _create(client, SMALL))
        assert nxt["status"] == "completed", nxt


# ---- in process ---------------------------------------------------------------------------


@pytest.fixture
def executor(tmp_path: Path, s3_server: EmbeddedS3) -> Iterator[StepExecutor]:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    upgrade(url)
    settings = Settings(
        database={"url": url},
        s3=s3_settings(s3_server),
        worker={
            "tmp_dir": str(tmp_path),
            "failpoints_file": str(tmp_path / "failpoints.json"),
            "reconcile_interval_s": 0,
        },
    )
    engine = make_engine(settings.database)
    served = ServedModel(name=MODEL, adapter=ADAPTER, dtype="float32", spec=ModelSpec(name=MODEL))
    pipelines = PipelineRegistry({MODEL: served}, "cpu")
    artifacts = ArtifactStore(make_s3_client(settings.s3), settings.s3)
    jobs = JobStore(make_sessionmaker(engine))
    yield StepExecutor(settings, jobs, artifacts, pipelines, worker_id="test:1:oom")
    engine.dispose()


def _job(executor: StepExecutor, width: int, height: int, frames: int) -> str:
    spec = VideoSpec(
        model=MODEL,
        prompt="a ball",
        seed=1,
        num_inference_steps=5,
        width=width,
        height=height,
        num_frames=frames,
        fps=16,
    )
    job_id = f"video_{uuid.uuid4().hex}"
    executor.jobs.create(Job.new(spec, id=job_id, owner="test"), idempotency_window_s=0)
    return job_id


def _failpoints(executor: StepExecutor, points: dict[str, str]) -> None:
    path = executor.settings.worker.failpoints_file
    assert path is not None
    Path(path).write_text(json.dumps(points))


def test_the_failed_steps_tensors_are_released_and_the_row_failed_first(
    executor: StepExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    """Every log record is held (``caplog``), the failure's traceback with it: the step's
    tensors must die anyway. The row is failed before the memory is released."""
    caplog.set_level(logging.INFO)
    released_after: list[str | None] = []
    release = executor._release_memory

    def release_memory(**kw: Any) -> None:  # the row as the release finds it
        row = executor.jobs.get(job_id)
        released_after.append(row.status if row else None)
        release(**kw)

    executor._release_memory = release_memory  # type: ignore[method-assign]
    job_id = _job(executor, 1280, 720, 81)
    assert executor.run(job_id, MODEL) == "oom"
    refs = AttentionPipeline.step_tensors
    assert len(refs) == 2 and all(ref() is None for ref in refs)
    row = executor.jobs.get(job_id)
    assert row is not None
    assert (row.status, row.error_code, row.stage) == ("failed", "oom", "denoise")
    assert released_after == ["failed"]
    (line,) = [m for r in caplog.records if (m := OOM_LINE.search(r.getMessage()))]
    assert line.group(1) == job_id and line.group(2) == "step 1 of 5"
    assert row.completed_at is not None
    assert float(line.group(3)) <= row.completed_at <= float(line.group(4))
    # the whole traceback is still in the log, for whoever reads it
    assert any(
        r.exc_info and r.exc_info[0] and issubclass(r.exc_info[0], MemoryError)
        for r in caplog.records
    )

    nxt = _job(executor, 64, 48, 8)
    assert executor.run(nxt, MODEL) == "completed"


def test_an_oom_raised_in_a_block_hook_is_a_failure_not_a_stop(executor: StepExecutor) -> None:
    """The block gates are where a cancel stops a step; an out-of-memory raised there is
    still ``oom``, and the stop flag stays down for the next job's gates."""
    _failpoints(executor, {"block:1:2": "oom"})
    job_id = _job(executor, 64, 48, 8)
    assert executor.run(job_id, MODEL) == "oom"
    row = executor.jobs.get(job_id)
    assert row is not None and (row.status, row.error_code) == ("failed", "oom")
    assert row.cancel_requested is False
    assert all(ref() is None for ref in AttentionPipeline.step_tensors)
    _failpoints(executor, {})
    assert executor.run(_job(executor, 64, 48, 8), MODEL) == "completed"
