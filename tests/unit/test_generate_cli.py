"""``omniqueue generate`` against a small fake of the videos API served over real HTTP."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cli.submit import run_generate
from workers.runtime.processes import free_port

VIDEO_ID = "video_0123456789abcdef01234567"
CONTENT = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 64


def _video(status: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": VIDEO_ID,
        "object": "video",
        "model": "reference/video",
        "status": status,
        "progress": 0,
        "queue_position": None,
        "step": 0,
        "num_inference_steps": 4,
        "stage": "queue",
        "error": None,
        **extra,
    }


COMPLETING = [
    _video("queued", queue_position=1),
    _video("in_progress", progress=20, stage="denoise", step=1),
    _video("in_progress", progress=70, stage="denoise", step=4),
    _video("completed", progress=100, stage="done", step=4),
]


@dataclass
class FakeApi:
    """Serves POST /v1/videos, then the scripted states of the video, one per GET."""

    states: list[dict[str, Any]]
    create_error: tuple[int, dict[str, Any]] | None = None
    created: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    polls: int = 0
    url: str = ""


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:  # keep test output quiet
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: dict[str, Any]) -> None:
            self._send(status, json.dumps(obj).encode())

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            api.auth.append(self.headers.get("Authorization"))
            if self.path == "/v1/videos":
                if api.create_error is not None:
                    self._json(*api.create_error)
                    return
                api.created.append(json.loads(raw))
                self._json(200, api.states[0])
            elif self.path == f"/v1/videos/{VIDEO_ID}/cancel":
                api.cancelled.append(VIDEO_ID)
                error = {"code": "cancelled", "message": "cancelled by the client"}
                self._json(200, _video("failed", error=error))
            else:
                self._json(404, {"error": {"message": "no such route", "type": "x"}})

        def do_GET(self) -> None:
            if self.path == f"/v1/videos/{VIDEO_ID}":
                api.polls += 1
                self._json(200, api.states[min(api.polls, len(api.states) - 1)])
            elif self.path == f"/v1/videos/{VIDEO_ID}/content":
                self.send_response(302)  # like the S3 presigned redirect
                self.send_header("Location", "/blobs/artifact.mp4")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/blobs/artifact.mp4":
                self._send(200, CONTENT, "video/mp4")
            else:
                self._json(404, {"error": {"message": "not found", "type": "x"}})

    return Handler


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(api: FakeApi) -> FakeApi:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        api.url = f"http://127.0.0.1:{server.server_address[1]}"
        return api

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _no_sleep(_: float) -> None:
    pass


def test_completed_video_is_downloaded(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(FakeApi(COMPLETING))
    out = tmp_path / "fox.mp4"
    code = run_generate(
        "a fox",
        url=api.url,
        api_key="sk-test",
        seconds=2,
        size="64x64",
        steps=4,
        seed=7,
        output=out,
        sleep=_no_sleep,
    )
    assert code == 0
    assert out.read_bytes() == CONTENT
    assert not (tmp_path / "fox.mp4.part").exists()
    assert api.created == [
        {"prompt": "a fox", "seconds": "2", "size": "64x64", "num_inference_steps": 4, "seed": 7}
    ]
    assert set(api.auth) == {"Bearer sk-test"}
    assert api.polls == len(COMPLETING) - 1
    captured = capsys.readouterr()
    assert f"{out} ({len(CONTENT)} bytes)" in captured.out
    assert "queued (position 1)" in captured.err
    assert "in_progress denoise step 1/4" in captured.err


def test_env_defaults_and_default_output_name(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = serve(FakeApi(COMPLETING))
    monkeypatch.setenv("OMNIQ_URL", api.url + "/")
    monkeypatch.setenv("OMNIQ_API_KEY", "sk-env")
    monkeypatch.chdir(tmp_path)
    assert run_generate("a fox", model="reference/video", sleep=_no_sleep) == 0
    assert (tmp_path / f"{VIDEO_ID}.mp4").read_bytes() == CONTENT
    assert api.created == [{"prompt": "a fox", "model": "reference/video"}]
    assert set(api.auth) == {"Bearer sk-env"}


def test_failed_video_exits_1_with_the_error(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    error = {"code": "oom", "message": "the GPU ran out of memory"}
    api = serve(FakeApi([_video("queued"), _video("failed", progress=40, error=error)]))
    code = run_generate("a fox", url=api.url, output=tmp_path / "x.mp4", sleep=_no_sleep)
    assert code == 1
    assert not (tmp_path / "x.mp4").exists()
    assert "oom: the GPU ran out of memory" in capsys.readouterr().err


def test_ctrl_c_while_polling_cancels_the_job(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(FakeApi([_video("queued"), _video("in_progress", progress=10)]))
    calls = 0

    def interrupt_on_third_poll(_: float) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise KeyboardInterrupt

    code = run_generate(
        "a fox", url=api.url, output=tmp_path / "x.mp4", sleep=interrupt_on_third_poll
    )
    assert code == 130
    assert api.cancelled == [VIDEO_ID]
    assert f"cancelled {VIDEO_ID}" in capsys.readouterr().err
    assert not (tmp_path / "x.mp4").exists()


def test_http_error_prints_the_server_message(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {
        "error": {
            "message": "size: must be WIDTHxHEIGHT",
            "type": "invalid_request_error",
            "param": "size",
            "code": "invalid_value",
        }
    }
    api = serve(FakeApi(COMPLETING, create_error=(400, body)))
    assert run_generate("a fox", url=api.url, size="huge", sleep=_no_sleep) == 1
    err = capsys.readouterr().err
    assert "size: must be WIDTHxHEIGHT (param size, invalid_value, HTTP 400)" in err


def test_a_missing_key_names_the_options_that_send_one(
    serve: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's 401 says to send 'Authorization: Bearer <key>'; the command line
    names its own --api-key and OMNIQ_API_KEY instead."""
    monkeypatch.delenv("OMNIQ_API_KEY", raising=False)
    body = {
        "error": {
            "message": "missing API key: send 'Authorization: Bearer <key>'",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    api = serve(FakeApi(COMPLETING, create_error=(401, body)))
    assert run_generate("a fox", url=api.url, sleep=_no_sleep) == 1
    err = capsys.readouterr().err
    assert "pass --api-key KEY or set OMNIQ_API_KEY" in err and "Bearer" not in err, err
    assert "(invalid_api_key, HTTP 401)" in err


def test_connection_refused_suggests_omniqueue_up(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert run_generate("a fox", url=url, sleep=_no_sleep) == 1
    err = capsys.readouterr().err
    assert "cannot connect" in err and "omniqueue up" in err


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_a_bad_output_path_is_refused_before_the_job_is_created(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    api = serve(FakeApi(COMPLETING))
    output = tmp_path / "no" / "such" / "x.mp4" if where == "missing" else tmp_path
    assert run_generate("a fox", url=api.url, output=output, sleep=_no_sleep) == 1
    assert api.created == [] and api.polls == 0  # nothing was generated
    err = capsys.readouterr().err
    expected = "does not exist" if where == "missing" else "is a directory"
    assert "omniqueue video: " in err and expected in err


def test_a_stage_without_steps_shows_a_spinner_with_its_name(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preparing = _video("in_progress", progress=0, stage="prepare")
    states = [_video("queued"), preparing, preparing, preparing, *COMPLETING[1:]]
    api = serve(FakeApi(states))
    assert run_generate("a fox", url=api.url, output=tmp_path / "x.mp4", sleep=_no_sleep) == 0
    err = capsys.readouterr().err
    spun = {c for c in "|/-\\" if f"in_progress {c} prepare" in err}
    assert len(spun) >= 2, err  # it turns from one poll to the next
    assert "in_progress denoise step 1/4" in err


def test_each_frame_of_the_bar_shows_the_step_of_its_percentage(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bar drew a poll's new percentage with the previous poll's step (`70%` with
    `step 1/4`) before it drew the new step: one poll, one frame."""
    import time

    api = serve(FakeApi(COMPLETING))
    slow = lambda _: time.sleep(0.15)  # noqa: E731  (past tqdm's 0.1 s between draws)
    assert run_generate("a fox", url=api.url, output=tmp_path / "x.mp4", sleep=slow) == 0
    frames = [f for f in capsys.readouterr().err.split("\r") if "%|" in f]
    shown = {(m[1], m[2]) for f in frames if (m := re.search(r"(\d+)%\|.*step (\d)/4", f))}
    assert ("20", "1") in shown and ("70", "4") in shown, frames
    assert shown <= {("20", "1"), ("70", "4"), ("100", "4")}, frames


def test_a_cancelled_job_is_said_to_be_cancelled_once(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.jobs import run_download

    error = {"code": "cancelled", "message": "cancelled by the client"}
    api = serve(FakeApi([_video("failed", error=error)]))
    assert run_download(VIDEO_ID, url=api.url, output=tmp_path / "x.mp4") == 1
    err = capsys.readouterr().err.strip()
    assert err == f"omniqueue download: {VIDEO_ID} was cancelled by the client"


def test_up_help_shows_every_option_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import build_parser
    from cli.paths import default_data_dir

    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--help"])
    options = " ".join(capsys.readouterr().out.split()).split("options:", 1)[1]
    for option, default in (
        ("--host", "127.0.0.1"),
        ("--port", "8000"),
        ("--data-dir", str(default_data_dir())),
        ("--workers", "1"),
    ):
        found = re.search(rf" {option} [A-Z_]+ (.*?)(?= --[a-z-]+ [A-Z]|$)", options)
        assert found is not None, option
        assert f"(default: {default})" in found.group(1), (option, found.group(1))
