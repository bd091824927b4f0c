"""A create request's ``lora`` on the wire (:class:`models.videos.LoraRequest`): the JSON
shape vLLM-Omni's clients send, refusals that name the field, and the schema in
``/openapi.json``. Where the adapter is (roots, catalog, S3) is
``tests/integration/test_lora_queue.py``'s."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from api.app import create_app
from api.validation import parse_create
from models.errors import InvalidRequest
from models.job_specs import LoraSpec
from models.videos import LoraRequest


@pytest.mark.parametrize(
    ("lora", "want"),
    [
        # as the ComfyUI node sends it (nulls for what is not set), as JSON text or an object
        (
            json.dumps({"local_path": None, "name": "style", "scale": 1.0, "int_id": None}),
            LoraRequest(name="style", scale=1.0),
        ),
        (
            {"name": "s", "local_path": "/loras/s.safetensors", "scale": 0.8, "int_id": 3},
            LoraRequest(name="s", local_path="/loras/s.safetensors", scale=0.8, int_id=3),
        ),
        ({"name": "s", "scale": 2}, LoraRequest(name="s", scale=2.0)),
        ({}, LoraRequest()),  # the service says it needs a name or a local_path
        ("", None),
        ("null", None),
        (None, None),
    ],
)
def test_accepted_shapes(lora: Any, want: LoraRequest | None) -> None:
    assert parse_create({"prompt": "p", "lora": lora}).lora == want


@pytest.mark.parametrize(
    ("lora", "param", "code"),
    [
        ({"name": "style", "weights": 1}, "lora.weights", "unknown_parameter"),
        ({"name": "style", "scale": "much"}, "lora.scale", "invalid_value"),
        ({"name": "style", "scale": "0.8"}, "lora.scale", "invalid_value"),
        ({"name": "style", "scale": True}, "lora.scale", "invalid_value"),
        ({"name": 3}, "lora.name", "invalid_value"),
        ({"local_path": ["/a"]}, "lora.local_path", "invalid_value"),
        ({"name": "style", "int_id": -1}, "lora.int_id", "invalid_value"),
        ({"name": "style", "int_id": 2**63}, "lora.int_id", "invalid_value"),
        ({"name": "style", "int_id": 1.0}, "lora.int_id", "invalid_value"),
        ({"name": "style", "int_id": True}, "lora.int_id", "invalid_value"),
        ('{"name": ', "lora", "invalid_body"),  # broken JSON text is still that
    ],
)
def test_refusals_name_the_field(lora: Any, param: str, code: str) -> None:
    for value in (lora, json.dumps(lora) if isinstance(lora, dict) else lora):
        with pytest.raises(InvalidRequest) as info:
            parse_create({"prompt": "p", "lora": value})
        assert (info.value.param, info.value.code) == (param, code), info.value.message


@pytest.mark.parametrize("lora", ["my-style", '"my-style"', 7, ["style"], "[1]"])
def test_a_lora_that_is_not_an_object_says_what_lora_is(lora: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_create({"prompt": "p", "lora": lora})
    assert info.value.param == "lora"
    assert 'must be a JSON object with a "name"' in info.value.message
    assert '"local_path"' in info.value.message


def test_openapi_shows_the_lora_object() -> None:
    schemas = create_app().openapi()["components"]["schemas"]
    lora = schemas["LoraRequest"]
    assert set(lora["properties"]) == {"name", "local_path", "scale", "int_id"}
    assert lora["additionalProperties"] is False
    ref = {"$ref": "#/components/schemas/LoraRequest"}
    assert ref in schemas["VideoCreate"]["properties"]["lora"]["anyOf"]
    assert "$defs" not in json.dumps(schemas)  # every reference resolves to a component
    assert schemas["VideoCreateForm"]["properties"]["lora"]["type"] == "string"


def test_int_id_stops_at_the_api() -> None:
    """A set ``int_id`` is refused (above), so the job's spec has no field for it: a
    stored spec naming one is refused like any unknown key."""
    assert set(LoraSpec.model_fields) == {"name", "path", "scale", "version"}
    with pytest.raises(ValidationError):
        LoraSpec.model_validate({"name": "s", "path": "/loras/s.safetensors", "int_id": None})
