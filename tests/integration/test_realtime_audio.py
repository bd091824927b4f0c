"""``WS /v1/realtime`` end to end with the OpenAI Python SDK's own realtime client: the API
process (silero VAD, the protocol), Redis Streams and a realtime worker process running
``reference/voice``. Speech is real: espeak-ng recordings (tests/fixtures/speech)."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import ClientConnection, connect

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.unit.realtime_client import RESPONSE_END  # the order the protocol tests pin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIXTURES = Path(__file__).parents[1] / "fixtures" / "speech"
TRUTH = {f["file"]: f for f in json.loads((FIXTURES / "fixtures.json").read_text())["fixtures"]}
CHUNK = 2400 * 2  # 100 ms of PCM16 at 24 kHz
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


def pcm(name: str) -> bytes:
    with wave.open(str(FIXTURES / name)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return w.readframes(w.getnframes())


@pytest.fixture(scope="module")
def rstack(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, redis_db: int
) -> Iterator[Stack]:
    env = {
        "OMNIQ_REALTIME__SLOTS": "2",
        # long enough that the session admitted on a freed slot makes it on a loaded CI box
        # (at 3 s it was refused there once); the refused one waits this long
        "OMNIQ_REALTIME__ADMISSION_TIMEOUT_S": "6",
        "OMNIQ_REALTIME__LOST_AFTER_S": "3",
        "OMNIQ_REALTIME__KEEPALIVE_S": "0.5",
        "OMNIQ_REALTIME__RESUME_GRACE_S": "10",
    }
    work = Path(tmp_path_factory.mktemp("realtime-audio"))
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=0, realtime_workers=1)
        yield st


def sdk(st: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=st.url + "/v1", api_key="not-needed-auth-is-off", max_retries=0)


def sdk_key(st: Stack, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=st.url + "/v1", api_key=key, max_retries=0)


def as_dict(event: Any) -> dict[str, Any]:
    return dict(event.model_dump(mode="json", exclude_unset=True))


async def until(conn: Any, kind: str, seen: list[dict[str, Any]], timeout: float = 30) -> dict:
    async def _wait() -> dict[str, Any]:
        while True:
            event = as_dict(await conn.recv())
            seen.append(event)
            if event["type"] == kind:
                return event

    return await asyncio.wait_for(_wait(), timeout)


async def stream(conn: Any, audio: bytes, pace_s: float = 0.0) -> None:
    for i in range(0, len(audio), CHUNK):
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + CHUNK]).decode())
        if pace_s:
            await asyncio.sleep(pace_s)


def test_speech_turn_with_server_vad_gets_a_complete_response(rstack: Stack) -> None:
    async def run() -> list[dict[str, Any]]:
        async with sdk(rstack).realtime.connect(model="reference/voice") as conn:
            seen: list[dict[str, Any]] = []
            created = await until(conn, "session.created", seen)
            assert created["session"]["model"] == "reference/voice"
            await conn.session.update(
                session={
                    "type": "realtime",
                    "instructions": "be brief",
                    "audio": {"output": {"voice": "marin"}},
                }
            )
            updated = await until(conn, "session.updated", seen)
            assert updated["session"]["audio"]["output"]["voice"] == "marin"
            await stream(conn, pcm("hello.wav"))
            await until(conn, "response.done", seen)
            return seen

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    truth = TRUTH["hello.wav"]
    started = events[kinds.index("input_audio_buffer.speech_started")]
    stopped = events[kinds.index("input_audio_buffer.speech_stopped")]
    # audio_start_ms includes the 300 ms prefix padding; audio_end_ms the 500 ms silence
    assert abs(started["audio_start_ms"] + 300 - truth["onset_ms"]) <= 150
    assert abs(stopped["audio_end_ms"] - 500 - truth["offset_ms"]) <= 250
    assert started["item_id"] == stopped["item_id"]
    i = kinds.index("input_audio_buffer.committed")
    assert kinds[i : i + 7] == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert kinds[-6:] == RESPONSE_END
    done = events[-1]["response"]
    assert done["status"] == "completed"
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) > 24000  # more than half a second of speech-like audio
    transcript = events[kinds.index("response.output_audio_transcript.done")]["transcript"]
    deltas = "".join(
        e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"
    )
    assert transcript and transcript == deltas
    assert done["output"][0]["content"][0]["transcript"] == transcript


def test_barge_in_cancels_the_response_with_turn_detected(rstack: Stack) -> None:
    async def run() -> list[dict[str, Any]]:
        async with sdk(rstack).realtime.connect(model="reference/voice") as conn:
            seen: list[dict[str, Any]] = []
            await stream(conn, pcm("hello.wav"))
            await until(conn, "response.output_audio.delta", seen)
            # speak over the answer (paced as a microphone would send it)
            talker = asyncio.create_task(stream(conn, pcm("stop.wav"), pace_s=0.1))
            await until(conn, "response.done", seen)
            await talker
            await until(conn, "response.done", seen)  # the answer to the interrupting turn
            return seen

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    first_done = kinds.index("response.done")
    cancelled = events[first_done]["response"]
    assert cancelled["status"] == "cancelled"
    assert cancelled["status_details"]["reason"] == "turn_detected"
    barge = kinds.index("input_audio_buffer.speech_started", kinds.index("response.created"))
    assert barge < first_done
    # no audio of the cancelled response after the barge-in was detected
    rid = cancelled["id"]
    late = [
        e
        for e in events[barge:first_done]
        if e["type"] == "response.output_audio.delta" and e["response_id"] == rid
    ]
    assert late == []
    assert events[-1]["response"]["status"] == "completed"


def test_response_cancel_and_truncate_with_manual_turns(rstack: Stack) -> None:
    async def run() -> list[dict[str, Any]]:
        async with sdk(rstack).realtime.connect(model="reference/voice") as conn:
            seen: list[dict[str, Any]] = []
            await conn.session.update(session=MANUAL)
            await until(conn, "session.updated", seen)
            await conn.response.cancel()
            err = await until(conn, "error", seen)
            assert err["error"]["code"] == "response_cancel_not_active"
            await stream(conn, pcm("weather.wav"))
            await conn.input_audio_buffer.commit()
            await until(conn, "input_audio_buffer.committed", seen)
            await conn.response.create()
            await until(conn, "response.output_audio.delta", seen)
            await conn.response.cancel()
            done = await until(conn, "response.done", seen)
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"]["reason"] == "client_cancelled"
            # the session goes on: a second response completes
            await conn.response.create()
            done = await until(conn, "response.done", seen)
            assert done["response"]["status"] == "completed"
            item_id = done["response"]["output"][0]["id"]
            await conn.conversation.item.truncate(
                item_id=item_id, content_index=0, audio_end_ms=600_000
            )
            err = await until(conn, "error", seen)
            assert err["error"]["param"] == "audio_end_ms"
            await conn.conversation.item.truncate(
                item_id=item_id, content_index=0, audio_end_ms=200
            )
            truncated = await until(conn, "conversation.item.truncated", seen)
            assert truncated["audio_end_ms"] == 200
            await conn.conversation.item.retrieve(item_id=item_id)
            got = await until(conn, "conversation.item.retrieved", seen)
            assert len(base64.b64decode(got["item"]["content"][0]["audio"])) == 200 * 48
            return seen

    asyncio.run(run())


async def _raw(st: Stack, path: str) -> ClientConnection:
    return await connect(st.url.replace("http://", "ws://") + path, max_size=32 * 1024 * 1024)


async def _json(ws: ClientConnection, timeout: float = 30) -> dict[str, Any]:
    return dict(json.loads(await asyncio.wait_for(ws.recv(), timeout)))


def test_duplex_resume_replays_missed_events_exactly_once(rstack: Stack) -> None:
    """The OpenAI SDK's client, unchanged, on the duplex extension: connect with
    ``duplex=1``, lose the network mid-answer, reconnect and ``session.resume``."""

    async def recv(conn: Any) -> dict[str, Any]:
        # raw JSON: the extension's events are not in the SDK's union of event types
        return dict(json.loads(await asyncio.wait_for(conn.recv_bytes(), 30)))

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        client = sdk(rstack)
        duplex = {"duplex": "1"}
        first = await client.realtime.connect(model="reference/voice", extra_query=duplex).enter()
        created = await recv(first)
        session = created["session"]
        assert session["capabilities"]["supports_session_resume"] is True
        before = [created]
        await first.session.update(session=MANUAL)
        await first.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "tell me about the sea"}],
            }
        )
        await first.response.create()
        while before[-1]["type"] != "response.output_audio.delta":
            before.append(await recv(first))
        first._connection.transport.abort()  # a dropped network, no close handshake
        await asyncio.sleep(1.0)  # the answer goes on while nobody listens
        last = before[-1]["server_event_seq"]
        second = await client.realtime.connect(model="reference/voice", extra_query=duplex).enter()
        fresh = await recv(second)
        assert fresh["type"] == "session.created" and fresh["session"]["id"] != session["id"]
        await second.send(
            {
                "type": "session.resume",
                "session_id": session["id"],
                "resume_token": session["resume_token"],
                "last_received_server_event_seq": last,
            }
        )
        after = [await recv(second)]
        while after[-1]["type"] != "response.done":
            after.append(await recv(second))
        await second.send({"type": "session.heartbeat"})
        after.append(await recv(second))
        await second.send({"type": "session.close", "reason": "done"})
        after.append(await recv(second))
        await second.close()
        return before, after

    before, after = asyncio.run(run())
    resumed = after[0]
    assert resumed["type"] == "session.resumed"
    # the replayed events, then (on a loaded machine the answer may still run) live ones
    following = after[1:-2]
    replayed = following[: resumed["replayed"]]
    assert replayed and replayed[-1]["server_event_seq"] == resumed["last_server_event_seq"]
    seqs = [e["server_event_seq"] for e in before] + [e["server_event_seq"] for e in following]
    assert seqs == list(range(1, len(seqs) + 1))  # every event once, in order, none missing
    assert following[-1]["response"]["status"] == "completed"
    assert after[-2]["type"] == "session.heartbeat_ack"
    assert after[-1] == {**after[-1], "type": "session.closed", "reason": "done"}


def test_resume_with_a_wrong_token_asks_for_resync(rstack: Stack) -> None:
    async def run() -> dict[str, Any]:
        ws = await _raw(rstack, "/v1/duplex")
        created = await _json(ws)
        await ws.close()
        ws2 = await _raw(rstack, "/v1/duplex")
        await _json(ws2)
        await ws2.send(
            json.dumps(
                {
                    "type": "session.resume",
                    "session_id": created["session"]["id"],
                    "resume_token": "wrong",
                    "last_received_server_event_seq": 1,
                }
            )
        )
        reply = await _json(ws2)
        await ws2.close()
        return reply

    assert asyncio.run(run())["type"] == "session.resync_required"


def test_sessions_beyond_the_worker_slots_get_resource_exhausted(rstack: Stack) -> None:
    async def run() -> tuple[dict[str, Any], dict[str, Any], int | None]:
        held = []
        for _ in range(2):
            ws = await _raw(rstack, "/v1/realtime?model=reference/voice")
            await _json(ws)
            held.append(ws)
        await asyncio.sleep(1.0)  # both placed on the worker's two slots
        third = await _raw(rstack, "/v1/realtime?model=reference/voice")
        await _json(third)  # session.created
        error = await _json(third, timeout=15)
        await asyncio.wait_for(third.wait_closed(), 10)
        code = third.close_code
        # a client that goes away frees its slot: the next session is admitted and answers
        await held[0].close()
        await asyncio.sleep(1.0)
        fourth = await _raw(rstack, "/v1/realtime?model=reference/voice")
        await _json(fourth)
        await fourth.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "hi"}],
                    },
                }
            )
        )
        await fourth.send(json.dumps({"type": "response.create"}))
        while (done := await _json(fourth))["type"] != "response.done":
            pass
        for ws in (held[1], fourth):
            await ws.close()
        return error, done, code

    error, done, code = asyncio.run(run())
    assert error["type"] == "error" and error["error"]["code"] == "resource_exhausted"
    assert code == 1013
    assert done["response"]["status"] == "completed"


def test_auth_by_bearer_header_or_browser_subprotocol(stack: Stack) -> None:
    """The main stack requires keys (it has no realtime worker: only the handshake and
    ``session.created`` are checked here)."""
    from websockets.exceptions import InvalidStatus

    key = stack.create_key("realtime-auth")

    async def run() -> tuple[str, str, str | None]:
        async with sdk_key(stack, key).realtime.connect(model="reference/voice") as conn:
            by_header = as_dict(await conn.recv())["type"]
        url = stack.url.replace("http://", "ws://") + "/v1/realtime?model=reference/voice"
        protocols = ["realtime", f"openai-insecure-api-key.{key}"]
        async with connect(url, subprotocols=protocols) as ws:
            by_protocol = json.loads(await ws.recv())["type"]
            chosen = ws.subprotocol
        with pytest.raises(InvalidStatus):
            async with connect(url, additional_headers={"Authorization": "Bearer oq_wrong"}):
                pass
        return by_header, by_protocol, chosen

    by_header, by_protocol, chosen = asyncio.run(run())
    assert by_header == by_protocol == "session.created"
    assert chosen == f"openai-insecure-api-key.{key}"


def test_unknown_model_is_refused(rstack: Stack) -> None:
    async def run() -> dict[str, Any]:
        ws = await _raw(rstack, "/v1/realtime?model=nope")
        return await _json(ws)

    error = asyncio.run(run())
    assert error["error"]["code"] == "model_not_found" and error["error"]["param"] == "model"


def test_hostile_json_is_an_error_event_and_the_session_goes_on(rstack: Stack) -> None:
    async def run() -> list[dict[str, Any]]:
        ws = await _raw(rstack, "/v1/realtime?model=reference/voice")
        try:
            assert (await _json(ws))["type"] == "session.created"
            errors = []
            for hostile in (
                "[" * 100_000,
                '{"type": "session.update", "session": {"instructions": ' + "9" * 5000 + "}}",
                '{"type": "session.update", "session": {"instructions": "\\ud800"}}',
            ):
                await ws.send(hostile)
                errors.append(await _json(ws))
            # the session is still open and still works
            await ws.send(json.dumps({"type": "session.update", "session": MANUAL}))
            updated = await _json(ws)
            assert updated["type"] == "session.updated"
            return errors
        finally:
            await ws.close()

    errors = asyncio.run(run())
    assert [e["type"] for e in errors] == ["error"] * 3
    assert {e["error"]["type"] for e in errors} == {"invalid_request_error"}
    assert errors[2]["error"]["param"] == "session.instructions"


def test_beta_session_shape_from_the_sdks_beta_client(rstack: Stack) -> None:
    """``client.beta.realtime`` sends the beta session shape: ``turn_detection: null`` at
    the session's top level must turn server VAD off (it was dropped, VAD stayed on)."""

    async def recv(conn: Any) -> dict[str, Any]:
        return dict(json.loads(await asyncio.wait_for(conn.recv_bytes(), 30)))

    async def until_beta(conn: Any, kind: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
        while True:
            event = await recv(conn)
            seen.append(event)
            if event["type"] == kind:
                return event

    async def run() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        client = AsyncOpenAI(
            base_url=rstack.url + "/v1",
            websocket_base_url=rstack.url.replace("http://", "ws://") + "/v1",
            api_key="not-needed-auth-is-off",
            max_retries=0,
        )
        async with client.beta.realtime.connect(model="reference/voice") as conn:
            seen: list[dict[str, Any]] = []
            await until_beta(conn, "session.created", seen)
            await conn.session.update(session={"turn_detecton": None})  # a typo
            error = await until_beta(conn, "error", seen)
            await conn.session.update(
                session={
                    "modalities": ["text", "audio"],
                    "instructions": "be brief",
                    "voice": "ash",
                    "input_audio_format": "pcm16",
                    "output_audio_format": "pcm16",
                    "turn_detection": None,
                }
            )
            updated = await until_beta(conn, "session.updated", seen)
            # speech and a long silence: with VAD off nothing is detected or answered
            await stream(conn, pcm("hello.wav") + bytes(24000 * 2 * 2))
            await conn.input_audio_buffer.commit()
            await until_beta(conn, "input_audio_buffer.committed", seen)
            await conn.response.create()
            await until_beta(conn, "response.done", seen)
            return error, updated, seen

    error, updated, seen = asyncio.run(run())
    assert error["error"]["code"] == "unknown_parameter"
    assert error["error"]["param"] == "session.turn_detecton"
    session = updated["session"]
    assert session["audio"]["input"]["turn_detection"] is None
    assert session["audio"]["output"]["voice"] == "ash"
    assert session["output_modalities"] == ["audio"] and session["instructions"] == "be brief"
    kinds = [e["type"] for e in seen]
    assert "input_audio_buffer.speech_started" not in kinds
    assert kinds.count("response.created") == 1  # only the one asked for
    assert seen[-1]["response"]["status"] == "completed"


def test_worker_death_ends_the_session_with_an_error(rstack: Stack) -> None:
    async def run() -> dict[str, Any]:
        ws = await _raw(rstack, "/v1/realtime?model=reference/voice")
        await _json(ws)
        await asyncio.sleep(1.0)
        rstack.stop_process("rt0", sig=signal.SIGKILL)
        while True:
            event = await _json(ws, timeout=20)
            if event["type"] == "error":
                return event

    error = asyncio.run(run())
    assert error["error"]["code"] == "worker_lost"
