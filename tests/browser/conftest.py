"""A real browser on the real embedded stack: one ``omniqueue up`` per module (its own
Valkey, SeaweedFS and SQLite), and Debian's chromium driven by Playwright.

``up`` binds 127.0.0.2 (loopback, but not one of the addresses where ``omniqueue up``
turns auth off), so its pages go through the key path: bearer header, SSE over
``fetch``, the WebSocket subprotocol, media fetched with the key. ``open_up`` is the
default 127.0.0.1 with auth off. Screenshots go to ``$BROWSER_ARTIFACTS`` when it is set,
else to the module's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.embedded_up import ROOT, start_up, stop_up

KEY_STORAGE = "omniqueue.apiKey"
# What a page may take to react (a socket to open, a request to answer) on a loaded
# 2-core CI machine; the waits for jobs and sessions set their own, longer ones.
REACT_MS = 20_000
expect.set_options(timeout=REACT_MS)
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


@contextmanager
def running_up(work: Path, host: str) -> Iterator[Up]:
    """``omniqueue up`` on ``host`` with its data in ``work``; on any address but
    127.0.0.1 auth is on, and a key is made for the page."""
    data = work / "data"
    failpoints = work / "failpoints.json"
    failpoints.write_text("{}")
    log = work / "up.log"
    env = {
        "OMNIQ_WORKER__FAILPOINTS_FILE": str(failpoints),
        "OMNIQ_WORKER__PREVIEW_EVERY": "1",
        "OMNIQ_WORKER__PREVIEW_MAX_SIDE": "64",
    }
    proc, url = start_up(data, env=env, args=["--host", host], log=log)
    try:
        key = ""
        if host != "127.0.0.1":
            key = subprocess.run(
                [sys.executable, "-m", "cli.main", "keys", "create", "--name", "browser"],
                env={**os.environ, "OMNIQ_DATABASE__URL": f"sqlite:///{data / 'omniqueue.db'}"},
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.strip()
        artifacts = Path(os.environ.get("BROWSER_ARTIFACTS") or work / "screenshots")
        artifacts.mkdir(parents=True, exist_ok=True)
        yield Up(url, key, failpoints, artifacts, log)
    finally:
        stop_up(proc, data)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """The stack with auth on."""
    with running_up(tmp_path_factory.mktemp("playground"), "127.0.0.2") as stack:
        yield stack


@pytest.fixture(scope="module")
def open_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """The stack as ``omniqueue up`` runs by default: on 127.0.0.1, auth off."""
    with running_up(tmp_path_factory.mktemp("playground-open"), "127.0.0.1") as stack:
        yield stack


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@contextmanager
def tab(browser: Browser, key: str = "") -> Iterator[Page]:
    """A fresh tab (holding ``key``, as if it had been typed into the dialog once) that
    fails the test on any uncaught script error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    if key:
        context.add_init_script(f"sessionStorage.setItem({KEY_STORAGE!r}, {key!r})")
    page = context.new_page()
    page.set_default_timeout(REACT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert errors == [], errors


@pytest.fixture
def page(browser: Browser, up: Up) -> Iterator[Page]:
    with tab(browser, up.key) as opened:
        yield opened
