"""Video jobs as the API sees them: create, read, cancel, delete, fetch content.

Routes call these methods and map the results; every call is blocking (database, S3) and
runs in the thread pool, never on the event loop.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from api.inputs import decode_data_url, reference_frame_png
from api.state import AppState
from api.validation import ResolvedVideo, parse_create, resolve
from models.db import Artifact, Job, JobStatus
from models.errors import Gone, InvalidRequest, NotFound, NotReady, ServiceUnavailable
from models.events import DoneEvent, StatusEvent
from models.videos import StageDurations, VideoError, VideoObject, VideoPage
from storage.artifacts import StorageError
from storage.constants import ID_PREFIX, job_events_key, job_prefix

log = logging.getLogger(__name__)

REFERENCE_KEY = "input/reference.png"


class VideoService:
    def __init__(self, state: AppState) -> None:
        self.state = state
        self.settings = state.settings

    # ---- create -----------------------------------------------------------------

    async def create(
        self,
        raw: dict[str, Any],
        reference: bytes | None,
        owner: str,
        idempotency_key: str | None,
    ) -> tuple[VideoObject, bool]:
        """Validate, store the reference frame, insert the job, enqueue. Nothing is stored
        unless every check passed."""
        if "input_reference" in raw:
            value = raw.pop("input_reference")
            if isinstance(value, dict):
                value = value.get("image_url")
            if reference is None and value:
                reference = decode_data_url(str(value), "input_reference")
        req = parse_create(raw)
        if req.input_reference_url:
            reference = decode_data_url(req.input_reference_url, "input_reference_url")
        resolved = resolve(req, self.state.specs, self.settings)
        spec = self.state.specs[resolved.model]
        png = None
        if reference is not None:
            if not spec.supports_image_input:
                raise InvalidRequest(
                    f"model {resolved.model!r} does not take an input_reference",
                    param="input_reference",
                )
            png = await run_in_threadpool(
                reference_frame_png,
                reference,
                resolved.width,
                resolved.height,
                self.settings.limits,
                "input_reference",
            )
        job, created = await run_in_threadpool(self._persist, resolved, png, owner, idempotency_key)
        positions = await run_in_threadpool(self.state.jobs.queue_positions, [job])
        if created:
            event = StatusEvent(status="queued", queue_position=positions.get(job.id))
            await self.state.abus.publish(job_events_key(job.id), event)
        return self.to_wire(job, positions.get(job.id)), created

    def _persist(
        self, r: ResolvedVideo, png: bytes | None, owner: str, idempotency_key: str | None
    ) -> tuple[Job, bool]:
        jobs = self.state.jobs
        window = self.settings.idempotency_ttl_s
        now = time.time()
        job_id = ID_PREFIX["video"] + secrets.token_hex(12)
        params = r.params()
        prefix = job_prefix("video", job_id)
        if png is not None:
            params["reference_key"] = prefix + REFERENCE_KEY
        job = Job(
            id=job_id,
            kind="video",
            owner=owner,
            model=r.model,
            status=JobStatus.QUEUED.value,
            prompt=r.prompt,
            params=params,
            width=r.width,
            height=r.height,
            fps=r.fps,
            num_frames=r.num_frames,
            seed=r.seed,
            num_inference_steps=r.num_inference_steps,
            has_audio=r.has_audio,
            progress=0,
            step=0,
            stage="queue",
            stage_durations={},
            created_at=now,
            deadline_at=None,
            idempotency_key=idempotency_key,
            attempt=0,
            cancel_requested=False,
        )
        if idempotency_key:
            existing = jobs.find_idempotent(owner, idempotency_key, window)
            if existing is not None:
                return existing, False
        if png is not None:
            try:
                self.state.artifacts.put_bytes(params["reference_key"], png, "image/png")
            except StorageError as exc:
                raise ServiceUnavailable(
                    "object storage is unavailable", code="storage_error"
                ) from exc
        try:
            stored, created = jobs.create(job, idempotency_window_s=window)
        except Exception:
            self._drop_objects(prefix)
            raise
        if not created:  # lost an idempotency race: ours is not needed
            self._drop_objects(prefix)
            return stored, False
        try:
            self.state.queue.enqueue(job_id, r.model)
        except Exception as exc:
            jobs.delete(job_id)
            self._drop_objects(prefix)
            raise ServiceUnavailable("the job broker is unavailable", code="broker_error") from exc
        return stored, True

    def _drop_objects(self, prefix: str) -> None:
        try:
            self.state.artifacts.delete_prefix(prefix)
        except StorageError:
            log.warning("could not delete %s; the reconciler will", prefix)

    # ---- read -------------------------------------------------------------------

    def get_job(self, job_id: str, owner: str) -> Job:
        job = self.state.jobs.get(job_id, owner)
        if job is None or job.kind != "video":
            raise NotFound(f"no video with id {job_id!r}", param="video_id")
        return job

    def retrieve(self, job_id: str, owner: str) -> VideoObject:
        job = self.get_job(job_id, owner)
        positions = self.state.jobs.queue_positions([job])
        return self.to_wire(job, positions.get(job.id))

    def page(self, owner: str, after: str | None, limit: int, order: str) -> VideoPage:
        try:
            rows, has_more = self.state.jobs.page(
                owner, after=after, limit=limit, order=order, kind="video"
            )
        except KeyError as exc:
            raise InvalidRequest(f"after: no video with id {after!r}", param="after") from exc
        positions = self.state.jobs.queue_positions(rows)
        data = [self.to_wire(j, positions.get(j.id)) for j in rows]
        return VideoPage(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=has_more,
        )

    # ---- cancel / delete --------------------------------------------------------

    def cancel(self, job_id: str, owner: str) -> VideoObject:
        """Cancel a queued or running job; a finished job is returned unchanged."""
        job = self.get_job(job_id, owner)
        self.cancel_job(job.id, "cancelled by the client")
        return self.retrieve(job_id, owner)

    def cancel_job(self, job_id: str, message: str) -> bool:
        """Fail the job with ``cancelled`` if it is still active, and tell its watchers.
        The worker notices at its next step boundary and cleans up."""
        if not self.state.jobs.cancel(job_id, message):
            return False
        error = VideoError(code="cancelled", message=message)
        try:
            self.state.bus.publish(job_events_key(job_id), DoneEvent(status="failed", error=error))
        except Exception:  # the row is the truth; watchers also poll it
            log.warning("could not publish the cancel of %s", job_id, exc_info=True)
        return True

    def delete(self, job_id: str, owner: str) -> None:
        """Cancel if active, delete every object under the job's prefix, then the record."""
        job = self.get_job(job_id, owner)
        self.cancel_job(job.id, "deleted by the client")
        try:
            self.state.artifacts.delete_prefix(job_prefix(job.kind, job.id))
        except StorageError as exc:
            raise ServiceUnavailable(
                "object storage is unavailable; the video was cancelled, retry the delete",
                code="storage_error",
            ) from exc
        self.state.jobs.delete(job.id)
        self.state.bus.delete(job_events_key(job.id))

    def content_artifact(self, job_id: str, owner: str, variant: str) -> tuple[Job, Artifact]:
        job = self.get_job(job_id, owner)
        if job.status != JobStatus.COMPLETED:
            raise NotReady(
                f"video {job_id} is {job.status}; content is available once it is completed",
                param="video_id",
            )
        if job.expires_at is not None and job.expires_at <= time.time():
            raise Gone(f"the content of video {job_id} has expired", param="video_id")
        artifact = self.state.jobs.artifact(job.id, variant)
        if artifact is None:
            raise NotFound(f"video {job_id} has no {variant!r} variant", param="variant")
        return job, artifact

    # ---- wire -------------------------------------------------------------------

    def to_wire(self, job: Job, queue_position: int | None = None) -> VideoObject:
        error = None
        if job.status == JobStatus.FAILED:
            error = VideoError(
                code=job.error_code or "internal_error",
                message=job.error_message or "the job failed",
            )
        return VideoObject(
            id=job.id,
            model=job.model,
            status=job.status,
            progress=job.progress,
            created_at=int(job.created_at),
            started_at=_int(job.started_at),
            completed_at=_int(job.completed_at),
            expires_at=_int(job.expires_at),
            prompt=job.prompt,
            size=f"{job.width}x{job.height}",
            seconds=str(job.params.get("seconds", f"{job.num_frames / job.fps:g}")),
            fps=job.fps,
            num_frames=job.num_frames,
            seed=job.seed,
            num_inference_steps=job.num_inference_steps,
            step=job.step,
            stage=job.stage,
            error=error,
            queue_position=queue_position if job.status == JobStatus.QUEUED else None,
            has_audio=job.has_audio,
            inference_time_s=job.inference_time_s,
            stage_durations=StageDurations(**(job.stage_durations or {})),
            peak_memory_mb=job.peak_memory_mb,
            attempt=job.attempt,
        )


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
