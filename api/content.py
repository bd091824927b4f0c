"""Serving a stored artifact over HTTP: stream it from S3 with ``Range`` support (206,
416), for every kind of job. Every S3 call (open, each chunk read) runs on the store's own
pool (:meth:`ArtifactStore.run`), never on the thread pool that serves database reads."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import Response, StreamingResponse

from models.db import Artifact
from models.errors import Gone, InvalidRequest, RangeNotSatisfiable, ServiceUnavailable
from storage.artifacts import ArtifactStore, ObjectMissing, StorageError

# ASCII digits only; a position longer than any object size is refused, not parsed.
_RANGE_RE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
_MAX_POSITION_DIGITS = 19
_CHUNK = 256 * 1024


async def stream_artifact(
    store: ArtifactStore,
    artifact: Artifact,
    range_header: str | None,
    headers: dict[str, str],
    id_param: str = "video_id",
) -> Response:
    size = artifact.size_bytes
    start: int | None = None
    end: int | None = None
    if range_header:
        start, end = parse_range(range_header, size)
    try:
        obj = await store.run(store.open, artifact.key, start, end)
    except ObjectMissing as exc:
        raise Gone(f"the content of {artifact.job_id} is no longer stored", param=id_param) from exc
    except StorageError as exc:
        raise ServiceUnavailable("object storage is unavailable", code="storage_error") from exc
    out = {
        **headers,
        "Accept-Ranges": "bytes",
        "Content-Length": str(obj.content_length),
        "Cache-Control": "private, max-age=3600",
    }
    status = 200
    if obj.partial:
        status = 206
        out["Content-Range"] = f"bytes {obj.start}-{obj.end}/{obj.total_size}"
    return StreamingResponse(
        _chunks(store, obj.body),
        status_code=status,
        media_type=artifact.content_type,
        headers=out,
    )


async def _chunks(store: ArtifactStore, body: Any) -> AsyncIterator[bytes]:
    """The object's bytes, one S3 read per chunk on the store's pool."""
    try:
        while chunk := await store.run(body.read, _CHUNK):
            yield chunk
    finally:
        body.close()


def parse_range(header: str, size: int) -> tuple[int, int]:
    """One ``bytes=a-b`` range → inclusive (start, end); 416 when unsatisfiable."""
    m = _RANGE_RE.match(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        raise InvalidRequest("Range must look like 'bytes=START-END'", param="Range")
    if max(len(m.group(1)), len(m.group(2))) > _MAX_POSITION_DIGITS:
        raise RangeNotSatisfiable(
            f"Range positions must have at most {_MAX_POSITION_DIGITS} digits", size=size
        )
    if not m.group(1):  # suffix: the last N bytes
        n = int(m.group(2))
        start, end = max(size - n, 0), size - 1
    else:
        start = int(m.group(1))
        end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
    if start >= size or start > end:
        raise RangeNotSatisfiable(f"Range {header} is outside the {size}-byte object", size=size)
    return start, end
