"""The client verbs of ``omniqueue`` against the session's real stack (API, worker,
PostgreSQL, Redis, S3; auth required): ``video`` (and its alias ``generate``),
``audio``, ``speech``, ``status``, ``list``, ``cancel``, ``download`` and ``models``, run
in-process through ``cli.main.main`` as a shell would, and Ctrl-C as a subprocess; every
refusal is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from cli.main import main
from tests.integration.stack import REPO, Stack

pytestmark = pytest.mark.integration

TINY = ["--seconds", "0.5", "--size", "64x48", "--steps", "2"]


@pytest.fixture
def omniqueue(stack: Stack, key: str, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """Run ``omniqueue ARGS --url … --api-key …`` in-process; (exit code, stdout,
    stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*args, "--url", stack.url, "--api-key", key])
        out, err = capsys.readouterr()
        return code, out, err

    yield run


def _one_line(err: str) -> str:
    """The one line ``err`` shows on a terminal (a progress bar's ``\r`` redraws and
    the blank it leaves when it closes are not lines)."""
    lines = [shown for line in err.split("\n") if (shown := line.rsplit("\r", 1)[-1].strip())]
    assert len(lines) == 1, err
    return lines[0]


def _wait(client: httpx.Client, job_id: str, until: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/videos/{job_id}").json()
        if until(job):
            return dict(job)
        time.sleep(0.05)
    raise TimeoutError(f"{job_id}: {job}")


def test_video_status_list_download(omniqueue: Any, tmp_path: Path) -> None:
    out = tmp_path / "ball.mp4"
    code, stdout, err = omniqueue("video", "a red ball", *TINY, "--seed", "3", "-o", str(out))
    assert code == 0, err
    data = out.read_bytes()
    assert data[4:8] == b"ftyp"
    assert stdout.strip() == f"{out} ({len(data)} bytes)"
    video_id = err.split("created ", 1)[1].split()[0]
    assert video_id.startswith("video_") and "100%" in err and "reference/video" in err

    code, stdout, _ = omniqueue("status", video_id)
    assert code == 0
    fields = dict(line.split(None, 1) for line in stdout.strip().splitlines())
    assert fields["status"] == "completed" and fields["progress"] == "100%"
    assert (fields["size"], fields["seed"], fields["num_inference_steps"]) == ("64x48", "3", "2")
    code, stdout, _ = omniqueue("status", video_id, "--json")
    assert json.loads(stdout)["id"] == video_id

    code, stdout, _ = omniqueue("list", "--kind", "video", "--limit", "5")
    assert code == 0
    header, *rows = stdout.splitlines()
    assert header.split()[:4] == ["ID", "STATUS", "PROGRESS", "MODEL"]
    assert rows[0].split()[:4] == [video_id, "completed", "100%", "reference/video"]
    assert rows[0].endswith("a red ball")
    code, stdout, _ = omniqueue("list", "--json", "--limit", "1")
    assert [json.loads(line)["id"] for line in stdout.splitlines()] == [video_id]

    again = tmp_path / "again.mp4"
    code, stdout, err = omniqueue("download", video_id, "-o", str(again))
    assert code == 0, err
    assert again.read_bytes() == data
    code, _, err = omniqueue("download", video_id, "--thumbnail", "-o", str(tmp_path / "t.jpg"))
    assert code == 0, err
    assert (tmp_path / "t.jpg").read_bytes()[:3] == b"\xff\xd8\xff"


def test_generate_without_waiting_then_status_waits_and_download_names_the_file(
    omniqueue: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stdout, _ = omniqueue("generate", "a blue kite", *TINY, "--no-wait")
    assert code == 0
    video_id = stdout.strip()
    assert video_id.startswith("video_")
    code, stdout, err = omniqueue("status", video_id, "--wait")
    assert code == 0, err
    assert "100%" in err and "completed" in stdout
    monkeypatch.chdir(tmp_path)
    code, stdout, err = omniqueue("download", video_id)
    assert code == 0, err
    assert (tmp_path / f"{video_id}.mp4").read_bytes()[4:8] == b"ftyp"


def test_video_with_n_saves_every_output_and_download_takes_an_index(
    omniqueue: Any, tmp_path: Path
) -> None:
    out = tmp_path / "kites.mp4"
    code, stdout, err = omniqueue("video", "two kites", *TINY, "--n", "2", "-o", str(out))
    assert code == 0, err
    second = tmp_path / "kites-1.mp4"
    assert stdout.splitlines() == [
        f"{out} ({out.stat().st_size} bytes)",
        f"{second} ({second.stat().st_size} bytes)",
    ]
    assert out.read_bytes() != second.read_bytes()
    video_id = err.split("created ", 1)[1].split()[0]
    again = tmp_path / "again.mp4"
    code, _, err = omniqueue("download", video_id, "--index", "1", "-o", str(again))
    assert code == 0, err
    assert again.read_bytes() == second.read_bytes()
    code, _, err = omniqueue("download", video_id, "--index", "2", "-o", str(again))
    assert code == 1 and "has no output 2" in _one_line(err)


def test_video_from_an_image(omniqueue: Any, tmp_path: Path) -> None:
    """--image goes up as multipart ``input_reference``: its colour is the first frame."""
    image = tmp_path / "red.png"
    Image.new("RGB", (64, 48), (255, 0, 0)).save(image)
    code, _, err = omniqueue(
        "video", "a ball", *TINY, "--image", str(image), "-o", str(tmp_path / "v.mp4")
    )
    assert code == 0, err
    assert (tmp_path / "v.mp4").stat().st_size > 0


def test_audio_and_speech(omniqueue: Any, tmp_path: Path) -> None:
    code, stdout, err = omniqueue(
        "audio", "rain and drums", "--seconds", "0.5", "--steps", "2", "-o", str(tmp_path / "a.wav")
    )
    assert code == 0, err
    assert (tmp_path / "a.wav").read_bytes()[:4] == b"RIFF"
    audio_id = err.split("created ", 1)[1].split()[0]
    assert audio_id.startswith("audio_") and "100%" in err

    code, stdout, err = omniqueue(
        "speech",
        "hello there",
        "--format",
        "wav",
        "--voice",
        "alloy",
        "-o",
        str(tmp_path / "s.wav"),
    )
    assert code == 0, err
    assert (tmp_path / "s.wav").read_bytes()[:4] == b"RIFF"
    speech_id = stdout.strip().rsplit(", ", 1)[1].rstrip(")")
    assert speech_id.startswith("audio_")

    code, stdout, _ = omniqueue("list", "--kind", "audio", "--limit", "2")
    assert [row.split()[0] for row in stdout.splitlines()[1:]] == [speech_id, audio_id]
    code, stdout, _ = omniqueue("status", speech_id)
    fields = dict(line.split(None, 1) for line in stdout.strip().splitlines())
    assert (fields["status"], fields["response_format"]) == ("completed", "wav")
    code, _, err = omniqueue("download", audio_id, "-o", str(tmp_path / "b.wav"))
    assert code == 0, err
    assert (tmp_path / "b.wav").read_bytes() == (tmp_path / "a.wav").read_bytes()


def test_models(omniqueue: Any) -> None:
    code, stdout, _ = omniqueue("models")
    assert code == 0
    rows = {line.split()[0]: line for line in stdout.splitlines()[1:]}
    assert "omniqueue video" in rows["reference/video"] and "--image" in rows["reference/video"]
    assert "omniqueue audio | speech" in rows["reference/audio"]
    assert "omniqueue audio | speech" in rows["reference/speech"]
    assert "5 s, 1 step" in rows["reference/speech"] and "1 steps" not in stdout  # one step
    assert "30 steps" in rows["reference/video"]
    assert "WS /v1/realtime/video" in rows["reference/world"]
    code, stdout, _ = omniqueue("models", "--json")
    assert {json.loads(line)["id"] for line in stdout.splitlines()} >= set(rows)


def test_cancel_a_running_job(omniqueue: Any, stack: Stack, key: str) -> None:
    with stack.client_without_failpoints() as c:
        c.headers["Authorization"] = f"Bearer {key}"
        stack.set_failpoints({"step:1": "pause"})
        code, stdout, _ = omniqueue("video", "a long one", *TINY, "--no-wait")
        video_id = stdout.strip()
        _wait(c, video_id, lambda j: j["step"] == 1)
        code, stdout, err = omniqueue("cancel", video_id)
        assert (code, stdout) == (0, f"{video_id}\tcancelled\n"), err
        job = c.get(f"/v1/videos/{video_id}").json()
        assert job["status"] == "failed" and job["error"]["code"] == "cancelled"
    code, _, err = omniqueue("download", video_id)
    assert code == 1
    assert job["error"]["message"] == "cancelled by the client"
    assert _one_line(err) == f"omniqueue download: {video_id} was cancelled by the client"


def test_ctrl_c_cancels_the_job(stack: Stack, key: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMNIQ_URL": stack.url, "OMNIQ_API_KEY": key}
    out = tmp_path / "x.mp4"
    with stack.client_without_failpoints() as c:
        c.headers["Authorization"] = f"Bearer {key}"
        stack.set_failpoints({"step:1": "pause"})
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "video", "a fox", *TINY, "-o", str(out)],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("created video_"), line
        video_id = line.split()[1]
        _wait(c, video_id, lambda j: j["step"] == 1)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=30)
        assert proc.returncode == 130, rest
        assert f"cancelled {video_id}" in rest
        job = c.get(f"/v1/videos/{video_id}").json()
    assert job["error"]["code"] == "cancelled"
    assert not out.exists() and not out.with_name("x.mp4.part").exists()


def test_ctrl_c_on_speech_closes_the_connection_and_the_job_is_cancelled(
    stack: Stack, key: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMNIQ_URL": stack.url, "OMNIQ_API_KEY": key}
    with stack.client_without_failpoints() as c:
        c.headers["Authorization"] = f"Bearer {key}"
        stack.set_failpoints({"step:1": "pause"})
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "speech", "interrupt me, please", "-o", "x.mp3"],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        job: dict[str, Any] = {}
        while time.monotonic() < deadline and not (
            job.get("prompt") == "interrupt me, please" and job.get("step") == 1
        ):
            time.sleep(0.05)
            page = c.get("/v1/audio/generations", params={"limit": 1}).json()["data"]
            job = page[0] if page else {}
        assert job.get("step") == 1, job
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "the server cancels the job" in err
        final = stack.wait_for(c, job["id"], collection="audio/generations")
    assert final["error"]["code"] == "cancelled", final
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["status", "video_000000000000000000000000"], "not_found, HTTP 404)"),
        (["cancel", "audio_000000000000000000000000"], "not_found, HTTP 404)"),
        (["status", "job_1"], "'job_1' is not a job id: job ids start with video_ or audio_"),
        (
            ["video", "a ball", *TINY, "--quality", "fast"],
            "(param quality, invalid_value, HTTP 400)",
        ),
        (["video", "a ball", *TINY, "--n", "5"], "(param n, invalid_value, HTTP 400)"),
        (["video", "a ball", *TINY, "--lora", "style"], "(param lora"),
        (["audio", "a song", "--seconds", "-1"], "(param seconds, invalid_value, HTTP 400)"),
        (["speech", "hi", "--speed", "9"], "(param speed, invalid_value, HTTP 400)"),
        (["download", "video_000000000000000000000000"], "not_found, HTTP 404)"),
    ],
    ids=[
        "unknown-video",
        "unknown-audio",
        "not-an-id",
        "quality",
        "n",
        "lora",
        "audio",
        "speech",
        "download",
    ],
)
def test_refusals_are_one_line(omniqueue: Any, args: list[str], expected: str) -> None:
    code, stdout, err = omniqueue(*args)
    assert code == 1 and stdout == ""
    line = _one_line(err)
    assert line.startswith(f"omniqueue {args[0]}: ") and expected in line, line


def test_a_wrong_key_and_no_server_are_one_line(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMNIQ_API_KEY", raising=False)
    assert main(["list", "--url", stack.url, "--api-key", "oq-wrong"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "invalid_api_key, HTTP 401)" in line and "--api-key or $OMNIQ_API_KEY" in line
    assert main(["list", "--url", stack.url]) == 1  # no key: the options that send one
    line = _one_line(capsys.readouterr().err)
    assert "pass --api-key KEY or set OMNIQ_API_KEY" in line, line
    assert "Authorization" not in line
    assert main(["models", "--url", "http://127.0.0.1:9"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "cannot connect to http://127.0.0.1:9" in line and "omniqueue up" in line
