"""A real omniqueue deployment for tests: ``omniqueue api`` and ``omniqueue worker``
subprocesses on given services, with helpers to talk to it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, func, select

from cli.embedded import EmbeddedS3
from models.db import Job
from storage.db import make_engine, make_sessionmaker
from storage.keys import ApiKeyStore
from storage.settings import DatabaseSettings
from tests.helpers import write_failpoints
from workers.runtime.processes import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    work: Path
    database_url: str
    redis_url: str
    s3: EmbeddedS3
    auth: str = "required"
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_offsets: dict[str, int] = field(default_factory=dict)
    # Processes run by another interpreter (a venv with one tier's install): by name. They
    # run outside the repository, so they import the installed package, not this checkout.
    interpreters: dict[str, Path] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIQ_")}
        env.update(
            {
                "OMNIQ_MODE": "production",
                "OMNIQ_DATABASE__URL": self.database_url,
                "OMNIQ_REDIS__URL": self.redis_url,
                "OMNIQ_S3__ENDPOINT_URL": self.s3.endpoint_url,
                "OMNIQ_S3__BUCKET": self.s3.bucket,
                "OMNIQ_S3__ACCESS_KEY_ID": self.s3.access_key,
                "OMNIQ_S3__SECRET_ACCESS_KEY": self.s3.secret_key,
                "OMNIQ_AUTH": self.auth,
                "OMNIQ_WORKER__TMP_DIR": str(self.tmp_dir),
                "OMNIQ_WORKER__FAILPOINTS_FILE": str(self.failpoints),
                "OMNIQ_WORKER__PROGRESS_INTERVAL_S": "0.05",
                "OMNIQ_POLL_AFTER_MS": "100",
                "OMNIQ_WORKER__PREVIEW_EVERY": "2",
                "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def sibling(self, work: Path, env: dict[str, str]) -> Stack:
        """Another deployment on this one's database, Redis and S3 (a second API process,
        say), with ``env`` on top of this one's environment; not started."""
        return Stack(
            work=work,
            database_url=self.database_url,
            redis_url=self.redis_url,
            s3=self.s3,
            auth=self.auth,
            extra_env={**self.extra_env, **env},
        )

    @property
    def failpoints(self) -> Path:
        """The workers' failpoints file (workers/common/failpoints.py); none until a test
        sets it."""
        return self.work / "failpoints.json"

    def set_failpoints(self, points: dict[str, str]) -> None:
        write_failpoints(self.failpoints, points)

    @contextmanager
    def client_without_failpoints(self, timeout: float = 30) -> Iterator[httpx.Client]:
        """A client for one test that sets failpoints: none are set before or after it."""
        self.set_failpoints({})
        try:
            with self.client(timeout=timeout) as c:
                yield c
        finally:
            self.set_failpoints({})

    @property
    def tmp_dir(self) -> Path:
        path = self.work / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        path = self.work / f"{name}.log"
        self.log_offsets[name] = path.stat().st_size if path.exists() else 0
        log = open(path, "ab")  # noqa: SIM115 - owned by the process
        python = self.interpreters.get(name)
        env = self.env()
        if python is not None:
            del env["PYTHONPATH"]
        proc = subprocess.Popen(
            [str(python or sys.executable), "-m", "cli.main", *args],
            cwd=self.work if python is not None else REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def start(self, workers: int = 1, realtime_workers: int = 0) -> None:
        self.port = self.port or free_port()
        self._spawn("api", "api", "--host", "127.0.0.1", "--port", str(self.port))
        for i in range(workers):
            self.start_worker(f"w{i}")
        for i in range(realtime_workers):
            self._spawn(f"rt{i}", "worker", "--realtime", "--name", f"rt{i}")
        self.wait_ready()
        self.wait_workers(workers + realtime_workers)

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        return self._spawn(name, "worker", "--name", name)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.procs["api"].poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("API did not become ready:\n" + self.log("api"))

    def wait_workers(self, count: int, timeout: float = 90) -> None:
        """Wait until ``count`` workers logged that they are ready to consume."""
        deadline = time.monotonic() + timeout
        names = [n for n in self.procs if n != "api"][:count]
        while time.monotonic() < deadline:
            if all("ready." in self._log_since_spawn(n) for n in names):
                return
            for n in names:
                if self.procs[n].poll() is not None:
                    raise RuntimeError(f"worker {n} exited:\n" + self.log(n))
            time.sleep(0.2)
        raise RuntimeError("workers not ready:\n" + "\n".join(self.log(n) for n in names))

    def _log_since_spawn(self, name: str) -> str:
        path = self.work / f"{name}.log"
        with open(path, "rb") as f:
            f.seek(self.log_offsets.get(name, 0))
            return f.read().decode(errors="replace")

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""

    def stop_process(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self, timeout: float = 20, *, graceful: bool = True) -> None:
        """Every process at once: SIGTERM to each group, then the waits (a worker's warm
        shutdown takes a second or more, and one after another they added up); SIGKILL
        for what has not exited after ``timeout``. Not ``graceful``: SIGKILL at once, for a
        stack thrown away at the end of its tests (a worker's warm shutdown is 2 s of an
        idle event loop's poll and of torch's exit, which no test there looks at; the
        tests of a stopping worker stop it themselves)."""
        running = []
        for name in list(self.procs):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
                running.append(proc)
        deadline = time.monotonic() + timeout
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    # ---- talking to it ----------------------------------------------------------------

    def create_key(self, name: str = "test") -> str:
        engine = make_engine(DatabaseSettings(url=self.database_url))
        try:
            _, secret = ApiKeyStore(make_sessionmaker(engine)).create(name)
        finally:
            engine.dispose()
        return secret

    def client(self, key: str | None = None, timeout: float = 30) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def wait_for(
        self,
        client: httpx.Client,
        job_id: str,
        timeout: float = 120,
        until: tuple[str, ...] = ("completed", "failed"),
        collection: str = "videos",
    ) -> dict[str, Any]:
        """Poll ``GET /v1/{collection}/{job_id}`` until its status is one of ``until``."""
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            resp = client.get(f"/v1/{collection}/{job_id}")
            resp.raise_for_status()
            body = resp.json()
            if body["status"] in until:
                return body
            time.sleep(0.1)
        raise TimeoutError(f"{job_id} still {body.get('status')}:\n" + self.log("w0"))

    def count_jobs(self) -> int:
        """Rows in the jobs table."""
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                return int(conn.execute(select(func.count()).select_from(Job)).scalar_one())
        finally:
            engine.dispose()

    def objects(self, kind: str, job_id: str) -> list[str]:
        """The S3 keys under a job's prefix (``videos/<id>/``, ``audios/<id>/``)."""
        resp = self.s3.client().list_objects_v2(Bucket=self.s3.bucket, Prefix=f"{kind}/{job_id}/")
        return [o["Key"] for o in resp.get("Contents", [])]


def assert_not_found(other: httpx.Client, job_url: str, *more_gets: str) -> list[httpx.Response]:
    """Every route of the job at ``job_url`` answers 404 to ``other`` (a key that does not
    own it): GET, its content, the GETs of the ``more_gets`` suffixes, cancel, DELETE."""
    requests = [
        ("GET", job_url),
        ("GET", f"{job_url}/content"),
        *(("GET", job_url + suffix) for suffix in more_gets),
        ("POST", f"{job_url}/cancel"),
        ("DELETE", job_url),
    ]
    answers = []
    for method, path in requests:
        resp = other.request(method, path)
        assert resp.status_code == 404, (method, path, resp.text)
        answers.append(resp)
    return answers
