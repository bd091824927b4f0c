"""The playground at ``/`` in headless chromium, against ``omniqueue up`` with auth on:
each page does what a person would do with it, through the public API only."""

from __future__ import annotations

import json
import re
import wave
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect

from tests.browser.conftest import REACT_MS, SPEECH, Up
from tests.browser.pages import JOB_MS, media, record_statuses, submit

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

STEP_TEXT = re.compile(r"step \d+/\d+")


def api(up: Up) -> httpx.Client:
    return httpx.Client(base_url=up.url, headers={"Authorization": f"Bearer {up.key}"}, timeout=30)


def test_video_job_shows_live_progress_plays_and_downloads(page: Page, up: Up) -> None:
    page.goto(up.url + "/")
    record_statuses(page)
    card, video_id = submit(
        page, "reference/video", "a red ball bouncing", Size="128x72", Seconds="1", Steps="6"
    )
    expect(card.locator(".status")).to_have_text(re.compile("completed · 100 %"), timeout=JOB_MS)
    seen: list[str] = page.evaluate("window.seen")
    assert any(STEP_TEXT.search(text) and "in progress" in text for text in seen), seen
    assert card.locator("progress").evaluate("p => p.value") == 100
    expect(card.locator("img.preview")).to_be_visible()  # the worker's preview events
    player = card.locator("video")
    page.wait_for_function("v => v.readyState >= 2", arg=player.element_handle(), timeout=JOB_MS)
    state = media(player)
    assert state["error"] is None and abs(state["duration"] - 1.0) < 0.15, state

    with page.expect_download() as download:
        card.get_by_role("link", name="Download").click()
    saved = Path(download.value.path()).read_bytes()
    assert download.value.suggested_filename == f"{video_id}.mp4"
    with api(up) as client:
        assert saved == client.get(f"/v1/videos/{video_id}/content").content
    player.evaluate("v => new Promise(done => { v.onseeked = done; v.currentTime = 0.5; })")
    page.screenshot(path=up.artifacts / "jobs.png", full_page=True)


def test_audio_job_plays_in_an_audio_element(page: Page, up: Up) -> None:
    page.goto(up.url + "/#jobs")
    card, _ = submit(page, "reference/audio", "rain and drums at night", Seconds="1", Steps="3")
    expect(card.locator(".status")).to_have_text(re.compile("completed"), timeout=JOB_MS)
    player = card.locator("audio")
    page.wait_for_function("a => a.readyState >= 2", arg=player.element_handle(), timeout=JOB_MS)
    assert abs(media(player)["duration"] - 1.0) < 0.05
    player.evaluate("a => a.play()")
    page.wait_for_function("a => a.currentTime > 0.3", arg=player.element_handle(), timeout=10_000)


def test_cancel_from_the_page_frees_the_worker_and_the_list_pages(page: Page, up: Up) -> None:
    page.goto(up.url + "/")
    up.failpoints.write_text(json.dumps({"step:2": "pause"}))  # holds the job mid-run
    try:
        card, video_id = submit(
            page, "reference/video", "a slow kite", Size="64x48", Seconds="0.5", Steps="8"
        )
        expect(card).to_have_attribute("data-status", "in_progress", timeout=JOB_MS)
        card.get_by_role("button", name="Cancel").click()
        expect(card.locator(".status")).to_have_text("cancelled", timeout=JOB_MS)
        expect(card.get_by_role("button", name="Cancel")).to_be_hidden()
    finally:
        up.failpoints.write_text("{}")
    after, _ = submit(
        page, "reference/video", "the next one", Size="64x48", Seconds="0.5", Steps="2"
    )
    expect(after.locator(".status")).to_have_text(re.compile("completed"), timeout=JOB_MS)

    # The list is the API's own: it survives a reload, and pages with the cursor.
    with api(up) as client:
        total = len(client.get("/v1/videos", params={"limit": 100}).json()["data"])
    assert total >= 3
    page.goto(up.url + "/?limit=2")
    cards = page.locator("#video-jobs li.job")
    expect(cards).to_have_count(2)
    expect(page.locator(f'li.job[data-id="{video_id}"] .status')).to_have_text("cancelled")
    more = page.get_by_role("button", name="Older video jobs")
    for shown in range(4, total + 2, 2):
        more.click()
        expect(cards).to_have_count(min(shown, total))
    expect(more).to_be_hidden()


