"""``omniqueue status``, ``list``, ``cancel``, ``download`` and ``models``: the jobs and
models of a deployment, read over its public API.

A job id says its kind (``video_…`` under ``/v1/videos``, ``audio_…`` under
``/v1/audio/generations``). Tables and ``key: value`` lines go to stdout for people;
``--json`` prints the server's objects as they are, one per line, for scripts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from cli.client import (
    EXIT_INTERRUPTED,
    POLL_INTERVAL_S,
    CliError,
    call,
    cancel,
    connect,
    download,
    extension,
    failure,
    job_path,
    refuse_output,
    say,
    watch,
)

KINDS = {"video": "/v1/videos", "audio": "/v1/audio/generations"}
_TIMES = ("created_at", "started_at", "estimated_start_at", "completed_at", "expires_at")
# The fields ``status`` shows, in this order, when they are set.
_FIELDS = (
    "id", "model", "status", "progress", "stage", "queue_position", "estimated_start_at",
    "prompt", "size", "seconds", "fps", "num_frames", "num_inference_steps", "seed",
    "quality", "response_format", "sample_rate", "channels", "created_at", "started_at",
    "completed_at", "expires_at", "inference_time_s", "peak_memory_mb", "attempt",
)  # fmt: skip


def _when(value: Any) -> str:
    if not isinstance(value, int | float):
        return str(value)
    return datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def _state(job: dict[str, Any]) -> str:
    """``completed``, ``failed (oom)``, ``cancelled``, ``in_progress``…"""
    error = job.get("error") or {}
    if job.get("status") == "failed":
        return "cancelled" if error.get("code") == "cancelled" else f"failed ({error.get('code')})"
    return str(job.get("status"))


def _lines(job: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, str]] = []
    for name in _FIELDS:
        value = job.get(name)
        if value is None or value == "":
            continue
        if name == "status":
            value = _state(job)
        elif name == "stage" and job.get("num_inference_steps"):
            value = f"{value} (step {job.get('step') or 0}/{job['num_inference_steps']})"
        elif name == "progress":
            value = f"{value}%"
        elif name in _TIMES:
            value = _when(value)
        rows.append((name, str(value)))
    error = job.get("error")
    if error:
        rows.append(("error", f"{error.get('code')}: {error.get('message')}"))
    width = max(len(name) for name, _ in rows)
    return [f"{name.ljust(width)}  {value}" for name, value in rows]


def run_status(
    job_id: str,
    *,
    url: str | None = None,
    api_key: str | None = None,
    as_json: bool = False,
    wait: bool = False,
    poll_interval: float = POLL_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print a job's state; ``wait``: first watch it to its end with a progress bar
    (Ctrl-C stops watching, the job runs on). Exit 0, 1 when it cannot be read, or when
    ``wait`` saw it fail."""
    with connect(url, api_key) as client:
        try:
            job = call(client, "GET", job_path(job_id))
            if wait:
                job = watch(client, job, poll_interval, sleep)
        except KeyboardInterrupt:
            say(f"stopped watching {job_id}; it goes on (omniqueue cancel {job_id} stops it)")
            return EXIT_INTERRUPTED
        except CliError as error:
            say(f"omniqueue status: {error}")
            return 1
    print(json.dumps(job) if as_json else "\n".join(_lines(job)), flush=True)
    return 1 if wait and job.get("status") == "failed" else 0


