"""Streaming video sessions (``WS /v1/realtime/video``): delivery timing of N concurrent sessions.

    python -m benchmarks.realtime.video --sessions 1,20
    python -m benchmarks.realtime.video --sessions 20 --size 128x128

Starts its own embedded stack (``python -m cli.main up`` on a free port, temporary data
directory, ``OMNIQ_REALTIME__SLOTS`` = the largest N so every session gets a worker slot),
runs one small warm-up session, then for each N opens N concurrent sessions of
``reference/world`` (``session.start`` with seed = session index) and reads them to
``session.done``. Stops the stack with SIGINT at the end. Prints one JSON object.

Per N it reports:

* ``time_to_first_chunk_s``: ``session.start`` sent → first chunk's binary frame received.
* ``inter_chunk_ms``: arrival intervals between consecutive media chunks (all sessions).
* ``steady_rtf``: media seconds of chunks 1…n-1 ÷ wall seconds from the first to the last
  chunk's arrival (≥ 1: faster than real time). ``rtf_all_media`` divides all the media
  (chunk 0 included) by the same wall time, as a plain "media delivered ÷ wall time".
* ``stall_ratio``: playback simulation. Playback starts when chunk 0 arrives, each chunk
  plays ``num_frames / fps`` seconds; when a chunk arrives after the previous one ended
  playback waits for it (a stall). Ratio = total stall time ÷ total media time.
* ``transport_overhead_ms``: client arrival time of a binary frame − ``produced_at`` of
  its metadata (the worker's ``time.time()`` right after encoding the fragment; same
  machine, same clock). Every binary frame counts (media and the trailer).
* ``breakdown_ms`` (after the run, from Redis): each chunk's entry in the session's
  ``oq:session:{id}:out`` stream carries the moment Redis stored it (the stream id's
  millisecond timestamp, floored), which splits the overhead in two:
  ``worker_to_redis`` = stored − ``produced_at`` (the worker's publish) and
  ``redis_to_client`` = arrival − stored (the API's XREAD relay, the WebSocket send and
  the client's receive).
* ``client_loop_lag_ms``: how late this script's event loop wakes from a 10 ms sleep
  (the client's own share of ``redis_to_client``).
* ``cpu_cores_used``: average cores busy during the level, by this script and its stack
  and by every other process. The machine may be shared: other work inflates every
  latency here, so compare only runs where ``other_processes`` is near 0.

Diagnostics: ``--worker-nice 10`` renices the realtime worker (API, Valkey and client
then win the CPU), ``--stack-env KEY=VALUE`` passes extra environment to the stack,
``--up-log`` keeps the stack's log, ``--keep-raw`` writes every chunk's timestamps.

Checks per session: the media chunk count equals ``((num_frames-1)//4+1)//3``,
``generation_chunk_index`` runs 0,1,2… and ``transport_chunk_index`` 0,1,2…, every binary
frame's length equals ``byte_length``, the first starts with ``ftyp``, the stream ends
with ``session.done`` (not stopped, ``chunks`` = the formula).

The client sends ``session.ping`` every ``--ping`` s (the server stops a session that is
silent for 60 s, and 20 sessions on 2 cores can take longer than that).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis
import websockets

from benchmarks.common import machine, parser, summary, valkey_url
from models.session_bus import OUTPUTS, ChunkOutput
from storage.constants import session_out_key
from tests.embedded_up import start_up, stop_up

MAX_SIZE = 16 * 1024 * 1024


def expected_chunks(num_frames: int) -> int:
    return ((num_frames - 1) // 4 + 1) // 3


def _playback(arrivals: list[float], durations: list[float]) -> tuple[float, int]:
    """Total stall seconds and stall count of a player that starts at the first arrival."""
    end = arrivals[0] + durations[0]
    stall, stalls = 0.0, 0
    for arrived, duration in zip(arrivals[1:], durations[1:], strict=True):
        if arrived > end:
            stall += arrived - end
            stalls += 1
            end = arrived
        end += duration
    return stall, stalls


async def _pinger(ws: Any, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        await ws.send(json.dumps({"type": "session.ping"}))


async def one_session(ws_url: str, start: dict[str, Any], ping_s: float) -> dict[str, Any]:
    problems: list[str] = []
    chunks: list[dict[str, Any]] = []  # metadata + arrival of each binary frame
    done: dict[str, Any] | None = None
    request_id = None
    async with websockets.connect(ws_url, max_size=MAX_SIZE, ping_interval=None) as ws:
        sent_mono = time.monotonic()
        await ws.send(json.dumps(start))
        pinger = asyncio.create_task(_pinger(ws, ping_s))
        try:
            meta: dict[str, Any] | None = None
            async for message in ws:
                if isinstance(message, bytes):
                    arrived_wall, arrived_mono = time.time(), time.monotonic()
                    if meta is None:
                        problems.append("binary frame without metadata")
                        continue
                    chunks.append(
                        {
                            **meta,
                            "arrived_wall": arrived_wall,
                            "arrived_mono": arrived_mono,
                            "received_bytes": len(message),
                            "head": message[4:8],
                        }
                    )
                    meta = None
                    continue
                msg = json.loads(message)
                kind = msg["type"]
                if meta is not None:
                    problems.append(f"{kind} between chunk metadata and its binary frame")
                    meta = None
                if kind == "video.start":
                    request_id = msg["request_id"]
                elif kind == "video.chunk_metadata":
                    meta = msg
                elif kind == "session.done":
                    done = msg
                    break
                elif kind == "error":
                    problems.append(f"error {msg.get('code')}: {msg.get('message')}")
                    break
        finally:
            pinger.cancel()
    return _session_result(start, sent_mono, request_id, chunks, done, problems)


def _session_result(
    start: dict[str, Any],
    sent_mono: float,
    request_id: str | None,
    chunks: list[dict[str, Any]],
    done: dict[str, Any] | None,
    problems: list[str],
) -> dict[str, Any]:
    want = expected_chunks(start["num_frames"])
    media = [c for c in chunks if c["kind"] == "media"]
    if len(media) != want:
        problems.append(f"{len(media)} media chunks, expected {want}")
    if [c["generation_chunk_index"] for c in media] != list(range(len(media))):
        problems.append("generation_chunk_index is not 0,1,2,…")
    if [c["transport_chunk_index"] for c in chunks] != list(range(len(chunks))):
        problems.append("transport_chunk_index is not 0,1,2,…")
    if any(c["received_bytes"] != c["byte_length"] for c in chunks):
        problems.append("a binary frame's length differs from byte_length")
    if chunks and chunks[0]["head"] != b"ftyp":
        problems.append("the first binary frame does not start with ftyp")
    if done is None:
        problems.append("no session.done")
    elif done.get("stopped") or done.get("chunks") != want:
        problems.append(f"session.done {done}")
    result: dict[str, Any] = {
        "request_id": request_id,
        "problems": problems,
        "chunks": chunks,
    }
    if not media:
        return result
    fps = float(start["fps"])
    arrivals = [c["arrived_mono"] for c in media]
    durations = [c["num_frames"] / fps for c in media]
    wall = arrivals[-1] - arrivals[0]
    stall, stalls = _playback(arrivals, durations)
    result.update(
        {
            "ttfc_s": arrivals[0] - sent_mono,
            "intervals_ms": [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)],
            "steady_rtf": sum(durations[1:]) / wall if wall > 0 else None,
            "rtf_all_media": sum(durations) / wall if wall > 0 else None,
            "media_s": sum(durations),
            "stall_s": stall,
            "stalls": stalls,
            "stall_ratio": stall / sum(durations),
            "session_wall_s": arrivals[-1] - sent_mono,
            "overhead_ms": [(c["arrived_wall"] - c["produced_at"]) * 1000 for c in chunks],
        }
    )
    return result


def _breakdown(redis_url: str, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Split each chunk's overhead at the moment Redis stored it (stream id, ms)."""
    client = redis.Redis.from_url(redis_url)
    to_redis: list[float] = []
    to_client: list[float] = []
    try:
        for s in sessions:
            if not s["request_id"]:
                continue
            stored: dict[int, float] = {}
            entries: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange(
                session_out_key(s["request_id"])
            )  # type: ignore[assignment]
            for entry_id, fields in entries:
                if isinstance(OUTPUTS.validate_json(fields[b"event"]), ChunkOutput):
                    stored[len(stored)] = int(entry_id.split(b"-")[0]) / 1000
            for i, c in enumerate(s["chunks"]):
                if i in stored:
                    to_redis.append((stored[i] - c["produced_at"]) * 1000)
                    to_client.append((c["arrived_wall"] - stored[i]) * 1000)
    finally:
        client.close()
    return {
        "note": "stream ids have 1 ms resolution (floored)",
        "worker_to_redis": summary(to_redis, 2),
        "redis_to_client": summary(to_client, 2),
    }


