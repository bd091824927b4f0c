"""What every fault must leave true, read from the services themselves (root namespace):

* every job created ended, in exactly one terminal state: its row ``completed`` or
  ``failed``, at most one ``done`` on its event stream and as its last entry (none when
  the bus was cut as its worker ended it: its watchers still get a ``done``, made from the
  row, which the load checks), exactly one webhook delivery queued for it;
* a completed job's objects are its completing attempt's two outputs, whole (the sizes its
  artifact rows recorded; the MP4 decodes), and nothing else; a failed job has none;
* no multipart upload is open, and no job's temp directory is left.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from typing import Any

import av
import redis

from storage.constants import job_events_key
from tests.cluster.cluster import Cluster

TERMINAL = ("completed", "failed")


def wait_terminal(cluster: Cluster, job_ids: list[str], timeout: float = 180) -> dict[str, Any]:
    """Every job's row once all have ended (fails naming those that did not)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = {
            r.id: r
            for r in cluster.rows(
                "SELECT id, status, attempt, worker_id, error_code FROM jobs WHERE id = ANY(:ids)",
                ids=job_ids,
            )
        }
        open_ = [j for j in job_ids if j not in rows or rows[j].status not in TERMINAL]
        if not open_:
            return rows
        assert time.monotonic() < deadline, f"jobs that never ended: {open_[:5]}"
        time.sleep(0.5)


def check_jobs(cluster: Cluster, job_ids: list[str]) -> dict[str, Any]:
    """The checks above, for ``job_ids``; a summary for the report."""
    assert job_ids, "the load created no job"
    rows = wait_terminal(cluster, job_ids)
    r = redis.Redis.from_url(cluster.redis_url, socket_timeout=10)
    s3 = cluster.s3()
    bucket = cluster.s3_keys["bucket"]
    deliveries = dict(
        cluster.rows(
            "SELECT job_id, count(*) FROM webhook_deliveries WHERE job_id = ANY(:ids) "
            "GROUP BY job_id",
            ids=job_ids,
        )
    )
    artifacts: dict[str, dict[str, int]] = {}
    for job_id, key, size in cluster.rows(
        "SELECT job_id, key, size_bytes FROM artifacts WHERE job_id = ANY(:ids)", ids=job_ids
    ):
        artifacts.setdefault(job_id, {})[key] = size
    codes: Counter[str] = Counter()
    lost_done = 0
    for job_id in job_ids:
        row = rows[job_id]
        codes[row.status if row.status == "completed" else f"failed:{row.error_code}"] += 1
        entries: Any = r.xrange(job_events_key(job_id))
        types = [json.loads(f[b"event"])["type"] for _, f in entries]
        # one done at most, and last; none when the bus was cut as the job ended (its
        # watchers then get the end from the row: the watch check of the load)
        assert types.count("done") <= 1, (job_id, types)
        if "done" in types:
            assert types[-1] == "done", (job_id, types)
            done = json.loads(entries[-1][1][b"event"])
            assert done["status"] == row.status, (job_id, done, row)
        else:
            lost_done += 1
        assert deliveries.get(job_id) == 1, (job_id, deliveries.get(job_id))
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"videos/{job_id}/")
        objects = {o["Key"]: o["Size"] for o in listed.get("Contents", [])}
        if row.status == "completed":
            # exactly the artifacts its row lists, whole: nothing missing, nothing extra
            names = sorted(key.rsplit("/", 1)[-1] for key in objects)
            assert names == ["spritesheet.jpg", "thumbnail.jpg", "video.mp4"], (job_id, objects)
            assert artifacts.get(job_id) == objects, (job_id, artifacts.get(job_id), objects)
            (video,) = (key for key in objects if key.endswith("/video.mp4"))
            mp4 = s3.get_object(Bucket=bucket, Key=video)["Body"].read()
            with av.open(io.BytesIO(mp4), mode="r") as container:
                assert next(iter(container.decode(video=0)), None) is not None
        else:
            assert objects == {}, (job_id, objects)
    r.close()
    check_no_leftovers(cluster)
    return {
        "terminal": dict(codes),
        "done_events_lost": lost_done,
        "attempts_max": max(rows[j].attempt for j in job_ids),
    }


def check_no_leftovers(cluster: Cluster, timeout: float = 60) -> None:
    """No open multipart upload, no job temp directory (within ``timeout``: the
    reconciler aborts what a cut-off worker left)."""
    s3 = cluster.s3()
    deadline = time.monotonic() + timeout
    while True:
        uploads = s3.list_multipart_uploads(Bucket=cluster.s3_keys["bucket"]).get("Uploads", [])
        temp = [p.name for p in (cluster.work / "tmp").glob("*/omniq-video_*")]
        if not uploads and not temp:
            return
        assert time.monotonic() < deadline, (uploads, temp)
        time.sleep(1)


def wait_running(cluster: Cluster, job_id: str, timeout: float = 60, step: int = 1) -> str:
    """Wait until ``job_id`` runs (at ``step`` or later); its worker's host."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = cluster.rows("SELECT status, step, worker_id FROM jobs WHERE id = :id", id=job_id)
        if rows and rows[0].status == "in_progress" and rows[0].step >= step:
            return str(rows[0].worker_id).rsplit(":", 1)[-1]
        time.sleep(0.1)
    raise AssertionError(f"{job_id} did not start")


def wait_taken(cluster: Cluster, job_id: str, timeout: float = 60) -> str:
    """Wait until a worker has taken ``job_id`` (running it, or already done: a small job
    can run between two polls); that worker's host."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = cluster.rows("SELECT worker_id FROM jobs WHERE id = :id", id=job_id)
        if rows and rows[0].worker_id:
            return str(rows[0].worker_id).rsplit(":", 1)[-1]
        time.sleep(0.1)
    raise AssertionError(f"{job_id} was not taken by any worker")


def metric(cluster: Cluster, host: str, name: str) -> float:
    """The sum of a worker's metric ``name`` over its labels (0 when absent)."""
    import httpx

    text = httpx.get(f"http://{cluster.net.addresses[host]}:9100/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name:
                total += float(value)
    return total
