"""The mixed load a fault is injected under, from clients in the root namespace:

* video jobs, created on either API host (a failed create is retried on the other host
  with the same ``Idempotency-Key``, as a careful client does), each followed by an SSE
  watcher on the other host that resumes on the first with ``Last-Event-ID`` when its
  stream breaks;
* a duplex voice session (``/v1/duplex``, ``reference/voice``), one response after another;
* a world session (``/v1/realtime/video``, ``reference/world``).

Both sessions resume on the other API host when their socket breaks (``session.resume``)
and record what the client lost: missing server event numbers and audio of the voice
session, missing chunks (frames) of the video. Every HTTP answer's latency is recorded
against the client's deadline (``DEADLINE_S``): the API never hangs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from models.realtime_video_chunks import frames_in_chunk
from tests.cluster.cluster import API_HOSTS, Cluster
from tests.helpers import world_session_start

DEADLINE_S = 15.0  # the longest any API answer may take, faults included
SMALL = {"size": "64x48", "seconds": "1", "fps": 16, "num_inference_steps": 8}
WEBHOOK = "http://10.100.9.1:9/hook"  # never delivered here; the outbox rows are counted
QUESTION = "tell me a long story about the sea, the wind and the boats in the harbour"
WORLD_START = world_session_start(900)  # under the session time limit at 16 fps; about a minute


def other(host: str) -> str:
    return API_HOSTS[1 - API_HOSTS.index(host)]


@dataclass
class Answers:
    """Every HTTP answer's latency; failures by kind."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def timed(self, fn: Any, *args: Any, **kwargs: Any) -> httpx.Response | None:
        t = time.monotonic()
        try:
            resp: httpx.Response = fn(*args, **kwargs)
        except httpx.HTTPError as exc:
            with self.lock:
                self.latencies.append(time.monotonic() - t)
                self.errors.append(type(exc).__name__)
            return None
        with self.lock:
            self.latencies.append(time.monotonic() - t)
        return resp

    @property
    def max_s(self) -> float:
        return max(self.latencies, default=0.0)


@dataclass
class Watch:
    job_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    resumes: int = 0
    done: bool = False


