"""``GET /metrics``: the API's Prometheus metrics in the text exposition format.

No API key, like ``/health`` and ``/ready``: a scraper holds none, and what it reads
(counts per model, route and status) names no job or key. Keep it off the public network
(docs/metrics.md says how); ``OMNIQ_METRICS__ENABLED=false`` removes the route.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.deps import StateDep

router = APIRouter(tags=["system"])


@router.get("/metrics", include_in_schema=False)
async def metrics(state: StateDep) -> Response:
    # Off the event loop: a multiprocess scrape reads files, the queue depth a database.
    body = await state.blocking(state.metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
