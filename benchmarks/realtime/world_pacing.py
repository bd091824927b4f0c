"""How far a ``WS /v1/realtime/video`` session's generation runs ahead of playback, and
how soon a key press reaches the screen: the World page's experience, measured.

    omniqueue up --port 18800 &
    python -m benchmarks.realtime.world_pacing --url http://127.0.0.1:18800  # the server's pacing
    python -m benchmarks.realtime.world_pacing --url http://127.0.0.1:18800 \\
        --max-chunks-ahead 0                                                 # unpaced

The client plays in real time from the first chunk's arrival and stalls when it runs dry,
as the page's video element does. At every chunk: ``ahead_s`` = video received − playback
position. A ``w`` goes up
``--key-at`` seconds into playback; ``key_to_screen_s`` = the playback time of the first
chunk that started it − the playback time at the press. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from websockets.sync.client import connect


def run(url: str, seconds: float, size: str, key_at: float, lead: int | None) -> dict[str, Any]:
    width, height = (int(v) for v in size.split("x"))
    fps = 16
    start: dict[str, Any] = {
        "type": "session.start",
        "model": "reference/world",
        "prompt": "a red ball in a green field",
        "width": width,
        "height": height,
        "num_frames": round(seconds * fps),
        "fps": fps,
        "seed": 1,
    }
    if lead is not None:
        start["extra_params"] = {"max_chunks_ahead": lead}
    ws_url = url.replace("http", "ws", 1) + "/v1/realtime/video"
    samples: list[dict[str, float]] = []
    key_sent: float | None = None
    key_applied: float | None = None  # set only once key_sent is
    last: float | None = None
    played = 0.0  # the simulated player's position, seconds of video
    video_s = 0.0
    late: list[str] = []
    with connect(ws_url, max_size=64 * 2**20) as ws:
        ws.send(json.dumps(start))
        while True:
            message = ws.recv(timeout=60)
            assert isinstance(message, str)
            event = json.loads(message)
            if event["type"] == "video.chunk_metadata":
                ws.recv(timeout=60)  # its binary frame
                now = time.monotonic()
                if event["kind"] != "media":
                    continue
                if last is not None:  # real time passes; a dry player waits
                    played = min(played + (now - last), video_s)
                last = now
                chunk_start = video_s
                video_s += event["num_frames"] / fps
                ahead = round(video_s - played, 3)
                samples.append({"played_s": round(played, 3), "ahead_s": ahead})
                if key_sent is not None and "w" in event["started_event_ids"]:
                    key_applied = chunk_start
                if key_sent is None and played >= key_at:
                    key_sent = played
                    camera = [["w"], ["w"], ["w"]]
                    interaction = {"event_id": "w", "event": {"camera": camera}}
                    ws.send(json.dumps({"type": "session.interaction", "interaction": interaction}))
            elif event["type"] == "error":
                late.append(event.get("code", "?"))
            elif event["type"] == "session.done":
                break
    chunk_s = 12 / fps
    at_key = [s for s in samples if s["played_s"] <= key_at]
    return {
        "lead_chunks_asked": lead,
        "clip_s": round(video_s, 3),
        "chunks": len(samples),
        "max_ahead_s": max(s["ahead_s"] for s in samples),
        "max_ahead_chunks": round(max(s["ahead_s"] for s in samples) / chunk_s, 2),
        "ahead_s_at_key": at_key[-1]["ahead_s"] if at_key else None,
        "key_pressed_at_s": key_sent,
        "key_to_screen_s": (
            None if key_applied is None or key_sent is None else round(key_applied - key_sent, 3)
        ),
        "errors": late,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--size", default="480x272")
    parser.add_argument("--key-at", type=float, default=4.0)
    parser.add_argument("--max-chunks-ahead", type=int, default=None)
    args = parser.parse_args()
    result = run(args.url, args.seconds, args.size, args.key_at, args.max_chunks_ahead)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