def _json_lines(objects: list[dict[str, Any]]) -> None:
    """``--json``: the server's objects as they are, one a line."""
    for obj in objects:
        print(json.dumps(obj))


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    """Rows under their header row, columns padded to their widest cell (the last, free
    text, not)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])


def _page(client: httpx.Client, path: str, limit: int) -> list[dict[str, Any]]:
    page = call(client, "GET", path, params={"limit": limit, "order": "desc"})
    return list(page.get("data") or [])


def _prompt(job: dict[str, Any], width: int = 48) -> str:
    text = " ".join(str(job.get("prompt") or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def run_list(
    *,
    url: str | None = None,
    api_key: str | None = None,
    kind: str = "all",
    limit: int = 20,
    as_json: bool = False,
) -> int:
    """Print the caller's latest ``limit`` jobs, newest first: videos, audio, or both
    (the two lists merged by creation time)."""
    paths = list(KINDS.values()) if kind == "all" else [KINDS[kind]]
    with connect(url, api_key) as client:
        try:
            jobs = [job for path in paths for job in _page(client, path, limit)]
        except CliError as error:
            say(f"omniqueue list: {error}")
            return 1
    # Stable: the server's own order (created_at to the microsecond) within a second.
    jobs.sort(key=lambda j: j.get("created_at") or 0, reverse=True)
    jobs = jobs[:limit]
    if as_json:
        _json_lines(jobs)
        return 0
    if not jobs:
        say("no jobs")
        return 0
    rows = [("ID", "STATUS", "PROGRESS", "MODEL", "CREATED", "PROMPT")]
    rows += [
        (
            str(j["id"]),
            _state(j),
            f"{j.get('progress') or 0}%",
            str(j.get("model")),
            _when(j.get("created_at")),
            _prompt(j),
        )
        for j in jobs
    ]
    _table(rows)
    return 0


def run_cancel(job_ids: list[str], *, url: str | None = None, api_key: str | None = None) -> int:
    """Cancel each job; a line each (``cancelled``, or the state it had ended in
    already). Exit 1 if any could not be cancelled (unknown id, server refused)."""
    code = 0
    with connect(url, api_key) as client:
        for job_id in job_ids:
            try:
                job = cancel(client, job_id)
            except CliError as error:
                say(f"omniqueue cancel: {job_id}: {error}")
                code = 1
                continue
            state = _state(job)
            print(f"{job_id}\t{state}" if state == "cancelled" else f"{job_id}\t{state} already")
    return code


def run_download(
    job_id: str,
    *,
    url: str | None = None,
    api_key: str | None = None,
    output: str | Path | None = None,
    thumbnail: bool = False,
    index: int = 0,
) -> int:
    """Download a completed job's file (a video's MP4 or JPEG thumbnail, an audio job's
    file in its format; of a video's output ``index``) to ``output``, default
    ``<id>.<extension>`` (``<id>-<index>.<extension>`` for an output after the first)."""
    if refuse_output("omniqueue download", output):
        return 1
    with connect(url, api_key) as client:
        try:
            job = call(client, "GET", job_path(job_id))
            if thumbnail and job.get("object") != "video":
                raise CliError(f"{job_id} is not a video: only videos have a thumbnail")
            if job.get("status") == "failed":
                raise CliError(failure(job))
            if index and job.get("object") != "video":
                raise CliError(f"{job_id} is not a video: only videos have several outputs")
            ext = "jpg" if thumbnail else extension(job)
            name = f"{job_id}-{index}.{ext}" if index else f"{job_id}.{ext}"
            path = Path(output) if output is not None else Path(name)
            params = {"variant": "thumbnail"} if thumbnail else {}
            if index:
                params["index"] = str(index)
            size = download(client, f"{job_path(job_id)}/content", path, params)
        except (CliError, OSError) as error:
            say(f"omniqueue download: {error}")
            return 1
    print(f"{path} ({size} bytes)", flush=True)
    return 0


def _verb(model: dict[str, Any]) -> str:
    kind, modality = model.get("kind"), model.get("modality")
    if kind == "world":
        return "WS /v1/realtime/video"
    if kind == "voice":
        return "WS /v1/realtime"
    return "omniqueue audio | speech" if modality == "audio" else "omniqueue video"


def _defaults(model: dict[str, Any]) -> str:
    limits = model.get("limits") or {}
    if model.get("kind") != "job" or not limits:
        return ""
    parts = [] if model.get("modality") == "audio" else [str(limits.get("default_size"))]
    steps = limits.get("default_steps")
    parts += [f"{limits.get('default_seconds'):g} s", f"{steps} step{'' if steps == 1 else 's'}"]
    if limits.get("supports_image_input"):
        parts.append("--image")
    tiers = model.get("quality_tiers") or []
    if len(tiers) > 1:
        parts.append("--quality " + "|".join(tiers))
    if model.get("loras") is not None:
        parts.append("--lora")
    if model.get("available") is False:
        parts.append(f"unavailable: {model.get('unavailable_reason')}")
    return ", ".join(parts)


def run_models(*, url: str | None = None, api_key: str | None = None, as_json: bool = False) -> int:
    """Print the served models: name, what makes requests to it, its defaults."""
    with connect(url, api_key) as client:
        try:
            models = list(call(client, "GET", "/v1/models").get("data") or [])
        except CliError as error:
            say(f"omniqueue models: {error}")
            return 1
    if as_json:
        _json_lines(models)
        return 0
    rows = [("MODEL", "MODALITY", "USE WITH", "DEFAULTS")]
    rows += [(str(m["id"]), str(m.get("modality")), _verb(m), _defaults(m)) for m in models]
    _table(rows)
    return 0
