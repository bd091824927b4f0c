"""A video create's ``n`` (issue 32 §2) through the real queue: one job with n outputs,
output k made from seed ``seed + k`` exactly as an ``n = 1`` job of that seed makes it,
each served by ``GET /v1/videos/{id}/content?index=k`` with its own thumbnail; cancel and
delete cover them all."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import av
import httpx
import numpy as np
import pytest

from tests.integration.stack import Stack

pytestmark = pytest.mark.integration

SMALL = {"size": "64x48", "seconds": "0.5", "fps": 16, "num_inference_steps": 3}


def _create(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"prompt": "three kites over a green hill", **SMALL, **fields}
    resp = client.post("/v1/videos", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _frames(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _frames_digest(stack: Stack, job_id: str, index: int = 0) -> str:
    """The SHA-256 of output ``index``'s raw frames, as the worker logged it."""
    which = "" if index == 0 else f" output {index}"
    pattern = re.compile(rf"job {job_id}:{which} frames sha256 ([0-9a-f]{{64}})")
    logs = "".join((stack.work / f"{n}.log").read_text(errors="replace") for n in stack.procs)
    found = pattern.findall(logs)
    assert len(found) == 1, found
    return str(found[0])


def _content(client: httpx.Client, job_id: str, **params: Any) -> httpx.Response:
    return client.get(f"/v1/videos/{job_id}/content", params=params)


def test_n_outputs_each_equal_to_a_one_output_job_of_its_seed(
    stack: Stack, client: httpx.Client
) -> None:
    job = _create(client, seed=40, n=3)
    assert job["n"] == 3
    assert job["outputs"] == [{"index": k, "seed": 40 + k} for k in range(3)]
    singles = [_create(client, seed=40 + k) for k in range(3)]
    done = stack.wait_for(client, job["id"])
    assert done["status"] == "completed", done
    assert done["progress"] == 100 and done["step"] == 3
    for single in singles:
        assert stack.wait_for(client, single["id"])["status"] == "completed"

    clips, thumbs = [], []
    for k, single in enumerate(singles):
        resp = _content(client, job["id"], index=k)
        assert resp.status_code == 200, resp.text
        assert len(_frames(resp.content)) == len(_frames(_content(client, single["id"]).content))
        # the raw frames the worker encoded (the MP4s' decoded frames vary with x264 under load)
        clip = _frames_digest(stack, job["id"], k)
        assert clip == _frames_digest(stack, single["id"]), f"output {k} differs from n=1's"
        thumb = _content(client, job["id"], index=k, variant="thumbnail")
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
        assert thumb.content == _content(client, single["id"], variant="thumbnail").content
        clips.append(clip)
        thumbs.append(thumb.content)
    assert clips[0] != clips[1] and thumbs[0] != thumbs[1]
    # index 0 is the default, and the one a one-output client downloads
    assert _content(client, job["id"]).content == _content(client, job["id"], index=0).content

    missing = _content(client, job["id"], index=3)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "index"
    for bad in ("-1", "x", "4", "١"):
        resp = _content(client, job["id"], index=bad)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "index", bad
    redirect = _content(client, job["id"], index=2, redirect="true")
    assert redirect.status_code == 302 and f"{job['id']}-2.mp4" in redirect.headers["location"]

    objects = stack.objects("videos", job["id"])
    assert len([o for o in objects if o.endswith(".mp4")]) == 3
    assert client.delete(f"/v1/videos/{job['id']}").status_code == 200
    assert stack.objects("videos", job["id"]) == []


def test_cancel_in_a_later_output_stops_the_job_and_leaves_nothing(
    stack: Stack, client: httpx.Client
) -> None:
    job = _create(client, n=4, size="160x120", seconds="2", num_inference_steps=200)
    job_id = job["id"]
    seen = stack.wait_for(client, job_id, until=("in_progress",))
    while seen["status"] == "in_progress" and seen["progress"] < 30:  # into output 1
        seen = client.get(f"/v1/videos/{job_id}").json()
    assert seen["status"] == "in_progress", seen
    cancelled = client.post(f"/v1/videos/{job_id}/cancel").json()
    assert cancelled["status"] == "failed" and cancelled["error"]["code"] == "cancelled"
    for k in range(4):
        resp = _content(client, job_id, index=k)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "job_cancelled"
    # the worker stops at its next step and removes output 0's files with the rest
    deadline = time.monotonic() + 30
    while any(job_id in p.name for p in stack.tmp_dir.iterdir()):
        assert time.monotonic() < deadline, "the job's temp dir was left behind"
        time.sleep(0.05)
    assert stack.objects("videos", job_id) == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"n": 0}, "n"), ({"n": 5}, "n"), ({"n": 2, "seed": 2**63 - 1}, "seed")],
)
def test_n_out_of_range_is_refused_and_stores_nothing(
    stack: Stack, client: httpx.Client, fields: dict[str, Any], param: str
) -> None:
    before = stack.count_jobs()
    resp = client.post("/v1/videos", json={"prompt": "p", **SMALL, **fields})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    assert stack.count_jobs() == before
