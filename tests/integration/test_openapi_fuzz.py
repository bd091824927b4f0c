"""A bounded schemathesis run over the live API's ``/openapi.json``: no request the
document allows (or a mutation of it) may get a 5xx, and every response must be one the
document declares, of its media type and schema.

The stack has no worker, so created jobs stay queued and nothing blocks on the GPU path;
the routes that wait for a job to finish (``/v1/videos/sync``, ``/v1/audio/speech``,
``/v1/audio/generate``) are left out, and WebSocket routes are not in the document.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Per operation; 17 operations on 2 shared cores stay well under a minute.
MAX_EXAMPLES = 12
_WAITING_ROUTES = r"^/v1/videos/sync$|^/v1/audio/(speech|generate)$"


@pytest.fixture(scope="module")
def fuzz_stack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    work = module_dir
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env={}, auth="required") as st:
        st.start(workers=0)
        yield st


@pytest.fixture(scope="module")
def auth_headers(fuzz_stack: Stack) -> dict[str, str]:
    return {"Authorization": f"Bearer {fuzz_stack.create_key('fuzz')}"}


@pytest.fixture(scope="module")
def api_schema(fuzz_stack: Stack, auth_headers: dict[str, str]) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(fuzz_stack.url + "/openapi.json", headers=auth_headers)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
BOUNDED = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_never_answers_5xx(
    api_schema: schemathesis.BaseSchema, auth_headers: dict[str, str], mode: GenerationMode
) -> None:
    """Every operation, ``MAX_EXAMPLES`` requests each (valid ones, then schema
    violations), checked for 5xx and against the document."""
    operations = [
        r.ok() for r in api_schema.exclude(path_regex=_WAITING_ROUTES).get_all_operations()
    ]
    assert len(operations) >= 15
    statuses: Counter[int] = Counter()
    for operation in operations:

        @BOUNDED
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: schemathesis.Case) -> None:
            response = case.call_and_validate(headers=auth_headers, timeout=20, checks=CHECKS)
            statuses[response.status_code] += 1

        try:
            run()
        except Unsatisfiable:
            # Nothing of this operation can be made invalid (no parameters, no body).
            assert mode == GenerationMode.NEGATIVE, operation.label
    # Valid requests reached the handlers (not only auth and validation); invalid ones
    # were refused.
    if mode == GenerationMode.POSITIVE:
        assert statuses[200] > 0, statuses
    else:
        assert statuses[400] + statuses[422] > 0, statuses
