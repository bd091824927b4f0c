"""Audio jobs as the API sees them: the lifecycle of :class:`api.jobs_service.JobService`
(kind ``audio``) with the three request shapes of ``api/audio_validation.py``.

An audio job's :class:`models.job_specs.AudioSpec` carries its length (``duration_ms``,
also a column), format, requested rate and channels; after completion the row's
``output`` (:class:`models.job_specs.AudioJobOutput`) has the artifact's real
``sample_rate``, ``channels`` and ``num_samples``.
"""

from __future__ import annotations

from api.audio_validation import resolve_audio, resolve_generate, resolve_speech
from api.jobs_service import JobService
from models.audio import (
    EXTENSIONS,
    MEDIA_TYPES,
    AudioCreate,
    AudioGenerate,
    AudioObject,
    AudioPage,
    SpeechCreate,
)
from models.db import Job, JobView, audio_output, job_spec
from models.job_specs import AudioSpec, audio_seconds, audio_shape
from storage.constants import new_job_id


class AudioService(JobService[AudioObject, AudioCreate]):
    kind = "audio"

    # ---- create -----------------------------------------------------------------

    async def create(
        self, request: AudioCreate, owner: str, idempotency_key: str | None
    ) -> AudioObject:
        """``POST /v1/audio/generations``."""
        resolved = resolve_audio(request, self.state.specs, self.settings)
        job, position = await self.submit(resolved, owner, idempotency_key)
        return self.to_wire(job, position)

    async def create_waited(
        self, request: SpeechCreate | AudioGenerate, owner: str, idempotency_key: str | None
    ) -> Job:
        """``POST /v1/audio/speech`` (a :class:`SpeechCreate`) and ``/v1/audio/generate``
        (an :class:`AudioGenerate`): the stored job, which the route waits on."""
        if isinstance(request, SpeechCreate):
            resolved = resolve_speech(request, self.state.specs, self.settings)
        else:
            resolved = resolve_generate(request, self.state.specs, self.settings)
        job, _ = await self.submit(resolved, owner, idempotency_key)
        return job

    async def submit(
        self, spec: AudioSpec, owner: str, idempotency_key: str | None
    ) -> tuple[Job, int | None]:
        """Store and enqueue; the job and its queue position."""
        job = Job.new(spec, id=new_job_id("audio"), owner=owner, idempotency_key=idempotency_key)
        job, _, position = await self.state.blocking(self.store, job, idempotency_key)
        return job, position

    # ---- read -------------------------------------------------------------------

    def page(self, owner: str, after: str | None, limit: int, order: str) -> AudioPage:
        return AudioPage(**self.page_fields(owner, after, limit, order))

    # ---- wire -------------------------------------------------------------------

    def to_wire(self, job: JobView, queue_position: int | None = None) -> AudioObject:
        # Columns and the stored spec's fields, not a parsed spec: see audio_shape.
        shape = audio_shape(job.spec, job.output)
        return AudioObject(
            **self.wire_fields(job, queue_position),
            seconds=audio_seconds(job.duration_ms or 0),
            response_format=shape.response_format,
            media_type=MEDIA_TYPES.get(shape.response_format, "application/octet-stream"),
            sample_rate=shape.sample_rate,
            channels=shape.channels,
        )

    def content_headers(self, job: JobView) -> dict[str, str]:
        """``pcm`` is raw s16le: its rate and channels travel as headers (every format's do)."""
        output = audio_output(job)
        return {
            "X-Sample-Rate": str(output.sample_rate if output else None),
            "X-Channels": str(output.channels if output else None),
        }

    def filename(self, job: JobView, variant: str) -> str:
        return f"{job.id}.{EXTENSIONS[audio_shape(job.spec, job.output).response_format]}"


def audio_spec(job: JobView) -> AudioSpec:
    spec = job_spec(job)
    assert isinstance(spec, AudioSpec), job.id
    return spec
