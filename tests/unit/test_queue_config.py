"""The broker configuration DESIGN.md asks for, and the queue naming."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from storage.constants import job_prefix, job_queue
from storage.queue import celery_config, publisher_config
from storage.settings import Settings


def test_celery_runs_at_least_once_one_job_at_a_time() -> None:
    settings = Settings(limits={"max_job_timeout_s": 3600})  # type: ignore[arg-type]
    conf = celery_config(settings)
    assert conf["task_acks_late"] is True
    assert conf["task_reject_on_worker_lost"] is True
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["worker_pool"] == "solo" and conf["worker_concurrency"] == 1
    assert conf["broker_transport_options"]["visibility_timeout"] > 3600
    assert conf["task_serializer"] == "json" and conf["accept_content"] == ["json"]


def test_queue_and_key_layout() -> None:
    assert job_queue("reference/video") == "jobs.reference-video"
    assert job_queue("Wan-AI/Wan2.1 T2V") == "jobs.Wan-AI-Wan2.1-T2V"
    assert job_prefix("video", "video_abc") == "videos/video_abc/"


def test_the_api_publisher_is_bounded_and_workers_keep_their_defaults() -> None:
    settings = Settings(redis={"command_timeout_s": 1.5, "connect_timeout_s": 3})  # type: ignore[arg-type]
    api = publisher_config(settings)
    assert api["broker_transport_options"]["socket_timeout"] == 1.5
    assert api["broker_transport_options"]["socket_connect_timeout"] == 3
    assert api["broker_transport_options"]["visibility_timeout"] > 3600
    assert api["task_publish_retry_policy"]["max_retries"] == 1
    worker = celery_config(settings)
    assert "socket_timeout" not in worker["broker_transport_options"]
    assert "task_publish_retry_policy" not in worker


def test_bad_timeouts_are_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError) as exc:
        Settings(redis={"command_timeout_s": 0})  # type: ignore[arg-type]
    assert "command_timeout_s" in str(exc.value)
    with pytest.raises(ValidationError) as exc:
        Settings(http={"body_timeout_s": -1})  # type: ignore[arg-type]
    assert "body_timeout_s" in str(exc.value)
