"""``/v1/models``, ``/health`` (liveness) and ``/ready`` (readiness)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import CurrentOwner, StateDep
from api.loras import catalog
from api.model_list import model_object
from api.openapi import errors
from models.common import Health, ModelList

router = APIRouter(tags=["system"])


@router.get("/v1/models", response_model=ModelList, responses=errors(401))
async def list_models(state: StateDep, _owner: CurrentOwner) -> ModelList:
    limits = state.settings.limits
    loras: list[str] = []
    if any(spec.supports_lora for spec in state.specs.values()):
        entries = await state.blocking(catalog, state.settings.lora)  # a directory listing
        loras = [e.name for e in entries]
    unavailable = await state.blocking(state.availability.unavailable)  # Redis, cached
    memory = {}
    if any(spec.memory is not None for spec in state.specs.values()):
        memory = await state.blocking(state.availability.memory)  # Redis, cached
    return ModelList(
        data=[
            model_object(spec, limits, loras, unavailable.get(name), memory.get(name))
            for name, spec in state.specs.items()
        ]
    )


# /health waits at most this long for the models' figures (seconds): it is a liveness
# probe, so a stalled Redis must not make it slow; it then says the last figures read.
HEALTH_MODELS_WAIT_S = 0.25


@router.get("/health", response_model=Health)
async def health(state: StateDep) -> Health:
    """Liveness: the process serves requests (200 whatever its dependencies do). Its
    ``unavailable_models`` are ``/ready``'s, from the same figures, waited for
    ``HEALTH_MODELS_WAIT_S`` at most."""
    wait = min(HEALTH_MODELS_WAIT_S, state.settings.http.ready_timeout_s)
    return Health(status="ok", unavailable_models=await state.unavailable_models(wait))


@router.get(
    "/ready",
    response_model=Health,
    responses={503: {"model": Health, "description": "A dependency did not answer."}},
)
async def ready(state: StateDep) -> JSONResponse:
    """Readiness: the database, Redis and S3 answer; 503 naming the service that did not
    (within ``OMNIQ_HTTP__READY_TIMEOUT_S``, 1.5 s) otherwise. ``unavailable_models``
    names the served models no live worker can load, and why; they leave the API ready."""
    checks = await state.readiness()
    ok = all(v == "ok" for v in checks.values())
    # Redis answered: a read on the probe pool, bounded, cached
    unavailable = await state.unavailable_models() if checks.get("redis") == "ok" else {}
    body = Health(
        status="ok" if ok else "unavailable", checks=checks, unavailable_models=unavailable
    )
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)
