"""Real diffusers pipelines through the real queue: tiny random-weight Wan, LTX, CogVideoX,
LTX-2 and Stable Audio pipelines saved to disk, named in a model-registry file, served by
the API and run step by step by a Celery worker process; the MP4 (or the audio file)
matches the pipeline's own call."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.unit.diffusers_fixtures import (
    TINY_SEQ_LEN,
    tiny_cogvideox_pipeline,
    tiny_ltx_pipeline,
    tiny_wan_pipeline,
)
from tests.unit.diffusers_fixtures_av import tiny_ltx2_pipeline, tiny_stable_audio_pipeline
from workers.media.audio import decode_audio
from workers.media.mp4 import encode_mp4
from workers.pipelines.base import Media

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "a red ball"
AUDIO_MODEL = "tiny/stable-audio"
# A tiny Wan job of 9 frames of 32x32; the tests add its steps and seed or tier.
WAN_JOB: dict[str, Any] = {"model": "tiny/wan", "prompt": PROMPT, "size": "32x32", "num_frames": 9}


# name → (builder, family, frames, fps, spec overrides)
MODELS: dict[str, tuple[Callable[[], Any], str, int, float, str]] = {
    "tiny/wan": (tiny_wan_pipeline, "diffusers.wan", 9, 16.0, ""),
    "tiny/ltx": (tiny_ltx_pipeline, "diffusers.ltx", 9, 25.0, ""),
    "tiny/cogvideox": (tiny_cogvideox_pipeline, "diffusers.cogvideox", 9, 8.0, ""),
    # the tiny LTX-2 VAE compresses time by 4, not 8 as the released one
    "tiny/ltx2": (
        tiny_ltx2_pipeline,
        "diffusers.ltx2",
        5,
        25.0,
        "frame_multiple = 4\nframe_offset = 1\n",
    ),
}


@pytest.fixture(scope="module")
def dstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    work = module_dir
    entries = []
    for name, (build, family, _, _, spec) in MODELS.items():
        path = work / name.replace("/", "_")
        build().save_pretrained(path)
        entries.append(
            f'[[model]]\nname = "{name}"\nadapter = "{family}"\npath = "{path}"\n'
            f'dtype = "float32"\n[model.adapter_options]\nmax_sequence_length = {TINY_SEQ_LEN}\n'
            + (f"[model.spec]\n{spec}" if spec else "")
        )
    # The tiny Stable Audio makes at most 4 s (sample_size 16 x hop 2 at 8 Hz).
    sa_path = work / "tiny_stable_audio"
    tiny_stable_audio_pipeline().save_pretrained(sa_path)
    entries.append(
        f'[[model]]\nname = "{AUDIO_MODEL}"\nadapter = "diffusers.stable_audio"\n'
        f'path = "{sa_path}"\ndtype = "float32"\n[model.spec]\nmax_seconds = 4.0\n'
    )
    registry = work / "models.toml"
    registry.write_text("\n".join(entries))
    env = {"OMNIQ_MODEL_REGISTRY": str(registry), "OMNIQ_WORKER__LOG_FRAME_DIGESTS": "true"}
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=1)
        yield st


def _decode(data: bytes) -> tuple[np.ndarray, bool]:
    with av.open(io.BytesIO(data)) as container:
        has_audio = bool(container.streams.audio)
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return np.stack(frames), has_audio


@pytest.mark.parametrize("name", list(MODELS))
def test_diffusers_model_runs_through_the_queue(dstack: Stack, name: str, tmp_path: Path) -> None:
    build, _, frames, fps, _ = MODELS[name]
    with dstack.client() as c:
        models = [m["id"] for m in c.get("/v1/models").json()["data"]]
        assert name in models
        resp = c.post(
            "/v1/videos",
            json={
                "model": name,
                "prompt": PROMPT,
                "size": "32x32",
                "num_frames": frames,
                "fps": fps,
                "num_inference_steps": 3,
                "seed": 7,
            },
        )
        assert resp.status_code == 200, resp.text
        done = dstack.wait_for(c, resp.json()["id"], timeout=180)
        assert done["status"] == "completed", (done, dstack.log("w0"))
        assert done["step"] == 3 and done["progress"] == 100
        video, has_audio = _decode(c.get(f"/v1/videos/{done['id']}/content").content)
    assert video.shape == (frames, 32, 32, 3)
    assert has_audio == (name == "tiny/ltx2")

    # The pipeline's own __call__ for the same seed.
    pipe = build()
    kwargs: dict[str, Any] = {}
    if name == "tiny/ltx2":
        kwargs["frame_rate"] = fps
    out = pipe(
        PROMPT,
        height=32,
        width=32,
        num_frames=frames,
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(7),
        output_type="np",
        max_sequence_length=TINY_SEQ_LEN,
        **kwargs,
    )
    expected = np.asarray(out.frames[0] if not isinstance(out, tuple) else out[0][0])
    expected = (expected * 255).round().clip(0, 255).astype(np.uint8)
    # Encoded the same way, the frames decode (nearly) identically. x264's frame threads
    # make its decisions timing-dependent under load, so allow a small mean difference;
    # different content (another seed, a wrong loop) differs by ~50 levels at this size.
    reference = tmp_path / "reference.mp4"
    encode_mp4(Media(frames=expected, fps=fps), reference)
    decoded, _ = _decode(reference.read_bytes())
    assert np.abs(decoded.astype(int) - video.astype(int)).mean() < 4


def test_stable_audio_runs_through_the_queue(dstack: Stack) -> None:
    request = {
        "model": AUDIO_MODEL,
        "prompt": PROMPT,
        "seconds": 1.5,
        "num_inference_steps": 3,
        "seed": 7,
        "guidance_scale": 6.0,
        "negative_prompt": "muffled noise",
    }
    content: dict[str, bytes] = {}
    with dstack.client() as c:
        models = {m["id"]: m["modality"] for m in c.get("/v1/models").json()["data"]}
        assert models[AUDIO_MODEL] == "audio"
        for fmt in ("wav", "pcm", "mp3"):
            resp = c.post("/v1/audio/generations", json={**request, "response_format": fmt})
            assert resp.status_code == 200, resp.text
            done = dstack.wait_for(
                c, resp.json()["id"], timeout=180, collection="audio/generations"
            )
            assert done["status"] == "completed", (done, dstack.log("w0"))
            assert done["step"] == 3 and done["channels"] == 2
            # The model's own rate (8 Hz) where the format takes it; MP3 resamples.
            assert done["sample_rate"] == (8000 if fmt == "mp3" else 8)
            content[fmt] = c.get(f"/v1/audio/generations/{done['id']}/content").content

    # The pipeline's own __call__ for the same seed: 1.5 s at 8 Hz = 12 stereo samples.
    out = tiny_stable_audio_pipeline()(
        PROMPT,
        negative_prompt="muffled noise",
        audio_end_in_s=1.5,
        num_inference_steps=3,
        guidance_scale=6.0,
        generator=torch.Generator().manual_seed(7),
        output_type="pt",
    )
    expected = out.audios[0].float().numpy().clip(-1.0, 1.0)
    assert expected.shape == (2, 12)
    wav, rate = decode_audio(io.BytesIO(content["wav"]))
    assert rate == 8 and wav.shape == (2, 12)
    assert np.abs(wav - expected).max() <= 2 / 32768  # 16-bit quantization only
    pcm = np.frombuffer(content["pcm"], dtype="<i2").reshape(-1, 2).T
    assert np.abs(pcm - np.round(expected * 32767)).max() <= 1
    mp3, rate = decode_audio(io.BytesIO(content["mp3"]))
    assert mp3.shape[1] / rate == 1.5


def test_cancel_stops_a_diffusers_job_inside_a_step(dstack: Stack) -> None:
    """A cancel lands between two transformer blocks of a step, not at the step's end: the
    worker is held inside step 1 before its second block (a failpoint sleep), the client
    cancels, and the job stops right there; the worker goes on to the next job."""
    job = {**WAN_JOB, "num_inference_steps": 4, "seed": 3}
    with dstack.client_without_failpoints() as c:
        dstack.set_failpoints({"block:1:2": "sleep:3"})
        vid = c.post("/v1/videos", json=job).json()["id"]
        deadline = time.monotonic() + 120
        while "failpoint block:1:2: sleep:3" not in dstack.log("w0"):
            assert time.monotonic() < deadline, dstack.log("w0")
            time.sleep(0.02)
        assert c.post(f"/v1/videos/{vid}/cancel").status_code == 200
        done = dstack.wait_for(c, vid, timeout=30)
        assert done["status"] == "failed", (done, dstack.log("w0"))
        assert done["error"]["code"] == "cancelled"
        deadline = time.monotonic() + 10
        wanted = (f"job {vid} stops in step 1 before block 2", f"job {vid}: cancelled")
        while not all(line in dstack.log("w0") for line in wanted):
            assert time.monotonic() < deadline, dstack.log("w0")
            time.sleep(0.05)
        assert dstack.objects("video", vid) == []
        dstack.set_failpoints({})
        again = c.post("/v1/videos", json=job).json()["id"]
        assert dstack.wait_for(c, again, timeout=120)["status"] == "completed"


def _video_frames(stack: Stack, client: Any, job: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Run ``job``; its object and the SHA-256 of the raw frames its worker encoded (from
    the worker's log: x264's output under load differs from run to run, the frames not)."""
    resp = client.post("/v1/videos", json=job)
    assert resp.status_code == 200, resp.text
    done = stack.wait_for(client, resp.json()["id"], timeout=180)
    assert done["status"] == "completed", (done, stack.log(next(reversed(stack.procs))))
    pattern = re.compile(rf"job {done['id']}: frames sha256 ([0-9a-f]{{64}})")
    logs = "".join((stack.work / f"{n}.log").read_text(errors="replace") for n in stack.procs)
    found = pattern.findall(logs)
    assert len(found) == 1, found
    return done, found[0]


