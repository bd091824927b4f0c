"""Persist a realtime session's rolled-out video as a video object (``extra_params.persist``).

The fragmented MP4 the session streamed is remuxed (no re-encode) into a progressive MP4,
uploaded with a thumbnail under ``videos/{id}/output/``, and recorded as a completed job of
the session's owner, so ``GET /v1/videos/{id}`` and ``…/content`` serve it like any other.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import av

from models.db import Artifact, Job, JobStatus
from models.session_bus import WorldSessionConfig
from storage.artifacts import ArtifactStore
from storage.constants import ID_PREFIX, job_prefix
from storage.jobs import JobStore
from storage.settings import Settings
from workers.media import encode_thumbnail, remux_faststart


class SessionPersister:
    def __init__(self, settings: Settings, jobs: JobStore, artifacts: ArtifactStore) -> None:
        self.settings = settings
        self.jobs = jobs
        self.artifacts = artifacts

    def __call__(self, session_id: str, config: WorldSessionConfig, fragmented: Path) -> str:
        job_id = ID_PREFIX["video"] + secrets.token_hex(12)
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
        fps = float(config.fps)
        job = Job(
            id=job_id,
            kind="video",
            owner=config.owner,
            model=config.model,
            status=JobStatus.COMPLETED.value,
            prompt=config.prompt,
            params={"session_id": session_id, "seconds": f"{frames / fps:g}"},
            width=config.width,
            height=config.height,
            fps=fps,
            num_frames=frames,
            seed=config.seed,
            num_inference_steps=0,
            has_audio=False,
            progress=100,
            step=0,
            stage="done",
            stage_durations={},
            created_at=now,
            started_at=now,
            completed_at=now,
            expires_at=now + self.settings.artifact_ttl_s,
            attempt=1,
            cancel_requested=False,
        )
        self.jobs.insert_finished(job, rows)
        return job_id
