"""Time to the first audio byte of ``POST /v1/audio/speech`` on a fresh embedded stack
(CPU, the default model ``reference/speech``); prints one JSON object on stdout.

    python -m benchmarks.jobs.speech_ttfb                  # 40 requests per format
    python -m benchmarks.jobs.speech_ttfb --requests 10    # a quick run

Starts ``python -m cli.main up`` (one job worker) on a free port with its own temporary
data directory, sends ``--warmup`` requests that are not counted, then ``--requests``
requests one at a time for each streamed format: ``pcm`` (raw PCM16, ``stream_format``
``audio``) and ``pcm`` with ``stream_format: "sse"``, and, for comparison, ``wav`` (the
file once the job has completed). Each request speaks a paragraph of three sentences
(``--text``), a different voice each time (OpenAI's names, round robin).

Per request, from just before the request is sent: ``ttfb_ms``, when the first byte of the
body arrived (the API answers a PCM stream at its first chunk, so headers and the first
audio come together); ``total_ms``, when the body ended; and ``audio_s``, the clip's
length. Target: ``ttfb_ms`` p95 <= 150 ms for the streamed formats (issue 32 §3).
Progress goes to stderr. Ends ``up`` with SIGINT (it must exit 0).
"""

from __future__ import annotations

import base64
import json
import platform
import time
from typing import Any

import httpx

from benchmarks.common import machine, parser, summary
from benchmarks.embedded_stack import Stack, report, say

TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest. "
    "Nobody saw where it went, but the birds were singing all afternoon. "
    "In the evening the fox came home again, tired and happy."
)
VOICES = ("alloy", "ash", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer")
TARGET_P95_MS = 150.0


def one(client: httpx.Client, fmt: str, voice: str, text: str) -> dict[str, float]:
    """One request: time to the first body byte, to the end, and the audio's length."""
    body: dict[str, Any] = {"input": text, "voice": voice}
    if fmt == "sse":
        body |= {"response_format": "pcm", "stream_format": "sse"}
    else:
        body["response_format"] = fmt
    started = time.perf_counter()
    first: float | None = None
    data = bytearray()
    with client.stream("POST", "/v1/audio/speech", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{fmt}: {resp.status_code} {resp.read()!r}")
        for piece in resp.iter_bytes():
            if first is None and piece:
                first = time.perf_counter()
            data += piece
    ended = time.perf_counter()
    if fmt == "sse":
        pcm = b"".join(
            base64.b64decode(json.loads(line[6:])["audio"])
            for line in bytes(data).decode().splitlines()
            if line.startswith("data: ") and '"speech.audio.delta"' in line
        )
        audio_s = len(pcm) / 2 / 24_000
    elif fmt == "pcm":
        audio_s = len(data) / 2 / 24_000
    else:
        audio_s = (len(data) - 44) / 2 / 24_000  # RIFF/WAVE header, mono s16 24 kHz
    assert first is not None
    return {
        "ttfb_ms": (first - started) * 1000,
        "total_ms": (ended - started) * 1000,
        "audio_s": audio_s,
    }


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--requests", type=int, default=40, help="per format (default 40)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--text", default=TEXT)
    args = p.parse_args()

    stack = Stack(workers=1, args=("--realtime-workers", "0"))
    out: dict[str, Any] = {
        "benchmark": "speech_ttfb",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "platform": platform.platform(),
        "requests_per_format": args.requests,
        "text_words": len(args.text.split()),
        "target": {"ttfb_ms_p95_max": TARGET_P95_MS},
    }
    with stack.running(out), httpx.Client(base_url=stack.url, timeout=60) as client:
        model = client.get("/v1/models").json()
        out["speech_models"] = [
            m["id"] for m in model["data"] if m["id"].startswith("reference/speech")
        ]
        for i in range(args.warmup):
            one(client, "pcm", VOICES[i % len(VOICES)], args.text)
        results: dict[str, Any] = {}
        for fmt in ("pcm", "sse", "wav"):
            runs = [
                one(client, fmt, VOICES[i % len(VOICES)], args.text) for i in range(args.requests)
            ]
            results[fmt] = {
                key: summary([r[key] for r in runs], 3 if key == "audio_s" else 1)
                for key in ("ttfb_ms", "total_ms", "audio_s")
            }
            say(f"{fmt}: ttfb p95 {results[fmt]['ttfb_ms']['p95']} ms")
        out["results"] = results
        out["target_met"] = all(
            results[f]["ttfb_ms"]["p95"] <= TARGET_P95_MS for f in ("pcm", "sse")
        )
    return report(out)


if __name__ == "__main__":
    raise SystemExit(main())
