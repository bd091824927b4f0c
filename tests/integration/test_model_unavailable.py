"""A model that cannot load is visible, and takes nothing else down (issue 34 §2).

A registry with ``reference/video`` and two entries whose weights are not where their
``path`` says: a job model (``diffusers.ltx``) and a streaming one (``diffusers.helios``);
and a tiny Wan whose entry asks for FP8 weights (``quantization = "fp8"``), which a CPU
worker refuses (issue 44: the model, the field and the device named).
A real job worker loads the first and serves it, records why it cannot load the others;
a real realtime worker loads none of its models, records why, and exits with
``CONFIG_ERROR``. Then: ``/v1/models`` and ``/ready`` name both with their paths, a job
queued before the workers started fails ``model_unavailable`` (its uploaded reference
deleted), a create for the model is a 503 that stores nothing, and ``reference/video``
still runs jobs. The records themselves are checked on a real Redis first.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from websockets.sync.client import connect

from cli.embedded import EmbeddedS3
from models.memory_plan import MemoryReport
from storage.constants import load_failures_key, memory_key
from storage.worker_presence import Availability, WorkerPresence
from tests.integration.conftest import RedisDbPool, isolated_stack
from tests.integration.stack import Stack
from tests.unit.diffusers_fixtures import tiny_wan_entry
from workers.runtime.supervisor import CONFIG_ERROR

pytestmark = pytest.mark.integration

BUCKET = "omniqueue-unavailable"  # this module's own: "nothing stored" is an empty bucket
JOB_MODEL = "acme/ltx-missing"
WORLD_MODEL = "acme/helios-missing"
FP8_MODEL = "acme/wan-fp8"
FP8_WHY = (
    f"model '{FP8_MODEL}': quantization = 'fp8' needs a CUDA GPU of compute capability 8.9 "
    "or more (FP8 matmuls), and device cpu is not a CUDA GPU"
)
LTX = {"prompt": "a lighthouse", "size": "32x32", "num_frames": 9, "num_inference_steps": 2}
TINY = {"prompt": "a lighthouse", "size": "64x48", "seconds": "0.5", "num_inference_steps": 2}


def test_load_failure_records_live_with_the_worker_and_name_the_model(
    redis_pool: RedisDbPool,
) -> None:
    with redis_pool.leased() as db:
        client = redis.Redis.from_url(redis_pool.url(db))
        presence = WorkerPresence(client)
        why = "path /w/m does not exist"
        # a live worker: its records last as its lease does
        presence.renew(["m/ok"], "h:1:w0", 0.3, {"m/gone": why}, "h:w0")
        # one that loaded nothing and exited: its records stay (here 30 s)
        presence.renew([], "h:2:w1", 30, {"m/gone": why, "m/ok": why}, "h:w1")
        found = presence.availability(["m/ok", "m/gone", "m/unknown"])
        assert (found["m/ok"].workers, found["m/ok"].reason) == (1, None)  # one serves it
        assert found["m/gone"].failures == (why, why) and found["m/gone"].reason == why
        assert found["m/unknown"].reason is None  # nothing known: not unavailable
        assert client.ttl(load_failures_key("m/gone")) > 1  # the longest record's keep
        time.sleep(0.4)
        assert presence.availability(["m/gone"])["m/gone"].failures == (why,)  # w0's lapsed
        assert client.hkeys(load_failures_key("m/gone")) == [b"h:w1"]
        # w1 starts again (same slot) and loads m/gone now: its record goes
        presence.renew(["m/gone"], "h:3:w1", 30, {}, "h:w1")
        assert presence.availability(["m/gone"])["m/gone"] == Availability(1, ())
        presence.leave(["m/gone"], "h:3:w1")
        presence.renew(["m/ok"], "h:4:w2", 30, {"m/x": why}, "h:w2")
        presence.leave(["m/ok"], "h:4:w2", ["m/x"], "h:w2")  # a stopped worker leaves both
        assert presence.availability(["m/x"])["m/x"].failures == ()
        client.close()


def test_memory_reports_live_with_the_worker_that_wrote_them(redis_pool: RedisDbPool) -> None:
    """A worker that loaded a model with a memory plan keeps its report as long as its
    lease; ``/v1/models`` lists what the live workers keep (issue 44)."""
    with redis_pool.leased() as db:
        client = redis.Redis.from_url(redis_pool.url(db))
        presence = WorkerPresence(client)
        report = MemoryReport(fp8_modules={"transformer": 300}, bytes_saved=1_200_000_000)
        presence.report_memory({"m/fp8": report}, 0.3)
        presence.report_memory({}, 0.3)  # nothing to write: no round trip
        assert presence.memory_reports(["m/fp8", "m/plain"]) == {"m/fp8": report}
        assert presence.memory_reports([]) == {}
        assert 0 < client.pttl(memory_key("m/fp8")) <= 1000  # at least a second
        time.sleep(1.1)
        assert presence.memory_reports(["m/fp8"]) == {}  # the lease ran out with it
        client.close()


@pytest.fixture(scope="module")
def ustack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    """An API on the registry above with no worker yet; the first test starts them."""
    work = module_dir
    weights = work / "weights"
    registry = work / "models.toml"
    registry.write_text(
        '[[model]]\nname = "reference/video"\nadapter = "reference.video"\ndtype = "float32"\n'
        f'[[model]]\nname = "{JOB_MODEL}"\nadapter = "diffusers.ltx"\n'
        f'path = "{weights / "LTX-Video-0.9.5"}"\n'
        '[model.spec]\nworkflows = ["t2v", "i2v"]\n'  # takes the keyframe _create sends
        f'[[model]]\nname = "{WORLD_MODEL}"\nadapter = "diffusers.helios"\n'
        f'path = "{weights / "Helios-Distilled"}"\n'
        + tiny_wan_entry(FP8_MODEL, weights / "wan", 'quantization = "fp8"\n')
    )
    s3 = s3_server.client()
    s3.create_bucket(Bucket=BUCKET)
    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_S3__BUCKET": BUCKET,
        "OMNIQ_WORKER__RECONCILE_INTERVAL_S": "0.3",
        "OMNIQ_WORKER__HEARTBEAT_S": "0.5",
    }
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=0)
        yield st


def _objects(st: Stack) -> list[str]:
    listed = st.s3.client().list_objects_v2(Bucket=BUCKET)
    return [o["Key"] for o in listed.get("Contents", [])]


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 40, 40)).save(buf, format="PNG")
    return buf.getvalue()


def _create(c: httpx.Client, **headers: str) -> httpx.Response:
    files = {"input_reference": ("ref.png", _png(), "image/png")}
    form = {k: str(v) for k, v in {**LTX, "model": JOB_MODEL}.items()}
    return c.post("/v1/videos", data=form, files=files, headers=headers)


def _listed(c: httpx.Client) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in c.get("/v1/models").json()["data"]}


def test_a_model_that_cannot_load_is_named_and_refused_and_the_rest_serves(ustack: Stack) -> None:
    weights = ustack.work / "weights"
    with ustack.client() as c:
        # before any worker said a word: accepted, and it waits, as it always did
        assert all(m["available"] for m in _listed(c).values())
        early = _create(c, **{"Idempotency-Key": "early"})
        assert early.status_code == 200, early.text
        job = early.json()
        assert job["status"] == "queued" and len(_objects(ustack)) == 1  # its reference

        ustack.start_worker("w0")
        realtime = ustack._spawn("rt0", "worker", "--realtime", "--name", "rt0")
        ustack.wait_workers(1)  # w0
        # the realtime worker could load none of its models: it exits, not restarted by up
        assert realtime.wait(60) == CONFIG_ERROR, ustack.log("rt0")
        rt_log = ustack.log("rt0")
        assert f"'{WORLD_MODEL}': path {weights / 'Helios-Distilled'} does not exist" in rt_log
        assert "neither a valid local path" not in ustack.log("w0")  # no diffusers' words
        # a session for it is ended at once, not after the admission timeout
        ws_url = ustack.url.replace("http://", "ws://") + "/v1/realtime/video"
        with connect(ws_url) as ws:
            start = {"type": "session.start", "model": WORLD_MODEL, "prompt": "a lighthouse"}
            ws.send(json.dumps(start))
            error = json.loads(ws.recv(timeout=5))
        assert (error["type"], error["code"]) == ("error", "model_unavailable"), error
        assert f"path {weights / 'Helios-Distilled'} does not exist" in error["message"]

        # the queued job fails, its reference deleted
        failed = ustack.wait_for(c, job["id"], timeout=30)
        job_why = f"path {weights / 'LTX-Video-0.9.5'} does not exist"
        assert failed["status"] == "failed", failed
        assert failed["error"] == {
            "code": "model_unavailable",
            "message": f"no live worker can load model '{JOB_MODEL}': {job_why}",
        }
        assert failed["started_at"] is None

        # /v1/models and /ready name both, with their paths
        world_why = f"path {weights / 'Helios-Distilled'} does not exist"
        listed = _listed(c)
        assert listed["reference/video"]["available"] is True
        assert listed["reference/video"]["unavailable_reason"] is None
        assert (listed[JOB_MODEL]["available"], listed[JOB_MODEL]["unavailable_reason"]) == (
            False,
            job_why,
        )
        assert listed[WORLD_MODEL]["unavailable_reason"] == world_why
        assert (listed[FP8_MODEL]["available"], listed[FP8_MODEL]["unavailable_reason"]) == (
            False,
            FP8_WHY,
        )
        assert listed[FP8_MODEL]["memory"]["quantization"] == "fp8"
        assert listed[FP8_MODEL]["memory"]["fp8_modules"] is None  # no worker loaded it
        assert listed[JOB_MODEL]["memory"] is None  # no plan
        ready = httpx.get(ustack.url + "/ready")
        assert ready.status_code == 200  # the API serves the other models
        assert ready.json()["unavailable_models"] == {
            JOB_MODEL: job_why,
            WORLD_MODEL: world_why,
            FP8_MODEL: FP8_WHY,
        }

        # a create for it is a 503 naming why, and stores nothing
        end = time.monotonic() + 10
        while _objects(ustack):  # the failed job's reference goes with it
            assert time.monotonic() < end, _objects(ustack)
            time.sleep(0.05)
        rows = ustack.count_jobs()
        for refused in (_create(c), c.post("/v1/videos", json={**LTX, "model": JOB_MODEL})):
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["param"], error["type"]) == (
                "model_unavailable",
                "model",
                "server_error",
            )
            assert error["message"] == failed["error"]["message"]
        assert ustack.count_jobs() == rows and _objects(ustack) == []
        # a retried create still gets its job
        again = _create(c, **{"Idempotency-Key": "early"})
        assert again.status_code == 200 and again.json()["id"] == job["id"]

        # the model that loads runs
        ran = c.post("/v1/videos", json=TINY)
        assert ran.status_code == 200, ran.text
        done = ustack.wait_for(c, ran.json()["id"], timeout=60)
        assert done["status"] == "completed", done
