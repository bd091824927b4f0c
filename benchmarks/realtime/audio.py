"""Realtime audio sessions (``WS /v1/realtime``): VAD, first-audio and barge-in latency of
N concurrent voice conversations.

    python -m benchmarks.realtime.audio --sessions 1,10,20,50

Starts its own embedded stack (``python -m cli.main up`` on a free port, temporary data
directory, ``OMNIQ_REALTIME__SLOTS`` = the largest N so every session gets a worker slot),
then for each N runs N concurrent sessions of ``reference/voice`` with server VAD
(defaults: threshold 0.5, 300 ms prefix padding, 500 ms silence). Each session plays a
microphone: PCM16 of the espeak-ng fixtures (tests/fixtures/speech, true onsets and
offsets in fixtures.json) in 100 ms appends, each sent when its 100 ms have "been
recorded" (real-time pacing), silence between utterances:

1. it speaks utterance A and waits for the answer's first audio delta;
2. it speaks utterance B over the answer (barge-in), and keeps listening;
3. it stays silent until the answer to B completes.

Per N it reports (ms; p50/p95/p99/max over sessions):

* ``vad_onset_ms``: ``speech_started`` received − the wall time the true onset was
  "spoken" (utterance start + onset_ms). ``vad_offset_ms``: ``speech_stopped`` received −
  the true offset's wall time; it includes the ``silence_duration_ms`` the detector must
  wait by design (reported also without it).
* ``first_audio_after_speech_stopped_ms``: ``speech_stopped`` received → first
  ``response.output_audio.delta`` of the response it started.
* ``barge_in_to_done_ms``: the interrupting speech's true onset → ``response.done``
  (``cancelled``, ``turn_detected``) received; ``barge_in_to_last_delta_ms``: the same
  onset → the last audio delta of the cancelled response received (≤ 0: no audio after
  the onset at all); ``detection_to_done_ms``: ``speech_started`` received →
  ``response.done`` (the "one model step + 20 ms" part).
* ``rtf``: audio seconds of the completed answer ÷ wall seconds from its first to its
  last delta (the worker paces answers to real time, so ≈ 1 with a lead buffer).
* ``underruns``: playback simulation of the completed answer: playback starts at its
  first delta; an underrun is a delta that arrives after the audio before it has played
  out. Counted per session; ``sessions_with_underruns`` totals them.

CPU: ``cores_used`` per process role over the level's wall time, and
``cpu_ms_per_session_second``: each role's CPU ms per second of one session (CPU over the
level ÷ the sum of the sessions' durations, socket open → closed).

Checks per session: the first response ends ``cancelled`` / ``turn_detected``, the
second ``completed``; a session that fails a check is reported in ``errors``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import psutil
import websockets

from benchmarks.common import ROOT, machine, parser, summary
from tests.embedded_up import start_up, stop_up

FIXTURES = ROOT / "tests" / "fixtures" / "speech"
CHUNK_MS = 100
BYTES_PER_MS = 48


def _fixture(name: str) -> tuple[bytes, dict[str, Any]]:
    meta = json.loads((FIXTURES / "fixtures.json").read_text())
    truth = next(f for f in meta["fixtures"] if f["file"] == name)
    with wave.open(str(FIXTURES / name)) as w:
        return w.readframes(w.getnframes()), truth


class Mic:
    """Sends PCM as a microphone would: chunk k leaves at start + (k+1) × 100 ms."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def speak(self, pcm: bytes) -> float:
        """Send ``pcm``; returns the wall time its first sample was "spoken"."""
        start = time.monotonic()
        step = CHUNK_MS * BYTES_PER_MS
        for k, i in enumerate(range(0, len(pcm), step)):
            delay = start + (k + 1) * CHUNK_MS / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            event = {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(pcm[i : i + step]).decode(),
            }
            await self.ws.send(json.dumps(event))
        return start


