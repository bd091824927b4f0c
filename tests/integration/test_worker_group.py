"""A worker group through the real queue: one job across two ranks (gloo on CPUs) of
``omniqueue worker --devices cpu,cpu``, next to a single-device worker serving the same
tiny Wan pipeline. The group's output equals the single device's; a cancel stops both
ranks inside a step at the same block; a SIGKILLed rank brings the whole group down and
back up, and its job is taken over and completes."""

from __future__ import annotations

import io
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import psutil
import pytest
import yaml

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.unit.diffusers_fixtures import tiny_wan_entry

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SINGLE, CFG, ULYSSES = "tiny/wan", "tiny/wan-cfg2", "tiny/wan-ulysses2"
# The model of docs/deployment.md's worker-group recipe (tiny weights under its name).
RECIPE_MODEL = "Wan-AI/Wan2.1-T2V-14B"
DEPLOYMENT_MD = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


@pytest.fixture(scope="module")
def gstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    work = module_dir
    path = work / "tiny_wan"
    registry = work / "models.toml"
    registry.write_text(
        "\n".join(
            tiny_wan_entry(name, path, group)
            for name, group in (
                (SINGLE, ""),
                (CFG, 'devices = 2\nparallel = "cfg"\n'),
                (ULYSSES, 'devices = 2\nparallel = "ulysses"\n'),
                (RECIPE_MODEL, 'devices = 2\nparallel = "cfg"\n'),
            )
        )
    )
    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_WORKER__HEARTBEAT_S": "0.5",
        "OMNIQ_WORKER__HEARTBEAT_TIMEOUT_S": "4",
        "OMNIQ_WORKER__RECONCILE_INTERVAL_S": "0.5",
        "OMNIQ_WORKER__COLLECTIVE_TIMEOUT_S": "60",
    }
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.set_failpoints({})
        st.start(workers=1)  # w0: one device, serves tiny/wan only
        st._spawn("g0", "worker", "--name", "g0", "--devices", "cpu,cpu")
        _wait_log(st, "g0", "ready.", timeout=180)
        yield st


def _wait_log(st: Stack, name: str, text: str, timeout: float = 60, since: int = 0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = _full_log(st, name)
        if text in log[since:]:
            return log
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in the {name} log:\n{_full_log(st, name)[-6000:]}")


def _full_log(st: Stack, name: str) -> str:
    path = st.work / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _job(model: str, **more: Any) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": "a red ball",
        "size": "32x32",
        "num_frames": 9,
        "num_inference_steps": 4,
        "seed": 5,
        "guidance_scale": 5.0,
        **more,
    }