async def _loop_lag(lags: list[float], every: float = 0.01) -> None:
    """How late this client's event loop wakes up (its share of the measured overhead)."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(every)
        lags.append((time.monotonic() - before - every) * 1000)


async def run_n(
    ws_url: str, n: int, base: dict[str, Any], ping_s: float
) -> tuple[list[dict[str, Any]], list[float]]:
    starts = [{**base, "seed": i} for i in range(n)]
    lags: list[float] = []
    probe = asyncio.create_task(_loop_lag(lags))
    t0 = time.monotonic()
    try:
        results = await asyncio.gather(*[one_session(ws_url, s, ping_s) for s in starts])
    finally:
        probe.cancel()
    for r in results:
        r["batch_wall_s"] = time.monotonic() - t0
    return list(results), lags


def aggregate(
    n: int, sessions: list[dict[str, Any]], lags: list[float], redis_url: str | None
) -> dict[str, Any]:
    ok = [s for s in sessions if "ttfc_s" in s]
    intervals = [v for s in ok for v in s["intervals_ms"]]
    overhead = [v for s in ok for v in s["overhead_ms"]]
    media_overhead = [
        (c["arrived_wall"] - c["produced_at"]) * 1000
        for s in ok
        for c in s["chunks"]
        if c["kind"] == "media"
    ]
    out: dict[str, Any] = {
        "sessions": n,
        "all_checks_passed": all(not s["problems"] for s in sessions),
        "problems": {i: s["problems"] for i, s in enumerate(sessions) if s["problems"]},
        "chunks_per_session": sorted(
            {len([c for c in s["chunks"] if c["kind"] == "media"]) for s in sessions}
        ),
        "binary_frames": sum(len(s["chunks"]) for s in sessions),
        "mean_chunk_bytes": round(
            statistics.fmean(
                c["byte_length"] for s in ok for c in s["chunks"] if c["kind"] == "media"
            )
        )
        if ok
        else None,
        "batch_wall_s": round(max((s["batch_wall_s"] for s in sessions), default=0), 2),
        "time_to_first_chunk_s": summary([s["ttfc_s"] for s in ok], 3),
        "inter_chunk_ms": summary(intervals, 1),
        "steady_rtf": summary([s["steady_rtf"] for s in ok if s["steady_rtf"]], 3),
        "rtf_all_media": summary([s["rtf_all_media"] for s in ok if s["rtf_all_media"]], 3),
        "stall_ratio": summary([s["stall_ratio"] for s in ok], 3),
        "stalls_per_session": summary([float(s["stalls"]) for s in ok], 1),
        "transport_overhead_ms": summary(overhead, 2),
        "transport_overhead_media_only_ms": summary(media_overhead, 2),
        "client_loop_lag_ms": summary(lags, 2),
    }
    if redis_url is not None:
        out["breakdown_ms"] = _breakdown(redis_url, sessions)
    return out


def _cpu_snapshot(up_pid: int) -> tuple[float, float, float]:
    """(wall, busy CPU seconds of the machine, CPU seconds of this script and its stack)."""
    ours = 0.0
    for proc in [psutil.Process(), *psutil.Process(up_pid).children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        ours += t.user + t.system
    total = psutil.cpu_times()
    busy = total.user + total.nice + total.system + total.irq + total.softirq + total.steal
    return time.monotonic(), busy, ours


def _cpu_used(
    before: tuple[float, float, float], after: tuple[float, float, float]
) -> dict[str, float]:
    """Average cores busy during a run: by this benchmark and its stack, by everything else
    (other work on a shared machine inflates every latency here)."""
    wall = after[0] - before[0]
    ours = (after[2] - before[2]) / wall
    return {
        "benchmark_and_stack": round(ours, 2),
        "other_processes": round(max(0.0, (after[1] - before[1]) / wall - ours), 2),
    }


def _renice_realtime_worker(up_pid: int, increment: int) -> None:
    """Lower the CPU priority of the realtime worker (all its threads: on Linux a nice
    value belongs to a thread, and threads started later inherit their creator's)."""
    for proc in psutil.Process(up_pid).children(recursive=True):
        if "--realtime" in proc.cmdline():
            for thread in proc.threads():
                os.setpriority(os.PRIO_PROCESS, thread.id, increment)
            return
    raise SystemExit("no realtime worker under omniqueue up")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--sessions", default="1,20", help="comma-separated concurrency levels")
    p.add_argument("--size", default="256x256", help="WIDTHxHEIGHT (multiples of 16)")
    p.add_argument("--num-frames", type=int, default=189, help="189 = 16 chunks")
    p.add_argument("--fps", type=float, default=16)
    p.add_argument("--prompt", default="a red ball rolling through a green valley at sunset")
    p.add_argument("--ping", type=float, default=10.0, help="session.ping interval (s)")
    p.add_argument("--no-breakdown", action="store_true", help="skip the Redis breakdown")
    p.add_argument("--keep-raw", type=Path, default=None, help="write per-chunk records here")
    p.add_argument("--up-log", type=Path, default=None, help="append up's stderr here")
    p.add_argument(
        "--stack-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the stack (diagnostics, e.g. OMP_NUM_THREADS=1)",
    )
    p.add_argument(
        "--worker-nice",
        type=int,
        default=0,
        help="diagnostic: renice every thread of the realtime worker by this much",
    )
    args = p.parse_args()
    levels = [int(x) for x in args.sessions.split(",") if x]
    width, height = (int(v) for v in args.size.lower().split("x"))
    base = {
        "type": "session.start",
        "model": "reference/world",
        "prompt": args.prompt,
        "width": width,
        "height": height,
        "num_frames": args.num_frames,
        "fps": args.fps,
        # throughput, as before pacing: chunks as fast as the model goes
        "extra_params": {"max_chunks_ahead": 0},
    }
    data_dir = Path(tempfile.mkdtemp(prefix="oq-rtv-bench-"))
    extra_env = dict(kv.split("=", 1) for kv in args.stack_env)
    up, url = start_up(
        data_dir, env={**extra_env, "OMNIQ_REALTIME__SLOTS": str(max(levels))}, log=args.up_log
    )
    redis_url = valkey_url(data_dir)
    ws_url = url.replace("http://", "ws://") + "/v1/realtime/video"
    report: dict[str, Any] = {
        "machine": machine(),
        "request": {**base, "seed": "session index"},
        "expected_chunks": expected_chunks(args.num_frames),
        "slots": max(levels),
        "stack_env": args.stack_env,
        "worker_nice": args.worker_nice,
        "results": [],
    }
    raw: dict[str, Any] = {}
    try:
        warm = {**base, "width": 64, "height": 64, "num_frames": 33, "seed": 0}
        if args.worker_nice:
            _renice_realtime_worker(up.pid, args.worker_nice)
        asyncio.run(run_n(ws_url, 1, warm, args.ping))  # loads the pipeline, warms the paths
        for n in levels:
            print(f"running {n} session(s)…", file=sys.stderr, flush=True)
            before = _cpu_snapshot(up.pid)
            sessions, lags = asyncio.run(run_n(ws_url, n, base, args.ping))
            result = aggregate(n, sessions, lags, None if args.no_breakdown else redis_url)
            result["cpu_cores_used"] = _cpu_used(before, _cpu_snapshot(up.pid))
            report["results"].append(result)
            raw[str(n)] = [
                {
                    "request_id": s["request_id"],
                    "chunks": [{k: v for k, v in c.items() if k != "head"} for c in s["chunks"]],
                }
                for s in sessions
            ]
        print(json.dumps(report, indent=2))
        if args.keep_raw is not None:
            args.keep_raw.write_text(json.dumps(raw))
    finally:
        stop_up(up, data_dir)


if __name__ == "__main__":
    main()
