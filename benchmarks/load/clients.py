"""The load generator's clients (``benchmarks/load/run.py``): one coroutine per arrival, on
one ``httpx.AsyncClient``, each playing one behaviour of the workload and leaving a
:class:`JobRecord` of what it saw.

Behaviours (``load_workload.BEHAVIOURS``): ``poll``, ``sse``, ``sync``, ``cancel``,
``sync_disconnect``, ``audio``, ``idempotent_retry``. A create answered 429 is a
refusal: the client records it (``queue_full`` and the ``Retry-After`` header) and does
not retry. Pollers wait what the server's ``openai-poll-after-ms`` header says between
two GETs (as the OpenAI SDK does), the workload's ``poll_interval_s`` without it. Every
client that got a job id follows it to a terminal state (``completed`` or ``failed``)
until :attr:`Clients.give_up` is set; its job is then lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.loadgen.workload import Arrival, Workload

TERMINAL = ("completed", "failed")
_VIDEO_ID_RE = re.compile(r"\b(video_[0-9a-f]{24})\b")


@dataclass
class JobRecord:
    """What one client saw of its job. Times: ``*_mono`` are ``time.monotonic()``,
    ``created_at``/``started_at`` the job object's (Unix seconds)."""

    behaviour: str
    kind: str  # video | audio
    shape: str
    ttl: int | None
    sent_mono: float
    create_ms: list[float] = field(default_factory=list)  # async creates only (not /sync)
    http_status: int | None = None  # of the (first) create; None: no answer
    refusal: str | None = None  # error.code of a 4xx/5xx create, or the transport error
    retry_after: str | None = None
    job_id: str | None = None
    first_status: str | None = None
    eta_field: bool = False  # the create's object had `estimated_start_at`
    estimated_start_at: float | None = None
    outcome: str | None = None  # completed | failed; None: not created or lost
    error_code: str | None = None
    end_mono: float | None = None  # when the client saw the terminal state
    created_at: float | None = None
    started_at: float | None = None
    queue_s: float | None = None
    idempotency_mismatch: bool = False
    action_status: int | None = None  # the cancel's HTTP status
    client_error: str | None = None  # an exception in the client itself

    @property
    def e2e_s(self) -> float | None:
        if self.end_mono is None:
            return None
        return self.end_mono - self.sent_mono


def _error_code(resp: httpx.Response) -> str:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        code = resp.json()["error"]["code"]
        if code:
            return str(code)
    return f"http_{resp.status_code}"


