"""``api.content.stream_artifact`` against a real SeaweedFS: a small object is read with its
open and sent whole, a large one streams in chunks, both with correct ``Range`` answers, and
an object gone from S3 is a 410."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi import FastAPI, Header
from fastapi.responses import Response, StreamingResponse
from fastapi.testclient import TestClient

from api import content
from api.errors import install_error_handlers
from cli.embedded import EmbeddedS3
from models.db import Artifact
from storage.artifacts import ArtifactStore, make_s3_client
from storage.settings import S3Settings

pytestmark = pytest.mark.integration

SMALL = os.urandom(40_000)
LARGE = os.urandom(content._WHOLE + 700_000)  # over the whole-body limit: streamed


@pytest.fixture(scope="module")
def client(s3_server: EmbeddedS3) -> Iterator[tuple[TestClient, list[Any]]]:
    settings = S3Settings(
        endpoint_url=s3_server.endpoint_url,
        bucket=s3_server.bucket,
        access_key_id=s3_server.access_key,
        secret_access_key=s3_server.secret_key,
    )
    pool = ThreadPoolExecutor(2)
    store = ArtifactStore(make_s3_client(settings), settings, executor=pool)
    store.ensure_bucket()
    store.put_bytes("delivery/small.bin", SMALL, "application/octet-stream")
    store.put_bytes("delivery/large.bin", LARGE, "application/octet-stream")
    responses: list[Any] = []  # the Response objects the route returned, newest last
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/{name}")
    async def get(name: str, range_header: str | None = Header(None, alias="Range")) -> Response:
        data = {"small.bin": SMALL, "large.bin": LARGE, "gone.bin": b"x" * 10}[name]
        artifact = Artifact(
            job_id="video_delivery",
            variant="video",
            bucket=store.bucket,
            key=f"delivery/{name}",
            content_type="application/octet-stream",
            size_bytes=len(data),
            created_at=0.0,
        )
        resp = await content.stream_artifact(store, artifact, range_header, {})
        responses.append(resp)
        return resp

    try:
        with TestClient(app) as tc:
            yield tc, responses
    finally:
        store.delete_prefix("delivery/")
        pool.shutdown()


@pytest.mark.parametrize(
    ("name", "data", "kind"),
    [("small.bin", SMALL, Response), ("large.bin", LARGE, StreamingResponse)],
)
def test_whole_and_streamed_bodies_with_ranges(
    client: tuple[TestClient, list[Any]], name: str, data: bytes, kind: type
) -> None:
    tc, responses = client
    full = tc.get(f"/{name}")
    assert full.status_code == 200 and full.content == data
    assert full.headers["content-length"] == str(len(data))
    assert type(responses[-1]) is kind
    part = tc.get(f"/{name}", headers={"Range": "bytes=100-30099"})
    assert part.status_code == 206 and part.content == data[100:30100]
    assert part.headers["content-range"] == f"bytes 100-30099/{len(data)}"
    assert type(responses[-1]) is Response  # 30,000 bytes: whole, whatever the object
    tail = tc.get(f"/{name}", headers={"Range": "bytes=-5"})
    assert tail.status_code == 206 and tail.content == data[-5:]
    assert tc.get(f"/{name}", headers={"Range": f"bytes={len(data)}-"}).status_code == 416


def test_an_object_missing_from_s3_is_gone(client: tuple[TestClient, list[Any]]) -> None:
    tc, _ = client
    resp = tc.get("/gone.bin")
    assert resp.status_code == 410
    assert "no longer stored" in resp.json()["error"]["message"]
