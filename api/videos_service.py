"""Video jobs as the API sees them: create, read, cancel, delete, fetch content.

Routes parse the create body (:func:`api.create_requests.parse_video`), call these
methods and map the results; the blocking ones (database, S3) run in the thread pool,
never on the event loop.
"""

from __future__ import annotations

import contextlib

from api import references
from api.create_requests import VideoRequest
from api.inputs import check_url, decode_data_url, reference_frame_png, reference_from_url
from api.jobs_service import JobService
from api.loras import resolve_lora
from api.validation import resolve
from models.db import Job, JobView
from models.errors import InvalidRequest
from models.job_specs import ReferenceInput, VideoSpec, video_seconds
from models.videos import VideoObject, VideoOutput, VideoPage
from storage.constants import job_prefix, new_job_id

REFERENCE_KEY = "input/reference.png"


class VideoService(JobService[VideoObject, VideoRequest]):
    kind = "video"

    # ---- create -----------------------------------------------------------------

    async def create(
        self, request: VideoRequest, owner: str, idempotency_key: str | None
    ) -> VideoObject:
        """Resolve, store the reference frame (or a workflow model's references), insert the
        job, enqueue. Nothing is stored unless every check passed."""
        req, files = request.body, list(request.reference_files)
        remote: tuple[str, str] | None = None  # (http(s) URL, param): fetched once valid
        if request.reference_url is not None:
            files, remote = self._with_url(files, request.reference_url, "input_reference")
        if req.input_reference_url:
            files, remote = self._with_url(files, req.input_reference_url, "input_reference_url")
        resolved = resolve(req, self.state.specs, self.settings)
        if req.lora is not None:  # the model takes LoRA (resolve checked): find the file
            s3 = self.state.artifacts
            lora = await s3.run(resolve_lora, req.lora, self.settings.lora, s3.client)
            resolved = resolved.model_copy(update={"lora": lora})
        model = self.state.specs[resolved.model]
        if model.workflows:
            return await self._create_workflow(
                request, resolved, files, remote, owner, idempotency_key
            )
        if (files or remote is not None) and not model.supports_image_input:
            raise InvalidRequest(
                f"model {resolved.model!r} does not take an input_reference",
                param="input_reference",
            )
        if len(files) > 1:
            raise InvalidRequest(
                f"model {resolved.model!r} takes one input reference", param="input_references"
            )
        png = None
        if remote is not None:
            png = await self._fetch(remote, resolved)
        elif files:
            png = await self.state.blocking(
                reference_frame_png,
                files[0],
                resolved.width,
                resolved.height,
                self.settings.limits,
                "input_reference",
            )
        # with a reference it uploads to S3: on the S3 pool, off the one serving DB reads
        run = self.state.blocking if png is None else self.state.artifacts.run
        job, _, position = await run(self._persist, resolved, png, owner, idempotency_key)
        return self.to_wire(job, position)

    async def _create_workflow(
        self,
        request: VideoRequest,
        resolved: VideoSpec,
        files: list[bytes],
        remote: tuple[str, str] | None,
        owner: str,
        idempotency_key: str | None,
    ) -> VideoObject:
        """A workflow model's create (api/references.py): the workflow and its inputs
        checked (a video model's keyframes fitted to the job's size), the canvas
        resolved, then every reference stored with the job."""
        model = self.state.specs[resolved.model]
        if remote is not None:  # a request the model refuses fetches nothing
            references.check_workflow(model, resolved.extra, len(files) + 1)
            files = [await self._fetch(remote, resolved), *files]
        limits = self.settings.limits
        size = (resolved.width, resolved.height)
        plan = await self.state.blocking(
            references.plan, model, resolved.extra, files, limits, size
        )
        resolved = references.with_canvas(resolved, request.body, model, plan)
        job, _, position = await self.state.artifacts.run(
            self._persist_references, resolved, plan.references, owner, idempotency_key
        )
        return self.to_wire(job, position)

    async def _fetch(self, remote: tuple[str, str], spec: VideoSpec) -> bytes:
        url, param = remote
        return await self.state.blocking(
            reference_from_url, url, spec.width, spec.height, self.settings, param
        )

    def _with_url(
        self, files: list[bytes], url: str, param: str
    ) -> tuple[list[bytes], tuple[str, str] | None]:
        data, remote = self._reference(url, param)
        return ([data, *files] if data is not None else files), remote

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

    def _persist_references(
        self,
        spec: VideoSpec,
        refs: list[references.Reference],
        owner: str,
        idempotency_key: str | None,
    ) -> tuple[Job, bool, int | None]:
        job_id = new_job_id("video")
        prefix = job_prefix("video", job_id)
        stored = [
            ReferenceInput(kind=r.kind, key=f"{prefix}input/ref-{i:02d}", frame_index=r.frame_index)
            for i, r in enumerate(refs)
        ]
        spec = spec.model_copy(update={"references": stored})
        job = Job.new(spec, id=job_id, owner=owner, idempotency_key=idempotency_key)

        def store_references() -> None:
            try:
                for ref, item in zip(refs, stored, strict=True):
                    self.state.artifacts.put_bytes(item.key, ref.data, ref.content_type)
            except BaseException:
                with contextlib.suppress(Exception):  # best effort; the sweep takes the rest
                    self.state.artifacts.delete_prefix(prefix)
                raise

        return self.store(job, idempotency_key, store_references if refs else None)

    # ---- read -------------------------------------------------------------------

    def page(self, owner: str, after: str | None, limit: int, order: str) -> VideoPage:
        return VideoPage(**self.page_fields(owner, after, limit, order))

    # ---- wire -------------------------------------------------------------------

    def to_wire(self, job: JobView, queue_position: int | None = None) -> VideoObject:
        # Columns and the spec's JSON: a status read parses no spec.
        fps, num_frames = job.fps or 0.0, job.num_frames or 0
        n = int(job.spec.get("n", 1))
        return VideoObject(
            **self.wire_fields(job, queue_position),
            size=f"{job.width}x{job.height}",
            seconds=video_seconds(num_frames, fps) if fps else "0",
            fps=fps,
            num_frames=num_frames,
            has_audio=job.has_audio,
            quality=job.spec.get("quality", "lossless"),
            n=n,
            outputs=[VideoOutput(index=k, seed=job.seed + k) for k in range(n)],
        )

    def content_headers(self, job: JobView) -> dict[str, str]:
        return {}

    def filename(self, job: JobView, variant: str) -> str:
        """``{id}.mp4`` / ``{id}.jpg``; output k's ``{id}-k.mp4`` (k > 0)."""
        kind, _, index = variant.partition(".")
        return f"{job.id}{'-' + index if index else ''}.{'mp4' if kind == 'video' else 'jpg'}"
