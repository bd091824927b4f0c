"""The ASGI application: ``create_app(settings)`` builds clients in the lifespan."""

from __future__ import annotations

import gc
import inspect
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI

from api.errors import install_error_handlers
from api.limits import BodySizeLimit
from api.metrics import HttpMetrics
from api.openapi import install as install_openapi
from api.playground import install as install_playground
from api.routes import (
    audio,
    metrics,
    realtime,
    realtime_video,
    speech,
    system,
    videos,
    webhooks,
)
from api.state import AppState
from storage.settings import Settings, get_settings

log = logging.getLogger(__name__)

# Room for form fields and multipart framing on top of the upload cap.
_BODY_OVERHEAD = 1024 * 1024


def _telemetry(settings: Settings) -> dict[str, Any]:
    """FastAPI's ``telemetry`` option (FastAPI releases that have it): its defaults when
    ``OMNIQ_HTTP__OPENTELEMETRY`` is on, else tracing, metrics and logs off."""
    if settings.http.opentelemetry or "telemetry" not in inspect.signature(FastAPI).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    settings.check_secrets()
    settings.served_models()  # a bad registry file fails at startup, not on a request

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Any]]:
        # Threads for blocking calls (database reads, Celery publishes). Fewer than anyio's
        # 40 keeps them from fighting the event loop for the GIL under load.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.http.threads
        state = AppState.build(settings)
        # What startup built lives as long as the process: out of the collector's sight,
        # so a full collection under load walks only what requests allocate.
        gc.freeze()
        try:
            yield {"app": state}
        finally:
            await state.aclose()

    app = FastAPI(
        **_telemetry(settings),
        title="omniqueue",
        version="0.1.0",
        summary="Async job queue with streaming delivery for generative video and audio",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(
        BodySizeLimit, max_bytes=settings.limits.max_upload_bytes * 2 + _BODY_OVERHEAD
    )
    if settings.metrics.enabled:  # outermost: a 413 or an unhandled error is counted too
        app.add_middleware(HttpMetrics)
    app.include_router(system.router)
    app.include_router(videos.router)
    app.include_router(realtime_video.router)
    app.include_router(audio.router)
    app.include_router(speech.router)
    app.include_router(realtime.router)
    app.include_router(webhooks.router)
    if settings.metrics.enabled:  # last: the API's own routes are matched first
        app.include_router(metrics.router)
    install_openapi(app)
    install_playground(app)  # after the API's routes, which it never shadows
    return app
