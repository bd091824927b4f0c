"""Read a create request body: JSON or multipart/form-data, with the same field names.

A multipart body must be whole: Starlette's parser (python-multipart underneath) takes a
body cut off before its closing boundary as complete, keeps the parts that ended and
drops the one cut off in silence, so a truncated upload became a text-to-video job.
:class:`_WholeMultipart` notices that the closing boundary never came, and the body is
refused like any other malformed one: 400 ``invalid_body``, nothing stored, its spooled
files closed (which removes them).
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

from fastapi import Request
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from api.payload import check_values, loads
from api.validation import refuse_latent_mask_editing
from models.errors import InvalidRequest, PayloadTooLarge
from storage.settings import LimitSettings

_FILE_FIELDS = ("input_reference", "input_references")


# One keyframe or up to 12 omni-references (api/references.py), plus one to spare so
# that the 13th is refused with a clear message, not the form parser's.
MAX_FILES = 13
MAX_FIELDS = 200


async def read_create_body(
    request: Request, limits: LimitSettings
) -> tuple[dict[str, Any], list[bytes]]:
    """Return the plain fields and the uploaded reference files, in the order sent
    (``input_reference`` and ``input_references``). Every value has passed
    :func:`api.payload.check_values` (400 naming the field if not)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        fields, upload = await _read_form(request, ctype, limits)
        check_values(fields)
        return fields, upload
    raw = await request.body()
    if not raw.strip():
        raise InvalidRequest("the body must be JSON or multipart/form-data", code="invalid_body")
    body = loads(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("the JSON body must be an object", code="invalid_body")
    return body, []


class _WholeMultipart(MultiPartParser):
    """Starlette's multipart parser, which also knows whether the body ended with its
    closing boundary (python-multipart calls ``on_end`` then, and only then), which part
    it stopped in, and every file it spooled (the one cut off is in no form item)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended = False
        self.spooled: list[UploadFile] = []

    def on_end(self) -> None:
        self.ended = True

    def on_headers_finished(self) -> None:
        super().on_headers_finished()
        if self._current_part.file is not None:
            self.spooled.append(self._current_part.file)

    @property
    def cut_off(self) -> str | None:
        """The name of the part the body stopped in, when its headers had come."""
        return self._current_part.field_name or None


async def _parse_multipart(request: Request) -> FormData:
    """The parts of a whole multipart body; :class:`InvalidRequest` (naming the body, or
    the part it stopped in) for a malformed or truncated one, every file it spooled
    closed."""
    async with aclosing(request.stream()) as stream:
        parser = _WholeMultipart(
            request.headers, stream, max_files=MAX_FILES, max_fields=MAX_FIELDS
        )
        try:
            form = await parser.parse()
        except MultiPartException as exc:
            raise InvalidRequest(
                f"the multipart body cannot be read: {exc.message}", code="invalid_body"
            ) from None
    if not parser.ended:
        for upload in parser.spooled:
            await upload.close()
        cut = parser.cut_off
        where = f" in the part {cut!r}" if cut else ""
        raise InvalidRequest(
            f"the multipart body is truncated: it stops{where} before its closing boundary "
            "(--BOUNDARY--), so a part may be missing or cut short; send the whole body",
            param=cut,
            code="invalid_body",
        )
    return form


async def _read_form(
    request: Request, ctype: str, limits: LimitSettings
) -> tuple[dict[str, Any], list[bytes]]:
    fields: dict[str, Any] = {}
    files: list[bytes] = []
    if ctype == "multipart/form-data":
        form = await _parse_multipart(request)
    else:  # urlencoded: no boundaries, nothing to cut short
        form = await request.form(max_files=MAX_FILES, max_fields=MAX_FIELDS)
    try:
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
    finally:
        await form.close()
    return fields, files


async def _read_capped(upload: UploadFile, param: str, cap: int) -> bytes:
    data = await upload.read(cap + 1)
    if len(data) > cap:
        raise PayloadTooLarge(f"{param} is larger than {cap} bytes", param=param)
    return data
