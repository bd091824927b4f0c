"""Audio jobs as the API sees them: the lifecycle of :class:`api.jobs_service.JobService`
(kind ``audio``) with the three request shapes of ``api/audio_validation.py``.

An audio job row keeps its duration in the frame columns as milliseconds (``fps`` 1000,
``num_frames`` = ms) so duration-driven adapters (Stable Audio's ``audio_end_in_s``
default) read it like a video's; width and height are 0. Its ``params`` carry the format,
requested rate and channels, and after completion ``output`` with the artifact's real
``sample_rate``, ``channels`` and ``num_samples``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from api.audio_validation import (
    ResolvedAudio,
    parse_generation,
    resolve_audio,
    resolve_generate,
    resolve_speech,
)
from api.jobs_service import JobService
from models.audio import MEDIA_TYPES, AudioObject, AudioPage, SpeechCreate
from models.db import Job, JobStatus, JobView
from models.errors import InvalidRequest
from storage.constants import ID_PREFIX

MS = 1000.0


class AudioService(JobService[AudioObject]):
    kind = "audio"
    noun = "audio"
    id_param = "audio_id"

    # ---- create -----------------------------------------------------------------

    async def create(
        self, raw: dict[str, Any], upload: bytes | None, owner: str, idempotency_key: str | None
    ) -> AudioObject:
        """``POST /v1/audio/generations``."""
        if upload is not None or "input_reference" in raw:
            raise InvalidRequest("audio models take no input_reference", param="input_reference")
        resolved = resolve_audio(parse_generation(raw), self.state.specs, self.settings)
        job, position = await self.submit(resolved, owner, idempotency_key)
        return self.to_wire(job, position)

    async def create_speech(
        self, raw: dict[str, Any], owner: str, idempotency_key: str | None
    ) -> tuple[Job, SpeechCreate]:
        """``POST /v1/audio/speech``."""
        resolved, body = resolve_speech(raw, self.state.specs, self.settings)
        job, _ = await self.submit(resolved, owner, idempotency_key)
        return job, body

    async def create_generate(
        self, raw: dict[str, Any], owner: str, idempotency_key: str | None
    ) -> Job:
        """``POST /v1/audio/generate``."""
        resolved = resolve_generate(raw, self.state.specs, self.settings)
        job, _ = await self.submit(resolved, owner, idempotency_key)
        return job

    async def submit(
        self, r: ResolvedAudio, owner: str, idempotency_key: str | None
    ) -> tuple[Job, int | None]:
        """Store and enqueue; the job and its queue position."""
        job, created, position = await self.state.blocking(self._persist, r, owner, idempotency_key)
        await self.announce(job, created, position)
        return job, position

    def _persist(
        self, r: ResolvedAudio, owner: str, idempotency_key: str | None
    ) -> tuple[Job, bool, int | None]:
        job = Job(
            id=ID_PREFIX["audio"] + secrets.token_hex(12),
            kind="audio",
            owner=owner,
            model=r.model,
            status=JobStatus.QUEUED.value,
            prompt=r.prompt,
            params=r.params(),
            width=0,
            height=0,
            fps=MS,
            num_frames=max(1, round(r.seconds * MS)),
            seed=r.seed,
            num_inference_steps=r.num_inference_steps,
            has_audio=True,
            progress=0,
            step=0,
            stage="queue",
            stage_durations={},
            created_at=time.time(),
            deadline_at=None,
            idempotency_key=idempotency_key,
            attempt=0,
            cancel_requested=False,
        )
        return self.store(job, idempotency_key)

    # ---- read -------------------------------------------------------------------

    def page(self, owner: str, after: str | None, limit: int, order: str) -> AudioPage:
        return AudioPage(**self.page_fields(owner, after, limit, order))

    # ---- wire -------------------------------------------------------------------

    def to_wire(self, job: JobView, queue_position: int | None = None) -> AudioObject:
        params: dict[str, Any] = job.params
        output: dict[str, Any] = params.get("output") or {}
        fmt = str(params.get("response_format") or "wav")
        return AudioObject(
            **self.wire_fields(job, queue_position),
            seconds=str(params.get("seconds", f"{job.num_frames / MS:g}")),
            response_format=fmt,
            media_type=MEDIA_TYPES.get(fmt, "application/octet-stream"),
            sample_rate=output.get("sample_rate", params.get("sample_rate")),
            channels=output.get("channels", params.get("channels")),
        )
