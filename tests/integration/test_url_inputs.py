"""URL input references through the real stack (API process, PostgreSQL and SQLite,
Redis, SeaweedFS): under the default ``OMNIQ_INPUTS__URL_FETCH=public`` a loopback URL is
refused before any connection, with 400 naming the param and nothing stored, on the job
endpoints and on ``WS /v1/realtime/video``; with ``any`` (an operator's opt-in) a local
image is fetched."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from websockets.sync.client import connect

from cli.embedded import EmbeddedS3
from tests.integration.conftest import RedisDbPool, isolated_stack, started_stack
from tests.integration.stack import Stack

pytestmark = pytest.mark.integration

SMALL = {"prompt": "a calm lake", "size": "64x48", "seconds": "0.5", "fps": 16}
FIXED = "could not be fetched as a usable image or video"


class _ImageServer:
    """A local HTTP server with one PNG; it records every request it gets."""

    def __init__(self) -> None:
        out = io.BytesIO()
        Image.new("RGB", (40, 30), (10, 200, 10)).save(out, format="PNG")
        png, self.requests = out.getvalue(), []
        requests: list[str] = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(png)))
                self.end_headers()
                self.wfile.write(png)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/frame.png"


@pytest.fixture(scope="module")
def images() -> Iterator[_ImageServer]:
    srv = _ImageServer()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def public_stack(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    s3_server: EmbeddedS3,
    redis_db: int,
) -> Iterator[Stack]:
    """The default settings, on PostgreSQL and on SQLite."""
    name = f"url-public-{request.param}"
    with started_stack(
        tmp_path_factory, s3_server, name, redis_db=redis_db, workers=0, database=request.param
    ) as st:
        yield st


@pytest.fixture(scope="module")
def any_stack(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, redis_pool: RedisDbPool
) -> Iterator[Stack]:
    """Fetching from any URL; alive beside :func:`public_stack`, so on a second index."""
    work = Path(tmp_path_factory.mktemp("url-any"))
    env = {"OMNIQ_INPUTS__URL_FETCH": "any"}
    with (
        redis_pool.leased() as redis_db,
        isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st,
    ):
        st.start(workers=0)
        yield st


def _keys(s3: EmbeddedS3) -> set[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def _creates(url: str) -> list[tuple[str, dict[str, Any]]]:
    """Every way a create request carries a URL reference: (param, httpx kwargs)."""
    return [
        ("input_reference", {"json": {**SMALL, "input_reference": url}}),
        ("input_reference", {"json": {**SMALL, "input_reference": {"image_url": url}}}),
        ("input_reference_url", {"json": {**SMALL, "input_reference_url": url}}),
        ("input_reference", {"files": {"input_reference": (None, url)}, "data": SMALL}),
    ]


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "169.254.169.254", "10.0.0.1"]
)
def test_job_create_refuses_a_loopback_url(
    public_stack: Stack, s3_server: EmbeddedS3, images: _ImageServer, host: str
) -> None:
    before, seen = _keys(s3_server), len(images.requests)
    with public_stack.client() as client:
        for param, kwargs in _creates(images.url(host)):
            resp = client.post("/v1/videos", **kwargs)
            assert resp.status_code == 400, resp.text
            error = resp.json()["error"]
            assert error["param"] == param and error["message"] == f"{param} {FIXED}", error
    assert len(images.requests) == seen, "the API connected to the refused host"
    assert public_stack.count_jobs() == 0
    assert _keys(s3_server) == before


def test_world_session_start_refuses_a_loopback_url(
    public_stack: Stack, images: _ImageServer
) -> None:
    seen = len(images.requests)
    start = {
        "type": "session.start", "model": "reference/world", "prompt": "a red ball",
        "width": 64, "height": 64, "num_frames": 9, "fps": 16,
        "image_reference": {"image_url": images.url()},
    }
    url = public_stack.url.replace("http://", "ws://") + "/v1/realtime/video"
    with connect(url) as ws:
        ws.send(json.dumps(start))
        event = json.loads(ws.recv(timeout=30))
    assert event["type"] == "error", event
    assert event["code"] == "invalid_image_reference"
    assert event["message"] == f"image_reference {FIXED}"
    assert len(images.requests) == seen


def test_any_fetches_a_local_image_for_a_job(
    any_stack: Stack, s3_server: EmbeddedS3, images: _ImageServer
) -> None:
    seen = len(images.requests)
    with any_stack.client() as client:
        resp = client.post("/v1/videos", json={**SMALL, "input_reference": images.url()})
    assert resp.status_code == 200, resp.text
    job_id = resp.json()["id"]
    assert images.requests[seen:] == ["/frame.png"]
    reference = s3_server.client().get_object(
        Bucket=s3_server.bucket, Key=f"videos/{job_id}/input/reference.png"
    )["Body"].read()
    with Image.open(io.BytesIO(reference)) as image:
        assert image.size == (64, 48)


def test_any_still_answers_one_message_for_a_closed_port(any_stack: Stack) -> None:
    with any_stack.client() as client:
        resp = client.post("/v1/videos", json={**SMALL, "input_reference": "http://127.0.0.1:1/"})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == f"input_reference {FIXED}"
    httpx.get(any_stack.url + "/health", timeout=5).raise_for_status()
