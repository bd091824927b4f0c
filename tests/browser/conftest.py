"""A real browser on the real embedded stack: one ``omniqueue up`` per module (its own
Valkey, SeaweedFS and SQLite; auth on), and Debian's chromium driven by Playwright.

The stack binds 127.0.0.2 (loopback, but not one of the addresses where ``omniqueue up``
turns auth off), so every page goes through the key path: bearer header, SSE over
``fetch``, the WebSocket subprotocol, media fetched with the key. Screenshots go to
``$BROWSER_ARTIFACTS`` when it is set, else to the module's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from benchmarks.common import ROOT, start_up, stop_up

KEY_STORAGE = "omniqueue.apiKey"
SPEECH = ROOT / "tests" / "fixtures" / "speech"
CHROMIUM_ARGS = [
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",  # microphone permission granted without a prompt
    "--use-fake-device-for-media-stream",
    # the fake microphone says "Hello, can you hear me?" once, then silence
    f"--use-file-for-fake-audio-capture={SPEECH / 'hello.wav'}%noloop",
    "--no-sandbox",  # CI runs as root
]


@dataclass
class Up:
    url: str
    key: str
    failpoints: Path
    artifacts: Path
    log: Path


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    work = tmp_path_factory.mktemp("playground")
    data = work / "data"
    failpoints = work / "failpoints.json"
    failpoints.write_text("{}")
    log = work / "up.log"
    env = {
        "OMNIQ_WORKER__FAILPOINTS_FILE": str(failpoints),
        "OMNIQ_WORKER__PREVIEW_EVERY": "1",
        "OMNIQ_WORKER__PREVIEW_MAX_SIDE": "64",
    }
    proc, url = start_up(data, env=env, args=["--host", "127.0.0.2"], log=log)
    try:
        created = subprocess.run(
            [sys.executable, "-m", "cli.main", "keys", "create", "--name", "browser"],
            env={**os.environ, "OMNIQ_DATABASE__URL": f"sqlite:///{data / 'omniqueue.db'}"},
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        artifacts = Path(os.environ.get("BROWSER_ARTIFACTS") or work / "screenshots")
        artifacts.mkdir(parents=True, exist_ok=True)
        yield Up(url, created.stdout.strip(), failpoints, artifacts, log)
    finally:
        stop_up(proc, data)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, up: Up) -> Iterator[Page]:
    """A fresh tab that already holds the key (as if it had been typed into the dialog
    once), failing the test on any uncaught script error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.add_init_script(f"sessionStorage.setItem({KEY_STORAGE!r}, {up.key!r})")
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    context.close()
    assert errors == [], errors
