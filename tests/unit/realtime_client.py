"""A scripted client of the ``WS /v1/realtime`` state machine for the sans-I/O tests
(``test_realtime_session.py``, ``test_realtime_turns.py``, ``test_realtime_duplex.py``).

Every OpenAI event the machine emits is validated against the OpenAI Python SDK's own
event model of that type (``openai.types.realtime``), so a drift from the GA wire shape
fails in every test that drives it. The voice-activity detector is scripted (the real one
is tested in ``test_vad.py`` on speech fixtures).
"""

from __future__ import annotations

import base64
import json
import typing
from dataclasses import dataclass
from typing import Any

from openai.types.realtime import RealtimeServerEvent

from realtime.audio_protocol import Respond, VoiceSessionOptions, VoiceSessionProtocol
from realtime.input_audio import BYTES_PER_MS


def _sdk_classes() -> dict[str, type]:
    union = typing.get_args(RealtimeServerEvent)[0]
    out = {}
    for cls in typing.get_args(union):
        literal = cls.model_fields["type"].annotation
        out[typing.get_args(literal)[0]] = cls
    return out


SDK = _sdk_classes()
EXTENSIONS = {
    "session.heartbeat_ack",
    "session.closed",
    "session.resumed",
    "session.resync_required",
    "playback.acknowledged",
}


@dataclass
class VadEvent:
    kind: str
    audio_ms: int


class ScriptedVAD:
    """Reports speech wherever the PCM has a non-zero sample (a 10 ms grid), with the
    silence rule of the real detector."""

    def __init__(self, threshold: float, silence_duration_ms: int) -> None:
        self.threshold = threshold
        self.silence_ms = silence_duration_ms
        self.pos_ms = 0
        self.speaking = False
        self.last_voiced = 0

    def configure(self, *, threshold: float, silence_duration_ms: int) -> None:
        self.threshold, self.silence_ms = threshold, silence_duration_ms

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        events = []
        for off in range(0, len(pcm16), 10 * BYTES_PER_MS):
            voiced = any(pcm16[off : off + 10 * BYTES_PER_MS])
            if voiced:
                if not self.speaking:
                    self.speaking = True
                    events.append(VadEvent("speech_started", self.pos_ms))
                self.last_voiced = self.pos_ms + 10
            elif self.speaking and self.pos_ms + 10 - self.last_voiced >= self.silence_ms:
                self.speaking = False
                events.append(VadEvent("speech_stopped", self.last_voiced))
            self.pos_ms += 10
        return events


def speech(ms: int) -> bytes:
    return b"\x10\x00" * (ms * BYTES_PER_MS // 2)


def silence(ms: int) -> bytes:
    return b"\x00" * (ms * BYTES_PER_MS)


class Client:
    """Drives a protocol and keeps every event it emitted, checked against the SDK."""

    def __init__(self, duplex: bool = False, turn_detection: Any = "default") -> None:
        self.now = 100.0
        self.p = VoiceSessionProtocol(
            "sess_test",
            VoiceSessionOptions(model="reference/voice", duplex=duplex),
            ScriptedVAD,
            0.0,
        )
        self.events: list[dict[str, Any]] = []
        self.cmds: list[Any] = []
        self.pump()
        if turn_detection != "default":  # None (off) or a turn_detection object
            self.send(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"turn_detection": turn_detection}}},
                }
            )

    def pump(self) -> list[dict[str, Any]]:
        new = [json.loads(f) for f in self.p.data_to_send()]
        for event in new:
            if event["type"] not in EXTENSIONS:
                SDK[event["type"]].model_validate(event)
        self.events += new
        self.cmds += self.p.commands()
        return new

    def send(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        self.p.receive_text(json.dumps(event), self.now)
        return self.pump()

    def append(self, pcm: bytes) -> list[dict[str, Any]]:
        return self.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
        )

    def types(self, events: list[dict[str, Any]] | None = None) -> list[str]:
        return [e["type"] for e in (self.events if events is None else events)]

    def respond(self) -> Respond:
        responds = [c for c in self.cmds if isinstance(c, Respond)]
        assert responds
        return responds[-1]


RESPONSE_START = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
]
RESPONSE_END = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def run_response(c: Client, deltas: int = 3) -> str:
    out = c.send({"type": "response.create"})
    assert c.types(out) == RESPONSE_START
    rid = c.respond().response_id
    for i in range(deltas):
        c.p.worker_audio(rid, speech(40), f"w{i} ", 1.0)
    c.pump()
    return rid
