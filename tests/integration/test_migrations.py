"""Alembic migrations behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import Engine, MetaData, Table, create_engine, inspect, select

from api.app import create_app
from cli.embedded import EmbeddedS3
from migrations.runner import downgrade, upgrade
from models.db import Base, audio_output, job_spec
from models.job_specs import AudioJobOutput, AudioSpec, VideoSpec
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.keys import ApiKeyStore
from storage.settings import DatabaseSettings, Settings
from tests.integration.conftest import (
    REDIS_BASE_URL,
    new_database,
    service_settings,
)

pytestmark = pytest.mark.integration

TABLES = {
    "api_keys",
    "jobs",
    "artifacts",
    "webhook_endpoints",
    "webhook_secrets",
    "webhook_deliveries",
    "webhook_attempts",
}


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with new_database(request.param, tmp_path, migrate=False) as url:
        yield url


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    upgrade(database_url)
    assert _tables(database_url) == TABLES
    downgrade(database_url, "base")
    assert _tables(database_url) == set()
    upgrade(database_url)
    assert _tables(database_url) == TABLES

    # The migrated schema is exactly what the ORM declares.
    engine = create_engine(database_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


# ---- 0002: typed job specs --------------------------------------------------------------

NOW = 1_764_460_000.0
STATE = dict(  # the state columns every 0001 row had, as the old services set them
    status="queued", error_code=None, error_message=None, cancel_requested=False,
    progress=0, step=0, stage="queue", stage_durations={}, inference_time_s=None,
    peak_memory_mb=None, created_at=NOW, started_at=None, completed_at=None,
    expires_at=None, deadline_at=None, idempotency_key=None, attempt=0, worker_id=None,
    heartbeat_at=None,
)
# Rows as the code before 0002 wrote them: VideoService._persist (with a reference
# frame), AudioService._persist plus the executor's params["output"] on completion, a
# streamed-PCM speech job, and SessionPersister's record of a realtime session.
OLD_ROWS: list[dict[str, object]] = [
    STATE | dict(
        id="video_old1", kind="video", owner="local", model="reference/video",
        prompt="a red fox", width=64, height=48, fps=16.0, num_frames=8, seed=42,
        num_inference_steps=3, has_audio=False,
        params={
            "negative_prompt": "blur", "options": {"guidance_scale": 7.5},
            "extra": {"motion": 2.0}, "seconds": "0.5", "timeout_s": 120.0,
            "reference_key": "videos/video_old1/input/reference.png",
        },
    ),
    STATE | dict(
        id="audio_old1", kind="audio", owner="local", model="reference/audio",
        prompt="rain", width=0, height=0, fps=1000.0, num_frames=1500, seed=7,
        num_inference_steps=4, has_audio=True, status="completed", progress=100,
        stage="done", completed_at=NOW + 3, expires_at=NOW + 3600,
        params={
            "negative_prompt": None, "options": {}, "extra": {"bpm": 90.0},
            "seconds": "1.5", "timeout_s": 600.0, "response_format": "mp3",
            "sample_rate": None, "channels": 2, "stream_pcm": False,
            "output": {"sample_rate": 44100, "channels": 2, "num_samples": 66150},
        },
    ),
    STATE | dict(
        id="audio_old2", kind="audio", owner="local", model="reference/audio",
        prompt="hello there", width=0, height=0, fps=1000.0, num_frames=1100, seed=3,
        num_inference_steps=4, has_audio=True,
        params={
            "negative_prompt": None, "options": {"speed": 1.0, "voice": "alloy"},
            "extra": {}, "seconds": "1.1", "timeout_s": 600.0, "response_format": "pcm",
            "sample_rate": 24000, "channels": 1, "stream_pcm": True,
        },
    ),
    STATE | dict(
        id="video_sess", kind="video", owner="local", model="reference/world",
        prompt="a walk", width=64, height=64, fps=16.0, num_frames=33, seed=1,
        num_inference_steps=0, has_audio=False, status="completed", progress=100,
        stage="done", started_at=NOW, completed_at=NOW, expires_at=NOW + 3600, attempt=1,
        params={"session_id": "sess_1", "seconds": "2.0625"},
    ),
]


def _jobs_table(url: str) -> tuple[Engine, Table]:
    engine = create_engine(url)
    return engine, Table("jobs", MetaData(), autoload_with=engine)


def _settings(url: str, s3: EmbeddedS3, redis_db: int) -> Settings:
    return service_settings(url, s3, redis_db=redis_db)


def test_rows_of_0001_are_read_by_the_new_code_and_downgrade_back(
    database_url: str, s3_server: EmbeddedS3, redis_db: int
) -> None:
    upgrade(database_url, "0001")
    engine, old = _jobs_table(database_url)
    with engine.begin() as conn:
        conn.execute(old.insert(), OLD_ROWS)
    engine.dispose()

    upgrade(database_url)
    engine = make_engine(DatabaseSettings(url=database_url))
    store = JobStore(make_sessionmaker(engine))
    video, audio, speech, session = (store.get(str(r["id"])) for r in OLD_ROWS)
    assert video is not None and audio is not None and speech is not None
    assert session is not None
    # the worker's view: typed specs
    assert job_spec(video) == VideoSpec(
        model="reference/video", prompt="a red fox", seed=42, num_inference_steps=3,
        timeout_s=120.0, negative_prompt="blur", options={"guidance_scale": 7.5},
        extra={"motion": 2.0}, width=64, height=48, fps=16.0, num_frames=8,
        reference_key="videos/video_old1/input/reference.png",
    )
    assert job_spec(audio) == AudioSpec(
        model="reference/audio", prompt="rain", seed=7, num_inference_steps=4,
        timeout_s=600.0, extra={"bpm": 90.0}, duration_ms=1500, response_format="mp3",
        channels=2,
    )
    assert job_spec(speech) == AudioSpec(
        model="reference/audio", prompt="hello there", seed=3, num_inference_steps=4,
        timeout_s=600.0, options={"speed": 1.0, "voice": "alloy"}, duration_ms=1100,
        response_format="pcm", sample_rate=24000, channels=1, stream_pcm=True,
    )
    session_spec = job_spec(session)
    assert isinstance(session_spec, VideoSpec) and session_spec.session_id == "sess_1"
    # audio rows are no longer video-shaped
    assert (audio.duration_ms, audio.fps, audio.num_frames, audio.width) == (1500, None, None, None)
    assert audio_output(audio) == AudioJobOutput(sample_rate=44100, channels=2, num_samples=66150)
    assert (video.duration_ms, video.fps, video.num_frames) == (None, 16.0, 8)
    engine.dispose()

    # the client's view: the same wire objects as before the migration
    try:
        with TestClient(create_app(_settings(database_url, s3_server, redis_db))) as client:
            got_video = client.get("/v1/videos/video_old1").json()
            got_audio = client.get("/v1/audio/generations/audio_old1").json()
            got_speech = client.get("/v1/audio/generations/audio_old2").json()
            got_session = client.get("/v1/videos/video_sess").json()
            listed = client.get("/v1/audio/generations", params={"order": "asc"}).json()
    finally:
        redis.Redis.from_url(f"{REDIS_BASE_URL}/{redis_db}").flushdb()
    assert {k: got_video[k] for k in ("size", "seconds", "fps", "num_frames", "seed")} == {
        "size": "64x48", "seconds": "0.5", "fps": 16.0, "num_frames": 8, "seed": 42,
    }
    assert got_video["status"] == "queued" and got_video["has_audio"] is False
    picked = ("seconds", "response_format", "media_type", "sample_rate", "channels", "status")
    assert {k: got_audio[k] for k in picked} == {
        "seconds": "1.5", "response_format": "mp3", "media_type": "audio/mpeg",
        "sample_rate": 44100, "channels": 2, "status": "completed",
    }
    assert {k: got_speech[k] for k in picked} == {
        "seconds": "1.1", "response_format": "pcm", "media_type": "audio/pcm",
        "sample_rate": 24000, "channels": 1, "status": "queued",
    }
    assert (got_session["seconds"], got_session["num_frames"]) == ("2.0625", 33)
    assert [a["id"] for a in listed["data"]] == ["audio_old1", "audio_old2"]

    # and back: the 0001 rows as they were written
    downgrade(database_url, "0001")
    engine, old = _jobs_table(database_url)
    with engine.connect() as conn:
        rows = {r["id"]: r for r in conn.execute(select(old)).mappings()}
    engine.dispose()
    for written in OLD_ROWS:
        back = dict(rows[str(written["id"])])
        params, old_params = back.pop("params"), dict(written)
        assert back == {k: v for k, v in old_params.items() if k != "params"}
        # every key the old code wrote; at most empty defaults it reads the same way
        assert params | dict(written["params"]) == params  # type: ignore[arg-type]
        assert all(params[k] in (None, {}) for k in params.keys() - written["params"])  # type: ignore[operator]


# ---- 0003: per-key quotas ---------------------------------------------------------------


def test_keys_of_0002_take_the_server_defaults_and_downgrade_back(database_url: str) -> None:
    upgrade(database_url, "0002")
    engine = create_engine(database_url)
    keys = Table("api_keys", MetaData(), autoload_with=engine)
    old_key = dict(id="key_old", name="old", prefix="oq-abc", key_hash="h" * 64, created_at=NOW)
    with engine.begin() as conn:
        conn.execute(keys.insert(), [old_key | {"revoked_at": None}])
    engine.dispose()

    upgrade(database_url)
    engine = make_engine(DatabaseSettings(url=database_url))
    store = ApiKeyStore(make_sessionmaker(engine))
    (row,) = store.list()
    # NULL: the server default for each quota
    assert (row.creates_per_minute, row.max_active_jobs, row.max_sessions) == (None, None, None)
    updated = store.update("key_old", max_active_jobs=0, max_sessions=2)
    assert updated is not None and (updated.max_active_jobs, updated.max_sessions) == (0, 2)
    indexes = {ix["name"] for ix in inspect(engine).get_indexes("jobs")}
    assert {"ix_jobs_owner_status", "ix_jobs_owner_model_started"} <= indexes
    engine.dispose()

    downgrade(database_url, "0002")
    engine = create_engine(database_url)
    try:
        columns = {c["name"] for c in inspect(engine).get_columns("api_keys")}
        indexes = {ix["name"] for ix in inspect(engine).get_indexes("jobs")}
        table = Table("api_keys", MetaData(), autoload_with=engine)
        with engine.connect() as conn:
            back = dict(conn.execute(select(table)).mappings().one())
    finally:
        engine.dispose()
    assert columns == {"id", "name", "prefix", "key_hash", "created_at", "revoked_at"}
    assert not indexes & {"ix_jobs_owner_status", "ix_jobs_owner_model_started"}
    assert back == old_key | {"revoked_at": None}
