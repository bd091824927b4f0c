"""api/inputs.py's URL references under ``OMNIQ_INPUTS__URL_FETCH``: data: URLs always
work, http(s) ones are fetched through the guard, and every failed fetch reads the same."""

from __future__ import annotations

import base64
import io
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from api.inputs import reference_from_url
from models.errors import InvalidRequest
from storage.settings import InputSettings, LimitSettings, Settings


def _png(size: tuple[int, int] = (32, 24)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    routes = {
        "/ok.png": (200, _png()),
        "/teapot": (418, _png()),
        "/text": (200, b"hello, not an image"),
        "/huge.png": (200, b"\x89PNG\r\n\x1a\n" + b"z" * 5000),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = routes.get(self.path, (404, b""))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _settings(mode: str, max_upload_bytes: int = 4000) -> Settings:
    return Settings(
        inputs=InputSettings(url_fetch=mode),  # type: ignore[arg-type]
        limits=LimitSettings(max_upload_bytes=max_upload_bytes),
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as image:
        return image.size


def test_any_fetches_a_local_image(base_url: str) -> None:
    png = reference_from_url(f"{base_url}/ok.png", 16, 16, _settings("any"), "image_reference")
    assert _png_size(png) == (16, 16)


def test_every_failed_fetch_reads_the_same(base_url: str) -> None:
    """Refused host, closed port, HTTP status, not an image, too large, a redirect to a
    refused host: one message, one code, naming the param. No oracle."""
    cases = {
        "public": [
            f"{base_url}/ok.png",
            "http://localhost/x.png",
            "http://[::1]/x.png",
            "http://10.0.0.1/x.png",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::ffff:127.0.0.1]/x.png",
        ],
        "any": [
            f"http://127.0.0.1:{_closed_port()}/x.png",
            f"{base_url}/teapot",
            f"{base_url}/text",
            f"{base_url}/huge.png",
            f"{base_url}/nothing",
        ],
    }
    answers = set()
    for mode, urls in cases.items():
        for url in urls:
            with pytest.raises(InvalidRequest) as info:
                reference_from_url(url, 16, 16, _settings(mode), "input_reference")
            err = info.value
            answers.add((err.message, err.code, err.param, err.status_code))
    assert answers == {
        (
            "input_reference could not be fetched as a usable image or video",
            "url_fetch_failed",
            "input_reference",
            400,
        )
    }


def test_off_refuses_remote_urls_and_data_urls_always_work() -> None:
    data_url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    for mode in ("off", "public", "any"):
        png = reference_from_url(data_url, 8, 8, _settings(mode), "image_reference")
        assert _png_size(png) == (8, 8)
    with pytest.raises(InvalidRequest, match="remote URLs are not fetched") as info:
        reference_from_url("https://example.com/a.png", 8, 8, _settings("off"), "image_reference")
    assert info.value.param == "image_reference"
    with pytest.raises(InvalidRequest, match="http\\(s\\) or data: URL"):
        reference_from_url("file:///etc/passwd", 8, 8, _settings("public"), "image_reference")
