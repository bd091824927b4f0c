"""S3 artifact store (boto3): uploads with abort on failure, ranged reads, presigned GETs.

Works against SeaweedFS (embedded stack and tests), MinIO (compose) and AWS S3: path-style
addressing, SigV4, and botocore's standard retry mode for transient 5xx/throttling.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from models.errors import ObjectMissing, StorageError, UploadAborted
from storage.settings import S3Settings

log = logging.getLogger(__name__)

T = TypeVar("T")


def make_s3_client(s3: S3Settings, *, public: bool = False) -> Any:
    """A boto3 S3 client; ``public=True`` signs for ``public_endpoint_url`` (presigning)."""
    endpoint = (s3.public_endpoint_url or s3.endpoint_url) if public else s3.endpoint_url
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": s3.addressing_style},
        retries={"mode": "standard", "max_attempts": s3.max_attempts},
        connect_timeout=s3.connect_timeout_s,
        read_timeout=s3.read_timeout_s,
        max_pool_connections=max(10, s3.api_threads),
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=s3.region,
        aws_access_key_id=s3.access_key_id,
        aws_secret_access_key=s3.secret_access_key,
        config=config,
    )


@dataclass(frozen=True)
class ObjectRange:
    body: Any  # botocore StreamingBody
    content_length: int
    total_size: int
    start: int
    end: int  # inclusive
    partial: bool


class ArtifactStore:
    """One bucket of job artifacts. The client is injected (one per process).

    ``executor`` is where :meth:`run` puts blocking S3 work from asyncio code (the API
    gives it a bounded pool of its own, so a stalled S3 cannot starve database reads).
    """

    def __init__(
        self,
        client: Any,
        settings: S3Settings,
        presign_client: Any = None,
        executor: Executor | None = None,
    ) -> None:
        self.client = client
        # Presigned URLs are signed for the endpoint clients will use.
        self._presigner = presign_client or client
        self.bucket = settings.bucket
        self._settings = settings
        self._executor = executor

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (blocking, S3) on the store's executor."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def ensure_bucket(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self.client.create_bucket(Bucket=self.bucket)

    def ping(self) -> None:
        self.client.head_bucket(Bucket=self.bucket)

    def upload_file(
        self,
        key: str,
        path: str | Path,
        content_type: str,
        *,
        should_continue: Callable[[], bool] | None = None,
    ) -> int:
        """Upload ``path`` to ``key``; multipart above the threshold, aborted on any failure.

        ``should_continue`` is asked between parts; when it answers False the multipart
        upload is aborted and :class:`UploadAborted` raised.
        """
        size = Path(path).stat().st_size
        try:
            if size < self._settings.multipart_threshold_bytes:
                with open(path, "rb") as f:
                    self.client.put_object(
                        Bucket=self.bucket, Key=key, Body=f, ContentType=content_type
                    )
            else:
                self._upload_multipart(key, Path(path), content_type, should_continue)
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"upload of {key} failed: {type(exc).__name__}") from exc
        return size

    def _upload_multipart(
        self,
        key: str,
        path: Path,
        content_type: str,
        should_continue: Callable[[], bool] | None,
    ) -> None:
        mpu = self.client.create_multipart_upload(
            Bucket=self.bucket, Key=key, ContentType=content_type
        )
        upload_id = mpu["UploadId"]
        parts = []
        try:
            with open(path, "rb") as f:
                number = 1
                while chunk := f.read(self._settings.part_size_bytes):
                    if should_continue is not None and not should_continue():
                        raise UploadAborted(key)
                    part = self.client.upload_part(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=chunk,
                    )
                    parts.append({"ETag": part["ETag"], "PartNumber": number})
                    number += 1
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            self._abort_quietly(key, upload_id)
            raise

    def _abort_quietly(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except (ClientError, BotoCoreError):
            log.warning("abort of multipart upload %s for %s failed", upload_id, key)

    def put_bytes(self, key: str, data: bytes, content_type: str) -> int:
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type)
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"upload of {key} failed: {type(exc).__name__}") from exc
        return len(data)

    def get_bytes(self, key: str) -> bytes:
        data: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return data

    def open(self, key: str, start: int | None = None, end: int | None = None) -> ObjectRange:
        """Open ``key`` for reading, optionally a byte range (``end`` inclusive)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if start is not None or end is not None:
            kwargs["Range"] = f"bytes={'' if start is None else start}-{'' if end is None else end}"
        try:
            resp = self.client.get_object(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ObjectMissing(key) from exc
            raise StorageError(f"read of {key} failed: {type(exc).__name__}") from exc
        length = int(resp["ContentLength"])
        content_range = resp.get("ContentRange")
        if content_range:  # "bytes 0-99/1234"
            span, total = content_range.split(" ", 1)[1].split("/")
            first, last = (int(x) for x in span.split("-"))
            return ObjectRange(resp["Body"], length, int(total), first, last, True)
        return ObjectRange(resp["Body"], length, length, 0, max(length - 1, 0), False)

    def size(self, key: str) -> int:
        return int(self.client.head_object(Bucket=self.bucket, Key=key)["ContentLength"])

    def presign_get(self, key: str, *, filename: str | None = None) -> str:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if filename:
            params["ResponseContentDisposition"] = f'attachment; filename="{filename}"'
        url: str = self._presigner.generate_presigned_url(
            "get_object", Params=params, ExpiresIn=self._settings.presign_ttl_s
        )
        return url

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    def iter_uploads(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Open multipart uploads under ``prefix``."""
        resp = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        yield from resp.get("Uploads", []) or []

    def abort_uploads(self, prefix: str, *, older_than: float | None = None) -> int:
        """Abort open multipart uploads under ``prefix`` (optionally only older ones)."""
        count = 0
        for upload in self.iter_uploads(prefix):
            started = upload["Initiated"].timestamp()
            if older_than is not None and started > older_than:
                continue
            self._abort_quietly(upload["Key"], upload["UploadId"])
            count += 1
        return count

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object and open multipart upload under ``prefix``."""
        try:
            self.abort_uploads(prefix)
            keys = self.list_keys(prefix)
            for i in range(0, len(keys), 1000):
                batch = [{"Key": k} for k in keys[i : i + 1000]]
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"delete of {prefix} failed: {type(exc).__name__}") from exc
        return len(keys)


def try_delete_prefix(artifacts: ArtifactStore, prefix: str) -> bool:
    """Cleanup's delete of everything under ``prefix``: a store that fails is logged,
    not raised, so the request or run that cleans up ends as it would have; whether it
    went. What stays is deleted only by a later call: the reconciler's expiry for a
    completed job's objects, its stale-upload pass for open multipart uploads."""
    try:
        artifacts.delete_prefix(prefix)
    except StorageError as exc:
        log.warning("%s; its objects stay", exc)
        return False
    return True


def s3_object_bytes(client: Any, uri: str) -> bytes:
    """The whole object ``s3://bucket/key`` (a LoRA adapter a worker reads). A missing
    object (or one we may not read) is a ``FileNotFoundError``; a failing store a
    :class:`StorageError` (transient)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    try:
        data: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code in ("NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "403"):
            raise FileNotFoundError(uri) from exc
        raise StorageError(f"read of {uri} failed: {type(exc).__name__}") from exc
    except BotoCoreError as exc:
        raise StorageError(f"read of {uri} failed: {type(exc).__name__}") from exc
    return data
