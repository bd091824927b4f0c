"""What the browser tests do on the playground's pages, as a person would."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Locator, Page, expect

JOB_MS = 90_000  # a tiny job (or session) on a loaded 2-core CI box


def media(locator: Locator) -> dict[str, Any]:
    state: dict[str, Any] = locator.evaluate(
        """m => ({readyState: m.readyState, duration: m.duration, time: m.currentTime,
                  error: m.error && m.error.code,
                  buffered: m.buffered.length ? m.buffered.end(m.buffered.length - 1) : 0})"""
    )
    return state


def record_statuses(page: Page) -> None:
    """Keep every status text the job lists show (they change faster than a poll)."""
    page.evaluate(
        """() => { window.seen = [];
          new MutationObserver(() => document.querySelectorAll('.job .status')
            .forEach(s => window.seen.push(s.textContent)))
          .observe(document.querySelector('#jobs .lists'),
                   {subtree: true, childList: true, characterData: true}); }"""
    )


def submit(page: Page, model: str, prompt: str, **fields: str) -> tuple[Locator, str]:
    """Fill the Jobs form as a person would and press Generate: (the job's card, its id)."""
    jobs = page.locator("#jobs")
    jobs.get_by_label("Model").select_option(model)
    jobs.get_by_label("Prompt").fill(prompt)
    for label, value in fields.items():
        jobs.get_by_label(label, exact=False).first.fill(value)
    jobs.get_by_role("button", name="Generate").click()
    status = page.locator("#job-form-status")
    expect(status).to_contain_text("created")
    job_id = status.inner_text().split()[-1]
    return page.locator(f'li.job[data-id="{job_id}"]'), job_id
