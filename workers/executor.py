"""The step executor: claim → prepare → step × N → decode → encode → upload → complete.

The executor owns the denoise loop, so between any two steps it can notice a cancel (the
job row is no longer ``in_progress`` and ours), enforce the deadline and record progress.
Cleanup lives here, not in the adapters: on every way out the temp directory is removed,
per-request tensors are dropped, and unless the job completed every object under the
job's S3 prefix is deleted (multipart uploads are aborted by the store itself).

The job's typed spec (``models/job_specs.py``, parsed once per run) says what to make:
a :class:`VideoSpec` becomes an MP4 and a thumbnail (``workers/media.py``); an
:class:`AudioSpec` one file in the requested format (``workers/audio_media.py``), and, when
it asks for it, its PCM16 samples as ``chunk`` events right after decoding.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from sqlalchemy.exc import InterfaceError, OperationalError

from models.common import JobError
from models.db import Artifact, Job, job_spec
from models.errors import ErrorCode, JobLost, JobTimedOut, StorageError, UploadAborted
from models.events import ChunkEvent, DoneEvent, PreviewEvent, ProgressEvent, StatusEvent
from models.job_specs import AudioJobOutput, AudioSpec, VideoSpec
from storage.artifacts import ArtifactStore
from storage.bus import EventBus
from storage.constants import job_events_key, job_prefix
from storage.jobs import JobStore, Lease
from storage.settings import Settings
from workers import metrics
from workers.audio_media import (
    EXTENSIONS,
    MEDIA_TYPES,
    AudioOut,
    encode_audio,
    output_rate,
    pcm16,
    prepare_audio,
)
from workers.failpoints import Failpoints
from workers.failures import classify, log_level
from workers.job_claim import JobClaim
from workers.media import decode_streamed, encode_video, finish_video, preview_jpeg
from workers.memory import forget_frames, peak_memory_mb, release_after_run
from workers.output_check import Expected, check_mp4
from workers.pipelines.base import (
    GenerationRequest,
    Media,
    Pipeline,
    StopReason,
    checkpoints,
    step_stops,
)
from workers.pipelines.registry import PipelineRegistry
from workers.reconciler import LIVE_TEMP_DIRS
from workers.references import load_references
from workers.run_objects import drop_other_attempts, output_prefix, stale_prefix
from workers.stop_signal import StopSignal
from workers.stop_watch import StopWatch

log = logging.getLogger(__name__)

# Progress (0–100) at the start of each stage; denoise fills its span step by step.
STAGE_START = {"prepare": 0, "denoise": 5, "decode": 85, "encode": 90, "upload": 95}
DENOISE_END = 85
# Inside prepare/decode, the ownership check runs at most this often (a DB read each).
STOP_POINT_INTERVAL_S = 0.02


@dataclass
class _Run:
    """Bookkeeping of one job run (timings, progress throttle)."""

    job: Job
    spec: VideoSpec | AudioSpec
    lease: Lease  # the worker and the attempt: every write of the run is fenced by it
    deadline: float
    stage: str = "prepare"
    stage_started: float = field(default_factory=time.monotonic)
    durations: dict[str, float] = field(default_factory=dict)
    progress: int = 0
    step: int = 0
    published_step: int = -1  # the step of the last progress event sent
    # Set by the step loop when it has progress to write; the writer thread writes it.
    dirty: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one write at a time
    timeout_s: float = 0.0
    # Set once the job is no longer ours to run: its sources and gates are listed in
    # workers/stop_signal.py.
    stop: StopSignal = field(default_factory=StopSignal)
    blocks: int = 0  # block gates passed in the current step
    in_step: bool = False  # inside ``pipe.step`` (what an out-of-memory line names)

    def timed_out(self) -> JobTimedOut:
        return JobTimedOut(f"the job passed its {self.timeout_s:g} s deadline")

    def end_stage(self) -> None:
        self.durations[self.stage] = round(time.monotonic() - self.stage_started, 4)


@dataclass(eq=False, repr=False)
class StepExecutor:
    """Runs jobs with the injected stores and pipelines (one per worker process)."""

    settings: Settings
    jobs: JobStore
    artifacts: ArtifactStore
    pipelines: PipelineRegistry
    worker_id: str
    bus: EventBus | None = None
    failpoints: Failpoints = field(init=False)
    claim: JobClaim = field(init=False)  # which job a message runs (workers/job_claim.py)

    def __post_init__(self) -> None:
        self.failpoints = Failpoints(self.settings.worker.failpoints_file)
        self.claim = JobClaim(
            self.settings, self.jobs, self.worker_id, self._publish, self._delete_objects
        )

    # ---- entry ------------------------------------------------------------------

    def run(self, job_id: str, model: str | None = None) -> str:
        """Run one job to a terminal state for the message of ``job_id`` (which job:
        :meth:`workers.job_claim.JobClaim.acquire`); returns the outcome for logs and tests."""
        job = self.claim.acquire(job_id, model)
        if job is None:
            return "skipped"
        job_id = job.id  # from here on: the job this message runs
        spec = job_spec(job)
        timeout = spec.timeout_s or self.settings.limits.default_job_timeout_s
        timeout = min(timeout, self.settings.limits.max_job_timeout_s)
        run = _Run(
            job=job,
            spec=spec,
            lease=Lease(self.worker_id, job.attempt),
            deadline=time.time() + timeout,
            timeout_s=timeout,
        )
        run.progress = job.progress  # a taken-over job never reports less than before
        run.durations["queue"] = round(max((job.started_at or time.time()) - job.created_at, 0), 4)
        started = self._publish(job, StatusEvent(status="in_progress"))
        run.stop = StopSignal(lambda: self.jobs.still_owned(job_id, run.lease))
        watch = StopWatch(self.bus, job_id, started, run.stop.set).start()
        tmp = Path(tempfile.mkdtemp(prefix=f"omniq-{job_id}-", dir=self.settings.worker.tmp_dir))
        LIVE_TEMP_DIRS.add(tmp)  # this host's sweep leaves it alone while the run lasts
        stop_heartbeat = self._start_heartbeat(run)
        pipe: Pipeline | None = None
        completed = False
        outcome = "failed"
        try:
            pipe = self.pipelines.job(job.model)
            completed = self._execute_on(pipe, run, tmp)
            outcome = "completed" if completed else "cancelled"
        except (JobLost, UploadAborted) as exc:
            outcome = "cancelled"  # whoever took the job from us recorded why
            forget_frames(exc)  # a stop inside a step: its tensors go with the state
        except (OperationalError, InterfaceError) as exc:
            # The database is out of reach: the row cannot be written (not even failed), so
            # the job is left as it is, for a take-over once its heartbeat lapses.
            outcome = "database_lost"
            log.warning("job %s: lost the database in %s; left for a take-over", job_id, run.stage)
            forget_frames(exc)
        except Exception as exc:
            outcome = self._failed(run, exc).value
        finally:
            stop_heartbeat.set()
            watch.close()
            if pipe is not None:
                self._end(pipe, run)
            shutil.rmtree(tmp, ignore_errors=True)
            LIVE_TEMP_DIRS.discard(tmp)
            if not completed:
                self._drop_run_objects(run)
            self._release_memory(after_oom=outcome == "oom", stopped=not completed)
        metrics.run_ended(self.jobs, job, outcome, run.durations)  # the device is idle now
        log.info("job %s: %s", job_id, outcome)
        if torch.cuda.is_available():  # back to the loaded weights after every job
            allocated = torch.cuda.memory_allocated() / 2**20
            log.info("job %s: cuda memory allocated %.1f MiB", job_id, allocated)
        return outcome

    def _failed(self, run: _Run, exc: Exception) -> ErrorCode:
        """A run that raised: the row failed with the exception's stable code first, so
        pollers see the terminal state before anything slow (the traceback's formatting,
        ``pipe.end()``, which in a worker group waits for the other ranks, the memory
        release, the objects' deletion); then the log, and the failed work's frames let go."""
        caught = time.time()  # an out-of-memory: the closest to its allocation failure
        code, message = classify(exc)
        if code == ErrorCode.INTERNAL_ERROR:
            message = f"{message} in stage {run.stage}"
        self._fail(run, code, message)
        if code == ErrorCode.OOM:
            n = run.job.num_inference_steps
            where = f"step {run.step + 1} of {n}" if run.in_step else f"stage {run.stage}"
            log.warning(
                "job %s: out of memory in %s at %.6f; failed at %.6f",
                run.job.id,
                where,
                caught,
                time.time(),
            )
        level = log_level(code)
        log.log(level, "job %s failed in %s: %s", run.job.id, run.stage, code, exc_info=exc)
        forget_frames(exc)  # nothing of the failed step stays referenced through exc
        return code

    def _end(self, pipe: Pipeline, run: _Run) -> None:
        """``pipe.end()`` after every run, once its outcome is recorded."""
        try:
            pipe.end()
        except Exception:
            log.exception("job %s: %s.end() failed", run.job.id, type(pipe).__name__)

    # ---- the pipeline -----------------------------------------------------------

    def _execute_on(self, pipe: Pipeline, run: _Run, tmp: Path) -> bool:
        job = run.job
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        started = time.monotonic()

        request = self._request(run.spec)
        self._failpoint(run, "prepare")
        with checkpoints(self._stop_point(run)):
            state = pipe.prepare(request)
        del request
        self._enter(run, "denoise")
        preview_every = self.settings.worker.preview_every
        in_step = self._in_step_stop(run)
        step_seconds = metrics.STEP_SECONDS.labels(job.model)
        while not state.done:
            self._failpoint(run, f"step:{state.step_index}")
            run.blocks = 0
            step_started = time.monotonic()
            run.in_step = True
            with step_stops(in_step):
                pipe.step(state)
            run.in_step = False
            step_seconds.observe(time.monotonic() - step_started)
            run.step = state.step_index
            span = DENOISE_END - STAGE_START["denoise"]
            progress = STAGE_START["denoise"] + span * state.step_index // state.num_steps
            self._report(run, progress, force=state.done)
            if preview_every and state.step_index % preview_every == 0 and not state.done:
                self._preview(run, pipe, state)

        self._enter(run, "decode")
        self._failpoint(run, "decode")
        streamed: np.ndarray | None = None  # the middle frame, once the MP4 is written
        # The raw frames' SHA-256, when logged (``worker.log_frame_digests``).
        frames_digest = hashlib.sha256() if self.settings.worker.log_frame_digests else None
        with checkpoints(self._stop_point(run)):
            if isinstance(run.spec, VideoSpec):
                streamed = decode_streamed(pipe, state, run.spec.fps, tmp, frames_digest)
            media = pipe.decode(state) if streamed is None else None
        del state
        inference_time = time.monotonic() - started

        self._enter(run, "encode")
        self._failpoint(run, "encode")
        extra_values: dict[str, Any] = {}
        if streamed is not None:
            files = finish_video(streamed, tmp)
        elif isinstance(run.spec, AudioSpec):
            assert media is not None
            files, output = self._encode_audio(run, run.spec, media, tmp)
            extra_values["output"] = output.model_dump()
        else:
            assert media is not None
            files = encode_video(media, tmp, frames_digest)
        if isinstance(run.spec, VideoSpec):
            made_sound = media is not None and media.audio is not None
            check_mp4(tmp / "video.mp4", Expected.of(run.spec, audio=made_sound))
        del media
        if frames_digest is not None and isinstance(run.spec, VideoSpec):
            log.info("job %s: frames sha256 %s", job.id, frames_digest.hexdigest())

        self._enter(run, "upload")
        self._failpoint(run, "upload")
        artifacts = self._upload(run, files)
        run.end_stage()
        self._failpoint(run, "complete")

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
            self._drop_other_attempts(run)
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

    def _encode_audio(
        self, run: _Run, spec: AudioSpec, media: Media, tmp: Path
    ) -> tuple[list[tuple[str, Path, str]], AudioJobOutput]:
        """Convert to the artifact's rate and channels, stream it as PCM16 chunks when the
        spec asks for it (before the encode, so listeners need not wait for it), encode."""
        fmt = spec.response_format
        if media.audio is None or not media.sample_rate:
            raise RuntimeError(f"model {run.job.model} made no audio")
        rate = output_rate(fmt, media.sample_rate, spec.sample_rate)
        audio = prepare_audio(media.audio, media.sample_rate, rate=rate, channels=spec.channels)
        if spec.stream_pcm:
            self._stream_pcm(run, audio)
        path = tmp / f"audio.{EXTENSIONS[fmt]}"
        encode_audio(audio, fmt, path)
        output = AudioJobOutput(
            sample_rate=audio.sample_rate, channels=audio.channels, num_samples=audio.num_samples
        )
        return [("audio", path, MEDIA_TYPES[fmt])], output

    def _stream_pcm(self, run: _Run, audio: AudioOut) -> None:
        """Publish the clip as ``chunk`` events of raw PCM16 (about 100 ms each)."""
        size = max(1, audio.sample_rate // 10)
        for seq, start in enumerate(range(0, audio.num_samples, size)):
            data = pcm16(audio, start, start + size)
            frames = min(size, audio.num_samples - start)
            event = ChunkEvent(seq=seq, byte_length=len(data), num_frames=frames)
            self._publish(run.job, event, data)
        self._check(run)

    def _upload(self, run: _Run, files: list[tuple[str, Path, str]]) -> list[Artifact]:
        job = run.job
        prefix = output_prefix(job, run.lease.attempt)
        bucket = self.artifacts.bucket
        out = []
        for variant, path, ctype in files:
            key = prefix + path.name
            size = self.artifacts.upload_file(
                key, path, ctype, should_continue=lambda: self._next_part(run)
            )
            self._check(run)
            out.append(
                Artifact(
                    job_id=job.id,
                    variant=variant,
                    bucket=bucket,
                    key=key,
                    content_type=ctype,
                    size_bytes=size,
                    created_at=time.time(),
                )
            )
        return out

    # ---- between steps ------------------------------------------------------------

    def _enter(self, run: _Run, stage: str) -> None:
        run.end_stage()
        run.stage = stage
        run.stage_started = time.monotonic()
        self._report(run, STAGE_START[stage], force=True)

    def _report(self, run: _Run, progress: int, *, force: bool = False) -> None:
        """Check deadline and ownership; record progress. A forced report (a stage change)
        is written here; a step's goes to the writer thread (``_start_heartbeat``), so the
        step loop never waits on a database write: on a GPU, whose queue holds only a
        couple of blocks (``workers/pipelines/blocks.py``), it would idle meanwhile."""
        if time.time() > run.deadline:
            raise run.timed_out()
        run.progress = max(run.progress, progress)
        if force:
            if not self._write_progress(run):
                raise JobLost
            return
        run.dirty.set()
        if run.stop.is_set():
            raise JobLost
        self._check(run)

    def _write_progress(self, run: _Run, *, background: bool = False) -> bool:
        """Write the job's latest progress, step and stage, and send them as a progress
        event (from the writer thread: only new denoise steps). False: no longer ours."""
        with run.lock:
            ok = self.jobs.update_running(
                run.job.id,
                run.lease,
                progress=run.progress,
                step=run.step,
                stage=run.stage,
                stage_durations=run.durations,
            )
            if not ok:
                return False
            if background and (run.stage != "denoise" or run.step <= run.published_step):
                return True
            run.published_step = run.step
            event = ProgressEvent(
                progress=run.progress,
                step=run.step,
                num_steps=run.job.num_inference_steps,
                stage=run.stage,
            )
            self._publish(run.job, event)
            return True

    def _failpoint(self, run: _Run, name: str) -> None:
        self.failpoints.hit(name, lambda: self._owned(run), run.lease.attempt, run.job.id)

    def _next_part(self, run: _Run) -> bool:
        """Asked before each part of a multipart upload: go on only while the job is ours."""
        self._failpoint(run, "upload_part")
        return self._owned(run)

    def _stop_point(self, run: _Run) -> Callable[[], None]:
        """What ``checkpoint()`` runs inside prepare and decode: the deadline and the
        ownership check of a step boundary, at most every ``STOP_POINT_INTERVAL_S``."""
        last = time.monotonic()

        def check() -> None:
            nonlocal last
            now = time.monotonic()
            if now - last < STOP_POINT_INTERVAL_S:
                return
            last = now
            if time.time() > run.deadline:
                raise run.timed_out()
            self._check(run)

        return check

    def _in_step_stop(self, run: _Run) -> StopReason:
        """What the denoiser's block gates ask before each block: the stop flag and the
        deadline (no database read: the stop watch and the heartbeat set the flag)."""
        failpoints = self.failpoints
        noted: list[int] = []

        def reason(block: int) -> BaseException | None:
            if block != run.blocks:
                run.blocks = block
                if failpoints.path is not None:
                    self._failpoint(run, f"block:{run.step}:{block}")
            if run.stop.is_set():
                if not noted:  # a group's gates ask again until the ranks agree
                    noted.append(block)
                    log.info("job %s stops in step %d before block %d", run.job.id, run.step, block)
                return JobLost()
            if time.time() > run.deadline:
                return run.timed_out()
            return None

        return reason

    def _check(self, run: _Run) -> None:
        run.stop.check()  # a row read; raises JobLost once the job is not ours

    def _owned(self, run: _Run) -> bool:
        return not run.stop.poll()

    def _fail(self, run: _Run, code: ErrorCode, message: str) -> None:
        """Fail the job if it is still ours. Under the writer thread's lock: a progress
        event it is sending goes out before the ``done`` event, never after it."""
        run.end_stage()
        with run.lock:
            failed = self.jobs.fail(
                run.job.id,
                code,
                message,
                lease=run.lease,
                stage_durations=run.durations,
                stage=run.stage,
            )
            if failed:
                error = JobError(code=code.value, message=message)
                self._publish(run.job, DoneEvent(status="failed", error=error))

    def _preview(self, run: _Run, pipe: Pipeline, state: Any) -> None:
        image = pipe.preview(state)
        if image is None:
            return
        jpeg = preview_jpeg(image, self.settings.worker.preview_max_side)
        event = PreviewEvent(
            step=run.step,
            width=jpeg.width,
            height=jpeg.height,
            jpeg_b64=base64.b64encode(jpeg.data).decode(),
        )
        self._publish(run.job, event)

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

    def _start_heartbeat(self, run: _Run) -> threading.Event:
        """The job's writer thread: it writes the step loop's progress within
        ``progress_interval_s`` of a step, and heartbeats every ``heartbeat_s`` besides, so
        a long stage (decode, upload) is not taken for a dead worker. When the job is no
        longer ours it sets the stop flag (the block gates and the step loop read it)."""
        stop = threading.Event()
        w = self.settings.worker

        def beat() -> None:
            last = time.monotonic()
            while not stop.wait(min(w.progress_interval_s, w.heartbeat_s)):
                now = time.monotonic()
                if not run.dirty.is_set() and now - last < w.heartbeat_s:
                    continue
                run.dirty.clear()
                last = now
                try:
                    if stop.is_set():
                        return
                    if not self._write_progress(run, background=True):
                        run.stop.set()  # cancelled or taken over: stop inside the step too
                        return
                except Exception:
                    log.warning("heartbeat of %s failed", run.job.id, exc_info=True)

        threading.Thread(target=beat, name=f"heartbeat-{run.job.id}", daemon=True).start()
        return stop

    # ---- cleanup ----------------------------------------------------------------

    def _delete_objects(self, job: Job) -> None:
        try:
            self.artifacts.delete_prefix(job_prefix(job.kind, job.id))
        except StorageError:
            log.warning("could not delete objects of %s; the reconciler will", job.id)

    def _drop_run_objects(self, run: _Run) -> None:
        """A run that did not complete: what :func:`workers.run_objects.stale_prefix` says
        it may delete (everything of a job that ended otherwise; only its own attempt's
        output when another attempt holds or completed the job)."""
        try:
            prefix = stale_prefix(self.jobs, run.job, run.lease)
            self.artifacts.delete_prefix(prefix)
        except StorageError:
            log.warning("could not delete objects of %s; the reconciler will", run.job.id)

    def _drop_other_attempts(self, run: _Run) -> None:
        """After completing: the output of earlier attempts (a killed or cut-off worker's)."""
        try:
            drop_other_attempts(self.artifacts, run.job, run.lease.attempt)
        except StorageError:
            log.warning("could not delete earlier attempts' output of %s", run.job.id)

    @staticmethod
    def _release_memory(*, after_oom: bool = False, stopped: bool = False) -> None:
        release_after_run(after_oom=after_oom, stopped=stopped)  # tests wrap this method


__all__ = ["JobLost", "JobTimedOut", "Pipeline", "StepExecutor"]
