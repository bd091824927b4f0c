"""Video jobs as the API sees them: create, read, cancel, delete, fetch content.

Routes parse the create body (:func:`api.create_requests.parse_video`), call these
methods and map the results; the blocking ones (database, S3) run in the thread pool,
never on the event loop.
"""

from __future__ import annotations

from api.create_requests import VideoRequest
from api.inputs import check_url, decode_data_url, reference_frame_png, reference_from_url
from api.jobs_service import JobService
from api.loras import resolve_lora
from api.validation import resolve
from models.db import Job, JobView
from models.errors import InvalidRequest
from models.job_specs import VideoSpec, video_seconds
from models.videos import VideoObject, VideoPage
from storage.constants import job_prefix, new_job_id

REFERENCE_KEY = "input/reference.png"


class VideoService(JobService[VideoObject, VideoRequest]):
    kind = "video"

    # ---- create -----------------------------------------------------------------

    async def create(
        self, request: VideoRequest, owner: str, idempotency_key: str | None
    ) -> VideoObject:
        """Resolve, store the reference frame, insert the job, enqueue. Nothing is stored
        unless every check passed."""
        req, reference = request.body, request.reference_file
        remote: tuple[str, str] | None = None  # (http(s) URL, param): fetched once valid
        if request.reference_url is not None:
            reference, remote = self._reference(request.reference_url, "input_reference")
        if req.input_reference_url:
            reference, remote = self._reference(req.input_reference_url, "input_reference_url")
        resolved = resolve(req, self.state.specs, self.settings)
        if req.lora is not None:  # the model takes LoRA (resolve checked): find the file
            s3 = self.state.artifacts
            lora = await s3.run(resolve_lora, req.lora, self.settings.lora, s3.client)
            resolved = resolved.model_copy(update={"lora": lora})
        model = self.state.specs[resolved.model]
        png = None
        if (reference is not None or remote is not None) and not model.supports_image_input:
            raise InvalidRequest(
                f"model {resolved.model!r} does not take an input_reference",
                param="input_reference",
            )
        if remote is not None:
            png = await self.state.blocking(
                reference_from_url,
                remote[0],
                resolved.width,
                resolved.height,
                self.settings,
                remote[1],
            )
        elif reference is not None:
            png = await self.state.blocking(
                reference_frame_png,
                reference,
                resolved.width,
                resolved.height,
                self.settings.limits,
                "input_reference",
            )
        # with a reference it uploads to S3: on the S3 pool, off the one serving DB reads
        run = self.state.blocking if png is None else self.state.artifacts.run
        job, _, position = await run(self._persist, resolved, png, owner, idempotency_key)
        return self.to_wire(job, position)

    def _reference(self, url: str, param: str) -> tuple[bytes | None, tuple[str, str] | None]:
        """A ``data:`` URL's bytes now, or an http(s) URL to fetch once the request is valid
        (refused here when fetching is off or the scheme is neither)."""
        check_url(url, self.settings.inputs, param)
        if url.startswith("data:"):
            return decode_data_url(url, param), None
        return None, (url, param)

    def _persist(
        self, spec: VideoSpec, png: bytes | None, owner: str, idempotency_key: str | None
    ) -> tuple[Job, bool, int | None]:
        job_id = new_job_id("video")
        if png is None:
            job = Job.new(spec, id=job_id, owner=owner, idempotency_key=idempotency_key)
            return self.store(job, idempotency_key)
        key = job_prefix("video", job_id) + REFERENCE_KEY
        spec = spec.model_copy(update={"reference_key": key})
        job = Job.new(spec, id=job_id, owner=owner, idempotency_key=idempotency_key)
        frame = png

        def store_reference() -> None:
            self.state.artifacts.put_bytes(key, frame, "image/png")

        return self.store(job, idempotency_key, store_reference)

    # ---- read -------------------------------------------------------------------

    def page(self, owner: str, after: str | None, limit: int, order: str) -> VideoPage:
        return VideoPage(**self.page_fields(owner, after, limit, order))

    # ---- wire -------------------------------------------------------------------

    def to_wire(self, job: JobView, queue_position: int | None = None) -> VideoObject:
        # Columns only: a status read parses no spec.
        fps, num_frames = job.fps or 0.0, job.num_frames or 0
        return VideoObject(
            **self.wire_fields(job, queue_position),
            size=f"{job.width}x{job.height}",
            seconds=video_seconds(num_frames, fps) if fps else "0",
            fps=fps,
            num_frames=num_frames,
            has_audio=job.has_audio,
            quality=job.spec.get("quality", "lossless"),
        )

    def content_headers(self, job: JobView) -> dict[str, str]:
        return {}

    def filename(self, job: JobView, variant: str) -> str:
        return f"{job.id}.{'mp4' if variant == 'video' else 'jpg'}"