def test_a_job_of_two_outputs_shows_both(page: Page, up: Up) -> None:
    """A create's ``n`` outputs (made by the CLI or an SDK: the form has no ``n``) are
    each a player and a download of ``…/content?index=k``; the page showed only the
    first."""
    with api(up) as client:
        job = client.post(
            "/v1/videos",
            json={
                "model": "reference/video",
                "prompt": "two kites",
                "size": "64x48",
                "seconds": "0.5",
                "num_inference_steps": 2,
                "n": 2,
            },
        ).json()
    page.goto(up.url + "/")
    card = page.locator(f'li.job[data-id="{job["id"]}"]')
    expect(card.locator(".status")).to_have_text(re.compile("completed"), timeout=JOB_MS)
    expect(card.locator(".meta")).to_contain_text("2 outputs")
    outputs = card.locator("figure.output")
    expect(outputs).to_have_count(2)
    files = []
    for k, output in enumerate(job["outputs"]):
        figure = outputs.nth(k)
        caption = f"Output {k + 1} of 2 · seed {output['seed']}"
        expect(figure.locator("figcaption")).to_have_text(caption)
        player = figure.get_by_label(f"Output {k + 1} of {job['id']}")
        page.wait_for_function("v => v.readyState >= 2", arg=player.element_handle())
        assert abs(media(player)["duration"] - 0.5) < 0.15
        with page.expect_download() as download:
            figure.get_by_role("link", name="Download").click()
        assert download.value.suggested_filename == f"{job['id']}-{k}.mp4"
        files.append(Path(download.value.path()).read_bytes())
        with api(up) as client:
            content = client.get(f"/v1/videos/{job['id']}/content", params={"index": k})
            assert files[-1] == content.content
    assert files[0] != files[1]  # seeds seed and seed + 1