class JobLoad:
    """Video jobs at ``every_s``, each watched over SSE until ``done``."""

    def __init__(self, cluster: Cluster, every_s: float = 1.5, **fields: Any) -> None:
        self.cluster = cluster
        self.every_s = every_s
        self.fields = {**SMALL, **fields}
        self.answers = Answers()
        self.jobs: list[str] = []
        self.refused: list[str] = []  # creates no host accepted (no job to account for)
        self.watches: list[Watch] = []
        self._stop = threading.Event()
        self._abort = threading.Event()  # watchers give up (the test is over)
        self._threads: list[threading.Thread] = []
        self._clients = {h: cluster.client(h, timeout=DEADLINE_S) for h in API_HOSTS}

    def start(self) -> JobLoad:
        self._spawn(self._create_loop)
        return self

    def _spawn(self, fn: Any, *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def create(self, host: str = "api1", **fields: Any) -> str | None:
        """One job, created on ``host`` or else on the other; its id (None: refused)."""
        body = {"prompt": "load", **self.fields, **fields, "webhook_url": WEBHOOK}
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        for h in (host, other(host)):
            resp = self.answers.timed(
                self._clients[h].post, "/v1/videos", json=body, headers=headers
            )
            if resp is not None and resp.status_code == 200:
                job_id = str(resp.json()["id"])
                self.jobs.append(job_id)
                watch = Watch(job_id)
                self.watches.append(watch)
                self._spawn(self._watch, watch, other(h))
                return job_id
        self.refused.append(headers["Idempotency-Key"])
        return None

    def _create_loop(self) -> None:
        i = 0
        while not self._stop.wait(self.every_s):
            self.create(API_HOSTS[i % 2])
            i += 1

    def _watch(self, watch: Watch, host: str) -> None:
        while not watch.done and not self._abort.is_set():
            self._read_sse(watch, host)
            if not watch.done:
                watch.resumes += 1
                host = other(host)
                time.sleep(0.2)

    def _read_sse(self, watch: Watch, host: str) -> None:
        headers = {"Authorization": f"Bearer {self.cluster.key}"}
        if watch.events:
            headers["Last-Event-ID"] = watch.events[-1]["id"]
        url = f"{self.cluster.api_url(host)}/v1/videos/{watch.job_id}/events"
        timeout = httpx.Timeout(DEADLINE_S, read=30)
        try:
            with httpx.stream("GET", url, headers=headers, timeout=timeout) as resp:
                if resp.status_code != 200:
                    return
                data = None
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        data = json.loads(line[6:])
                    elif line == "" and data is not None:
                        if "id" in data or data.get("type") == "done":
                            watch.events.append(data)  # not an error event (no id)
                        if data.get("type") == "done":
                            watch.done = True
                            return
                        data = None
        except httpx.HTTPError:
            return

    def stop(self) -> None:
        self._stop.set()

    def finish(self, timeout: float = 240) -> dict[str, Any]:
        """Stop creating, wait for every job to end and every watcher to see it."""
        self.stop()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        self._abort.set()
        for c in self._clients.values():
            c.close()
        unwatched = [w.job_id for w in self.watches if not w.done]
        assert not unwatched, f"watchers that never saw done: {unwatched[:5]}"
        for w in self.watches:  # each event once, in order, across resumes; one end
            ids = [tuple(map(int, e["id"].split("-"))) for e in w.events if "id" in e]
            assert ids == sorted(set(ids)), (w.job_id, ids)
            assert [e["type"] for e in w.events].count("done") == 1, w.job_id
        return {
            "jobs": len(self.jobs),
            "refused_creates": len(self.refused),
            "sse_resumes": sum(w.resumes for w in self.watches),
            "max_answer_s": round(self.answers.max_s, 3),
            "answer_errors": sorted(set(self.answers.errors)),
        }


# ---- sessions ----------------------------------------------------------------------------


async def _recv(ws: ClientConnection, timeout: float = 30) -> Any:
    return await asyncio.wait_for(ws.recv(), timeout)


async def _on_either_host(
    host: str, attempt: Callable[[str], Awaitable[ClientConnection | None]], what: str
) -> tuple[str, ClientConnection]:
    """A session's resume: ``attempt`` on the other API host, then back, every 0.5 s for
    30 s, until it gives a socket; that host and socket."""
    for _ in range(60):
        host = other(host)
        with contextlib.suppress(ConnectionClosed, WebSocketException, TimeoutError, OSError):
            ws = await attempt(host)
            if ws is not None:
                return host, ws
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} could not be resumed on either host")


