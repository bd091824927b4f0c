"""Webhooks without services: what is retried, how long it waits, the signature headers
(checked by ``standardwebhooks`` itself), the request fields and the destination guard."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI
from standardwebhooks import Webhook, WebhookVerificationError

from api.validation import resolve_webhook
from models.errors import InvalidRequest
from models.webhooks import JobWebhook, event_type
from storage.settings import WebhookSettings
from storage.webhooks import check_destination, new_secret
from workers.services.webhooks import backoff_s, judge, signed_headers


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "delivered"),
        (204, "delivered"),
        (299, "delivered"),
        (500, None),
        (503, None),
        (408, None),
        (429, None),
        (None, None),  # timeout, refused, reset
        (301, "failed"),
        (400, "failed"),
        (401, "failed"),
        (404, "failed"),
        (410, "failed"),
    ],
)
def test_what_is_retried(status: int | None, outcome: str | None) -> None:
    assert judge(status) == outcome


def test_backoff_doubles_up_to_the_cap_with_jitter_in_its_second_half() -> None:
    s = WebhookSettings(backoff_base_s=5, backoff_cap_s=60)
    assert [backoff_s(n, s, lambda: 1.0) for n in (1, 2, 3, 4, 5, 6)] == [5, 10, 20, 40, 60, 60]
    assert [backoff_s(n, s, lambda: 0.0) for n in (1, 2, 5)] == [2.5, 5, 30]


def test_signed_headers_verify_with_standardwebhooks() -> None:
    old, new = new_secret(), new_secret()
    body = '{"object":"event","id":"evt_1","type":"video.completed"}'
    now = time.time()
    headers = signed_headers("evt_1", body, [new, old], now)
    assert headers["webhook-id"] == "evt_1"
    assert headers["webhook-timestamp"] == str(int(now))
    assert headers["webhook-signature"].count("v1,") == 2
    for secret in (new, old):  # during a rotation either secret verifies
        assert Webhook(secret).verify(body, headers)["id"] == "evt_1"
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(body.replace("completed", "failed"), headers)
    # the OpenAI SDK verifies them as it verifies OpenAI's own
    OpenAI(api_key="unused").webhooks.verify_signature(body, headers, secret=new)


def test_event_types() -> None:
    assert event_type("video", "completed", None) == "video.completed"
    assert event_type("video", "failed", "cancelled") == "video.cancelled"
    assert event_type("audio", "failed", "timeout") == "audio.failed"


def test_request_fields() -> None:
    url = "https://hooks.example.com/omniqueue"
    assert resolve_webhook(None, None, "video") is None
    assert resolve_webhook(url, None, "video") == JobWebhook(url=url)
    got = resolve_webhook(url, ["audio.failed", "audio.failed"], "audio")
    assert got == JobWebhook(url=url, events=("audio.failed",))
    for bad_url, bad_events, param in [
        ("ftp://x.example/", None, "webhook_url"),
        ("//x.example/", None, "webhook_url"),
        ("https://u:p@x.example/", None, "webhook_url"),
        ("https://x.example/" + "a" * 2048, None, "webhook_url"),
        (url, ["audio.completed"], "webhook_events"),
        (url, [], "webhook_events"),
        (None, ["video.completed"], "webhook_events"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            resolve_webhook(bad_url, bad_events, "video")
        assert info.value.param == param, (bad_url, bad_events)


def test_destination_guard() -> None:
    def resolver(address: str) -> object:
        return lambda host, port: [address]

    strict, loose = WebhookSettings(), WebhookSettings(allow_private=True)
    check_destination("https://hooks.example.com/", strict, "p", resolver("93.184.216.34"))
    for address in ("127.0.0.1", "10.0.0.5", "169.254.169.254", "::1"):
        with pytest.raises(InvalidRequest) as info:
            check_destination("https://hooks.example.com/", strict, "p", resolver(address))
        assert info.value.param == "p" and info.value.code == "invalid_webhook_url"
        check_destination("https://hooks.example.com/", loose, "p", resolver(address))
    with pytest.raises(InvalidRequest):
        check_destination("http://localhost:8080/", strict, "p", resolver("127.0.0.1"))
