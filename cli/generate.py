"""``omniqueue generate``: submit a video job, watch it with a progress bar, download it.

Speaks the public HTTP API only (``POST /v1/videos``, ``GET /v1/videos/{id}``,
``GET /v1/videos/{id}/content``, ``POST /v1/videos/{id}/cancel``), so it works against
any omniqueue deployment. Ctrl-C after the job exists cancels it on the server.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

DEFAULT_URL = "http://127.0.0.1:8000"
POLL_INTERVAL_S = 0.5
# Consecutive failed polls (connection errors, 5xx; never 4xx) tolerated while waiting.
MAX_POLL_FAILURES = 10
EXIT_INTERRUPTED = 130
TERMINAL = ("completed", "failed")
# Stages with no progress of their own on the wire (progress moves only in ``denoise``):
# the bar shows a spinner, the stage's name and its time so far instead of a still 0 %.
_SPINNER = "|/-\\"


class _CliError(Exception):
    """A failure to report in one line and exit 1; ``retryable`` while polling."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _error_message(resp: httpx.Response) -> str:
    """The server's OpenAI-style error message, or the status line."""
    try:
        error = resp.json()["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}: {resp.text[:300] or resp.reason_phrase}"
    code = error.get("code") or error.get("type")
    return f"{message} ({code}, HTTP {resp.status_code})" if code else message


def _call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    try:
        resp = client.request(method, path, **kwargs)
    except httpx.ConnectError:
        raise _CliError(
            f"cannot connect to {client.base_url}: is omniqueue running? "
            "start it with 'omniqueue up' or pass --url / set OMNIQ_URL",
            retryable=True,
        ) from None
    except httpx.TransportError as exc:
        raise _CliError(f"{method} {path} failed: {exc!r}", retryable=True) from exc
    if resp.is_error:
        raise _CliError(_error_message(resp), retryable=resp.status_code >= 500)
    try:
        body: dict[str, Any] = resp.json()
    except ValueError:
        raise _CliError(f"{method} {path}: the server did not answer JSON") from None
    return body


def _create_body(
    prompt: str,
    *,
    seconds: str | float | None,
    size: str | None,
    steps: int | None,
    seed: int | None,
    model: str | None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "prompt": prompt,
        "model": model,
        "seconds": None if seconds is None else str(seconds),
        "size": size,
        "num_inference_steps": steps,
        "seed": seed,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _describe(video: dict[str, Any], tick: int = 0, in_stage_s: float | None = None) -> str:
    """The bar's postfix: status, queue position or stage, and the denoise step; a
    stage without steps (``prepare``, ``decode``, ``encode``, ``upload``) gets a spinner
    (``tick``: polls so far) and its time so far, so a long ``prepare`` is seen moving."""
    status = video.get("status", "?")
    if status == "queued":
        position = video.get("queue_position")
        return "queued" if position is None else f"queued (position {position})"
    stage = str(video.get("stage") or "")
    if status == "in_progress" and stage not in ("", "denoise", "queue"):
        spin = _SPINNER[tick % len(_SPINNER)]
        elapsed = "" if in_stage_s is None else f" {in_stage_s:.0f}s"
        return f"{status} {spin} {stage}{elapsed}"
    parts = [status, stage]
    if video.get("num_inference_steps"):
        parts.append(f"step {video.get('step') or 0}/{video['num_inference_steps']}")
    return " ".join(p for p in parts if p)


def _watch(
    client: httpx.Client, video: dict[str, Any], interval: float, sleep: Callable[[float], None]
) -> dict[str, Any]:
    """Poll until the job is completed or failed, drawing a 0-100 progress bar."""
    path = f"/v1/videos/{video['id']}"
    failures = tick = 0
    stage, stage_since = None, time.monotonic()
    bar = tqdm(
        total=100,
        unit="%",
        desc=video["id"],
        file=sys.stderr,
        dynamic_ncols=True,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]{postfix}",
    )
    with bar:
        while True:
            progress = int(video.get("progress") or 0)
            if progress > bar.n:
                bar.update(progress - bar.n)
            if video.get("stage") != stage:
                stage, stage_since = video.get("stage"), time.monotonic()
            bar.set_postfix_str(_describe(video, tick, time.monotonic() - stage_since))
            tick += 1
            if video.get("status") in TERMINAL:
                return video
            sleep(interval)
            try:
                video = _call(client, "GET", path)
                failures = 0
            except _CliError as exc:
                failures += 1
                if not exc.retryable or failures >= MAX_POLL_FAILURES:
                    raise


def _download(client: httpx.Client, video_id: str, output: Path) -> int:
    """Stream the artifact to ``output`` (through a ``.part`` file); its size in bytes."""
    partial = output.with_name(output.name + ".part")
    try:
        with client.stream("GET", f"/v1/videos/{video_id}/content", follow_redirects=True) as resp:
            if resp.is_error:
                resp.read()
                raise _CliError(_error_message(resp))
            with open(partial, "wb") as f:
                for chunk in resp.iter_bytes():
                    f.write(chunk)
        partial.replace(output)
    except httpx.TransportError as exc:
        raise _CliError(f"download failed: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return output.stat().st_size


def _check_output(output: Path) -> str | None:
    """Why the video could not be written to ``output``, or None: checked before the job
    is created, so a bad ``-o`` costs no generation."""
    parent = output.parent
    if output.is_dir():
        return f"{output} is a directory; give a file name (e.g. {output / 'video.mp4'})"
    if not parent.is_dir():
        return f"cannot write {output}: the directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"cannot write {output}: the directory {parent} is not writable"
    return None


def _cancel(client: httpx.Client, video_id: str) -> None:
    try:
        _call(client, "POST", f"/v1/videos/{video_id}/cancel")
    except (_CliError, httpx.HTTPError) as exc:
        _say(f"could not cancel {video_id}: {exc}")
        return
    _say(f"cancelled {video_id}")


def run_generate(
    prompt: str,
    *,
    url: str | None = None,
    api_key: str | None = None,
    seconds: str | float | None = None,
    size: str | None = None,
    steps: int | None = None,
    seed: int | None = None,
    model: str | None = None,
    output: str | Path | None = None,
    poll_interval: float = POLL_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Create a video, watch it, download it. Exit code: 0, 1 on failure, 130 on Ctrl-C.

    ``sleep`` runs between polls; tests pass one that raises ``KeyboardInterrupt``.
    """
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll is noise here
    base = (url or os.environ.get("OMNIQ_URL") or DEFAULT_URL).rstrip("/")
    key = api_key or os.environ.get("OMNIQ_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = _create_body(prompt, seconds=seconds, size=size, steps=steps, seed=seed, model=model)
    if output is not None and (problem := _check_output(Path(output))) is not None:
        _say(f"omniqueue generate: {problem}")
        return 1
    timeout = httpx.Timeout(60.0, connect=5.0)
    with httpx.Client(base_url=base, headers=headers, timeout=timeout) as client:
        try:
            video = _call(client, "POST", "/v1/videos", json=body)
        except _CliError as exc:
            _say(f"omniqueue generate: {exc}")
            return 1
        except KeyboardInterrupt:
            _say("interrupted before the video was created")
            return EXIT_INTERRUPTED
        video_id = str(video["id"])
        _say(f"created {video_id} ({video.get('model', '?')})")
        try:
            video = _watch(client, video, poll_interval, sleep)
            if video["status"] == "failed":
                error = video.get("error") or {}
                _say(
                    f"{video_id} failed: {error.get('code', 'unknown')}: "
                    f"{error.get('message', 'no message')}"
                )
                return 1
            path = Path(output) if output is not None else Path(f"{video_id}.mp4")
            size_bytes = _download(client, video_id, path)
        except KeyboardInterrupt:
            _cancel(client, video_id)
            return EXIT_INTERRUPTED
        except (_CliError, OSError) as exc:
            _say(f"omniqueue generate: {exc}")
            return 1
    print(f"{path} ({size_bytes} bytes)", flush=True)
    return 0
