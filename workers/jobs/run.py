"""One run of a job by this worker: its state, what it writes under its lease, its
heartbeat and its stop gates.

The executor (``workers/jobs/executor.py``) claims a job, makes a :class:`JobRun` of it and
drives the pipeline; the run is everything the executor asks between two calls:

* **state**: the stage, its timings, the progress and the step, the deadline;
* **writes**, each fenced by the run's :class:`~storage.jobs.Lease` (the worker and the
  attempt): progress at a stage change (:meth:`JobRun.enter`) and per step
  (:meth:`JobRun.report`, written by the heartbeat), the failure (:meth:`JobRun.failed`),
  and the run's events (progress, preview, PCM chunks, a failure's ``done``);
* **the heartbeat**: a writer thread that writes the step loop's progress and heartbeats
  besides, so a long stage is not taken for a dead worker;
* **the stop gates**: where the run asks whether it is still to run (the deadline, and
  its :class:`~workers.common.stop_signal.StopSignal`, whose module lists every source and gate).

Its lines log as ``workers.jobs.executor``: one job's story is one logger's (benchmarks and
operators read them there).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from models.common import JobError
from models.db import Job, job_spec
from models.errors import ErrorCode, JobLost, JobTimedOut
from models.events import ChunkEvent, DoneEvent, PreviewEvent, ProgressEvent
from models.job_specs import AudioSpec, VideoSpec
from storage.bus import EventBus
from storage.jobs import JobStore, Lease
from storage.settings import Settings
from workers.common.failpoints import Failpoints
from workers.common.failures import classify, log_level
from workers.common.memory import forget_frames
from workers.common.stop_signal import StopSignal
from workers.media.audio import AudioOut, pcm16
from workers.media.mp4 import preview_jpeg
from workers.pipelines.base import StopReason, SupportsPreview

log = logging.getLogger("workers.jobs.executor")

# Progress (0–100) at the start of each stage; denoise fills its span step by step.
STAGE_START = {"prepare": 0, "denoise": 5, "decode": 85, "encode": 90, "upload": 95}
DENOISE_END = 85
# Inside prepare/decode, the ownership check runs at most this often (a DB read each).
STOP_POINT_INTERVAL_S = 0.02

# The executor's best-effort, attempt-fenced publish: (job, event, data) → entry id or None.
Publish = Callable[[Job, Any, bytes | None], str | None]


@dataclass(eq=False)
class JobRun:
    """One run of a claimed ``job`` under ``lease``: made when the claim succeeds, its
    threads begun by :meth:`start` and ended by :meth:`close` in the run's ``finally``."""

    job: Job
    lease: Lease  # the worker and the attempt: every write of the run is fenced by it
    jobs: JobStore
    settings: Settings
    publish_to: Publish
    failpoints: Failpoints
    spec: VideoSpec | AudioSpec = field(init=False)
    timeout_s: float = field(init=False)
    deadline: float = field(init=False)
    stage: str = "prepare"
    stage_started: float = field(default_factory=time.monotonic)
    durations: dict[str, float] = field(default_factory=dict)
    progress: int = 0
    step: int = 0
    published_step: int = -1  # the step of the last progress event sent
    # Set by the step loop when it has progress to write; the writer thread writes it.
    dirty: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one write at a time
    # Set once the job is no longer ours to run: its sources and gates are listed in
    # workers/common/stop_signal.py.
    stop: StopSignal = field(init=False)
    # (index, count) of the output being made: a job of n outputs makes them one after
    # another, and its progress runs once from 0 to 100 over all of them.
    output: tuple[int, int] = (0, 1)
    _stage_base: float = 0.0  # the stage's time in the outputs before this one
    blocks: int = 0  # block gates passed in the current step
    in_step: bool = False  # inside ``pipe.step`` (what an out-of-memory line names)
    _heartbeat_done: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        job, limits = self.job, self.settings.limits
        self.spec = job_spec(job)  # the typed spec, parsed once per run
        timeout = self.spec.timeout_s or limits.default_job_timeout_s
        self.timeout_s = min(timeout, limits.max_job_timeout_s)
        self.deadline = time.time() + self.timeout_s
        self.progress = job.progress  # a taken-over job never reports less than before
        queued = max((job.started_at or time.time()) - job.created_at, 0)
        self.durations["queue"] = round(queued, 4)
        self.stop = StopSignal(lambda: self.jobs.still_owned(job.id, self.lease))

    def start(self, bus: EventBus | None, started: str | None) -> JobRun:
        """Begin the stop signal's bus watch (from the run's ``in_progress`` entry,
        ``started``) and the heartbeat."""
        self.stop.watch(bus, self.job.id, started)
        self._start_heartbeat()
        return self

    def close(self) -> None:
        """The run ended: the heartbeat and the bus watch stop."""
        self._heartbeat_done.set()
        self.stop.close()

    def timed_out(self) -> JobTimedOut:
        return JobTimedOut(f"the job passed its {self.timeout_s:g} s deadline")

    def end_stage(self) -> None:
        """The current stage's time (summed over the job's outputs) into ``durations``."""
        elapsed = time.monotonic() - self.stage_started
        self.durations[self.stage] = round(self._stage_base + elapsed, 4)

    def record_cancelled(self) -> None:
        """After a stop: the run's stage times onto its job's row, if a cancel ended the
        job under it (the cancel wrote the row, without the time in the last stage). A
        take-over's row is another run's and keeps its own."""
        self.end_stage()
        try:
            self.jobs.record_cancelled_run(self.job.id, self.lease, self.durations)
        except SQLAlchemyError:  # only figures are lost
            log.warning("job %s: could not record the cancelled run's stage times", self.job.id)

    def publish(self, event: Any, data: bytes | None = None) -> str | None:
        return self.publish_to(self.job, event, data)

    # ---- progress ---------------------------------------------------------------

    def enter(self, stage: str) -> None:
        self.end_stage()
        self.stage = stage
        self._stage_base = self.durations.get(stage, 0.0)
        self.stage_started = time.monotonic()
        self.report(STAGE_START[stage], force=True)

    def begin_output(self, index: int, count: int) -> None:
        """Start output ``index`` of ``count`` (after the first): its prepare, steps from
        0 again (their events too), progress from where the last output left it."""
        self.output = (index, count)
        self.step = 0
        self.published_step = -1
        self.enter("prepare")

    def _overall(self, progress: int) -> int:
        """A stage's progress within one output → the job's: each output has an equal
        share of 0..95 (the upload, of all of them at once, keeps 95..100)."""
        index, count = self.output
        top = STAGE_START["upload"]
        if count == 1 or progress >= top:
            return progress
        return (index * top + progress) // count

    def report(self, progress: int, *, force: bool = False) -> None:
        """Check deadline and ownership; record progress. A forced report (a stage change)
        is written here; a step's goes to the writer thread (:meth:`_start_heartbeat`), so
        the step loop never waits on a database write: on a GPU, whose queue holds only a
        couple of blocks (``workers/pipelines/blocks.py``), it would idle meanwhile."""
        if time.time() > self.deadline:
            raise self.timed_out()
        self.progress = max(self.progress, self._overall(progress))
        if force:
            if not self._write_progress():
                raise JobLost
            if self.stop.is_set():
                raise self.stop.cause()
            return
        self.dirty.set()
        if self.stop.is_set():
            raise self.stop.cause()
        self.check()

    def preview(self, pipe: SupportsPreview, state: Any) -> None:
        """A ``preview`` event of the current step, when the adapter has an estimate."""
        image = pipe.preview(state)
        if image is None:
            return
        jpeg = preview_jpeg(image, self.settings.worker.preview_max_side)
        event = PreviewEvent(
            step=self.step,
            width=jpeg.width,
            height=jpeg.height,
            jpeg_b64=base64.b64encode(jpeg.data).decode(),
        )
        self.publish(event)

    def stream_pcm(self, audio: AudioOut) -> None:
        """Publish the clip as ``chunk`` events of raw PCM16 (about 100 ms each)."""
        size = max(1, audio.sample_rate // 10)
        for seq, start in enumerate(range(0, audio.num_samples, size)):
            data = pcm16(audio, start, start + size)
            frames = min(size, audio.num_samples - start)
            self.publish(ChunkEvent(seq=seq, byte_length=len(data), num_frames=frames), data)
        self.check()

    def _write_progress(self, *, background: bool = False) -> bool:
        """Write the job's latest progress, step and stage, and send them as a progress
        event (from the writer thread: only new denoise steps). False: no longer ours."""
        with self.lock:
            ok = self.jobs.update_running(
                self.job.id,
                self.lease,
                progress=self.progress,
                step=self.step,
                stage=self.stage,
                stage_durations=self.durations,
            )
            if not ok:
                return False
            if background and (self.stage != "denoise" or self.step <= self.published_step):
                return True
            self.published_step = self.step
            event = ProgressEvent(
                progress=self.progress,
                step=self.step,
                num_steps=self.job.num_inference_steps,
                stage=self.stage,
            )
            self.publish(event)
            return True

    def _start_heartbeat(self) -> None:
        """The job's writer thread: it writes the step loop's progress within
        ``progress_interval_s`` of a step, and heartbeats every ``heartbeat_s`` besides, so
        a long stage (decode, upload) is not taken for a dead worker. When the job is no
        longer ours it sets the stop flag (the block gates and the step loop read it)."""
        done = self._heartbeat_done
        w = self.settings.worker

        def beat() -> None:
            last = time.monotonic()
            while not done.wait(min(w.progress_interval_s, w.heartbeat_s)):
                now = time.monotonic()
                if not self.dirty.is_set() and now - last < w.heartbeat_s:
                    continue
                self.dirty.clear()
                last = now
                try:
                    if done.is_set():
                        return
                    if not self._write_progress(background=True):
                        self.stop.set()  # cancelled or taken over: stop inside the step too
                        return
                except Exception:
                    log.warning("heartbeat of %s failed", self.job.id, exc_info=True)

        threading.Thread(target=beat, name=f"heartbeat-{self.job.id}", daemon=True).start()

    # ---- the stop gates -----------------------------------------------------------

    def check(self) -> None:
        self.stop.check()  # a row read; raises JobLost once the job is not ours

    def owned(self) -> bool:
        return not self.stop.poll()

    def failpoint(self, name: str) -> None:
        self.failpoints.hit(name, self.owned, self.lease.attempt, self.job.id)

    def next_part(self) -> bool:
        """Asked before each part of a multipart upload: go on only while the job is ours."""
        self.failpoint("upload_part")
        return self.owned()

    def stop_point(self) -> Callable[[], None]:
        """What ``checkpoint()`` runs inside prepare and decode: the deadline and the
        ownership check of a step boundary, at most every ``STOP_POINT_INTERVAL_S``."""
        last = time.monotonic()

        def check() -> None:
            nonlocal last
            now = time.monotonic()
            if now - last < STOP_POINT_INTERVAL_S:
                return
            last = now
            if time.time() > self.deadline:
                raise self.timed_out()
            self.check()

        return check

    def in_step_stop(self) -> StopReason:
        """What the denoiser's block gates ask before each block: the stop flag and the
        deadline (no database read: the stop watch and the heartbeat set the flag)."""
        failpoints = self.failpoints
        noted: list[int] = []

        def reason(block: int) -> BaseException | None:
            if block != self.blocks:
                self.blocks = block
                if failpoints.path is not None:
                    self.failpoint(f"block:{self.step}:{block}")
            if self.stop.is_set():
                if not noted:  # a group's gates ask again until the ranks agree
                    noted.append(block)
                    log.info(
                        "job %s stops in step %d before block %d", self.job.id, self.step, block
                    )
                return self.stop.cause()
            if time.time() > self.deadline:
                return self.timed_out()
            return None

        return reason

    # ---- failure ------------------------------------------------------------------

    def failed(self, exc: Exception) -> ErrorCode:
        """A run that raised: the row failed with the exception's stable code first, so
        pollers see the terminal state before anything slow (the traceback's formatting,
        ``pipe.end()``, which in a worker group waits for the other ranks, the memory
        release, the objects' deletion); then the log, and the failed work's frames let go."""
        caught = time.time()  # an out-of-memory: the closest to its allocation failure
        code, message = classify(exc)
        if code == ErrorCode.INTERNAL_ERROR:
            message = f"{message} in stage {self.stage}"
        self._fail(code, message)
        if code == ErrorCode.OOM:
            n = self.job.num_inference_steps
            where = f"step {self.step + 1} of {n}" if self.in_step else f"stage {self.stage}"
            log.warning(
                "job %s: out of memory in %s at %.6f; failed at %.6f",
                self.job.id,
                where,
                caught,
                time.time(),
            )
        level = log_level(code)
        log.log(level, "job %s failed in %s: %s", self.job.id, self.stage, code, exc_info=exc)
        forget_frames(exc)  # nothing of the failed step stays referenced through exc
        return code

    def _fail(self, code: ErrorCode, message: str) -> None:
        """Fail the job if it is still ours. Under the writer thread's lock: a progress
        event it is sending goes out before the ``done`` event, never after it."""
        self.end_stage()
        with self.lock:
            failed = self.jobs.fail(
                self.job.id,
                code,
                message,
                lease=self.lease,
                stage_durations=self.durations,
                stage=self.stage,
            )
            if failed:
                error = JobError(code=code.value, message=message)
                self.publish(DoneEvent(status="failed", error=error))
