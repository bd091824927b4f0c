"""What ``/openapi.json`` says, made true where FastAPI cannot see it by itself.

* The create routes read the raw request (JSON *or* multipart with the same fields), so
  their bodies are declared here (:func:`create_body`) from the wire models.
* Every error a route can answer is listed with the OpenAI error body (:func:`errors`);
  422 is ours too (``api/errors.py`` maps FastAPI's validation errors to it).
* Binary and streamed responses name their media types (:func:`binary`, :data:`SSE`).
* The API-key header is a bearer security scheme on every ``/v1`` operation.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from models.audio import MEDIA_TYPES, AudioCreate, AudioGenerate, SpeechCreate
from models.common import ErrorBody
from models.videos import VideoCreate

Responses = dict[int | str, dict[str, Any]]

_ERRORS = {
    400: "A value is invalid; `error.param` names it. Nothing was stored.",
    401: "Missing, invalid or revoked API key.",
    404: "No such job (or not yours), or its content is not ready.",
    409: "The job was cancelled before it finished.",
    410: "The job's content has expired.",
    413: "The body, an upload or a pixel count is above its cap.",
    416: "The byte range is outside the object.",
    422: "A query, path or header parameter has the wrong type; `error.param` names it.",
    429: "A quota of the key is used up (`error.param` names it: `creates_per_minute`, "
    "`max_active_jobs`); `Retry-After` says when to try again. Nothing was stored.",
    503: "A backing service (database, broker, object storage) is unavailable; or, on a "
    "create, no live worker can load the model (`model_unavailable`, naming why; nothing "
    "was stored).",
    504: "The job did not finish within the sync timeout; it was cancelled.",
}
_BINARY = {"type": "string", "format": "binary"}
SECURITY_SCHEME = "apiKey"

VIDEO_MEDIA_TYPES = ("video/mp4", "image/jpeg")
AUDIO_MEDIA_TYPES = tuple(dict.fromkeys(MEDIA_TYPES.values()))

# Request bodies declared by :func:`create_body`, added to the components by :func:`install`.
_BODIES: dict[str, type[BaseModel]] = {
    m.__name__: m for m in (VideoCreate, AudioCreate, SpeechCreate, AudioGenerate)
}
# Fields the create routes take besides the model's own (aliases, the reference frame).
_EXTRA_JSON_FIELDS: dict[str, dict[str, dict[str, Any]]] = {
    "VideoCreate": {
        "input_reference": {
            "description": "The first frame: a data: URL, or {image_url: <data: URL>}.",
            "anyOf": [
                {"type": "string"},
                {"type": "object", "properties": {"image_url": {"type": "string"}}},
            ],
        },
        "num_outputs_per_prompt": {"type": "integer", "description": "Alias of n."},
    },
    "AudioCreate": {
        "input": {"type": "string", "description": "Alias of prompt."},
        "audio_length": {"type": "number", "description": "Alias of seconds."},
    },
}
# Fields that carry JSON text in a multipart body.
_JSON_TEXT_FIELDS = ("extra_params", "lora")


def errors(*codes: int) -> Responses:
    """``responses=`` entries for the given error statuses, with the error body."""
    return {code: {"model": ErrorBody, "description": _ERRORS[code]} for code in codes}


def binary(description: str, *media_types: str, headers: dict[str, str] | None = None) -> Any:
    """A response whose body is bytes of one of ``media_types``."""
    out: dict[str, Any] = {
        "description": description,
        "content": {mt: {"schema": dict(_BINARY)} for mt in media_types},
    }
    if headers:
        out["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in headers.items()
        }
    return out


SSE: dict[str, Any] = {
    "description": "Server-Sent Events (`id:`, `event:`, `data:` JSON), ending with `done`.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
REDIRECT: dict[str, Any] = {
    "description": "A presigned URL of the object (`redirect=true`).",
    "headers": {"Location": {"schema": {"type": "string"}}},
}


def create_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a create route: the same fields as JSON or multipart (multipart
    values are text; ``extra_params`` and ``lora`` are JSON text there)."""
    name = model.__name__
    assert name in _BODIES, name
    form = f"#/components/schemas/{name}Form"
    content: dict[str, Any] = {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}},
        "multipart/form-data": {"schema": {"$ref": form}},
        "application/x-www-form-urlencoded": {"schema": {"$ref": form}},
    }
    return {"requestBody": {"required": True, "content": content}}


def _schemas() -> dict[str, Any]:
    """The JSON and form schemas of every declared request body."""
    out: dict[str, Any] = {}
    for name, model in _BODIES.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))  # nested models (LoraRequest) are components
        schema["properties"].update(copy.deepcopy(_EXTRA_JSON_FIELDS.get(name, {})))
        out[name] = schema
        form = copy.deepcopy(schema)
        form["title"] = f"{name}Form"
        for field in _JSON_TEXT_FIELDS:
            if field in form["properties"]:
                form["properties"][field] = {
                    "type": "string",
                    "description": "A JSON object, as text.",
                }
        if "webhook_events" in form["properties"]:  # one field: a form repeats no key
            form["properties"]["webhook_events"] = {
                "type": "string",
                "description": "Event types, comma-separated (or a JSON list, as text).",
            }
        if "input_reference" in form["properties"]:
            form["properties"]["input_reference"] = {
                "description": "The first frame: an image or video file, or a data: URL.",
                "anyOf": [dict(_BINARY), {"type": "string"}],
            }
        out[f"{name}Form"] = form
    return out


def install(app: FastAPI) -> None:
    """Complete the generated document: request bodies and the bearer security scheme."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = generate()
        components = doc.setdefault("components", {})
        components.setdefault("schemas", {}).update(_schemas())
        components["securitySchemes"] = {
            SECURITY_SCHEME: {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key (`omniqueue keys create`), unless auth is off.",
            }
        }
        for path, operations in doc.get("paths", {}).items():
            if path.startswith("/v1/"):
                for operation in operations.values():
                    operation["security"] = [{SECURITY_SCHEME: []}]
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
