"""The embedded Valkey and SeaweedFS launchers behind ``omniqueue up``: real servers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
import redis
from botocore.config import Config
from botocore.exceptions import ClientError

from cli.embedded import EmbeddedS3, EmbeddedValkey
from tests.integration.conftest import running_s3
from tests.integration.up_process import up_command
from workers.runtime.processes import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    with running_s3(tmp_path_factory.mktemp("s3"), "embedded-test", stop_timeout=1) as server:
        yield server


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (a zombie nobody reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return False


def _wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.1)
    return False


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


# ---- S3 ---------------------------------------------------------------------------------


def test_put_get_and_range(s3: EmbeddedS3) -> None:
    client = s3.client()
    body = os.urandom(3 * 1024 * 1024 + 17)
    client.put_object(Bucket=s3.bucket, Key="videos/a.mp4", Body=body, ContentType="video/mp4")

    got = client.get_object(Bucket=s3.bucket, Key="videos/a.mp4")
    assert got["Body"].read() == body
    assert got["ContentType"] == "video/mp4"
    ranged = client.get_object(Bucket=s3.bucket, Key="videos/a.mp4", Range="bytes=100-199")
    assert ranged["Body"].read() == body[100:200]
    assert client.head_object(Bucket=s3.bucket, Key="videos/a.mp4")["ContentLength"] == len(body)


def test_multipart_upload_and_abort(s3: EmbeddedS3) -> None:
    client = s3.client()
    part = os.urandom(5 * 1024 * 1024)
    done = client.create_multipart_upload(Bucket=s3.bucket, Key="big.bin")
    etags = [
        client.upload_part(
            Bucket=s3.bucket, Key="big.bin", UploadId=done["UploadId"], PartNumber=n, Body=data
        )["ETag"]
        for n, data in ((1, part), (2, b"tail"))
    ]
    client.complete_multipart_upload(
        Bucket=s3.bucket,
        Key="big.bin",
        UploadId=done["UploadId"],
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n} for n, e in enumerate(etags, 1)]},
    )
    assert client.get_object(Bucket=s3.bucket, Key="big.bin")["Body"].read() == part + b"tail"

    aborted = client.create_multipart_upload(Bucket=s3.bucket, Key="partial.bin")
    client.upload_part(
        Bucket=s3.bucket,
        Key="partial.bin",
        UploadId=aborted["UploadId"],
        PartNumber=1,
        Body=part,
    )
    pending = client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    assert [u["UploadId"] for u in pending] == [aborted["UploadId"]]
    client.abort_multipart_upload(Bucket=s3.bucket, Key="partial.bin", UploadId=aborted["UploadId"])
    assert client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []
    with pytest.raises(ClientError):
        client.head_object(Bucket=s3.bucket, Key="partial.bin")


def test_presigned_get_and_auth(s3: EmbeddedS3) -> None:
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="signed.txt", Body=b"hello presigned")
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": s3.bucket, "Key": "signed.txt"}, ExpiresIn=60
    )
    assert httpx.get(url).content == b"hello presigned"
    ranged = httpx.get(url, headers={"Range": "bytes=6-14"})
    assert (ranged.status_code, ranged.content) == (206, b"presigned")

    assert httpx.get(f"{s3.endpoint_url}/{s3.bucket}/signed.txt").status_code == 403
    wrong = boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key="not-the-secret",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
        wrong.get_object(Bucket=s3.bucket, Key="signed.txt")


def test_two_instances_run_side_by_side(s3: EmbeddedS3, tmp_path: Path) -> None:
    with EmbeddedS3(tmp_path / "other", bucket=s3.bucket) as other:
        assert set(other.ports.values()).isdisjoint(s3.ports.values())
        other.client().put_object(Bucket=other.bucket, Key="only-here", Body=b"2")
        s3.client().put_object(Bucket=s3.bucket, Key="only-there", Body=b"1")
        with pytest.raises(ClientError):
            s3.client().head_object(Bucket=s3.bucket, Key="only-here")
        assert other.client().get_object(Bucket=other.bucket, Key="only-here")["Body"].read()


def test_stop_leaves_nothing_and_restart_keeps_objects(tmp_path: Path) -> None:
    server = EmbeddedS3(tmp_path / "s3")
    server.start()
    pid, ports = server.pid, dict(server.ports)
    assert pid is not None
    body = os.urandom(6 * 1024 * 1024)  # two weed chunks
    server.client().put_object(Bucket=server.bucket, Key="keep.bin", Body=body)

    server.stop()  # SIGTERM, then SIGKILL after the default grace
    assert _group_gone(pid)
    assert not any(_listening(p) for p in ports.values())
    assert not list(Path("/tmp").glob(f"seaweedfs-*-{ports['s3.port']}.sock"))

    server.start()
    try:
        got = server.client().get_object(Bucket=server.bucket, Key="keep.bin")
        assert got["Body"].read() == body
    finally:
        server.stop(timeout=1)


# ---- Valkey -----------------------------------------------------------------------------


def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5)


def test_valkey_start_stop_restart_keeps_data(tmp_path: Path) -> None:
    valkey = EmbeddedValkey(tmp_path / "valkey")
    with valkey:
        client = _redis(valkey.url)
        assert client.ping()
        client.rpush("celery", "job-1", "job-2")
        pid = int(client.info("server")["process_id"])
        client.close()
    assert _wait_gone(pid)
    assert not _listening(valkey.port)

    with valkey:
        client = _redis(valkey.url)
        assert client.lrange("celery", 0, -1) == [b"job-1", b"job-2"]
        client.close()
    assert (tmp_path / "valkey" / "appendonlydir").is_dir()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_services_die_with_their_parent(tmp_path: Path) -> None:
    script = (
        "import sys, redis\n"
        "from pathlib import Path\n"
        "from cli.embedded import EmbeddedS3, EmbeddedValkey\n"
        "d = Path(sys.argv[1])\n"
        "s3 = EmbeddedS3(d / 's3'); s3.start()\n"
        "v = EmbeddedValkey(d / 'valkey'); v.start()\n"
        "pid = redis.Redis.from_url(v.url).info('server')['process_id']\n"
        "print(s3.pid, pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None and parent.stdout is not None
    pids: list[int] = []
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
        parent.send_signal(signal.SIGKILL)  # no atexit, no finalizers: only the kernel acts
        parent.wait()
        assert all(_wait_gone(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
        parent.stdin.close()
        parent.stdout.close()
        for pid in pids:  # never leave a server behind, even when the test fails
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# ---- omniqueue up -----------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _is_api(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b" api " in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    return False


def _start_up(data_dir: Path, port: int) -> tuple[subprocess.Popen[str], list[int]]:
    """``omniqueue up``, its restart backoff a tenth of the default (the test of its giving
    up waits out four backoffs: 15 s at the default's 1, 2, 4 and 8 s)."""
    log = data_dir.parent / "up.log"
    with open(log, "a") as log_file:
        proc = subprocess.Popen(
            up_command(port, data_dir),
            env={**os.environ, "OMNIQ_RESTART_BACKOFF_S": "0.1"},
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until "is up" or the process exits
    if not line.startswith(f"omniqueue is up: http://127.0.0.1:{port}"):
        proc.kill()  # its services die with it (parent-death signal)
        proc.wait()
        proc.stdout.close()
        pytest.fail(f"omniqueue up did not start: {line!r}\n{log.read_text()[-3000:]}")
    children = _children(proc.pid)
    # valkey, weed, api, one worker, one realtime worker, the webhook sender
    assert len(children) == 6, children
    return proc, children


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_omniqueue_up_serves_generate_and_gives_up_on_a_child_that_keeps_dying(
    tmp_path: Path,
) -> None:
    """``omniqueue generate`` against ``omniqueue up``; then the API is killed each time it
    is restarted, and after the 5th fast failure ``up`` takes everything down with exit
    code 1 (a single death is restarted: tests/integration/test_up_supervision.py)."""
    from cli.submit import run_generate

    port = free_port()
    proc, children = _start_up(tmp_path / "data", port)
    try:
        out = tmp_path / "a.mp4"
        code = run_generate(
            "a lighthouse at dusk",
            url=f"http://127.0.0.1:{port}",
            seconds=1,
            size="128x72",
            steps=2,
            output=out,
        )
        assert code == 0 and out.stat().st_size > 0
        killed: list[int] = []
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            api = [pid for pid in _children(proc.pid) if _is_api(pid) and pid not in killed]
            for pid in api:  # the first one, then each restarted API
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)
        assert len(killed) == 5, killed
        log = (tmp_path / "up.log").read_text()
        assert "omniqueue up: api restarted" in log
        assert "api exited with code -9: 5 failures in a row" in log and "giving up" in log
        assert proc.wait(60) == 1
        assert all(_wait_gone(pid) for pid in children)
        assert not _listening(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
