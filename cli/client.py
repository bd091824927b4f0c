"""The HTTP client of the ``omniqueue`` client verbs (``video``, ``audio``, ``speech``,
``status``, ``list``, ``cancel``, ``download``, ``models``): the public API only, so they
work against any omniqueue deployment.

A failure is a :class:`CliError`, shown as one line (the server's own error message, its
``param`` and ``code``), exit 1. Long waits draw a progress bar on stderr: a job's 0-100 %
with its stage, step and ETA (:func:`watch`), a download's bytes (:func:`download`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV, KEY_ENV = "OMNIQ_URL", "OMNIQ_API_KEY"
POLL_INTERVAL_S = 0.5
# Consecutive failed polls (connection errors, 5xx; never 4xx) tolerated while waiting.
MAX_POLL_FAILURES = 10
EXIT_INTERRUPTED = 130
TERMINAL = ("completed", "failed")
# Job id prefix → the collection that serves it.
COLLECTIONS = {"video_": "/v1/videos", "audio_": "/v1/audio/generations"}
# Stages with no progress of their own on the wire (progress moves only in ``denoise``):
# the bar shows a spinner, the stage's name and its time so far instead of a still 0 %.
_SPINNER = "|/-\\"


class CliError(Exception):
    """A failure to report in one line and exit 1; ``retryable`` while polling."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def base_url(url: str | None) -> str:
    return (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


@contextmanager
def connect(url: str | None, api_key: str | None, timeout: float = 60.0) -> Iterator[httpx.Client]:
    """A client of the API at ``url`` (else ``$OMNIQ_URL``, else :data:`DEFAULT_URL`)
    sending ``api_key`` (else ``$OMNIQ_API_KEY``, else none)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll is noise here
    key = api_key or os.environ.get(KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Timeout(timeout, connect=5.0)
    with httpx.Client(base_url=base_url(url), headers=headers, timeout=limits) as client:
        yield client


def collection(job_id: str) -> str:
    """The path of the collection a job id belongs to (``/v1/videos`` for ``video_…``)."""
    for prefix, path in COLLECTIONS.items():
        if job_id.startswith(prefix):
            return path
    raise CliError(f"{job_id!r} is not a job id: job ids start with video_ or audio_")


def job_path(job_id: str) -> str:
    return f"{collection(job_id)}/{job_id}"


def error_message(resp: httpx.Response) -> str:
    """The server's OpenAI-style error in one line: message, then the param it names, its
    code and the status; the status line when the body is not such an error. A 401 names
    this command's own way to send a key instead of the HTTP header the server names."""
    if resp.status_code == 401:
        return _auth_message(resp)
    try:
        error = resp.json()["error"]
        message = " ".join(str(error["message"]).split())
    except (ValueError, KeyError, TypeError):
        text = " ".join(resp.text[:300].split())
        return f"HTTP {resp.status_code}: {text or resp.reason_phrase}"
    details = [f"param {error['param']}"] if error.get("param") else []
    details += [str(c) for c in (error.get("code") or error.get("type"),) if c]
    details.append(f"HTTP {resp.status_code}")
    return f"{message} ({', '.join(details)})"


def _auth_message(resp: httpx.Response) -> str:
    """A 401 in the command line's words: pass ``--api-key`` or set ``OMNIQ_API_KEY``
    (the server's message names the HTTP header, which a command line user never sets)."""
    try:
        code = str(resp.json()["error"]["code"] or "invalid_api_key")
    except (ValueError, KeyError, TypeError):
        code = "invalid_api_key"
    if "authorization" in resp.request.headers:
        what = f"the API key given (--api-key or ${KEY_ENV}) is invalid or revoked"
    else:
        what = f"the server requires an API key: pass --api-key KEY or set {KEY_ENV}"
    return (
        f"{what}; 'omniqueue keys create --name NAME' makes one in the server's database "
        f"({code}, HTTP 401)"
    )


def transport_error(client: httpx.Client, method: str, path: str, error: Exception) -> CliError:
    if isinstance(error, httpx.ConnectError):
        return CliError(
            f"cannot connect to {client.base_url}: is omniqueue running? "
            f"start it with 'omniqueue up' or pass --url / set {URL_ENV}",
            retryable=True,
        )
    return CliError(f"{method} {path} failed: {error!r}", retryable=True)


def call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """One request; its JSON body, or :class:`CliError` (retryable: no answer or 5xx)."""
    try:
        resp = client.request(method, path, **kwargs)
    except httpx.TransportError as error:
        raise transport_error(client, method, path, error) from None
    if resp.is_error:
        raise CliError(error_message(resp), retryable=resp.status_code >= 500)
    try:
        body: dict[str, Any] = resp.json()
    except ValueError:
        raise CliError(f"{method} {path}: the server did not answer JSON") from None
    return body


def describe(job: dict[str, Any], tick: int = 0, in_stage_s: float | None = None) -> str:
    """The bar's postfix: status, queue position or stage, and the denoise step; a
    stage without steps (``prepare``, ``decode``, ``encode``, ``upload``) gets a spinner
    (``tick``: polls so far) and its time so far, so a long ``prepare`` is seen moving."""
    status = job.get("status", "?")
    if status == "queued":
        position = job.get("queue_position")
        return "queued" if position is None else f"queued (position {position})"
    stage = str(job.get("stage") or "")
    if status == "in_progress" and stage not in ("", "denoise", "queue"):
        spin = _SPINNER[tick % len(_SPINNER)]
        elapsed = "" if in_stage_s is None else f" {in_stage_s:.0f}s"
        return f"{status} {spin} {stage}{elapsed}"
    parts = [status, stage]
    if job.get("num_inference_steps"):
        parts.append(f"step {job.get('step') or 0}/{job['num_inference_steps']}")
    return " ".join(p for p in parts if p)


def watch(
    client: httpx.Client,
    job: dict[str, Any],
    interval: float = POLL_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll the job until it is completed or failed, drawing a 0-100 % bar with its ETA
    on stderr; the last state. A ``KeyboardInterrupt`` (Ctrl-C) passes through: what it
    means (cancel, or stop watching) is the caller's."""
    path = job_path(str(job["id"]))
    failures = tick = 0
    stage, stage_since = None, time.monotonic()
    bar = tqdm(
        total=100,
        unit="%",
        desc=str(job["id"]),
        file=sys.stderr,
        dynamic_ncols=True,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]{postfix}",
    )
    with bar:
        while True:
            # The percentage and the step of one poll go out in one frame: the postfix
            # first, unshown, then the count (whose update may draw), then one draw.
            if job.get("stage") != stage:
                stage, stage_since = job.get("stage"), time.monotonic()
            postfix = describe(job, tick, time.monotonic() - stage_since)
            bar.set_postfix_str(postfix, refresh=False)
            progress = int(job.get("progress") or 0)
            if progress > bar.n:
                bar.update(progress - bar.n)
            bar.refresh()
            tick += 1
            if job.get("status") in TERMINAL:
                return job
            sleep(interval)
            try:
                job = call(client, "GET", path)
                failures = 0
            except CliError as error:
                failures += 1
                if not error.retryable or failures >= MAX_POLL_FAILURES:
                    raise


def failure(job: dict[str, Any]) -> str:
    """``<id> failed: <code>: <message>`` of a failed job; a cancelled one (``failed``
    on the wire, ``error.code`` ``cancelled``) is said as such, once: ``<id> was
    cancelled by the client``."""
    error = job.get("error") or {}
    code, message = error.get("code", "unknown"), error.get("message", "no message")
    if code == "cancelled":
        said = message if str(message).startswith("cancelled") else f"cancelled ({message})"
        return f"{job['id']} was {said}"
    return f"{job['id']} failed: {code}: {message}"


def extension(job: dict[str, Any]) -> str:
    """The file extension of a job's content: ``mp4``, or an audio job's format."""
    return "mp4" if job.get("object") == "video" else str(job.get("response_format") or "wav")


def check_output(output: Path) -> str | None:
    """Why a file could not be written to ``output``, or None: checked before a job is
    created, so a bad ``-o`` costs no generation."""
    parent = output.parent
    if output.is_dir():
        return f"{output} is a directory; give a file name (e.g. {output / 'video.mp4'})"
    if not parent.is_dir():
        return f"cannot write {output}: the directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"cannot write {output}: the directory {parent} is not writable"
    return None


def refuse_output(command: str, output: str | Path | None) -> bool:
    """Say why ``-o`` ``output`` could not be written (:func:`check_output`), as a line
    of ``command``; True then, and the command exits 1 before asking anything."""
    problem = None if output is None else check_output(Path(output))
    if problem is not None:
        say(f"{command}: {problem}")
    return problem is not None


def save(resp: httpx.Response, output: Path) -> int:
    """Stream an open response's body to ``output`` through a ``.part`` file, with a byte
    progress bar on stderr (its total from ``Content-Length`` when there is one); the
    size in bytes. The file appears whole or not at all."""
    partial = output.with_name(output.name + ".part")
    length = resp.headers.get("content-length")
    bar = tqdm(
        total=int(length) if length and length.isdigit() else None,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=output.name,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    )
    try:
        with bar, open(partial, "wb") as f:
            for chunk in resp.iter_bytes():
                f.write(chunk)
                bar.update(len(chunk))
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)
    return output.stat().st_size


def download(
    client: httpx.Client, path: str, output: Path, params: dict[str, str] | None = None
) -> int:
    """GET ``path`` (a ``…/content`` route; presigned redirects followed) into ``output``
    (:func:`save`); its size in bytes."""
    try:
        with client.stream("GET", path, params=params, follow_redirects=True) as resp:
            if resp.is_error:
                resp.read()
                raise CliError(error_message(resp))
            return save(resp, output)
    except httpx.TransportError as error:
        raise transport_error(client, "GET", path, error) from None


def cancel(client: httpx.Client, job_id: str) -> dict[str, Any]:
    """Cancel the job on the server; its state after the cancel."""
    return call(client, "POST", f"{job_path(job_id)}/cancel")


def cancel_on_interrupt(client: httpx.Client, job_id: str) -> int:
    """After Ctrl-C on a job this command created: cancel it, say so; exit code 130."""
    try:
        job = cancel(client, job_id)
    except (CliError, httpx.HTTPError) as error:
        say(f"could not cancel {job_id}: {error}")
    else:
        done = job.get("status") == "completed"
        say(f"interrupted: {job_id} had completed already" if done else f"cancelled {job_id}")
    return EXIT_INTERRUPTED
