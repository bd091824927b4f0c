"""Read a create request body: JSON or multipart/form-data, with the same field names."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile

from api.payload import check_values, loads
from models.errors import InvalidRequest, PayloadTooLarge
from storage.settings import LimitSettings

_FILE_FIELDS = ("input_reference", "input_references")


async def read_create_body(
    request: Request, limits: LimitSettings
) -> tuple[dict[str, Any], bytes | None]:
    """Return the plain fields and the reference file bytes (if one was uploaded). Every
    value has passed :func:`api.payload.check_values` (400 naming the field if not)."""
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
    return body, None


async def _read_form(
    request: Request, limits: LimitSettings
) -> tuple[dict[str, Any], bytes | None]:
    fields: dict[str, Any] = {}
    files: list[bytes] = []
    async with request.form(max_files=8, max_fields=200) as form:
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key not in _FILE_FIELDS:
                    raise InvalidRequest(f"{key} does not take a file", param=key)
                files.append(await _read_capped(value, key, limits.max_upload_bytes))
            elif key in _FILE_FIELDS and value:
                fields["input_reference"] = value  # a data: URL sent as a plain field
            elif key in fields:
                raise InvalidRequest(f"{key} is given more than once", param=key)
            else:
                fields[key] = value
    if len(files) > 1:
        raise InvalidRequest(
            "only one input reference is supported by the served models",
            param="input_references",
        )
    return fields, files[0] if files else None


async def _read_capped(upload: UploadFile, param: str, cap: int) -> bytes:
    data = await upload.read(cap + 1)
    if len(data) > cap:
        raise PayloadTooLarge(f"{param} is larger than {cap} bytes", param=param)
    return data
