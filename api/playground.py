"""The web playground: ``GET /`` serves ``api/static/index.html`` and ``/static/…`` its
scripts and styles (plain ES modules, no build step), shipped as package data.

The page speaks only the public API, so it is mounted beside it rather than over it: a
mount at ``/`` would take every unmatched path and method from the routers (``PUT
/v1/videos`` would lose its 405 with ``Allow``, an unknown ``/v1/…`` its error body). No
route here reads a key: the page itself is public, and it asks for a key when the API
answers 401.
"""

from __future__ import annotations

import os
from os import PathLike
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).resolve().parent / "static"
# Revalidate on every load: an upgraded server must not run a cached older script.
_HEADERS = {"Cache-Control": "no-cache"}


class _Static(StaticFiles):
    """StaticFiles whose every answer says ``Cache-Control: no-cache``."""

    def file_response(
        self,
        full_path: PathLike[str] | str,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(_HEADERS)
        return response


def install(app: FastAPI) -> None:
    """``GET /`` (the page), ``/favicon.ico`` and ``/static`` (its files); none is in
    ``/openapi.json``."""

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers=_HEADERS)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        # browsers ask for it on every page (the API's JSON and /docs included)
        return FileResponse(STATIC_DIR / "favicon.ico", headers=_HEADERS)

    app.mount("/static", _Static(directory=STATIC_DIR), name="static")
