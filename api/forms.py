"""Read a create request body: JSON or multipart/form-data, with the same field names."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile

from api.payload import check_values, loads
from api.validation import refuse_latent_mask_editing
from models.errors import InvalidRequest, PayloadTooLarge
from storage.settings import LimitSettings

_FILE_FIELDS = ("input_reference", "input_references")


# One keyframe or up to 12 omni-references (api/references.py), plus one to spare so
# that the 13th is refused with a clear message, not the form parser's.
MAX_FILES = 13


async def read_create_body(
    request: Request, limits: LimitSettings
) -> tuple[dict[str, Any], list[bytes]]:
    """Return the plain fields and the uploaded reference files, in the order sent
    (``input_reference`` and ``input_references``). Every value has passed
    :func:`api.payload.check_values` (400 naming the field if not)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        fields, upload = await _read_form(request, limits)
        check_values(fields)
        return fields, upload
    raw = await request.body()
    if not raw.strip():
        raise InvalidRequest("the body must be JSON or multipart/form-data", code="invalid_body")
    body = loads(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("the JSON body must be an object", code="invalid_body")
    return body, []


async def _read_form(request: Request, limits: LimitSettings) -> tuple[dict[str, Any], list[bytes]]:
    fields: dict[str, Any] = {}
    files: list[bytes] = []
    async with request.form(max_files=MAX_FILES, max_fields=200) as form:
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                refuse_latent_mask_editing([key])
                if key not in _FILE_FIELDS:
                    raise InvalidRequest(f"{key} does not take a file", param=key)
                files.append(await _read_capped(value, key, limits.max_upload_bytes))
            elif key in _FILE_FIELDS and value:
                fields["input_reference"] = value  # a data: URL sent as a plain field
            elif key in fields:
                raise InvalidRequest(f"{key} is given more than once", param=key)
            else:
                fields[key] = value
    return fields, files


async def _read_capped(upload: UploadFile, param: str, cap: int) -> bytes:
    data = await upload.read(cap + 1)
    if len(data) > cap:
        raise PayloadTooLarge(f"{param} is larger than {cap} bytes", param=param)
    return data
