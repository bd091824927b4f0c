"""The playground as ``omniqueue up`` serves it by default (127.0.0.1, auth off): no key
is asked for, media elements load the content URLs themselves, WebSockets carry no
subprotocol."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import Up, tab
from tests.browser.pages import JOB_MS, media, submit

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]


def test_with_auth_off_the_page_needs_no_key(browser: Browser, open_up: Up) -> None:
    with tab(browser) as page:
        page.goto(open_up.url + "/")
        card, video_id = submit(
            page, "reference/video", "a green kite", Size="64x48", Seconds="0.5", Steps="2"
        )
        expect(card.locator(".status")).to_have_text(re.compile("completed"), timeout=JOB_MS)
        player = card.locator("video")
        page.wait_for_function("v => v.readyState >= 2", arg=player.element_handle())
        assert player.get_attribute("src") == f"/v1/videos/{video_id}/content"
        assert abs(media(player)["duration"] - 0.5) < 0.15

        page.get_by_role("link", name="World").click()
        world = page.locator("#world")
        world.get_by_label("Size").select_option("256x144")
        world.get_by_role("button", name="Start").click()
        page.wait_for_function(
            "Number(document.getElementById('world-chunks').textContent) >= 1", timeout=JOB_MS
        )
        world.get_by_role("button", name="Stop").click()
        expect(page.locator("#world-status")).to_have_text(
            re.compile(r"^done: \d+ chunks? \(stopped\)$"), timeout=JOB_MS
        )
        expect(page.locator("#key-dialog")).to_be_hidden()
