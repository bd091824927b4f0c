"""Persist a realtime session's rolled-out video as a video object (``extra_params.persist``).

The fragmented MP4 the session streamed is remuxed (no re-encode) into a progressive MP4,
uploaded with a thumbnail under ``videos/{id}/output/``, and recorded as a completed job of
the session's owner, so ``GET /v1/videos/{id}`` and ``…/content`` serve it like any other.
"""

from __future__ import annotations

import time
from pathlib import Path

import av

from models.db import Artifact, Job, JobStatus
from models.job_specs import VideoSpec
from models.session_bus import WorldSessionConfig
from storage.artifacts import ArtifactStore
from storage.constants import job_prefix, new_job_id
from storage.jobs import JobStore
from storage.settings import Settings
from workers.media.mp4 import encode_thumbnail, remux_faststart

# What the stored video job takes from the session's config as it was placed.
_FROM_SESSION = {"model", "prompt", "seed", "width", "height", "fps"}


class SessionPersister:
    def __init__(self, settings: Settings, jobs: JobStore, artifacts: ArtifactStore) -> None:
        self.settings = settings
        self.jobs = jobs
        self.artifacts = artifacts

    def __call__(self, session_id: str, config: WorldSessionConfig, fragmented: Path) -> str:
        job_id = new_job_id("video")
        video, thumb = fragmented.with_name("video.mp4"), fragmented.with_name("thumbnail.jpg")
        remux_faststart(fragmented, video)
        with av.open(str(video)) as container:
            frames = container.streams.video[0].frames
            first = next(container.decode(video=0)).to_ndarray(format="rgb24")
        encode_thumbnail(first, thumb)
        prefix = job_prefix("video", job_id) + "output/"
        now = time.time()
        rows = []
        for variant, path, ctype in (
            ("video", video, "video/mp4"),
            ("thumbnail", thumb, "image/jpeg"),
        ):
            size = self.artifacts.upload_file(prefix + path.name, path, ctype)
            rows.append(
                Artifact(
                    job_id=job_id,
                    variant=variant,
                    bucket=self.artifacts.bucket,
                    key=prefix + path.name,
                    content_type=ctype,
                    size_bytes=size,
                    created_at=now,
                )
            )
        spec = VideoSpec(
            **config.model_dump(include=_FROM_SESSION),
            num_inference_steps=0,
            num_frames=frames,  # what the remuxed file holds
            session_id=session_id,
        )
        job = Job.new(
            spec,
            id=job_id,
            owner=config.owner,
            status=JobStatus.COMPLETED.value,
            progress=100,
            stage="done",
            created_at=now,
            started_at=now,
            completed_at=now,
            expires_at=now + self.settings.artifact_ttl_s,
            attempt=1,
        )
        self.jobs.insert_finished(job, rows)
        return job_id
