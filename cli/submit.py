"""``omniqueue video`` (alias ``generate``), ``omniqueue audio`` and ``omniqueue
speech``: create a job, watch it with a progress bar, download what it made.

``video`` and ``audio`` create a job (``POST /v1/videos``, ``POST /v1/audio/generations``),
poll it with a 0-100 % bar (stage, step, ETA) and stream its content to a file; Ctrl-C
after the job exists cancels it on the server. ``speech`` is OpenAI's synchronous
``POST /v1/audio/speech``: a spinner while the server works, then the bytes; Ctrl-C closes
the connection, on which the server cancels the job. A bad ``-o`` is refused before
anything is created, and every refusal of the server is one line naming its ``param``.
"""

from __future__ import annotations

import json
import mimetypes
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from cli.client import (
    EXIT_INTERRUPTED,
    POLL_INTERVAL_S,
    CliError,
    call,
    cancel_on_interrupt,
    connect,
    download,
    error_message,
    extension,
    failure,
    job_path,
    refuse_output,
    save,
    say,
    transport_error,
    watch,
)

_REMOTE = ("http://", "https://", "data:")
_SPINNER = "|/-\\"


@dataclass
class Request:
    """What to create: the ``path`` of the create route, the ``fields`` of its body (None
    values dropped), an ``image`` file to send as multipart ``input_reference``."""

    path: str
    fields: dict[str, Any]
    label: str
    image: Path | None = None

    def body(self) -> dict[str, Any]:
        return {k: v for k, v in self.fields.items() if v is not None}


def lora_field(text: str | None, scale: float | None) -> dict[str, Any] | None:
    """``--lora``: a JSON object as is, an absolute path, ``s3://`` URL or a path with a
    ``/`` as ``local_path`` (a relative one made absolute), else a catalog ``name``;
    ``--lora-scale`` as ``scale``."""
    if text is None:
        if scale is not None:
            raise CliError("--lora-scale needs --lora")
        return None
    if text.lstrip().startswith("{"):
        try:
            lora = json.loads(text)
        except ValueError as error:
            raise CliError(f"--lora is not valid JSON: {error}") from None
        if not isinstance(lora, dict):
            raise CliError("--lora JSON must be an object")
    elif text.startswith("s3://"):
        lora = {"local_path": text}
    elif "/" in text:
        lora = {"local_path": str(Path(text).expanduser().resolve())}
    else:
        lora = {"name": text}
    if scale is not None:
        lora["scale"] = scale
    return dict(lora)


def video_request(
    prompt: str,
    *,
    seconds: str | float | None = None,
    size: str | None = None,
    steps: int | None = None,
    seed: int | None = None,
    model: str | None = None,
    negative_prompt: str | None = None,
    quality: str | None = None,
    lora: str | None = None,
    lora_scale: float | None = None,
    n: int | None = None,
    image: str | None = None,
) -> Request:
    fields: dict[str, Any] = {
        "prompt": prompt,
        "model": model,
        "seconds": None if seconds is None else str(seconds),
        "size": size,
        "num_inference_steps": steps,
        "seed": seed,
        "negative_prompt": negative_prompt,
        "quality": quality,
        "lora": lora_field(lora, lora_scale),
        "n": n,
    }
    upload = None
    if image is not None and image.startswith(_REMOTE):
        fields["input_reference"] = image  # the server fetches (or decodes) it
    elif image is not None:
        upload = Path(image).expanduser()
        if not upload.is_file():
            raise CliError(f"--image {image}: no such file")
    return Request("/v1/videos", fields, "video", upload)


def audio_request(
    prompt: str,
    *,
    seconds: float | None = None,
    steps: int | None = None,
    seed: int | None = None,
    model: str | None = None,
    negative_prompt: str | None = None,
    response_format: str | None = None,
    sample_rate: int | None = None,
    channels: int | None = None,
) -> Request:
    fields: dict[str, Any] = {
        "prompt": prompt,
        "model": model,
        "seconds": seconds,
        "num_inference_steps": steps,
        "seed": seed,
        "negative_prompt": negative_prompt,
        "response_format": response_format,
        "sample_rate": sample_rate,
        "channels": channels,
    }
    return Request("/v1/audio/generations", fields, "audio")


def _create(client: httpx.Client, request: Request) -> dict[str, Any]:
    body = request.body()
    if request.image is None:
        return call(client, "POST", request.path, json=body)
    # multipart, every value a string (docs/api.md, "Body formats"): the file as
    # ``input_reference``, objects as JSON text
    data = {k: json.dumps(v) if isinstance(v, dict) else str(v) for k, v in body.items()}
    mime = mimetypes.guess_type(request.image.name)[0] or "application/octet-stream"
    with open(request.image, "rb") as f:
        files = {"input_reference": (request.image.name, f, mime)}
        return call(client, "POST", request.path, data=data, files=files)