def _fresh_worker(stack: Stack, name: str) -> None:
    for old in [n for n in stack.procs if n != "api"]:
        stack.stop_process(old)
    stack.start_worker(name)
    stack.wait_workers(1)


def test_quality_tiers_through_the_queue(dstack: Stack) -> None:
    """Cache tiers (``quality``) through the API and a worker process: a worker serving
    alternating tiers gives each job exactly the frames that the same job gets alone on a
    fresh worker process (compared by the SHA-256 of the raw frames the worker encoded),
    and a lossless job after a fast one is bit-equal to a fresh worker's; a cancel inside
    a cached tier's computed step leaves the next job as on a fresh worker. A model
    without tiers refuses ``quality``, storing nothing; ``/v1/models`` lists the tiers;
    the job object records the tier."""
    job = {**WAN_JOB, "num_inference_steps": 6, "seed": 11}
    order = ["fast", "lossless", "high", "fast", "lossless"]
    with dstack.client() as c:
        listed = {m["id"]: m["quality_tiers"] for m in c.get("/v1/models").json()["data"]}
        assert listed["tiny/wan"] == ["lossless", "high", "fast"]
        assert listed["tiny/ltx2"] == ["lossless"] and listed[AUDIO_MODEL] == []
        jobs_before = dstack.count_jobs()
        bad = c.post("/v1/videos", json={**job, "model": "tiny/ltx2", "quality": "fast"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "quality", bad.text
        bad = c.post("/v1/videos", data={**job, "num_frames": "9", "quality": "ultra"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "quality", bad.text
        assert dstack.count_jobs() == jobs_before

        shared: dict[str, list[str]] = {}
        for quality in order:  # one worker, tiers alternating
            done, frames = _video_frames(dstack, c, {**job, "quality": quality})
            assert done["quality"] == quality and done["step"] == 6
            shared.setdefault(quality, []).append(frames)
        assert c.get(f"/v1/videos/{done['id']}").json()["quality"] == "lossless"

        alone: dict[str, str] = {}
        for i, quality in enumerate(("lossless", "high", "fast")):
            _fresh_worker(dstack, f"fresh{i}")
            alone[quality] = _video_frames(dstack, c, {**job, "quality": quality})[1]
        for quality, runs in shared.items():
            assert runs == [alone[quality]] * len(runs), quality
        assert len(set(alone.values())) == 3  # each tier changes the frames

        # A cancel inside a computed step of a fast job (step 1 of the warm-up), then lossless.
        with dstack.client_without_failpoints() as c2:
            dstack.set_failpoints({"block:1:2": "sleep:3"})
            worker = next(n for n in dstack.procs if n != "api")
            vid = c2.post("/v1/videos", json={**job, "quality": "fast"}).json()["id"]
            deadline = time.monotonic() + 120
            while "failpoint block:1:2: sleep:3" not in dstack.log(worker):
                assert time.monotonic() < deadline, dstack.log(worker)
                time.sleep(0.02)
            assert c2.post(f"/v1/videos/{vid}/cancel").status_code == 200
            assert dstack.wait_for(c2, vid, timeout=30)["error"]["code"] == "cancelled"
            dstack.set_failpoints({})
        assert _video_frames(dstack, c, {**job, "quality": "lossless"})[1] == alone["lossless"]


def test_n_outputs_of_a_diffusers_job_equal_one_output_jobs(dstack: Stack) -> None:
    """``n = 2`` on tiny Wan with a cache tier (issue 32 §2): output k's raw frames are
    those of an ``n = 1`` job of seed ``seed + k`` (the tier's state does not leak from
    output 0 into output 1), and both outputs are served."""
    job = {**WAN_JOB, "num_inference_steps": 4, "quality": "fast"}
    with dstack.client() as c:
        both, first = _video_frames(dstack, c, {**job, "seed": 30, "n": 2})
        logs = "".join((dstack.work / f"{n}.log").read_text(errors="replace") for n in dstack.procs)
        second = re.findall(rf"job {both['id']}: output 1 frames sha256 ([0-9a-f]{{64}})", logs)
        assert both["outputs"] == [{"index": 0, "seed": 30}, {"index": 1, "seed": 31}]
        assert first == _video_frames(dstack, c, {**job, "seed": 30})[1]
        assert second == [_video_frames(dstack, c, {**job, "seed": 31})[1]]
        assert first != second[0]
        for k in (0, 1):
            resp = c.get(f"/v1/videos/{both['id']}/content", params={"index": k})
            assert resp.status_code == 200 and _decode(resp.content)[0].shape[0] == 9
