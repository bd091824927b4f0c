"""``classify``: the one map from a worker-side exception to a stable code and a message a
client may see. Real exceptions of the libraries a pipeline uses, not hand-made ones."""

from __future__ import annotations

import io
from collections.abc import Callable

import av
import numpy as np
import pytest
import redis.exceptions
import torch
from PIL import Image

from models.errors import (
    BusUnavailable,
    DuplicateEventError,
    ErrorCode,
    InvalidJobInput,
    InvalidRequest,
    JobTimedOut,
    ObjectMissing,
    StorageError,
)
from tests.unit.reference_fixtures import loaded, video_request
from workers.common.failures import INTERNAL_ERROR_MESSAGE, classify
from workers.pipelines.reference_video import ReferenceVideoPipeline


def _raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except BaseException as exc:  # the exception is the value under test
        return exc
    raise AssertionError("the call did not raise")


LIBRARY_VALUE_ERRORS = {
    "numpy": lambda: np.zeros(3).reshape(2, 2),
    "PIL": lambda: Image.new("NOT-A-MODE", (2, 2)),
    "PyAV": lambda: av.open(io.BytesIO(b"not a container " * 8)),
    "torch": lambda: torch.nn.functional.interpolate(
        torch.zeros(1, 1, 2, 2), size=(2, 2), scale_factor=2.0
    ),
    "misconfiguration": lambda: ReferenceVideoPipeline().load("tpu:0"),
}


@pytest.mark.parametrize("source", sorted(LIBRARY_VALUE_ERRORS))
def test_a_library_value_error_is_an_internal_error_whose_text_stays_inside(source: str) -> None:
    exc = _raised(LIBRARY_VALUE_ERRORS[source])
    assert isinstance(exc, ValueError)  # what the old code turned into invalid_request
    code, message = classify(exc)
    assert code is ErrorCode.INTERNAL_ERROR
    assert message == INTERNAL_ERROR_MESSAGE
    assert str(exc) not in message


def test_a_request_refused_on_purpose_is_invalid_request_with_its_message() -> None:
    exc = InvalidJobInput("extra parameter 'bogus' is not supported", param="extra_params")
    assert isinstance(exc, ValueError) and isinstance(exc, InvalidRequest)
    assert classify(exc) == (
        ErrorCode.INVALID_REQUEST,
        "extra parameter 'bogus' is not supported",
    )


def test_adapters_refuse_bad_requests_with_invalid_job_input() -> None:
    pipe = loaded(ReferenceVideoPipeline)
    exc = _raised(lambda: pipe.prepare(video_request(extra={"bogus": 1})))
    code, message = classify(exc)
    assert code is ErrorCode.INVALID_REQUEST
    assert "bogus" in message
    assert classify(DuplicateEventError("event_id 'e1' was already used"))[0] == (
        ErrorCode.INVALID_REQUEST
    )


def test_long_messages_are_cut() -> None:
    code, message = classify(InvalidJobInput("x" * 2000))
    assert code is ErrorCode.INVALID_REQUEST and len(message) == 500


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 GiB"), ErrorCode.OOM),
        (MemoryError("host allocation of 9 GiB failed"), ErrorCode.OOM),
        (StorageError("botocore: 500 InternalError at s3://bucket/key"), ErrorCode.STORAGE_ERROR),
        (ObjectMissing("videos/vid_1/input.png"), ErrorCode.STORAGE_ERROR),
        (BusUnavailable("ConnectionError"), ErrorCode.BROKER_ERROR),
        (
            redis.exceptions.ConnectionError("Error 111 connecting to 10.0.0.3"),
            ErrorCode.BROKER_ERROR,
        ),
        (RuntimeError("secret detail"), ErrorCode.INTERNAL_ERROR),
        (KeyError("params"), ErrorCode.INTERNAL_ERROR),
    ],
)
def test_every_other_failure_has_a_stable_code_and_a_fixed_message(
    exc: BaseException, code: ErrorCode
) -> None:
    got, message = classify(exc)
    assert got is code
    assert str(exc) not in message
    assert message == classify(type(exc)("something else entirely"))[1]  # fixed per code


def test_a_deadline_keeps_its_own_message() -> None:
    assert classify(JobTimedOut("the job passed its 30 s deadline")) == (
        ErrorCode.TIMEOUT,
        "the job passed its 30 s deadline",
    )


def test_broker_error_is_a_stable_code() -> None:
    assert ErrorCode("broker_error") is ErrorCode.BROKER_ERROR
