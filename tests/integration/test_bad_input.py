"""Bad input is never a 500: every odd value a create request, a byte range or an event
cursor can carry is a 400 (416 for ``Range``) naming the parameter, and stores nothing.

Runs against the real stack on PostgreSQL (``stack``) and, where the database makes the
difference (NUL in text), on SQLite too.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from cli.embedded import EmbeddedS3
from tests.integration.conftest import started_stack
from tests.integration.stack import Stack

pytestmark = pytest.mark.integration

HUGE = "9" * 5000  # Python refuses to parse integers of more than 4300 digits
DEEP = 100_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = '"size": "64x48", "seconds": 0.5, "fps": 16, "num_inference_steps": 3'


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[httpx.Client]:
    with stack.client(stack.create_key("bad-input")) as c:
        yield c


@pytest.fixture(scope="module")
def sqlite_stack(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, redis_db: int
) -> Iterator[Stack]:
    """The API alone on SQLite (no worker: nothing here should ever be queued)."""
    with started_stack(
        tmp_path_factory, s3_server, "bad_input", redis_db=redis_db, workers=0, database="sqlite"
    ) as st:
        yield st


_TERMINAL = ("completed", "failed", "cancelled")


def _count_objects(stack: Stack) -> int:
    pages = stack.s3.client().get_paginator("list_objects_v2").paginate(Bucket=stack.s3.bucket)
    return sum(len(page.get("Contents", [])) for page in pages)


def _refused(
    stack: Stack,
    send: Any,
    param: str | None,
    status: int = 400,
) -> dict[str, Any]:
    """Call ``send()``; assert a ``status`` naming ``param`` and that nothing was stored."""
    jobs, objects = stack.count_jobs(), _count_objects(stack)
    resp = send()
    assert resp.status_code == status, resp.text[:500]
    error = resp.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error" and error["message"]
    assert stack.count_jobs() == jobs
    assert _count_objects(stack) == objects
    return dict(error)


def _nest(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


# ---- JSON bodies ------------------------------------------------------------------------

# (raw JSON text of a /v1/videos body, the param the 400 must name)
VIDEO_JSON = [
    (f'{{"prompt": "p", {SMALL}, "seed": {HUGE}}}', "seed"),
    (f'{{"prompt": "p", "seconds": {HUGE}}}', "seconds"),
    (f'{{"prompt": "p", "size": "{HUGE}x48"}}', "size"),
    (f'{{"prompt": "p", "width": {HUGE}, "height": 48}}', "width"),
    (f'{{"prompt": "p", "num_frames": -{HUGE}}}', "num_frames"),
    (f'{{"prompt": "p", {SMALL}, "n": {HUGE}}}', "n"),
    (f'{{"prompt": "p", {SMALL}, "timeout": {HUGE}}}', "timeout"),
    (f'{{"prompt": "p", {SMALL}, "guidance_scale": {HUGE}.5}}', "guidance_scale"),
    (f'{{"prompt": "p", {SMALL}, "extra_params": {{"motion": {HUGE}}}}}', "extra_params.motion"),
    (f'{{"prompt": "p", {SMALL}, "extra_params": {_nest(DEEP)}}}', "extra_params"),
    (f'{{"prompt": "p", {SMALL}, "extra_params": {json.dumps(_nest(DEEP))}}}', "extra_params"),
    (f'{{"prompt": "p", {SMALL}, "lora": {_nest(40)}}}', "lora" + ".a" * 31),
    (f'{{"prompt": {"[" * DEEP}{"]" * DEEP}}}', "prompt"),
    (f'{{"prompt": "p", {SMALL}, "extra_params": {{"motion": NaN}}}}', "extra_params.motion"),
    (f'{{"prompt": "a \\ud800 b", {SMALL}}}', "prompt"),
    (f'{{"prompt": "a \\u0000 b", {SMALL}}}', "prompt"),
    (f'{{"prompt": "p", {SMALL}, "negative_prompt": "x\\u0000"}}', "negative_prompt"),
    (
        f'{{"prompt": "p", {SMALL}, "extra_params": {{"mo\\u0000tion": 1}}}}',
        "extra_params.mo\0tion",
    ),
    ('{"prompt": "p", "size": "\uff16\uff14x48"}', "size"),
    (f'{{"prompt": "p", {SMALL.replace("0.5", "true")}}}', "seconds"),
    (f'{{"prompt": "p", {SMALL}, "seed": true}}', "seed"),
    (f'{{"prompt": "p", {SMALL.replace("16", "false")}}}', "fps"),
]


@pytest.mark.parametrize(("body", "param"), VIDEO_JSON, ids=[p for _, p in VIDEO_JSON])
def test_video_json_is_refused_naming_the_param(
    stack: Stack, client: httpx.Client, body: str, param: str
) -> None:
    headers = {"Content-Type": "application/json"}
    _refused(stack, lambda: client.post("/v1/videos", content=body, headers=headers), param)


def test_a_body_nested_too_deeply_is_a_400(stack: Stack, client: httpx.Client) -> None:
    body = "[" * DEEP + "]" * DEEP
    headers = {"Content-Type": "application/json"}
    error = _refused(stack, lambda: client.post("/v1/videos", content=body, headers=headers), None)
    assert error["code"] == "invalid_body"


# ---- multipart bodies -------------------------------------------------------------------

VIDEO_FORM = [
    ({"seed": HUGE}, "seed"),
    ({"size": f"{HUGE}x48"}, "size"),
    ({"size": "\uff16\uff14x48"}, "size"),
    ({"seconds": HUGE}, "seconds"),
    ({"seconds": "true"}, "seconds"),
    ({"width": HUGE, "height": "48"}, "width"),
    ({"extra_params": "[" * DEEP + "]" * DEEP}, "extra_params"),
    ({"extra_params": json.dumps({"motion": int("9" * 50)})}, "extra_params.motion"),
    ({"prompt": "a\0b"}, "prompt"),
]


@pytest.mark.parametrize("multipart", [True, False], ids=["multipart", "urlencoded"])
@pytest.mark.parametrize(("fields", "param"), VIDEO_FORM, ids=[p for _, p in VIDEO_FORM])
def test_video_form_is_refused_naming_the_param(
    stack: Stack, client: httpx.Client, fields: dict[str, str], param: str, multipart: bool
) -> None:
    data = {"prompt": "p", "size": "64x48", "seconds": "0.5", "fps": "16", **fields}
    # The reference is never decoded: every field is checked first.
    files = {"input_reference": ("r.png", PNG_MAGIC, "image/png")} if multipart else None
    _refused(stack, lambda: client.post("/v1/videos", data=data, files=files), param)


# ---- audio ------------------------------------------------------------------------------

AUDIO = [
    ("/v1/audio/generations", f'{{"prompt": "p", "seed": {HUGE}}}', "seed"),
    ("/v1/audio/generations", f'{{"prompt": "p", "seconds": {HUGE}}}', "seconds"),
    ("/v1/audio/generations", '{"prompt": "p", "seconds": true}', "seconds"),
    ("/v1/audio/generations", '{"prompt": "p", "sample_rate": true}', "sample_rate"),
    ("/v1/audio/generations", '{"prompt": "\\ud800"}', "prompt"),
    ("/v1/audio/generations", '{"prompt": "a\\u0000"}', "prompt"),
    ("/v1/audio/generations", f'{{"prompt": "p", "extra_params": {_nest(DEEP)}}}', "extra_params"),
    ("/v1/audio/speech", f'{{"input": "hi", "speed": {HUGE}}}', "speed"),
    ("/v1/audio/speech", '{"input": "hi", "speed": true}', "speed"),
    ("/v1/audio/speech", '{"input": "\\udfff"}', "input"),
    ("/v1/audio/generate", f'{{"input": "p", "audio_length": {HUGE}}}', "audio_length"),
    ("/v1/audio/generate", '{"input": "p", "audio_length": true}', "audio_length"),
]


@pytest.mark.parametrize(("path", "body", "param"), AUDIO, ids=[f"{a}-{c}" for a, _, c in AUDIO])
def test_audio_bodies_are_refused_naming_the_param(
    stack: Stack, client: httpx.Client, path: str, body: str, param: str
) -> None:
    headers = {"Content-Type": "application/json"}
    _refused(stack, lambda: client.post(path, content=body, headers=headers), param)


def test_audio_multipart_is_refused_naming_the_param(stack: Stack, client: httpx.Client) -> None:
    for fields, param in (({"seed": HUGE}, "seed"), ({"seconds": "\uff11"}, "seconds")):
        data = {"prompt": "p", **fields}
        _refused(stack, lambda d=data: client.post("/v1/audio/generations", data=d), param)


# ---- truncated and malformed multipart bodies --------------------------------------------

BOUNDARY = "oq-test-boundary"


def _part(name: str, value: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n"
    if filename:
        head += "Content-Type: image/png\r\n"
    return head.encode() + b"\r\n" + value + b"\r\n"


def _spooled_files(stack: Stack) -> list[str]:
    """The temporary files the API process holds open (a spooled upload rolls over to
    one past 1 MiB)."""
    pid = stack.procs["api"].pid
    targets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            targets.append(os.readlink(fd))
    temp = tempfile.gettempdir()
    return [t for t in targets if t.startswith(temp) and "(deleted)" in t]


PNG_CUT = PNG_MAGIC + bytes(1536 * 1024)  # past the spool's 1 MiB: on disk while read
# (route, the whole parts before the cut, the part that is cut, the param the 400 names)
TRUNCATED = [
    ("/v1/videos", _part("prompt", b"a cat"), ("input_reference", PNG_CUT, "r.png")),
    ("/v1/videos/sync", _part("prompt", b"a cat"), ("input_reference", PNG_CUT, "r.png")),
    ("/v1/videos", _part("prompt", b"a cat") + _part("size", b"64x48"), ("seconds", b"0.5", None)),
    ("/v1/audio/generations", _part("prompt", b"rain"), ("seconds", b"1", None)),
    ("/v1/audio/generate", _part("input", b"rain"), ("audio_length", b"1", None)),
    ("/v1/audio/speech", _part("input", b"hello"), ("voice", b"alloy", None)),
]


@pytest.mark.parametrize(
    ("path", "whole", "cut"), TRUNCATED, ids=[f"{p}-{c[0]}" for p, _, c in TRUNCATED]
)
def test_a_truncated_multipart_body_is_a_400_and_stores_nothing(
    stack: Stack, client: httpx.Client, path: str, whole: bytes, cut: tuple[str, bytes, str | None]
) -> None:
    """A body that stops before its closing boundary, in a part that has begun: before,
    the parts that ended made a job and the one cut off was dropped in silence (a
    text-to-video job instead of image-to-video)."""
    name, value, filename = cut
    body = whole + _part(name, value, filename)[:-2]  # no CRLF, no --BOUNDARY--
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    error = _refused(stack, lambda: client.post(path, content=body, headers=headers), name)
    assert error["code"] == "invalid_body" and "multipart body is truncated" in error["message"]
    assert _spooled_files(stack) == []
    # the same parts, whole: not refused for the body (a bad value may still be refused)
    complete = whole + _part(name, value, filename) + f"--{BOUNDARY}--\r\n".encode()
    resp = client.post(path, content=complete, headers=headers)
    assert "multipart body" not in resp.text, resp.text
    if resp.status_code == 200 and path in ("/v1/videos", "/v1/audio/generations"):
        # its objects must not land in the next test's count
        stack.wait_for(client, resp.json()["id"], collection=path.removeprefix("/v1/"))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"", None),  # no part at all, no closing boundary
        (_part("prompt", b"a cat"), "prompt"),  # no boundary after it: it may go on
        (f"--{BOUNDARY}\r\nContent-Dispo".encode(), None),  # cut in a part's headers
        (b"garbage that is no multipart at all", None),
        (
            b"".join(_part("input_references", PNG_MAGIC, f"{i}.png") for i in range(14))
            + f"--{BOUNDARY}--\r\n".encode(),
            None,
        ),  # whole, but more files than the parser takes
    ],
    ids=["empty", "no-closing-boundary", "cut-in-headers", "garbage", "too-many-files"],
)
def test_a_malformed_multipart_body_is_a_400_naming_the_body(
    stack: Stack, client: httpx.Client, body: bytes, param: str | None
) -> None:
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    send = lambda: client.post("/v1/videos", content=body, headers=headers)  # noqa: E731
    error = _refused(stack, send, param)
    assert error["code"] == "invalid_body" and "multipart body" in error["message"]


# ---- NUL on SQLite (stored there before; must be refused on every database) -------------


def test_nul_in_prompt_is_refused_on_sqlite_too(sqlite_stack: Stack) -> None:
    headers = {"Content-Type": "application/json"}
    with sqlite_stack.client() as c:
        for path, body, param in (
            ("/v1/videos", '{"prompt": "a\\u0000b", "size": "64x48"}', "prompt"),
            ("/v1/audio/generations", '{"prompt": "a\\u0000b"}', "prompt"),
        ):
            _refused(
                sqlite_stack, lambda p=path, b=body: c.post(p, content=b, headers=headers), param
            )
        _refused(sqlite_stack, lambda: c.post("/v1/videos", data={"prompt": "a\0b"}), "prompt")


# ---- a finished job: Range and event cursors ---------------------------------------------


@pytest.fixture(scope="module")
def done_video(stack: Stack, client: httpx.Client) -> str:
    resp = client.post(
        "/v1/videos",
        content=f'{{"prompt": "p", {SMALL}}}',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 200, resp.text
    done = stack.wait_for(client, resp.json()["id"])
    assert done["status"] == "completed", done
    return str(done["id"])


def test_range_with_a_5000_digit_end_is_416(
    stack: Stack, client: httpx.Client, done_video: str
) -> None:
    url = f"/v1/videos/{done_video}/content"
    for header in (f"bytes=0-{HUGE}", f"bytes={HUGE}-", f"bytes=-{HUGE}"):
        _refused(stack, lambda h=header: client.get(url, headers={"Range": h}), "Range", 416)
    assert client.get(url, headers={"Range": "bytes=0-9"}).status_code == 206


@pytest.mark.parametrize(
    ("cursor", "header"),
    [
        ("garbage", False),
        ("garbage", True),
        ("1-2-3", False),
        ("99999999999999999999-0", False),  # above 2**64
        ("\uff11-0", False),
        (HUGE, True),
    ],
)
def test_a_bad_event_cursor_is_a_400_before_the_stream_starts(
    stack: Stack, client: httpx.Client, done_video: str, cursor: str, header: bool
) -> None:
    url = f"/v1/videos/{done_video}/events"
    if header:
        send = lambda: client.get(url, headers={"Last-Event-ID": cursor})  # noqa: E731
    else:
        send = lambda: client.get(url, params={"last_event_id": cursor})  # noqa: E731
    _refused(stack, send, "Last-Event-ID" if header else "last_event_id")


def test_a_bad_websocket_cursor_is_refused_before_accepting(
    stack: Stack, client: httpx.Client, done_video: str
) -> None:
    key = client.headers["Authorization"]
    ws_url = stack.url.replace("http://", "ws://") + f"/v1/videos/{done_video}/stream"
    with pytest.raises(InvalidStatus) as info:
        connect(ws_url + "?last_event_id=garbage", additional_headers={"Authorization": key})
    assert info.value.response.status_code == 403
    with connect(ws_url + "?last_event_id=0-0", additional_headers={"Authorization": key}) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "status"


def test_a_good_event_cursor_still_resumes(
    stack: Stack, client: httpx.Client, done_video: str
) -> None:
    url = f"/v1/videos/{done_video}/events"
    events = client.get(url).text
    ids = [line[4:] for line in events.splitlines() if line.startswith("id: ")]
    assert len(ids) >= 2 and "event: done" in events
    resumed = client.get(url, headers={"Last-Event-ID": ids[-2]}).text
    assert [line[4:] for line in resumed.splitlines() if line.startswith("id: ")] == ids[-1:]


def test_audio_event_cursor_is_checked(stack: Stack, client: httpx.Client) -> None:
    resp = client.post("/v1/audio/generations", json={"prompt": "p", "seconds": 0.5})
    assert resp.status_code == 200, resp.text
    audio_id = resp.json()["id"]
    url = f"/v1/audio/generations/{audio_id}/events"
    # let the worker finish (and store its objects) first: the refusals must store nothing
    deadline = time.monotonic() + 120
    while client.get(f"/v1/audio/generations/{audio_id}").json()["status"] not in _TERMINAL:
        assert time.monotonic() < deadline, "the audio job did not finish"
        time.sleep(0.1)
    _refused(stack, lambda: client.get(url, params={"last_event_id": "garbage"}), "last_event_id")
    _refused(stack, lambda: client.get(url, headers={"Last-Event-ID": "x-1"}), "Last-Event-ID")


# ---- methods and list cursors -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/v1/videos", "GET, POST"),
        ("/v1/videos/video_123", "GET, DELETE"),
        ("/v1/audio/generations", "GET, POST"),
    ],
)
def test_an_unserved_method_is_405_with_the_full_allow_header(
    client: httpx.Client, path: str, allow: str
) -> None:
    resp = client.put(path, json={"prompt": "p"})
    assert resp.status_code == 405
    assert resp.headers["allow"] == allow
    assert resp.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_an_unknown_route_is_named_and_points_to_the_docs(
    client: httpx.Client, method: str
) -> None:
    resp = client.request(method, "/v1/vidoes/abc")
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert error["message"].startswith(f"Invalid URL ({method} /v1/vidoes/abc)"), error
    assert "/docs" in error["message"]


def test_a_bad_content_variant_is_a_400_like_every_other_bad_parameter(
    stack: Stack, client: httpx.Client
) -> None:
    error = _refused(
        stack, lambda: client.get("/v1/videos/video_0/content?variant=bogus"), "variant"
    )
    assert "video, thumbnail, spritesheet" in error["message"]


def test_the_favicon_is_served(client: httpx.Client) -> None:
    resp = client.get("/favicon.ico")
    assert resp.status_code == 200
    assert resp.content[:4] == b"\x00\x00\x01\x00"  # an ICO file


@pytest.mark.parametrize("path", ["/v1/videos", "/v1/audio/generations"])
def test_an_empty_after_is_ignored(client: httpx.Client, path: str) -> None:
    resp = client.get(path, params={"after": "", "limit": 2})
    assert resp.status_code == 200, resp.text
    assert resp.json() == client.get(path, params={"limit": 2}).json()


# ---- ids and cursors that cannot exist ---------------------------------------------------


@pytest.mark.parametrize("job_id", ["a%00b", "video_%ED%A0%80", "x" * 300])
def test_an_id_that_cannot_exist_is_404(stack: Stack, client: httpx.Client, job_id: str) -> None:
    for path in (f"/v1/videos/{job_id}", f"/v1/audio/generations/{job_id}"):
        param = "video_id" if path.startswith("/v1/videos") else "audio_id"
        _refused(stack, lambda p=path: client.get(p), param, 404)
        _refused(stack, lambda p=path: client.get(p + "/content"), param, 404)
        _refused(stack, lambda p=path: client.post(p + "/cancel"), param, 404)
        _refused(stack, lambda p=path: client.delete(p), param, 404)


@pytest.mark.parametrize("after", ["\0", "a\0b"])
def test_a_list_cursor_with_nul_is_a_400(stack: Stack, client: httpx.Client, after: str) -> None:
    for path in ("/v1/videos", "/v1/audio/generations"):
        _refused(stack, lambda p=path: client.get(p, params={"after": after}), "after")
