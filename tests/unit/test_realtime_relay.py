"""The /v1/realtime relay joins consecutive audio steps of one response into one delta."""

from __future__ import annotations

from api.routes.realtime import _coalesce
from storage.bus import BusEntry


def entry(
    i: int, kind: str, rid: str = "r1", text: str | None = None, data: bytes = b""
) -> BusEntry:
    event = {"type": kind, "response_id": rid, "produced_at": float(i), "text": text}
    return BusEntry(f"{i}-0", event, data or None)


def test_consecutive_audio_of_one_response_is_joined_in_order() -> None:
    got = _coalesce(
        [
            entry(1, "audio", text="I ", data=b"aa"),
            entry(2, "audio", data=b"bb"),
            entry(3, "audio", text="heard ", data=b"cc"),
            entry(4, "response_finished"),
            entry(5, "audio", rid="r2", data=b"dd"),
            entry(6, "audio", rid="r3", data=b"ee"),
        ]
    )
    assert [(e["type"], e["response_id"]) for e, _ in got] == [
        ("audio", "r1"),
        ("response_finished", "r1"),
        ("audio", "r2"),
        ("audio", "r3"),
    ]
    first, pcm = got[0]
    assert pcm == b"aabbcc" and first["text"] == "I heard " and first["produced_at"] == 1.0


def test_nothing_to_join() -> None:
    assert _coalesce([]) == []
    one = entry(1, "keepalive")
    assert _coalesce([one]) == [(one.event, None)]
