"""What the API does with the workers' load-failure records: a create for a model no live
worker can load is refused (:mod:`api.model_availability`, read at most once a second per
process), and ``GET /v1/models`` lists whether each model can be served. The records on a
real Redis, and the whole path with real workers: tests/integration/test_model_unavailable.py."""

from __future__ import annotations

import pytest

from api.model_availability import ModelAvailability
from api.model_list import model_object
from models.catalog import REFERENCE_VIDEO
from models.errors import ModelUnavailable
from models.memory_plan import MemoryPlan, MemoryReport
from storage.settings import LimitSettings
from storage.worker_presence import Availability


class _Presence:
    """Stands in for :class:`storage.worker_presence.WorkerPresence`."""

    def __init__(self) -> None:
        self.figures: dict[str, Availability] = {}
        self.reads = 0
        self.down = False
        self.memory: dict[str, MemoryReport] = {}

    def memory_reports(self, models: list[str]) -> dict[str, MemoryReport]:
        self.reads += 1
        if self.down:
            raise ConnectionError("redis is down")
        return {m: self.memory[m] for m in models if m in self.memory}

    def availability(self, models: list[str]) -> dict[str, Availability]:
        self.reads += 1
        if self.down:
            raise ConnectionError("redis is down")
        return {m: self.figures.get(m, Availability(0)) for m in models}


def test_the_api_refuses_a_create_for_an_unavailable_model_and_caches_its_read() -> None:
    presence = _Presence()
    now = [100.0]
    availability = ModelAvailability(
        presence,  # type: ignore[arg-type]
        ["acme/wan", "reference/video"],
        refresh_s=1.0,
        clock=lambda: now[0],
    )
    availability.check("acme/wan")  # nothing known: accepted
    presence.figures["acme/wan"] = Availability(0, ("path /w does not exist",))
    availability.check("acme/wan")  # within the refresh: the figures read before
    assert presence.reads == 1
    now[0] += 1.0
    with pytest.raises(ModelUnavailable) as refused:
        availability.check("acme/wan")
    error = refused.value
    assert (error.status_code, error.code, error.param) == (503, "model_unavailable", "model")
    assert error.type == "server_error"
    assert error.message == "no live worker can load model 'acme/wan': path /w does not exist"
    availability.check("reference/video")
    assert availability.unavailable() == {"acme/wan": "path /w does not exist"}
    presence.down, now[0] = True, now[0] + 5  # a failed read keeps the last figures
    assert availability.unavailable() == {"acme/wan": "path /w does not exist"}


def test_models_list_whether_a_worker_can_load_them() -> None:
    listed = model_object(REFERENCE_VIDEO, LimitSettings())
    assert listed.available and listed.unavailable_reason is None
    down = model_object(REFERENCE_VIDEO, LimitSettings(), None, "path /w does not exist")
    assert not down.available and down.unavailable_reason == "path /w does not exist"


def test_models_list_their_memory_plan_with_what_live_workers_report() -> None:
    """A model without a plan lists ``memory: null`` and nothing else changes; one with a
    plan lists it, with the FP8 figures once a live worker reports them (re-read at most
    once a second; none while Redis cannot be read)."""
    plain = model_object(REFERENCE_VIDEO, LimitSettings()).model_dump(mode="json")
    assert plain["memory"] is None
    presence = _Presence()
    now = [0.0]
    availability = ModelAvailability(
        presence,  # type: ignore[arg-type]
        ["acme/wan"],
        clock=lambda: now[0],
    )
    assert availability.memory() == {}
    report = MemoryReport(fp8_modules={"transformer": 300}, bytes_saved=1_300_000_000)
    presence.memory["acme/wan"] = report
    assert availability.memory() == {}  # cached
    now[0] += 1.0
    assert availability.memory() == {"acme/wan": report}
    spec = REFERENCE_VIDEO.model_copy(update={"memory": MemoryPlan(quantization="fp8")})
    listed = model_object(spec, LimitSettings(), None, None, report).model_dump(mode="json")
    assert {k: v for k, v in listed.items() if k != "memory"} == {
        k: v for k, v in plain.items() if k != "memory"
    }
    assert listed["memory"] == {
        "quantization": "fp8",
        "offload": "none",
        "offload_budget_gib": None,
        "offload_blocks": [],
        "fp8_modulation": False,
        "fp8_modules": 300,
        "fp8_components": {"transformer": 300},
        "fp8_weight_only_modules": 0,
        "fp8_weight_only_components": {},
        "bytes_saved": 1_300_000_000,
        "offload_host": None,
        "offload_host_bytes": None,
    }
    presence.down, now[0] = True, now[0] + 5
    assert availability.memory() == {}  # listed without the figures, never an error