class Clients:
    """Runs arrivals against ``client``; :attr:`give_up` stops every client."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        workload: Workload,
        rng: random.Random,
        *,
        ttl_supported: bool = True,
        sync_timeout_s: float = 600.0,
    ) -> None:
        self.client = client
        self.workload = workload
        self.rng = rng
        self.ttl_supported = ttl_supported
        self.sync_timeout_s = sync_timeout_s
        self.give_up = asyncio.Event()  # set: every client stops where it is
        self.last_end = time.monotonic()  # when a client last saw a terminal state
        self.in_flight = 0
        self.poll_read_ms: list[float] = []  # every GET a poller made
        self.counter = 0

    # -- bodies --------------------------------------------------------------------------

    def _prompt(self) -> str:
        self.counter += 1
        return f"{self.workload.prompt} #{self.counter}"

    def _video_body(self, arrival: Arrival) -> dict[str, Any]:
        body = {"prompt": self._prompt(), **arrival.shape.body()}
        if arrival.ttl is not None and self.ttl_supported:
            body["ttl"] = arrival.ttl
        return body

    def _audio_body(self, arrival: Arrival) -> dict[str, Any]:
        body = {"prompt": self._prompt(), **self.workload.audio.body()}
        if arrival.ttl is not None and self.ttl_supported:
            body["ttl"] = arrival.ttl
        return body

    # -- steps ---------------------------------------------------------------------------

    async def _create(
        self, rec: JobRecord, path: str, body: dict[str, Any], key: str | None = None
    ) -> dict[str, Any] | None:
        """POST a create; the job object when admitted (``rec`` updated), else None."""
        headers = {"Idempotency-Key": key} if key else None
        t0 = time.perf_counter()
        try:
            resp = await self.client.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            rec.create_ms.append((time.perf_counter() - t0) * 1000)
            if rec.http_status is None:
                rec.refusal = type(exc).__name__
            return None
        rec.create_ms.append((time.perf_counter() - t0) * 1000)
        if rec.http_status is None:
            rec.http_status = resp.status_code
        if resp.status_code != 200:
            rec.refusal = _error_code(resp)
            rec.retry_after = resp.headers.get("retry-after")
            return None
        obj: dict[str, Any] = resp.json()
        if rec.job_id is None:
            rec.job_id = obj["id"]
            rec.first_status = obj.get("status")
            rec.eta_field = "estimated_start_at" in obj
            rec.estimated_start_at = obj.get("estimated_start_at")
        return obj

    def _finish(self, rec: JobRecord, obj: dict[str, Any]) -> None:
        self.last_end = time.monotonic()
        rec.outcome = obj.get("status")
        rec.error_code = (obj.get("error") or {}).get("code")
        rec.created_at = obj.get("created_at")
        rec.started_at = obj.get("started_at")
        queue = (obj.get("stage_durations") or {}).get("queue")
        if queue is not None:
            rec.queue_s = float(queue)
        elif rec.started_at is not None and rec.created_at is not None:
            rec.queue_s = float(rec.started_at - rec.created_at)

    async def _read(self, path: str) -> tuple[dict[str, Any] | None, float]:
        """One status read: the object (None on a transport error or a non-200) and the
        pause before the next (``openai-poll-after-ms``, else the workload's)."""
        pause = self.workload.poll_interval_s
        t0 = time.perf_counter()
        try:
            resp = await self.client.get(path)
        except httpx.HTTPError:
            return None, pause
        self.poll_read_ms.append((time.perf_counter() - t0) * 1000)
        with contextlib.suppress(KeyError, ValueError):
            pause = int(resp.headers["openai-poll-after-ms"]) / 1000
        return (resp.json() if resp.status_code == 200 else None), pause

    async def _poll(self, rec: JobRecord, path: str) -> None:
        """GET ``path`` until the job is terminal (or the client is cancelled)."""
        while True:
            obj, pause = await self._read(path)
            if obj is not None and obj.get("status") in TERMINAL:
                rec.end_mono = time.monotonic()
                self._finish(rec, obj)
                return
            await asyncio.sleep(pause)

    async def _watch(self, rec: JobRecord, video_id: str) -> None:
        """Follow ``…/events`` to ``done``, then read the object; polls if the stream
        fails or ends early."""
        path = f"/v1/videos/{video_id}"
        with contextlib.suppress(httpx.HTTPError):
            async with self.client.stream("GET", f"{path}/events", timeout=None) as r:
                if r.status_code == 200:
                    async for line in r.aiter_lines():
                        if line.startswith("event: done"):
                            rec.end_mono = time.monotonic()
                            break
        obj, _ = await self._read(path)
        if obj is not None and obj.get("status") in TERMINAL:
            rec.end_mono = rec.end_mono or time.monotonic()
            self._finish(rec, obj)
        else:
            rec.end_mono = None
            await self._poll(rec, path)

    async def _resolve(self, rec: JobRecord, body: dict[str, Any], key: str) -> None:
        """The job a ``/sync`` call made, found by replaying its ``Idempotency-Key`` on
        ``POST /v1/videos`` (which returns the existing job), then followed."""
        with contextlib.suppress(httpx.HTTPError):
            resp = await self.client.post("/v1/videos", json=body, headers={"Idempotency-Key": key})
            if resp.status_code == 200:
                rec.job_id = resp.json()["id"]
        if rec.job_id is not None:
            await self._poll(rec, f"/v1/videos/{rec.job_id}")

    # -- behaviours ----------------------------------------------------------------------

    async def run(self, arrival: Arrival) -> JobRecord:
        kind = "audio" if arrival.behaviour == "audio" else "video"
        rec = JobRecord(
            behaviour=arrival.behaviour,
            kind=kind,
            shape="audio" if kind == "audio" else arrival.shape.label,
            ttl=arrival.ttl if self.ttl_supported else None,
            sent_mono=time.monotonic(),
        )
        self.in_flight += 1
        behaviour = asyncio.ensure_future(getattr(self, f"_run_{arrival.behaviour}")(rec, arrival))
        stop = asyncio.ensure_future(self.give_up.wait())
        try:
            await asyncio.wait({behaviour, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (behaviour, stop):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self.in_flight -= 1
        if behaviour.done() and not behaviour.cancelled() and behaviour.exception():
            exc = behaviour.exception()
            rec.client_error = f"{type(exc).__name__}: {exc}"[:200]  # the generator's bug
        return rec

    async def _run_poll(self, rec: JobRecord, arrival: Arrival) -> None:
        if await self._create(rec, "/v1/videos", self._video_body(arrival)):
            await self._poll(rec, f"/v1/videos/{rec.job_id}")

    async def _run_sse(self, rec: JobRecord, arrival: Arrival) -> None:
        if await self._create(rec, "/v1/videos", self._video_body(arrival)):
            assert rec.job_id is not None
            await self._watch(rec, rec.job_id)

    async def _run_audio(self, rec: JobRecord, arrival: Arrival) -> None:
        if await self._create(rec, "/v1/audio/generations", self._audio_body(arrival)):
            await self._poll(rec, f"/v1/audio/generations/{rec.job_id}")

    async def _run_cancel(self, rec: JobRecord, arrival: Arrival) -> None:
        if not await self._create(rec, "/v1/videos", self._video_body(arrival)):
            return
        await asyncio.sleep(self.rng.uniform(*self.workload.cancel_delay_s))
        with contextlib.suppress(httpx.HTTPError):
            resp = await self.client.post(f"/v1/videos/{rec.job_id}/cancel")
            rec.action_status = resp.status_code
        await self._poll(rec, f"/v1/videos/{rec.job_id}")

    async def _run_idempotent_retry(self, rec: JobRecord, arrival: Arrival) -> None:
        body = self._video_body(arrival)
        key = f"load-{uuid.uuid4().hex}"
        if not await self._create(rec, "/v1/videos", body, key):
            return  # refused: an open-loop client does not retry
        first = rec.job_id
        await asyncio.sleep(self.rng.uniform(0.0, 0.5))
        again = await self._create(rec, "/v1/videos", body, key)
        rec.idempotency_mismatch = again is None or again.get("id") != first
        await self._poll(rec, f"/v1/videos/{first}")

    async def _run_sync(self, rec: JobRecord, arrival: Arrival) -> None:
        await self._sync(rec, arrival, hang_up_after=None)

    async def _run_sync_disconnect(self, rec: JobRecord, arrival: Arrival) -> None:
        await self._sync(rec, arrival, self.rng.uniform(*self.workload.disconnect_delay_s))

    async def _sync(self, rec: JobRecord, arrival: Arrival, hang_up_after: float | None) -> None:
        """``POST /v1/videos/sync``; with ``hang_up_after``, the connection is closed
        then if no answer has come (the server must cancel the job)."""
        body = self._video_body(arrival)
        key = f"load-{uuid.uuid4().hex}"
        request = self.client.build_request(
            "POST",
            "/v1/videos/sync",
            json=body,
            headers={"Idempotency-Key": key},
            timeout=self.sync_timeout_s,
        )
        wait = self.sync_timeout_s if hang_up_after is None else hang_up_after
        try:
            async with asyncio.timeout(wait):
                resp = await self.client.send(request, stream=True)
        except TimeoutError:  # hung up (or the sync wait ran out): the job is found by key
            rec.http_status = None
            await self._resolve(rec, body, key)
            return
        except httpx.HTTPError as exc:
            rec.refusal = type(exc).__name__
            await self._resolve(rec, body, key)
            return
        try:
            rec.http_status = resp.status_code
            if resp.status_code == 200:
                async for _ in resp.aiter_bytes():
                    pass
                rec.end_mono = time.monotonic()
                rec.job_id = resp.headers.get("x-request-id")
            else:
                await resp.aread()
                rec.refusal = _error_code(resp)
                rec.retry_after = resp.headers.get("retry-after")
                m = _VIDEO_ID_RE.search(resp.text)
                rec.job_id = m.group(1) if m else None
                if resp.status_code in (400, 409, 500, 504) and rec.job_id:
                    rec.end_mono = time.monotonic()  # a failed job's answer
        finally:
            await resp.aclose()
        if rec.job_id is None:
            return
        obj, _ = await self._read(f"/v1/videos/{rec.job_id}")
        if obj is not None and obj.get("status") in TERMINAL:
            self._finish(rec, obj)
        else:
            rec.end_mono = None
            await self._poll(rec, f"/v1/videos/{rec.job_id}")
