"""JSON responses made from wire models in one step.

``JSONResponse(model.model_dump(mode="json"))`` builds a dict of Python objects and then
encodes it again with :mod:`json`; returning a pydantic model from a route with a
``response_model`` makes FastAPI validate and serialise it once more. pydantic-core
writes the JSON bytes directly, which is most of the cost of a status read's response.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi.responses import Response
from pydantic import BaseModel


def json_response(model: BaseModel, headers: Mapping[str, str] | None = None) -> Response:
    """``model`` as an ``application/json`` response (the same JSON FastAPI would send)."""
    return Response(model.model_dump_json(), media_type="application/json", headers=headers)
