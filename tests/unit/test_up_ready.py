"""``omniqueue up`` waits for its workers (:mod:`cli.up_ready`): a worker's status file
says it is ready (with the models it could not load) or stopped; a stopped one is said
with its worker, model, reason and log, once, and the wait ends when every worker is one
or the other. Real files, a real :class:`Supervisor` over stand-in children.
(Real workers under a real ``up``: tests/integration/test_up_lifecycle.py and
test_up_options.py.)"""

from __future__ import annotations

from pathlib import Path

from cli.up_ready import WorkerWatch, wait_for_workers
from models.worker_status import WorkerStatus
from workers.runtime.status_file import read_status, write_status
from workers.runtime.supervisor import CONFIG_ERROR, Supervisor


def _watch(tmp_path: Path, name: str, process: str) -> WorkerWatch:
    return WorkerWatch.of(tmp_path, name, ["python", "-m", "cli.main", "worker", "--name", process])


def test_a_status_is_written_whole_and_an_earlier_one_is_forgotten(tmp_path: Path) -> None:
    watch = _watch(tmp_path, "worker 0", "embedded-0")
    assert watch.status_file == tmp_path / "run" / "worker-0.status.json"
    assert watch.log_file == tmp_path / "logs" / "worker-0.log"
    assert watch.env == {"OMNIQ_WORKER__STATUS_FILE": str(watch.status_file)}
    assert read_status(watch.status_file) is None
    write_status(watch.status_file, WorkerStatus(state="ready", models=["reference/video"]))
    assert read_status(watch.status_file) == WorkerStatus(state="ready", models=["reference/video"])
    assert [p.name for p in watch.status_file.parent.iterdir()] == ["worker-0.status.json"]
    watch.reset()
    assert read_status(watch.status_file) is None
    write_status(None, WorkerStatus(state="ready"))  # no file configured: nothing to do


def test_the_wait_ends_when_each_worker_is_ready_or_stopped(tmp_path: Path) -> None:
    ready = _watch(tmp_path, "worker 0", "embedded-0")
    broken = _watch(tmp_path, "worker 1", "embedded-1")
    exit_codes: dict[str, int | None] = {"worker 0": None, "worker 1": None}
    said: list[str] = []
    supervisor = Supervisor(said.append)
    for watch in (ready, broken):
        supervisor.add(watch.name, lambda n=watch.name: exit_codes[n], lambda: None, watch.stopped)
    ticks = 0

    def tick(_: float) -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 2:  # worker 1 loads none of its models and exits 78
            failed = {"acme/wan": "path /w does not exist"}
            write_status(broken.status_file, WorkerStatus(state="stopped", failed=failed))
            exit_codes["worker 1"] = CONFIG_ERROR
        if ticks == 4:  # worker 0 consumes, without one of its models
            write_status(
                ready.status_file,
                WorkerStatus(
                    state="ready", models=["reference/video"], failed={"acme/ltx": "no GPU"}
                ),
            )

    stopped = wait_for_workers([ready, broken], supervisor, said.append, sleep=tick)
    assert stopped == [broken]
    assert said == [
        "omniqueue up: worker 1 (embedded-1) could not load 'acme/wan': path /w does not "
        "exist. It exited with code 78, a configuration error that a restart cannot mend, "
        "so it stays stopped. The API runs on and serves the other models; /ready, /health "
        "and /v1/models name these as unavailable, and their creates get 503 "
        f"model_unavailable. Its log: {broken.log_file}",
        "worker 0 (embedded-0) is ready: reference/video; it could not load 'acme/ltx': "
        f"no GPU (its log: {ready.log_file})",
    ]
    supervisor.check()  # said once
    assert len(said) == 2


def test_a_configuration_error_without_a_status_points_to_the_log(tmp_path: Path) -> None:
    watch = _watch(tmp_path, "realtime worker 0", "embedded-rt")
    message = watch.stopped()
    assert message.startswith(
        "realtime worker 0 (embedded-rt) stopped on a configuration error (its reason is "
        "in its log)."
    )
    assert message.endswith(f"Its log: {tmp_path / 'logs' / 'realtime-worker-0.log'}")