async def one_session(url: str, a: tuple[bytes, dict], b: tuple[bytes, dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    opened = time.monotonic()
    async with websockets.connect(url, max_size=32 * 1024 * 1024) as ws:
        mic = Mic(ws)
        events: list[tuple[float, dict[str, Any]]] = []
        first_delta = asyncio.Event()

        async def reader() -> None:
            dones = 0
            async for message in ws:
                event = json.loads(message)
                event["_wall"] = time.time()
                events.append((time.monotonic(), event))
                if event["type"] == "response.output_audio.delta":
                    first_delta.set()
                if event["type"] == "error":
                    out.setdefault("server_errors", []).append(event["error"])
                if event["type"] == "response.done":
                    dones += 1
                    if dones == 2:
                        return

        task = asyncio.create_task(reader())
        t_a = await mic.speak(a[0])
        await asyncio.wait_for(first_delta.wait(), 30)
        t_b = await mic.speak(b[0])
        silence = b"\x00" * (CHUNK_MS * BYTES_PER_MS) * 30
        speaker = asyncio.create_task(mic.speak(silence))
        await asyncio.wait_for(task, 60)
        speaker.cancel()
    out["session_s"] = time.monotonic() - opened
    return _measure(events, (t_a, a[1]), (t_b, b[1]), out)


def _measure(
    events: list[tuple[float, dict[str, Any]]],
    a: tuple[float, dict[str, Any]],
    b: tuple[float, dict[str, Any]],
    out: dict[str, Any],
) -> dict[str, Any]:
    def times(kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, e) for t, e in events if e["type"] == kind]

    started, stopped = (
        times("input_audio_buffer.speech_started"),
        times("input_audio_buffer.speech_stopped"),
    )
    dones = times("response.done")
    if len(started) < 2 or len(stopped) < 2 or len(dones) < 2:
        out["error"] = f"events: {len(started)} starts, {len(stopped)} stops, {len(dones)} done"
        return out
    (t_a, truth_a), (t_b, truth_b) = a, b
    out["vad_onset_ms"] = [
        (started[0][0] - (t_a + truth_a["onset_ms"] / 1000)) * 1000,
        (started[1][0] - (t_b + truth_b["onset_ms"] / 1000)) * 1000,
    ]
    out["vad_offset_ms"] = [
        (stopped[0][0] - (t_a + truth_a["offset_ms"] / 1000)) * 1000,
        (stopped[1][0] - (t_b + truth_b["offset_ms"] / 1000)) * 1000,
    ]
    cancelled, completed = dones[0][1]["response"], dones[1][1]["response"]
    if cancelled["status"] != "cancelled" or completed["status"] != "completed":
        out["error"] = f"statuses {cancelled['status']} / {completed['status']}"
        return out
    deltas = times("response.output_audio.delta")
    for stop_t, _ in stopped:
        after = [t for t, e in deltas if t > stop_t]
        if after:
            out.setdefault("first_audio_ms", []).append((after[0] - stop_t) * 1000)
    for stop_t, stop_e in stopped:
        first = next((e for t, e in deltas if t > stop_t), None)
        if first is not None and first.get("produced_at"):
            # split: speech_stopped at the client → audio made on the worker → delivered
            made = (first["produced_at"] - stop_e["_wall"]) * 1000
            out.setdefault("first_audio_made_ms", []).append(made)
    out["transport_ms"] = [
        (e["_wall"] - e["produced_at"]) * 1000 for _, e in deltas if e.get("produced_at")
    ]
    onset_b = t_b + truth_b["onset_ms"] / 1000
    cancelled_deltas = [t for t, e in deltas if e["response_id"] == cancelled["id"]]
    out["barge_in_to_done_ms"] = (dones[0][0] - onset_b) * 1000
    out["barge_in_to_last_delta_ms"] = (max(cancelled_deltas) - onset_b) * 1000
    out["detection_to_done_ms"] = (dones[0][0] - started[1][0]) * 1000
    answer = [(t, e) for t, e in deltas if e["response_id"] == completed["id"]]
    audio_s = [len(base64.b64decode(e["delta"])) / (BYTES_PER_MS * 1000) for _, e in answer]
    wall = answer[-1][0] - answer[0][0]
    out["rtf"] = sum(audio_s[:-1]) / wall if wall > 0 else None
    underruns, dry_s, play_end = 0, 0.0, answer[0][0]
    for i, ((t, _), dur) in enumerate(zip(answer, audio_s, strict=True)):
        if i and t > play_end + 1e-3:
            underruns += 1  # playback ran dry; it resumes when this delta arrives
            # which delta, ms since the answer's first delta, ms dry, ms of audio before
            at = [i, round((t - answer[0][0]) * 1000), round((t - play_end) * 1000)]
            out.setdefault("underrun_at", []).append([*at, round(sum(audio_s[:i]) * 1000)])
            dry_s += t - play_end
        play_end = max(play_end, t) + dur
    out["underruns"] = underruns
    out["underrun_ms"] = dry_s * 1000
    out["max_delta_gap_ms"] = max(b[0] - a[0] for a, b in itertools.pairwise(answer)) * 1000
    out["answer_lead_ms"] = [  # audio received ahead of playback when each delta arrived
        (play - t) * 1000 for t, play in _buffer_levels(answer, audio_s)
    ]
    return out


def _buffer_levels(
    answer: list[tuple[float, dict[str, Any]]], audio_s: list[float]
) -> list[tuple[float, float]]:
    """(arrival, playback end of everything received so far) per delta."""
    levels, play_end = [], answer[0][0]
    for (t, _), dur in zip(answer, audio_s, strict=True):
        play_end = max(play_end, t) + dur
        levels.append((t, play_end - dur))
    return levels


async def run_n(url: str, n: int) -> list[dict[str, Any]]:
    a, b = _fixture("hello.wav"), _fixture("stop.wav")
    return list(await asyncio.gather(*(one_session(url, a, b) for _ in range(n))))


def aggregate(n: int, sessions: list[dict[str, Any]], silence_ms: int) -> dict[str, Any]:
    ok = [s for s in sessions if "error" not in s]

    def flat(key: str) -> list[float]:
        values: list[float] = []
        for s in ok:
            v = s.get(key)
            values += v if isinstance(v, list) else [] if v is None else [v]
        return values

    return {
        "sessions": n,
        "completed_checks": len(ok),
        "errors": [s.get("error") for s in sessions if "error" in s][:5],
        "vad_onset_ms": summary(flat("vad_onset_ms")),
        "vad_offset_ms": summary(flat("vad_offset_ms")),
        "vad_offset_minus_silence_ms": summary([v - silence_ms for v in flat("vad_offset_ms")]),
        "first_audio_after_speech_stopped_ms": summary(flat("first_audio_ms")),
        "first_audio_made_after_speech_stopped_ms": summary(flat("first_audio_made_ms")),
        "audio_transport_ms": summary(flat("transport_ms")),
        "barge_in_to_done_ms": summary(flat("barge_in_to_done_ms")),
        "barge_in_to_last_delta_ms": summary(flat("barge_in_to_last_delta_ms")),
        "detection_to_done_ms": summary(flat("detection_to_done_ms")),
        "rtf": summary(flat("rtf")),
        "underruns": summary(flat("underruns")),
        "underrun_ms": summary(flat("underrun_ms")),
        "max_delta_gap_ms": summary(flat("max_delta_gap_ms")),
        "buffered_at_arrival_ms": summary(flat("answer_lead_ms")),
        "sessions_with_underruns": sum(1 for s in ok if s.get("underruns")),
        # [delta index, ms after the first delta, ms dry, audio ms before it], ≤ 10 sessions
        "underrun_at": [s["underrun_at"] for s in ok if s.get("underrun_at")][:10],
        "session_seconds": round(sum(s.get("session_s", 0.0) for s in sessions), 1),
    }


def _role(cmd: str) -> str:
    if "--realtime" in cmd:
        return "realtime_worker"
    if " api" in cmd:
        return "api"
    if "valkey" in cmd:
        return "valkey"
    return "job_worker" if " worker" in cmd else "other_stack"


def _stack(up_pid: int | None) -> list[tuple[str, psutil.Process]]:
    if up_pid is None:
        return []
    out = []
    for proc in psutil.Process(up_pid).children(recursive=True):
        try:
            out.append((_role(" ".join(proc.cmdline())), proc))
        except psutil.Error:
            continue
    return out


def _cpu_by_process(up_pid: int | None) -> dict[str, float]:
    """CPU seconds so far: this client, and each process of the stack by its role."""
    out = {"client": sum(psutil.Process().cpu_times()[:2])}
    for role, proc in _stack(up_pid):
        try:
            used = sum(proc.cpu_times()[:2])
        except psutil.Error:
            continue
        out[role] = out.get(role, 0.0) + used
    return out


def _threads(up_pid: int | None) -> dict[str, dict[int, tuple[float, int, int]]]:
    """Per role, per thread id: (CPU seconds, voluntary, involuntary context switches) so
    far, from /proc (Linux; elsewhere empty)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, dict[int, tuple[float, int, int]]] = {}
    for role, proc in _stack(up_pid):
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            try:
                stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = (task / "status").read_text()
            except OSError:
                continue
            cpu = (int(stat[11]) + int(stat[12])) / tick  # utime, stime
            v = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            i = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            out.setdefault(role, {})[int(task.name)] = (cpu, v, i)
    return out


def _thread_report(
    before: dict[str, dict[int, tuple[float, int, int]]],
    after: dict[str, dict[int, tuple[float, int, int]]],
    wall: float,
) -> dict[str, Any]:
    """Per role over the level: threads that ran, the busiest threads' CPU seconds, and
    context switches per second (voluntary, involuntary), all threads together."""
    report: dict[str, Any] = {}
    for role, threads in after.items():
        old = before.get(role, {})
        deltas = [
            tuple(a - b for a, b in zip(now, old.get(tid, (0.0, 0, 0)), strict=True))
            for tid, now in threads.items()
        ]
        busy = sorted((d for d in deltas if d[0] > 0), key=lambda d: -d[0])
        report[role] = {
            "threads_that_ran": len(busy),
            "busiest_threads_cpu_s": [round(d[0], 2) for d in busy[:5]],
            "context_switches_per_s": [
                round(sum(d[1] for d in deltas) / wall),
                round(sum(d[2] for d in deltas) / wall),
            ],
        }
    return report


def _cores_used(before: dict[str, float], after: dict[str, float], wall: float) -> dict:
    return {k: round((after[k] - before.get(k, 0.0)) / wall, 2) for k in after}


def _cpu_ms_per_session_s(
    before: dict[str, float], after: dict[str, float], session_s: float
) -> dict[str, float]:
    """CPU ms each role spent per second of one session (its socket open → closed)."""
    if session_s <= 0:
        return {}
    return {k: round((after[k] - before.get(k, 0.0)) * 1000 / session_s, 1) for k in after}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--sessions", default="1,10,20,50", help="comma-separated concurrency levels")
    p.add_argument("--url", default=None, help="use a running server instead of starting one")
    p.add_argument(
        "--realtime-workers",
        type=int,
        default=1,
        help="realtime worker processes; the sessions' slots are split among them",
    )
    p.add_argument(
        "--api-processes",
        type=int,
        default=1,
        help="API processes on the one port (SO_REUSEPORT spreads the sessions over them)",
    )
    args = p.parse_args()
    levels = [int(x) for x in args.sessions.split(",") if x]
    data_dir = Path(tempfile.mkdtemp(prefix="oq-rta-bench-"))
    up = None
    if args.url:
        url = args.url
    else:
        slots = -(-max(levels) // args.realtime_workers)
        up, url = start_up(
            data_dir,
            env={"OMNIQ_REALTIME__SLOTS": str(slots)},
            args=[
                "--realtime-workers",
                str(args.realtime_workers),
                "--api-processes",
                str(args.api_processes),
            ],
        )
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?model=reference/voice"
    report: dict[str, Any] = {
        "machine": machine(),
        "fixtures": ["hello.wav", "stop.wav (barge-in)"],
        "slots": max(levels),
        "realtime_workers": args.realtime_workers,
        "api_processes": args.api_processes,
        "results": [],
    }
    try:
        asyncio.run(run_n(ws_url, 1))  # warm-up: loads the VAD and the voice pipeline
        for n in levels:
            print(f"running {n} session(s)…", file=sys.stderr, flush=True)
            pid = up.pid if up else None
            before, t0 = _cpu_by_process(pid), time.monotonic()
            threads = _threads(pid)
            result = aggregate(n, asyncio.run(run_n(ws_url, n)), 500)
            wall = time.monotonic() - t0
            after = _cpu_by_process(pid)
            result["cores_used"] = _cores_used(before, after, wall)
            result["cpu_ms_per_session_second"] = _cpu_ms_per_session_s(
                before, after, result["session_seconds"]
            )
            result["threads"] = _thread_report(threads, _threads(pid), wall)
            report["results"].append(result)
        print(json.dumps(report, indent=2))
    finally:
        if up is not None:
            stop_up(up, data_dir)


if __name__ == "__main__":
    main()