@dataclass
class VoiceSession:
    """A duplex voice session asking one question after another. A question whose
    ``response.created`` never came (its replica lost Redis before it could store it, so
    it was never taken: docs/protocols/realtime-audio.md) is asked again after a resume."""

    cluster: Cluster
    host: str = "api1"
    events: list[dict[str, Any]] = field(default_factory=list)
    resumes: list[float] = field(default_factory=list)  # seconds from break to resumed
    close_codes: list[int | None] = field(default_factory=list)  # of each broken socket
    broke_at: list[float] = field(default_factory=list)  # wall clock of each break
    responses: int = 0
    asked_again: int = 0
    resync: bool = False
    asked: bool = False  # a question is out: its response.done has not come
    started: bool = False  # … and its response.created came
    session: dict[str, Any] = field(default_factory=dict)

    def url(self, host: str) -> str:
        return self.cluster.api_url(host).replace("http", "ws") + "/v1/duplex?model=reference/voice"

    async def run(self, stop: asyncio.Event) -> None:
        ws = await connect(self.url(self.host), additional_headers=self.cluster.auth())
        created = json.loads(await _recv(ws))
        assert created["type"] == "session.created", created
        self.session = created["session"]
        self.events.append(created)
        manual = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        await ws.send(json.dumps({"type": "session.update", "session": manual}))
        while not stop.is_set() and not self.resync:
            try:
                await self._ask(ws)
            except (ConnectionClosed, WebSocketException, TimeoutError, OSError) as e:
                self.close_codes.append(ws.close_code if isinstance(e, ConnectionClosed) else None)
                self.broke_at.append(time.time())
                ws = await self._resume()
        await ws.send(json.dumps({"type": "session.close", "reason": "done"}))
        while json.loads(await _recv(ws))["type"] != "session.closed":  # its slot is free
            pass
        await ws.close()

    def _seen(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event["type"] == "response.created":
            self.started = True
        elif event["type"] == "response.done":
            self.responses += 1
            self.asked = self.started = False
        elif event["type"] == "session.resync_required":
            self.resync = True

    async def _ask(self, ws: ClientConnection) -> None:
        """Ask, and read the answer to its end; after a resume mid-answer, read on."""
        if not self.asked:
            item = {"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": QUESTION}]}  # fmt: skip
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create"}))
            self.asked = True
        while self.asked and not self.resync:
            self._seen(json.loads(await _recv(ws, timeout=10)))

    async def _resume(self) -> ClientConnection:
        broke = time.monotonic()

        async def attempt(host: str) -> ClientConnection | None:
            ws = await connect(self.url(host), additional_headers=self.cluster.auth())
            fresh = json.loads(await _recv(ws, timeout=10))
            assert fresh["type"] == "session.created"
            seq = max((e.get("server_event_seq", 0) for e in self.events), default=0)
            resume = {"type": "session.resume", "session_id": self.session["id"],
                      "resume_token": self.session["resume_token"],
                      "last_received_server_event_seq": seq}  # fmt: skip
            await ws.send(json.dumps(resume))
            answer = json.loads(await _recv(ws, timeout=10))
            if answer["type"] == "session.resumed":
                self.resumes.append(round(time.monotonic() - broke, 3))
                for _ in range(answer["replayed"]):
                    self._seen(json.loads(await _recv(ws, timeout=10)))
                if self.asked and not self.started:  # the question never got there
                    self.asked = False
                    self.asked_again += 1
                return ws
            self.resync = answer["type"] == "session.resync_required"
            return ws if self.resync else None

        self.host, ws = await _on_either_host(self.host, attempt, "the voice session")
        return ws

    def report(self) -> dict[str, Any]:
        seqs = [e["server_event_seq"] for e in self.events if "server_event_seq" in e]
        missing = (max(seqs) - len(set(seqs))) if seqs else 0
        # Every answer to the one question is as long: audio lost is what a completed
        # answer lacks against the longest one.
        per_answer: dict[str, int] = {}  # response id → PCM16 bytes at 24 kHz
        for e in self.events:
            if e["type"] == "response.output_audio.delta":
                size = len(base64.b64decode(e["delta"]))
                per_answer[e["response_id"]] = per_answer.get(e["response_id"], 0) + size
        audio_ms = sum(per_answer.values()) // 48
        per_answer = {r: size // 48 for r, size in per_answer.items()}
        done = [e["response"]["id"] for e in self.events if e["type"] == "response.done"]
        lengths = [per_answer.get(r, 0) for r in done]
        return {
            "responses": self.responses,
            "resumes_s": self.resumes,
            "close_codes": self.close_codes,
            "broke_at": self.broke_at,
            "events_lost": missing,
            "duplicates": len(seqs) - len(set(seqs)),
            "audio_ms_received": audio_ms,
            "answer_ms": sorted(set(lengths)),
            "audio_ms_lost": sum(max(lengths) - n for n in lengths) if lengths else 0,
            "asked_again": self.asked_again,
            "resync_required": self.resync,
        }


@dataclass
class WorldSession:
    """A world session streamed to the end (or until stopped)."""

    cluster: Cluster
    host: str = "api2"
    chunks: dict[int, int] = field(default_factory=dict)  # generation index → bytes
    duplicates: int = 0
    resumes: list[float] = field(default_factory=list)
    start: dict[str, Any] = field(default_factory=dict)
    ended: bool = False
    stopping: bool = False

    def url(self, host: str) -> str:
        return self.cluster.api_url(host).replace("http", "ws") + "/v1/realtime/video"

    async def _ws(self, host: str) -> ClientConnection:
        return await connect(
            self.url(host), additional_headers=self.cluster.auth(), max_size=16 * 2**20
        )

    async def run(self, stop: asyncio.Event) -> None:
        ws = await self._ws(self.host)
        await ws.send(json.dumps(WORLD_START))
        self.start = json.loads(await _recv(ws))
        assert self.start["type"] == "video.start", self.start
        while not self.ended:
            if stop.is_set() and not self.stopping:
                await ws.send(json.dumps({"type": "session.stop"}))  # its slot is free
                self.stopping = True
            try:
                await self._read(ws)
            except (ConnectionClosed, WebSocketException, TimeoutError, OSError):
                ws = await self._resume()
        await ws.close()

    async def _read(self, ws: ClientConnection) -> None:
        event = json.loads(await _recv(ws, timeout=10))
        if event["type"] == "session.done":
            self.ended = True
            return
        if event["type"] == "error":
            raise ConnectionClosed(None, None)
        if event["type"] != "video.chunk_metadata":
            return
        data = await _recv(ws, timeout=10)
        assert isinstance(data, bytes) and len(data) == event["byte_length"]
        if event["kind"] == "media":
            index = event["generation_chunk_index"]
            self.duplicates += index in self.chunks
            self.chunks[index] = len(data)

    async def _resume(self) -> ClientConnection:
        broke = time.monotonic()

        async def attempt(host: str) -> ClientConnection | None:
            ws = await self._ws(host)
            last = max(self.chunks, default=-1)
            resume = {"type": "session.resume", "session_id": self.start["session_id"],
                      "resume_token": self.start["resume_token"],
                      "last_generation_chunk_index": last}  # fmt: skip
            await ws.send(json.dumps(resume))
            answer = json.loads(await _recv(ws, timeout=10))
            if answer["type"] != "session.resumed":
                return None
            self.resumes.append(round(time.monotonic() - broke, 3))
            return ws

        self.host, ws = await _on_either_host(self.host, attempt, "the world session")
        return ws

    def report(self) -> dict[str, Any]:
        top = max(self.chunks, default=-1)
        missing = [i for i in range(top + 1) if i not in self.chunks]
        return {
            "chunks": len(self.chunks),
            "resumes_s": self.resumes,
            "chunks_lost": len(missing),
            "frames_lost": sum(frames_in_chunk(i) for i in missing),
            "duplicates": self.duplicates,
        }


class Sessions:
    """Both sessions on a loop of their own (a thread), until :meth:`finish`."""

    def __init__(self, cluster: Cluster) -> None:
        self.voice = VoiceSession(cluster, host="api1")
        self.world = WorldSession(cluster, host="api1")
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sessions:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not (self.voice.responses or self._errors) or not self.world.chunks:
            assert time.monotonic() < deadline, "sessions did not start"
            if self._errors:
                raise self._errors[0]
            time.sleep(0.1)
        return self

    def _run(self) -> None:
        async def both() -> None:
            results = await asyncio.gather(
                self.voice.run(self._stop), self.world.run(self._stop), return_exceptions=True
            )
            self._errors.extend(r for r in results if isinstance(r, BaseException))

        self._loop.run_until_complete(both())

    def finish(self, timeout: float = 60) -> dict[str, Any]:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._errors:
            raise self._errors[0]
        return {"voice": self.voice.report(), "video": self.world.report()}