def _speech(name: str, start_ms: int, end_ms: int | None = None) -> tuple[bytes, int]:
    """The PCM16 frames of a speech fixture between two times, and its rate."""
    with wave.open(str(SPEECH / name), "rb") as w:
        rate = w.getframerate()
        frames = w.readframes(w.getnframes())
    width = 2  # mono PCM16
    end = len(frames) if end_ms is None else end_ms * rate // 1000 * width
    return frames[start_ms * rate // 1000 * width : end], rate


def _write_wav(path: Path, parts: list[tuple[bytes, int]]) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(parts[0][1])
        w.writeframes(b"".join(pcm for pcm, _ in parts))
    return path


def test_talk_with_a_wav_file_gets_an_answer_and_barge_in_cancels_it(
    page: Page, up: Up, tmp_path: Path
) -> None:
    # The reference voice answers 0.6 s + half the turn's length, in real time. With the
    # fixtures as recorded (0.6 s of silence before the words) the interruption's speech
    # was detected about when a 3 s question's answer had ended, and a loaded CI machine
    # saw the answer complete first (nothing left to cancel). So the question is two
    # sentences (a longer answer) and the interruption starts 0.1 s before its words.
    question = _write_wav(
        tmp_path / "question.wav",
        [_speech("hello.wav", 0, 2100), _speech("weather.wav", 500)],
    )
    interruption = _write_wav(tmp_path / "stop_now.wav", [_speech("stop.wav", 500)])
    page.goto(up.url + "/#talk")
    talk = page.locator("#talk")
    talk.get_by_role("button", name="Connect", exact=True).click()
    expect(page.locator("#talk-conn")).to_have_text("open")
    wav = talk.get_by_label("WAV file")
    wav.set_input_files(question)
    talk.get_by_role("button", name="Send file").click()
    answer = page.locator("#talk-answer")
    expect(answer).to_have_attribute("data-state", "speaking", timeout=30_000)
    expect(page.locator("#talk-vad")).to_have_text("silence")
    wav.set_input_files(interruption)  # speak over the answer
    talk.get_by_role("button", name="Send file").click()
    expect(page.locator("#talk-log")).to_contain_text("cancelled (turn_detected)", timeout=30_000)
    expect(answer).to_have_text("completed", timeout=30_000)  # the answer to "stop…"
    # the answer's audio in one unit, labelled: as much played as received once it ends
    # (it said "Heard 1720 ms", the session's total, beside "2.2 s received")
    played = re.compile(r"^(\d+\.\d) s received · \1 s played$")
    expect(page.locator("#talk-audio")).to_have_text(played, timeout=30_000)
    assert float(page.locator("#talk-audio").inner_text().split()[0]) > 0
    page.screenshot(path=up.artifacts / "talk.png", full_page=True)


def test_talk_says_no_speech_detected_and_offers_the_bundled_samples(
    page: Page, up: Up, tmp_path: Path
) -> None:
    silent = tmp_path / "silence.wav"
    with wave.open(str(silent), "wb") as w:  # 2 s of 24 kHz PCM16 zeros
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(bytes(2 * 48000))
    page.goto(up.url + "/#talk")
    talk = page.locator("#talk")
    talk.get_by_role("button", name="Connect", exact=True).click()
    expect(page.locator("#talk-conn")).to_have_text("open")
    talk.get_by_label("WAV file").set_input_files(silent)
    talk.get_by_role("button", name="Send file").click()
    log = page.locator("#talk-log")
    expect(log).to_contain_text("no speech detected in silence.wav", timeout=15_000)
    expect(page.locator("#talk-vad")).to_have_text("no speech detected")
    expect(page.locator("#talk-answer")).to_have_text("–")  # nothing was answered
    # without a microphone or a file: a bundled sample
    talk.get_by_label("No microphone? A sample").select_option("weather.wav")
    talk.get_by_role("button", name="Send sample").click()
    expect(log).to_contain_text("sending weather.wav")
    expect(page.locator("#talk-answer")).to_have_text("completed", timeout=30_000)
    expect(log).not_to_contain_text("no speech detected in weather.wav")


def test_talk_with_the_microphone_gets_an_answer(page: Page, up: Up) -> None:
    page.goto(up.url + "/#talk")
    talk = page.locator("#talk")
    talk.get_by_role("button", name="Connect", exact=True).click()
    expect(page.locator("#talk-conn")).to_have_text("open")
    mic = talk.get_by_role("button", name="Microphone")
    mic.click()  # Web Audio at 24 kHz → PCM16 appends; the fake device plays hello.wav
    expect(mic).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#talk-log")).to_contain_text("turn committed", timeout=30_000)
    expect(page.locator("#talk-answer")).to_have_text("completed", timeout=30_000)
    mic.click()
    expect(mic).to_have_attribute("aria-pressed", "false")


def _chunks_at_least(page: Page, count: int) -> None:
    page.wait_for_function(
        f"Number(document.getElementById('world-chunks').textContent) >= {count}",
        timeout=JOB_MS,
    )


def _start_messages(page: Page) -> list[dict[str, Any]]:
    """The ``session.start`` messages the page sends from now on."""
    starts: list[dict[str, Any]] = []

    def sent(payload: str | bytes) -> None:
        if isinstance(payload, str) and '"session.start"' in payload:
            starts.append(json.loads(payload))

    page.on("websocket", lambda ws: ws.on("framesent", sent))
    return starts


def test_world_runs_until_stop_plays_through_mse_and_w_and_a_prompt_are_acknowledged(
    page: Page, up: Up
) -> None:
    """A world runs until Stop: it asks for the model's longest rollout (reference/world:
    957 frames, 80 chunks), so a key pressed after the old 6 s default (8 chunks) still
    steers it."""
    starts = _start_messages(page)
    page.goto(up.url + "/#world")
    world = page.locator("#world")
    expect(page.locator("#world-limit")).to_have_text(
        "Runs until Stop, at most 957 frames (59.8 s) a session: the server's limit for this model."
    )
    world.get_by_label("Size").select_option("256x144")
    world.get_by_role("button", name="Start").click()
    _chunks_at_least(page, 1)
    assert [m["num_frames"] for m in starts] == [957]
    expect(page.locator("#world-status")).to_have_text(
        "streaming 256x144 at 16 fps until Stop (at most 80 chunks)"
    )
    page.keyboard.press("w")
    expect(page.locator("#world-action")).to_have_attribute("data-state", "queued")
    world.get_by_label("New prompt").fill("snow begins to fall")
    world.get_by_role("button", name="Send prompt").click()
    expect(page.locator("#world-log")).to_contain_text(
        'prompt "snow begins to fall": queued by the server as prompt-2'
    )
    _chunks_at_least(page, 9)  # past 93 frames, where the 6 s default ended
    page.keyboard.press("d")
    expect(page.locator("#world-action")).to_have_text("d acknowledged (d-3)")
    world.get_by_role("button", name="Stop").click()
    expect(page.locator("#world-status")).to_have_text(
        re.compile(r"^done: \d+ chunks \(stopped\)$"), timeout=JOB_MS
    )
    chunks = int(page.locator("#world-status").inner_text().split()[1])
    assert chunks >= 9
    video = page.locator("#world-video")
    # at least three chunks played: past the end of the second (9 + 12 frames)
    page.wait_for_function("v => v.currentTime > 21 / 16", arg=video.element_handle())
    state = media(video)
    assert state["error"] is None and state["buffered"] > 93 / 16, state
    expect(page.locator("#world-latency")).to_contain_text(f"over {chunks}")
    page.screenshot(path=up.artifacts / "world.png", full_page=True)


def test_world_says_when_the_servers_limit_ended_the_session(page: Page, up: Up) -> None:
    """The model's ``max_frames`` (here lowered to 45 in the page's copy of
    ``/v1/models``: 4 chunks) is what the page asks for; the server ends the session
    there, and the page says so, and why a key pressed then is not sent."""

    def lowered(route: Route) -> None:
        listed = route.fetch()
        body = listed.json()
        for model in body["data"]:
            if model["id"] == "reference/world":
                model["limits"]["max_frames"] = 45
        route.fulfill(response=listed, json=body)

    page.route("**/v1/models", lowered)
    starts = _start_messages(page)
    page.goto(up.url + "/#world")
    world = page.locator("#world")
    world.get_by_label("Size").select_option("256x144")
    world.get_by_role("button", name="Start").click()
    limit = "the server's limit for this model, 45 frames (2.8 s)"
    expect(page.locator("#world-status")).to_have_text(
        f"done: 4 chunks: the session reached {limit}; press Start for a new one",
        timeout=JOB_MS,
    )
    assert [m["num_frames"] for m in starts] == [45]
    page.keyboard.press("w")
    expect(page.locator("#world-action")).to_have_text(
        f"w not sent: the session ended at {limit}; press Start for a new one"
    )
    expect(page.locator("#world-log")).to_contain_text(f"the session reached {limit}")


def test_the_page_asks_for_the_key_once_and_fits_a_phone(browser: Browser, up: Up) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.set_default_timeout(REACT_MS)
    try:
        page.goto(up.url + "/")  # the page itself needs no key; /v1/models does
        dialog = page.get_by_role("dialog")
        expect(dialog).to_contain_text("needs an API key")
        dialog.get_by_label("Key").fill(up.key)
        dialog.get_by_role("button", name="Use key").click()
        # the job models: reference/video, reference/audio, reference/speech
        expect(page.locator("#job-model option")).to_have_count(3)
        page.get_by_role("link", name="World").click()
        expect(page.locator("#world-model option")).to_have_count(1)
        expect(dialog).to_be_hidden()  # asked once
        stored = page.evaluate("[sessionStorage.length, localStorage.length]")
        assert stored == [1, 0]
        page.get_by_role("link", name="Jobs").click()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.screenshot(path=up.artifacts / "phone.png", full_page=True)
    finally:
        context.close()


def test_the_page_shadows_no_api_route(up: Up) -> None:
    with httpx.Client(base_url=up.url, timeout=30) as client:
        page = client.get("/")
        assert page.status_code == 200 and "<title>omniqueue playground" in page.text
        script = client.get("/static/app.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert client.get("/v1/models").status_code == 401
        unknown = client.get("/v1/nothing-here")
        assert unknown.status_code == 404 and "error" in unknown.json()
        wrong = client.put("/v1/videos")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, POST"
        assert client.get("/health").status_code == 200
        assert "/" not in client.get("/openapi.json").json()["paths"]
