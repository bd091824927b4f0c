"""The broker configuration docs/architecture.md asks for (rule 8), and the queue naming."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis
from pydantic import ValidationError

from storage.broker_transport import WORKER_PATH, WorkerQoS
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


def test_the_api_publisher_and_the_workers_are_bounded() -> None:
    settings = Settings(redis={"command_timeout_s": 1.5, "connect_timeout_s": 3})  # type: ignore[arg-type]
    api = publisher_config(settings)
    assert api["broker_transport_options"]["socket_timeout"] == 1.5
    assert api["broker_transport_options"]["socket_connect_timeout"] == 3
    assert api["broker_transport_options"]["visibility_timeout"] > 3600
    assert api["task_publish_retry_policy"]["max_retries"] == 1
    worker = celery_config(settings)
    # a worker's broker link: bounded (it reconnects after a partition), retried forever
    assert worker["broker_transport_options"]["socket_timeout"] == 5.0
    assert worker["broker_transport_options"]["socket_keepalive"] is True
    assert worker["broker_connection_max_retries"] is None
    assert "task_publish_retry_policy" not in worker


def test_bad_timeouts_are_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError) as exc:
        Settings(redis={"command_timeout_s": 0})  # type: ignore[arg-type]
    assert "command_timeout_s" in str(exc.value)
    with pytest.raises(ValidationError) as exc:
        Settings(http={"body_timeout_s": -1})  # type: ignore[arg-type]
    assert "body_timeout_s" in str(exc.value)


def test_a_failed_ack_frees_the_workers_prefetch_slot() -> None:
    """kombu's Redis ack kept the slot when Redis failed, and a worker with a prefetch of
    1 then never consumed again (a healed worker stayed deaf after a partition)."""

    def failing() -> None:
        raise redis.exceptions.ConnectionError("the broker link is down")

    qos = WorkerQoS(SimpleNamespace(do_restore=False), prefetch_count=1)
    qos._delivered["tag-1"] = SimpleNamespace()
    assert not qos.can_consume()
    qos._remove_from_indices = lambda tag: SimpleNamespace(execute=failing)  # type: ignore[method-assign]
    with pytest.raises(redis.exceptions.ConnectionError):
        qos.ack("tag-1")  # Celery logs it; the message is delivered again later
    assert qos.can_consume()
    assert celery_config(Settings())["broker_transport"] == WORKER_PATH
