"""The embedded SeaweedFS serves objects to signed S3 requests only: not to anonymous
callers of the S3 port, nor through the filer's or the volume server's HTTP ports (which
served bucket objects to anyone before), while presigned URLs keep working."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time

import httpx
import pytest

from cli.embedded import EmbeddedS3
from storage.artifacts import ArtifactStore
from storage.settings import S3Settings

pytestmark = pytest.mark.integration

SECRET = b"another tenant's thumbnail " * 4000  # > the filer's inline limit: a volume chunk


def _jwt(key: str) -> str:
    """An HS256 token as the S3 gateway makes them for the filer (tests only)."""

    def b64(raw: bytes) -> bytes:
        return base64.urlsafe_b64encode(raw).rstrip(b"=")

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"exp": int(time.time()) + 60}).encode())
    signature = hmac.new(key.encode(), head + b"." + body, hashlib.sha256).digest()
    return (head + b"." + body + b"." + b64(signature)).decode()


def _chunk_ids(s3: EmbeddedS3, path: str) -> list[str]:
    """The volume file ids of an object, from the filer's metadata (with a valid token
    when the filer wants one)."""
    url = f"http://127.0.0.1:{s3.ports['filer.port']}{path}?metadata=true"
    resp = httpx.get(url, timeout=10)
    if resp.status_code == 401:
        token = _jwt(s3.jwt_keys["WEED_JWT_FILER_SIGNING_READ_KEY"])
        resp = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert resp.status_code == 200, resp.text
    return re.findall(r'"file_id":"([^"]+)"', resp.text)


def test_objects_are_served_to_signed_requests_only(s3_server: EmbeddedS3) -> None:
    settings = S3Settings(
        endpoint_url=s3_server.endpoint_url,
        bucket=s3_server.bucket,
        access_key_id=s3_server.access_key,
        secret_access_key=s3_server.secret_key,
    )
    store = ArtifactStore(s3_server.client(), settings)
    key = f"videos/vid_auth{time.monotonic_ns()}/thumbnail.jpg"
    store.put_bytes(key, SECRET, "image/jpeg")
    filer_path = f"/buckets/{s3_server.bucket}/{key}"
    fids = _chunk_ids(s3_server, filer_path)
    assert fids, "the object should live in a volume chunk"
    filer = f"http://127.0.0.1:{s3_server.ports['filer.port']}"
    volume = f"http://127.0.0.1:{s3_server.ports['volume.port']}"
    anonymous = {
        "s3 object": f"{s3_server.endpoint_url}/{s3_server.bucket}/{key}",
        "s3 listing": f"{s3_server.endpoint_url}/{s3_server.bucket}?list-type=2",
        "filer object": filer + filer_path,
        "filer metadata": filer + filer_path + "?metadata=true",
        "filer listing": f"{filer}/buckets/{s3_server.bucket}/videos/",
        **{f"volume {fid}": f"{volume}/{fid}" for fid in fids},
    }
    master = f"http://127.0.0.1:{s3_server.ports['master.port']}"
    anonymous.update({f"master {fid}": f"{master}/{fid}" for fid in fids})  # → volume
    answers = {
        name: httpx.get(url, timeout=10, follow_redirects=True) for name, url in anonymous.items()
    }
    for name, resp in answers.items():
        assert resp.status_code in (401, 403), (name, resp.status_code, resp.content[:200])
        assert SECRET[:40] not in resp.content, name
    # signed requests, and a presigned GET as /content?redirect=true hands out, still work
    assert store.get_bytes(key) == SECRET
    resp = httpx.get(store.presign_get(key), timeout=10)
    assert resp.status_code == 200 and resp.content == SECRET
