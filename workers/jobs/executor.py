"""The step executor: claim → prepare → step × N → decode → encode → upload → complete.

The executor owns the denoise loop, so between any two steps it can notice a cancel (the
job row is no longer ``in_progress`` and ours), enforce the deadline and record progress:
it asks the run (:class:`workers.jobs.run.JobRun`, the run's state, heartbeat and stop
gates). Cleanup lives here, not in the adapters: on every way out the temp directory is
removed, per-request tensors are dropped, and unless the job completed every object under
the job's S3 prefix is deleted (multipart uploads are aborted by the store itself).

The job's typed spec (``models/job_specs.py``, parsed once per run) says what to make:
its outputs (a video job's ``n``), each made by :func:`workers.jobs.output.make_output`
(the step loop, the decode and the encode) into the job's temp directory, then uploaded
together.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from sqlalchemy.exc import InterfaceError, OperationalError

from models.db import Artifact, Job
from models.errors import JobLost, JobTimedOut, UploadAborted, WorkerStopping
from models.events import DoneEvent, StatusEvent
from models.job_specs import AudioSpec, VideoSpec, output_variant
from storage.artifacts import ArtifactStore, try_delete_prefix
from storage.bus import EventBus
from storage.constants import job_events_key, job_prefix
from storage.jobs import JobStore, Lease
from storage.settings import Settings
from workers.common import metrics
from workers.common.failpoints import Failpoints
from workers.common.memory import forget_frames, peak_memory_mb, release_after_run
from workers.jobs.batcher import DeviceShare, StepBatcher
from workers.jobs.claim import JobClaim
from workers.jobs.objects import drop_other_attempts, output_prefix, stale_prefix
from workers.jobs.output import Files, make_output
from workers.jobs.references import load_references
from workers.jobs.run import JobRun
from workers.jobs.shutdown import Shutdown
from workers.jobs.temp_dirs import TempDirs, temp_root
from workers.pipelines.base import GenerationRequest, Pipeline, SupportsStepBatch
from workers.pipelines.registry import PipelineRegistry

log = logging.getLogger(__name__)


@dataclass(eq=False, repr=False)
class StepExecutor:
    """Runs jobs with the injected stores and pipelines (one per worker process)."""

    settings: Settings
    jobs: JobStore
    artifacts: ArtifactStore
    pipelines: PipelineRegistry
    worker_id: str
    bus: EventBus | None = None
    # The worker's job temp directories (the context's, which its sweep shares); by
    # default a set of this executor's own under the configured ``tmp_dir``.
    temp_dirs: TempDirs | None = None
    # Puts a job id back on its model's broker queue (the worker's JobQueue.enqueue): what
    # a run released by the worker's shutdown needs.
    requeue: Callable[[str, str], Any] | None = None
    shutdown: Shutdown = field(default_factory=Shutdown)  # SIGTERM: workers/jobs/shutdown.py
    # Who runs on the device (one job, or up to OMNIQ_WORKER__BATCH_SIZE of batched models)
    # and the step batcher of each batched model (batcher.py; ``start_batching``).
    device: DeviceShare = field(default_factory=lambda: DeviceShare(1))
    batchers: dict[str, StepBatcher] = field(default_factory=dict)
    failpoints: Failpoints = field(init=False)
    claim: JobClaim = field(init=False)  # which job a message runs (workers/jobs/claim.py)

    def __post_init__(self) -> None:
        if self.temp_dirs is None:
            self.temp_dirs = TempDirs(temp_root(self.settings))
        self.failpoints = Failpoints(self.settings.worker.failpoints_file)
        self.claim = JobClaim(
            self.settings, self.jobs, self.worker_id, self._publish, self._delete_objects
        )

    # ---- entry ------------------------------------------------------------------

    def start_batching(self) -> dict[str, StepBatcher]:
        """With ``OMNIQ_WORKER__BATCH_SIZE`` above 1, a step batcher for each loaded model
        whose adapter batches its steps (and holds its weights on the device: an offload
        plan moves them between calls), warmed up for batches on its device thread; the
        other models' jobs run alone (``DeviceShare``). Called once the models loaded."""
        size = self.settings.worker.batch_size
        self.device = DeviceShare(size)
        if size < 2:
            return self.batchers
        wait_s = self.settings.worker.batch_wait_ms / 1000
        for name, model in self.pipelines.models.items():
            pipe = self.pipelines.job(name)
            offloads = model.spec.memory is not None and model.spec.memory.offload != "none"
            if not isinstance(pipe, SupportsStepBatch) or offloads:
                log.info("model %s: one job at a time (its steps are not batched)", name)
                continue
            batcher = StepBatcher(pipe, size=size, wait_s=wait_s, name=name)
            batcher.call(functools.partial(pipe.warm_up_batch, size))
            self.batchers[name] = batcher
            log.info("model %s: up to %d jobs at once, their steps batched", name, size)
        return self.batchers

    def run(self, job_id: str, model: str) -> str:
        """Run one job to a terminal state for the message of ``job_id`` (which job:
        :meth:`workers.jobs.claim.JobClaim.acquire`); returns the outcome for logs and tests.
        On a worker that batches ``model``'s steps, beside the model's other jobs; else
        alone on the device."""
        with self.device.hold(batched=model in self.batchers):
            return self._run(job_id, model, self.batchers.get(model))

    def _run(self, job_id: str, model: str, batcher: StepBatcher | None) -> str:
        assert self.temp_dirs is not None
        job = self.claim.acquire(job_id, model)
        if job is None:
            return "skipped"
        job_id = job.id  # from here on: the job this message runs
        lease = Lease(self.worker_id, job.attempt)
        run = JobRun(job, lease, self.jobs, self.settings, self._publish, self.failpoints)
        started = self._publish(job, StatusEvent(status="in_progress"))
        tmp = self.temp_dirs.make(job_id)  # this host's sweep leaves it alone meanwhile
        run.start(self.bus, started)
        pipe: Pipeline | None = None
        completed = False
        outcome = "failed"
        try:
            pipe = self.pipelines.job(job.model)
            with self.shutdown.running(run):
                completed = self._execute_on(pipe, run, tmp, batcher)
            outcome = "completed" if completed else "cancelled"
            if not completed:
                run.record_cancelled()
        except (JobLost, UploadAborted) as exc:
            forget_frames(exc)  # a stop inside a step: its tensors go with the state
            if run.stop.cause is WorkerStopping and self._release(run):
                outcome = "released"  # back on the queue, for the next worker
            else:
                outcome = "cancelled"  # whoever took the job from us recorded why
                run.record_cancelled()
        except (OperationalError, InterfaceError) as exc:
            # The database is out of reach: the row cannot be written (not even failed), so
            # the job is left as it is, for a take-over once its heartbeat lapses.
            outcome = "database_lost"
            log.warning("job %s: lost the database in %s; left for a take-over", job_id, run.stage)
            forget_frames(exc)
        except Exception as exc:
            outcome = run.failed(exc).value
        finally:
            run.close()
            if pipe is not None:
                self._end(pipe, run, batcher)
            self.temp_dirs.remove(tmp)
            if not completed:
                self._drop_run_objects(run)
            self._release_memory(after_oom=outcome == "oom", stopped=not completed)
        metrics.run_ended(self.jobs, job, outcome, run.durations)  # the device is idle now
        log.info("job %s: %s", job_id, outcome)
        if torch.cuda.is_available():  # back to the loaded weights after every job
            allocated = torch.cuda.memory_allocated() / 2**20
            log.info("job %s: cuda memory allocated %.1f MiB", job_id, allocated)
        return outcome

    def _release(self, run: JobRun) -> bool:
        """Put the job of a run stopped by the worker's shutdown back on the queue: the
        row (while the run's lease holds it), a ``queued`` event, a broker message."""
        job = run.job
        try:
            released = self.jobs.release(job.id, run.lease)
        except (OperationalError, InterfaceError):
            released = False  # left in progress: the reconciler takes it over later
        if not released:
            return False
        self._publish(job, StatusEvent(status="queued"))
        if self.requeue is not None:
            self.requeue(job.id, job.model)
        return True

    def _end(self, pipe: Pipeline, run: JobRun, batcher: StepBatcher | None) -> None:
        """``pipe.end()`` after every run, once its outcome is recorded (on the batcher's
        device thread where the model's steps are batched)."""
        try:
            pipe.end() if batcher is None else batcher.call(pipe.end)
        except Exception:
            log.exception("job %s: %s.end() failed", run.job.id, type(pipe).__name__)

    # ---- the pipeline -----------------------------------------------------------

    def _execute_on(
        self, pipe: Pipeline, run: JobRun, tmp: Path, batcher: StepBatcher | None
    ) -> bool:
        """Make the job's outputs one after another (a video job's ``n``: output k as an
        ``n = 1`` job of seed ``seed + k`` makes it), then upload them all and complete."""
        job, spec = run.job, run.spec
        if torch.cuda.is_available() and self.device.running < 2:  # the peak of jobs alone
            torch.cuda.reset_peak_memory_stats()
        inputs = self._request(spec)  # the conditioning inputs, fetched once
        count = spec.n if isinstance(spec, VideoSpec) else 1
        files: Files = []
        extra_values: dict[str, Any] = {}
        inference_time = 0.0
        for index in range(count):
            out = tmp if index == 0 else tmp / f"output{index}"
            out.mkdir(exist_ok=True)
            if index:
                self._end(pipe, run, batcher)  # between outputs as between jobs
                run.begin_output(index, count)
            request = inputs
            if index and isinstance(spec, VideoSpec):
                request = dataclasses.replace(inputs, spec=spec.output(index))
            made, values, seconds = make_output(pipe, run, request, out, index, batcher)
            files += [(output_variant(variant, index), path, ct) for variant, path, ct in made]
            extra_values.update(values)
            inference_time += seconds
        del inputs

        run.enter("upload")
        run.failpoint("upload")
        artifacts = self._upload(run, files, tmp)
        run.end_stage()
        run.failpoint("complete")

        now = time.time()
        done = self.jobs.complete(
            job.id,
            run.lease,
            artifacts,
            **extra_values,
            progress=100,
            step=job.num_inference_steps,
            stage="done",
            completed_at=now,
            expires_at=now + self.settings.artifact_ttl_s,
            stage_durations=run.durations,
            inference_time_s=round(inference_time, 4),
            peak_memory_mb=peak_memory_mb(),
        )
        if done:
            self._publish(job, DoneEvent(status="completed"))
            # the output of earlier attempts (a killed or cut-off worker's)
            drop_other_attempts(self.artifacts, job, run.lease.attempt)
        return done

    def _request(self, spec: VideoSpec | AudioSpec) -> GenerationRequest:
        """What the adapter gets: the spec, with its reference frame or its keyframes and
        references fetched and decoded."""
        request = GenerationRequest(spec)
        if isinstance(spec, VideoSpec) and spec.reference_key:
            png = self.artifacts.get_bytes(spec.reference_key)
            with Image.open(io.BytesIO(png)) as img:
                request.reference_image = np.asarray(img.convert("RGB"))
        if isinstance(spec, VideoSpec) and spec.references:
            first, last, refs = load_references(spec.references, self.artifacts.get_bytes)
            request.reference_image, request.last_image, request.references = first, last, refs
        return request

    def _upload(self, run: JobRun, files: Files, tmp: Path) -> list[Artifact]:
        """Each file under the run's prefix, at its path in ``tmp`` (``video.mp4``, an
        output k's ``output{k}/video.mp4``)."""
        job = run.job
        prefix = output_prefix(job, run.lease.attempt)
        out = []
        for variant, path, ctype in files:
            key = prefix + path.relative_to(tmp).as_posix()
            size = self.artifacts.upload_file(key, path, ctype, should_continue=run.next_part)
            run.check()
            out.append(
                Artifact(
                    job_id=job.id,
                    variant=variant,
                    bucket=self.artifacts.bucket,
                    key=key,
                    content_type=ctype,
                    size_bytes=size,
                    created_at=time.time(),
                )
            )
        return out

    def _publish(self, job: Job, event: Any, data: bytes | None = None) -> str | None:
        """Events are best effort: a bus failure never fails the job (the row is the
        truth, and pollers still see it). Returns the entry's id, None when not sent
        (or refused: fenced by the job's ``attempt``, :meth:`EventBus.publish_fenced`)."""
        if self.bus is None:
            return None
        stream = job_events_key(job.id)
        try:
            if job.attempt is None:  # not claimed (a queued job's end)
                return self.bus.publish(stream, event, data)
            return self.bus.publish_fenced(stream, event, data, attempt=job.attempt)
        except Exception:
            log.warning("could not publish %s of %s", event.type, job.id, exc_info=True)
            return None

    # ---- cleanup ----------------------------------------------------------------

    def _delete_objects(self, job: Job) -> None:
        try_delete_prefix(self.artifacts, job_prefix(job.kind, job.id))

    def _drop_run_objects(self, run: JobRun) -> None:
        """A run that did not complete: what :func:`workers.jobs.objects.stale_prefix` says
        it may delete (everything of a job that ended otherwise; only its own attempt's
        output when another attempt holds or completed the job)."""
        try_delete_prefix(self.artifacts, stale_prefix(self.jobs, run.job, run.lease))

    @staticmethod
    def _release_memory(*, after_oom: bool = False, stopped: bool = False) -> None:
        release_after_run(after_oom=after_oom, stopped=stopped)  # tests wrap this method


__all__ = ["JobLost", "JobTimedOut", "Pipeline", "StepExecutor"]
