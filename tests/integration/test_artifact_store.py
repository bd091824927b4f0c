"""The boto3 artifact store against a real S3 server (SeaweedFS)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.embedded import EmbeddedS3
from storage.artifacts import ArtifactStore, UploadAborted, make_s3_client, try_delete_prefix
from storage.settings import S3Settings

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


def _settings(s3_server: EmbeddedS3, bucket: str) -> S3Settings:
    return S3Settings(
        endpoint_url=s3_server.endpoint_url,
        bucket=bucket,
        access_key_id=s3_server.access_key,
        secret_access_key=s3_server.secret_key,
        multipart_threshold_bytes=5 * MIB,
        part_size_bytes=5 * MIB,
    )


@pytest.fixture
def store(s3_server: EmbeddedS3) -> Iterator[ArtifactStore]:
    settings = _settings(s3_server, s3_server.bucket)
    st = ArtifactStore(make_s3_client(settings), settings)
    st.ensure_bucket()
    yield st
    st.delete_prefix("store-test/")


def _blob(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(i % 251 for i in range(size)))
    return path


def test_multipart_upload_ranges_and_presign(store: ArtifactStore, tmp_path: Path) -> None:
    path = _blob(tmp_path, 12 * MIB + 123)
    size = store.upload_file("store-test/a/video.mp4", path, "video/mp4")
    assert size == path.stat().st_size
    assert store.size("store-test/a/video.mp4") == size
    assert list(store.iter_uploads("store-test/")) == []
    data = path.read_bytes()
    part = store.open("store-test/a/video.mp4", 5 * MIB - 10, 5 * MIB + 9)
    assert part.partial and part.total_size == size
    assert part.body.read() == data[5 * MIB - 10 : 5 * MIB + 10]
    url = store.presign_get("store-test/a/video.mp4", filename="a.mp4")
    resp = httpx.get(url)
    assert resp.status_code == 200 and resp.content == data
    assert store.delete_prefix("store-test/a/") == 1
    assert store.list_keys("store-test/a/") == []


def test_cancelled_multipart_upload_leaves_nothing(store: ArtifactStore, tmp_path: Path) -> None:
    path = _blob(tmp_path, 16 * MIB)
    asked = []

    def should_continue() -> bool:
        asked.append(1)
        return len(asked) < 3  # stop before the third part

    with pytest.raises(UploadAborted):
        store.upload_file(
            "store-test/b/video.mp4", path, "video/mp4", should_continue=should_continue
        )
    assert list(store.iter_uploads("store-test/b/")) == []
    assert store.list_keys("store-test/b/") == []


def test_delete_prefix_aborts_open_uploads(store: ArtifactStore) -> None:
    store.client.create_multipart_upload(Bucket=store.bucket, Key="store-test/c/x")
    store.put_bytes("store-test/c/y", b"y", "text/plain")
    assert len(list(store.iter_uploads("store-test/c/"))) == 1
    assert store.delete_prefix("store-test/c/") == 1
    assert list(store.iter_uploads("store-test/c/")) == []
    assert store.list_keys("store-test/c/") == []


def test_cleanup_deletes_through_one_call_that_logs_a_failing_store(
    store: ArtifactStore, s3_server: EmbeddedS3, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused create, a run that did not complete, a completed run's earlier attempts
    and the reconciler all clean up through ``try_delete_prefix``: a store that fails is
    a warning naming the prefix, and the caller goes on."""
    store.put_bytes("store-test/d/x", b"x", "text/plain")
    assert try_delete_prefix(store, "store-test/d/")
    assert store.list_keys("store-test/d/") == []
    settings = _settings(s3_server, "no-such-bucket")
    failing = ArtifactStore(make_s3_client(settings), settings)
    with caplog.at_level("WARNING", logger="storage.artifacts"):
        assert not try_delete_prefix(failing, "videos/video_1/")
    assert "delete of videos/video_1/ failed: NoSuchBucket; its objects stay" in caplog.text
