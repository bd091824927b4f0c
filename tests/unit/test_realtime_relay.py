"""The /v1/realtime relay joins consecutive audio steps of one response into one delta."""

from __future__ import annotations

from api.realtime.voice_session import coalesce
from models.session_bus import (
    KeepaliveOutput,
    ResponseAudioOutput,
    ResponseFinishedOutput,
    SessionOutput,
)
from storage.bus import BusMessage


def audio(
    i: int, rid: str = "r1", text: str | None = None, data: bytes = b""
) -> BusMessage[SessionOutput]:
    output = ResponseAudioOutput(response_id=rid, produced_at=float(i), text=text)
    return BusMessage(f"{i}-0", output, data or None)


def test_consecutive_audio_of_one_response_is_joined_in_order() -> None:
    finished = ResponseFinishedOutput(response_id="r1", status="completed")
    got = coalesce(
        [
            audio(1, text="I ", data=b"aa"),
            audio(2, data=b"bb"),
            audio(3, text="heard ", data=b"cc"),
            BusMessage("4-0", finished),
            audio(5, rid="r2", data=b"dd"),
            audio(6, rid="r3", data=b"ee"),
        ]
    )
    assert [(o.type, getattr(o, "response_id", None)) for o, _ in got] == [
        ("audio", "r1"),
        ("response_finished", "r1"),
        ("audio", "r2"),
        ("audio", "r3"),
    ]
    first, pcm = got[0]
    assert isinstance(first, ResponseAudioOutput)
    assert pcm == b"aabbcc" and first.text == "I heard " and first.produced_at == 1.0
    assert got[1][0] is finished


def test_a_single_step_is_passed_through_uncopied() -> None:
    one = audio(1, text="hi", data=b"aa")
    assert coalesce([one]) == [(one.event, b"aa")]
    assert coalesce([one])[0][0] is one.event


def test_nothing_to_join() -> None:
    assert coalesce([]) == []
    keepalive = BusMessage("1-0", KeepaliveOutput())
    assert coalesce([keepalive]) == [(keepalive.event, None)]