def _frames(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _run(c: httpx.Client, st: Stack, model: str, **more: Any) -> tuple[dict[str, Any], np.ndarray]:
    resp = c.post("/v1/videos", json=_job(model, **more))
    assert resp.status_code == 200, resp.text
    done = st.wait_for(c, resp.json()["id"], timeout=180)
    assert done["status"] == "completed", (done, _full_log(st, "g0")[-4000:])
    return done, _frames(c.get(f"/v1/videos/{done['id']}/content").content)


def test_a_job_on_two_ranks_equals_the_single_device_run(gstack: Stack) -> None:
    """cfg (the two guidance passes on two ranks) and ulysses (the sequence split across
    them) make the frames the single-device worker makes for the same job."""
    with gstack.client() as c:
        models = {m["id"] for m in c.get("/v1/models").json()["data"]}
        assert {SINGLE, CFG, ULYSSES} <= models
        single, expected = _run(c, gstack, SINGLE)
        assert single["step"] == 4
        for model in (CFG, ULYSSES):
            done, frames = _run(c, gstack, model)
            assert done["step"] == 4
            # Decoded by rank 0 and encoded as the single worker does. x264's frame threads
            # make its output timing-dependent, so the MP4s match only nearly (another seed
            # differs by ~50 levels); tests/unit/test_parallel.py compares the frames
            # before encoding, exactly.
            assert frames.shape == expected.shape
            assert np.abs(frames.astype(int) - expected.astype(int)).mean() < 4, model
    log = _full_log(gstack, "g0")
    assert "[rank 1]" in log and "rank 1 of 2 on cpu joined" in log


def test_a_cancel_stops_both_ranks_inside_a_step_at_the_same_block(gstack: Stack) -> None:
    with gstack.client_without_failpoints() as c:
        since = len(_full_log(gstack, "g0"))
        gstack.set_failpoints({"block:1:2": "sleep:3"})
        vid = c.post("/v1/videos", json=_job(CFG)).json()["id"]
        _wait_log(gstack, "g0", "failpoint block:1:2: sleep:3", timeout=120, since=since)
        assert c.post(f"/v1/videos/{vid}/cancel").status_code == 200
        done = gstack.wait_for(c, vid, timeout=30)
        assert done["status"] == "failed" and done["error"]["code"] == "cancelled"
        _wait_log(gstack, "g0", f"job {vid} stops in step 1 before block 2", since=since)
        _wait_log(gstack, "g0", "rank 1: step 1 aborted: stopped by rank 0 before block 2")
        _wait_log(gstack, "g0", f"job {vid}: cancelled", since=since)
        assert gstack.objects("video", vid) == []
        gstack.set_failpoints({})
        _, frames = _run(c, gstack, CFG)  # the group goes on
        assert frames.shape[0] == 9


def _ranks(st: Stack) -> dict[int, int]:
    """Rank → pid of the group's current ranks (from their "joined" lines)."""
    ranks = {}
    for line in _full_log(st, "g0").splitlines():
        if m := re.search(r"rank (\d+) of 2 on cpu joined \(pid (\d+)\)", line):
            ranks[int(m.group(1))] = int(m.group(2))
    return ranks


def test_a_sigkilled_rank_restarts_the_group_and_the_job_is_taken_over(gstack: Stack) -> None:
    with gstack.client_without_failpoints() as c:
        since = len(_full_log(gstack, "g0"))
        gstack.set_failpoints({"step:2@attempt1": "sleep:30"})
        vid = c.post("/v1/videos", json=_job(CFG, seed=9)).json()["id"]
        _wait_log(gstack, "g0", "failpoint step:2@attempt1: sleep:30", timeout=120, since=since)
        before = _ranks(gstack)
        assert sorted(before) == [0, 1]
        procs = [psutil.Process(pid) for pid in before.values()]
        os.kill(before[1], signal.SIGKILL)
        _wait_log(gstack, "g0", "restarting it", timeout=30, since=since)
        psutil.wait_procs(procs, timeout=30)  # the whole group went down
        assert not any(p.is_running() for p in procs)
        done = gstack.wait_for(c, vid, timeout=240)
        assert done["status"] == "completed", (done, _full_log(gstack, "g0")[-4000:])
        assert done["attempt"] == 2
        after = _ranks(gstack)
        assert sorted(after) == [0, 1] and not set(after.values()) & set(before.values())


class _ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's own tags (``!override``, ``!reset``) read as plain nodes."""


_ComposeLoader.add_multi_constructor(
    "!",
    lambda loader, _tag, node: (
        loader.construct_sequence(node, deep=True)
        if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.MappingNode)
        else loader.construct_scalar(node)
    ),
)


def _recipe() -> dict[str, Any]:
    """The ``worker-group`` service of docs/deployment.md, as written."""
    blocks = re.findall(r"```yaml\n(.*?)```", DEPLOYMENT_MD.read_text(), re.S)
    found = [b for b in blocks if "worker-group:" in b]
    assert len(found) == 1, "one worker-group recipe in docs/deployment.md"
    service: dict[str, Any] = yaml.load(found[0], Loader=_ComposeLoader)["services"]["worker-group"]
    return service


def test_the_deployment_recipe_runs_a_job_across_its_group(gstack: Stack) -> None:
    """docs/deployment.md's worker-group service, run as written but on CPU ranks: its
    command (the GPUs it names mapped to ``cpu``) with the environment it inherits from
    the compose ``worker`` service (``OMNIQ_WORKER__DEVICE=cuda:0`` included), serving
    the recipe's model (tiny Wan weights under its name). Docker, NCCL and GPUs are not
    part of this test (see docs/deployment.md)."""
    recipe = _recipe()
    compose = yaml.safe_load((DEPLOYMENT_MD.parents[1] / "docker-compose.yml").read_text())
    worker = compose["services"][recipe["extends"]]
    ids = recipe["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
    command = list(recipe["command"])
    devices = command[command.index("--devices") + 1].split(",")
    assert devices == [f"cuda:{i}" for i in range(len(ids))], (devices, ids)  # cuda:N inside
    assert command[command.index("--models") + 1] == RECIPE_MODEL
    command[command.index("--devices") + 1] = ",".join("cpu" for _ in devices)
    inherited = {k: str(v) for k, v in worker["environment"].items() if k.startswith("OMNIQ_W")}
    assert inherited["OMNIQ_WORKER__DEVICE"] == "cuda:0"
    name = command[command.index("--name") + 1]
    before = dict(gstack.extra_env)
    gstack.extra_env.update(inherited)  # the group's processes get it, as in the container
    try:
        gstack._spawn(name, *command)
    finally:
        gstack.extra_env.clear()
        gstack.extra_env.update(before)
    _wait_log(gstack, name, "ready.", timeout=180)
    gstack.procs["g0"].terminate()  # only the recipe's group may take the job
    gstack.procs["g0"].wait(timeout=60)
    with gstack.client() as c:
        done, frames = _run(c, gstack, RECIPE_MODEL)
    assert done["id"] in _full_log(gstack, name)
    assert frames.shape[0] == 9
