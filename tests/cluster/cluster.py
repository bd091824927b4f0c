"""A real omniqueue cluster on network hosts of its own (Linux network namespaces).

Hosts: ``services`` (PostgreSQL from ``initdb``, Valkey, SeaweedFS, the link proxy),
``api1`` and ``api2`` (one API replica each), ``w1`` and ``w2`` (a job worker each) and
``rt`` (a realtime worker). Clients run in the root namespace. Every process is the real
``omniqueue`` command (``python -m cli.main``) of this checkout, in its host's namespace
(``ip netns exec``), with its own process group.

Faults (:class:`tests.cluster.network.Network`): a link down, a host isolated, a host
vanished (isolated, then every process in it killed at once: nothing it sends on the way
out reaches anyone), and a slow link (every chunk delayed by the proxy).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
from botocore.config import Config
from sqlalchemy import create_engine, text

from migrations.runner import upgrade
from storage.db import make_engine, make_sessionmaker
from storage.keys import ApiKeyStore
from storage.settings import DatabaseSettings
from tests.cluster.network import ROOT, SERVICE_IPS, SERVICES_HOST, Network
from tests.helpers import write_failpoints

REPO = Path(__file__).resolve().parents[2]
API_PORT = 8000
DATABASE = "omniq"
JOB_HOSTS = ("w1", "w2")
API_HOSTS = ("api1", "api2")
HOSTS = (*API_HOSTS, *JOB_HOSTS, "rt")

# The bounds the faults are checked against (docs/deployment.md, "Failures between hosts").
CLUSTER_ENV = {
    "OMNIQ_WORKER__HEARTBEAT_S": "1",
    "OMNIQ_WORKER__HEARTBEAT_TIMEOUT_S": "8",
    "OMNIQ_WORKER__RECONCILE_INTERVAL_S": "2",
    "OMNIQ_WORKER__PROGRESS_INTERVAL_S": "0.1",
    "OMNIQ_WORKER__PREVIEW_EVERY": "2",
    "OMNIQ_REALTIME__KEEPALIVE_S": "0.5",
    "OMNIQ_REALTIME__LOST_AFTER_S": "25",
    "OMNIQ_REALTIME__RESUME_GRACE_S": "60",
    "OMNIQ_REALTIME__SLOTS": "4",
    "OMNIQ_POLL_AFTER_MS": "100",
    "OMNIQ_WEBHOOKS__ALLOW_PRIVATE": "true",
    "OMNIQ_METRICS__WORKER_PORT": "9100",
    # every upload is a multipart one, so "no open multipart upload" means something
    "OMNIQ_S3__MULTIPART_THRESHOLD_BYTES": "1",
    # what the reconciler aborts: an upload a dead or cut-off worker left open
    "OMNIQ_WORKER__STALE_UPLOAD_S": "30",
}


@dataclass
class Host:
    name: str
    ns: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


@dataclass
class Cluster:
    work: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(1))
    net: Network = field(init=False)
    hosts: dict[str, Host] = field(default_factory=dict)
    services: subprocess.Popen[bytes] | None = None
    s3_keys: dict[str, str] = field(default_factory=dict)
    pg_dir: Path | None = None
    key: str = ""  # an API key, made once the database is

    def __post_init__(self) -> None:
        self.net = Network(self.tag, list(HOSTS), list(API_HOSTS))

    # ---- addresses ---------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://postgres@{SERVICE_IPS['postgres']}:5432/{DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://{SERVICE_IPS['redis']}:6379/0"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{SERVICE_IPS['s3']}:8333"

    def api_url(self, host: str) -> str:
        return f"http://{self.net.addresses[host]}:{API_PORT}"

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def client(self, host: str, timeout: float = 10) -> httpx.Client:
        return httpx.Client(base_url=self.api_url(host), headers=self.auth(), timeout=timeout)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIQ_")}
        env.update(
            {
                "OMNIQ_MODE": "production",
                "OMNIQ_AUTH": "required",
                "OMNIQ_DATABASE__URL": self.database_url,
                "OMNIQ_REDIS__URL": self.redis_url,
                "OMNIQ_S3__ENDPOINT_URL": self.s3_endpoint,
                "OMNIQ_S3__BUCKET": self.s3_keys["bucket"],
                "OMNIQ_S3__ACCESS_KEY_ID": self.s3_keys["key"],
                "OMNIQ_S3__SECRET_ACCESS_KEY": self.s3_keys["secret"],
                "OMNIQ_WORKER__FAILPOINTS_FILE": str(self.failpoints),
                "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1",
                **CLUSTER_ENV,
            }
        )
        return env

    @property
    def failpoints(self) -> Path:
        return self.work / "failpoints.json"

    def set_failpoints(self, points: dict[str, str]) -> None:
        write_failpoints(self.failpoints, points)

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        (self.work / "tmp").mkdir(parents=True, exist_ok=True)
        self.set_failpoints({})
        self.net.create()
        self.pg_dir = Path(tempfile.mkdtemp(prefix=f"oq-cluster-{self.tag}-"))
        os.chmod(self.pg_dir, 0o755)
        svc_ns = self.net.ns(SERVICES_HOST)
        assert svc_ns is not None
        log = open(self.work / "services.log", "wb")  # noqa: SIM115 - the launcher's
        self.services = subprocess.Popen(
            ["ip", "netns", "exec", svc_ns, sys.executable, "-m", "tests.cluster.services",
             str(self.work / "services"), str(self.pg_dir)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert self.services.stdout is not None
        line = self.services.stdout.readline()
        if not line:
            raise RuntimeError("services host failed:\n" + self.log("services"))
        self.s3_keys = json.loads(line)
        self._create_database()
        upgrade(self.database_url)
        engine = make_engine(DatabaseSettings(url=self.database_url))
        try:
            _, self.key = ApiKeyStore(make_sessionmaker(engine)).create("cluster")
        finally:
            engine.dispose()
        for name in HOSTS:
            ns = self.net.ns(name)
            assert ns is not None
            self.hosts[name] = Host(name, ns)
        for name in API_HOSTS:
            self.start_api(name)
        for name in JOB_HOSTS:
            self.start_process(name, "worker", "--name", name)
        self.start_process("rt", "worker", "--realtime", "--name", "rt")
        for name in API_HOSTS:
            self.wait_api(name)
        for name in (*JOB_HOSTS, "rt"):
            self.wait_log(name, "ready.", timeout=120)

    def _create_database(self) -> None:
        admin = self.database_url.rsplit("/", 1)[0] + "/postgres"
        engine = create_engine(admin, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(f"CREATE DATABASE {DATABASE}"))
        finally:
            engine.dispose()

    def start_api(self, host: str) -> None:
        self.start_process(host, "api", "--host", "0.0.0.0", "--port", str(API_PORT))

    def tmp_dir(self, host: str) -> Path:
        """The host's own temp directory (hosts share this machine's disk, not their
        files: a worker sweeps its host's job directories)."""
        path = self.work / "tmp" / host
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start_process(self, host: str, *args: str) -> subprocess.Popen[bytes]:
        h = self.hosts[host]
        path = self.work / f"{host}.log"
        log = open(path, "ab")  # noqa: SIM115 - owned by the process
        env = {**self.env(), "OMNIQ_WORKER__TMP_DIR": str(self.tmp_dir(host))}
        proc = subprocess.Popen(
            ["ip", "netns", "exec", h.ns, sys.executable, "-m", "cli.main", *args],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        h.procs[args[0]] = proc
        return proc

    def wait_api(self, host: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.api_url(host) + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"API on {host} not ready:\n" + self.log(host))

    def log(self, host: str) -> str:
        path = self.work / f"{host}.log"
        return path.read_text(errors="replace")[-8000:] if path.exists() else ""

    def log_offset(self, host: str) -> int:
        path = self.work / f"{host}.log"
        return path.stat().st_size if path.exists() else 0

    def wait_log(self, host: str, needle: str, *, since: int = 0, timeout: float = 60) -> str:
        """Wait until ``needle`` appears in ``host``'s log after byte ``since``."""
        path = self.work / f"{host}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                with open(path, "rb") as f:
                    f.seek(since)
                    text_ = f.read().decode(errors="replace")
                if needle in text_:
                    return text_
            time.sleep(0.1)
        raise TimeoutError(f"{needle!r} not in the log of {host}:\n" + self.log(host))

    def vanish(self, host: str) -> None:
        """The host is gone: cut off, then every process in it killed at once."""
        self.net.isolate(host)
        for proc in self.hosts[host].procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.hosts[host].procs.values():
            proc.wait(10)
        self.hosts[host].procs.clear()

    def set_delay(self, delay_s: float) -> None:
        """Every link to the services delayed ``delay_s`` each way (the proxy)."""
        (self.work / "services" / "proxy.json").write_text(json.dumps({"delay_s": delay_s}))

    def stop(self) -> None:
        """Every process, then the network; also after a failure halfway through start.
        The network goes whatever happened to the processes."""
        try:
            procs = [p for h in self.hosts.values() for p in h.procs.values()]
            for proc in procs:
                if proc.poll() is None:
                    with suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
            for proc in procs:
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            if self.services is not None and self.services.poll() is None:
                os.killpg(self.services.pid, signal.SIGTERM)
                try:
                    self.services.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.services.pid, signal.SIGKILL)
                    self.services.wait(10)
        finally:
            self.net.destroy()
            if self.pg_dir is not None:
                subprocess.run(["rm", "-rf", str(self.pg_dir)], check=False)

    # ---- reading the truth (from the root namespace) ------------------------------------

    def s3(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id=self.s3_keys["key"],
            aws_secret_access_key=self.s3_keys["secret"],
            region_name="us-east-1",
            config=Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2}),
        )

    def rows(self, sql: str, **params: Any) -> list[Any]:
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                return list(conn.execute(text(sql), params))
        finally:
            engine.dispose()


@contextmanager
def running_cluster(work: Path) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        raise RuntimeError("the cluster tests build network namespaces: they run as root")
    cluster = Cluster(work)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


__all__ = ["ROOT", "Cluster", "running_cluster"]