def run_job(
    request: Request,
    *,
    url: str | None = None,
    api_key: str | None = None,
    output: str | Path | None = None,
    wait: bool = True,
    poll_interval: float = POLL_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Create the job, watch it, download it. Exit code: 0, 1 on failure, 130 on Ctrl-C
    (the job cancelled). ``wait=False``: print the job's id once created, and return.

    ``sleep`` runs between polls; tests pass one that raises ``KeyboardInterrupt``.
    """
    command = f"omniqueue {request.label}"
    if refuse_output(command, output):
        return 1
    with connect(url, api_key) as client:
        try:
            job = _create(client, request)
        except (CliError, OSError) as error:
            say(f"{command}: {error}")
            return 1
        except KeyboardInterrupt:
            say(f"interrupted before the {request.label} was created")
            return EXIT_INTERRUPTED
        job_id = str(job["id"])
        if not wait:
            print(job_id, flush=True)
            return 0
        say(f"created {job_id} ({job.get('model', '?')})")
        try:
            job = watch(client, job, poll_interval, sleep)
            if job["status"] == "failed":
                say(failure(job))
                return 1
            path = Path(output) if output is not None else Path(f"{job_id}.{extension(job)}")
            saved, content = [], f"{job_path(job_id)}/content"
            for index, target in enumerate(output_paths(path, int(job.get("n") or 1))):
                params = {"index": str(index)} if index else None
                saved.append((target, download(client, content, target, params)))
        except KeyboardInterrupt:
            return cancel_on_interrupt(client, job_id)
        except (CliError, OSError) as error:
            say(f"{command}: {error}")
            return 1
    for target, size in saved:
        print(f"{target} ({size} bytes)", flush=True)
    return 0


def output_paths(path: Path, count: int) -> list[Path]:
    """Where a job's ``count`` outputs go: ``path`` for the first, then ``<stem>-k<suffix>``
    beside it (the name a presigned download of output k gets)."""
    return [path] + [path.with_name(f"{path.stem}-{k}{path.suffix}") for k in range(1, count)]


def run_generate(
    prompt: str,
    *,
    url: str | None = None,
    api_key: str | None = None,
    output: str | Path | None = None,
    wait: bool = True,
    poll_interval: float = POLL_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
    **request: Any,
) -> int:
    """``omniqueue video`` (alias ``generate``): :func:`video_request` with ``request``
    (``seconds``, ``size``, ``image``, …), then :func:`run_job`."""
    try:
        video = video_request(prompt, **request)
    except CliError as error:
        say(f"omniqueue video: {error}")
        return 1
    return run_job(
        video,
        url=url,
        api_key=api_key,
        output=output,
        wait=wait,
        poll_interval=poll_interval,
        sleep=sleep,
    )


@contextmanager
def _spinner(label: str) -> Iterator[None]:
    """A line on stderr that turns and counts seconds while the block waits; gone after."""
    bar = tqdm(
        total=None, desc=label, file=sys.stderr, leave=False, bar_format="{desc} [{elapsed}]"
    )
    stop = threading.Event()

    def turn() -> None:
        tick = 0
        while not stop.wait(0.25):
            tick += 1
            bar.set_description_str(f"{label} {_SPINNER[tick % len(_SPINNER)]}")

    thread = threading.Thread(target=turn, name="spinner", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.close()


def run_speech(
    text: str,
    *,
    url: str | None = None,
    api_key: str | None = None,
    voice: str | None = None,
    instructions: str | None = None,
    speed: float | None = None,
    seconds: float | None = None,
    response_format: str = "mp3",
    sample_rate: int | None = None,
    seed: int | None = None,
    model: str | None = None,
    output: str | Path | None = None,
) -> int:
    """Speak ``text`` (``POST /v1/audio/speech``) into ``output`` (default
    ``<job id>.<format>``). Exit code: 0, 1 on failure, 130 on Ctrl-C."""
    if refuse_output("omniqueue speech", output):
        return 1
    fields = {
        "input": text,
        "model": model,
        "voice": voice,
        "instructions": instructions,
        "speed": speed,
        "duration_seconds": seconds,
        "response_format": response_format,
        "sample_rate": sample_rate,
        "seed": seed,
    }
    body = {k: v for k, v in fields.items() if v is not None}
    job_id = None
    with connect(url, api_key, timeout=900.0) as client, ExitStack() as waiting:
        try:
            waiting.enter_context(_spinner("speaking"))
            with client.stream("POST", "/v1/audio/speech", json=body) as resp:
                waiting.close()
                if resp.is_error:
                    resp.read()
                    raise CliError(error_message(resp))
                job_id = resp.headers.get("x-request-id")
                name = f"{job_id or 'speech'}.{response_format}"
                path = Path(output) if output is not None else Path(name)
                size = save(resp, path)
        except KeyboardInterrupt:
            waiting.close()
            if job_id is not None:
                return cancel_on_interrupt(client, job_id)
            say("interrupted: the connection is closed, and the server cancels the job")
            return EXIT_INTERRUPTED
        except httpx.TransportError as error:
            say(f"omniqueue speech: {transport_error(client, 'POST', '/v1/audio/speech', error)}")
            return 1
        except (CliError, OSError) as error:
            say(f"omniqueue speech: {error}")
            return 1
    suffix = f", {job_id}" if job_id else ""
    print(f"{path} ({size} bytes{suffix})", flush=True)
    return 0
