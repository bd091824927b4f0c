"""The webhook sender: delivers the outbox (:mod:`storage.outbox`) to the receivers, at
least once, signed as Standard Webhooks says.

It runs as its own process (``omniqueue webhooks serve``; ``omniqueue up`` starts and
supervises one): a receiver that answers slowly or not at all then holds sender threads,
never a GPU worker's step loop or an API request, and the API tier's dependencies suffice
(httpx, no torch). Any number may run: claims are atomic (:meth:`WebhookOutbox.claim`).

Every attempt:

1. signs the stored body again with the owner's current secret (and the previous one
   during a rotation's grace: two signatures), with a fresh ``webhook-timestamp`` and the
   same ``webhook-id`` (the event id) as every other attempt of the event;
2. resolves the destination through the URL guard and connects to the address it checked
   (:func:`storage.webhooks.pin_destination`), no redirects followed, no proxy;
3. POSTs within ``OMNIQ_WEBHOOKS__TIMEOUT_S`` and judges the answer (:func:`judge`): 2xx
   is delivered; 5xx, 408, 429, a timeout, a refused or reset connection and a host that
   does not resolve (or not to an allowed address) are retried with exponential backoff
   and jitter (:func:`backoff_s`) until the event is ``max_age_s`` old; any other status
   (3xx, 4xx) fails it at once: the receiver said no and will say it again;
4. stores the attempt and the delivery's next state (:meth:`WebhookOutbox.record`).

:func:`record_outcome` is the one place an attempt's outcome is counted (the metrics
counter ``omniqueue_webhook_deliveries_total{outcome}``, on this process's metrics port).
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from models.errors import URLFetchError
from storage.db import make_engine, make_sessionmaker
from storage.metrics import WEBHOOK_DELIVERIES, serve_port
from storage.outbox import Attempt, Claimed, Outcome, WebhookOutbox
from storage.settings import Settings, WebhookSettings
from storage.url_guard import Resolver, pinned_request, system_resolver
from storage.webhooks import WebhookStore, pin_destination

log = logging.getLogger(__name__)

# A claim outlives the attempt's timeout by this much before another sender may take it.
LEASE_MARGIN_S = 30.0
USER_AGENT = "omniqueue-webhooks/1"
_RETRIED_STATUSES = frozenset({408, 429})


def record_outcome(outcome: Outcome) -> None:
    """Count one attempt's outcome (``delivered``, ``retry``, ``failed``) in
    ``omniqueue_webhook_deliveries_total{outcome}`` (served on this process's metrics
    port, ``OMNIQ_METRICS__WORKER_PORT``)."""
    WEBHOOK_DELIVERIES.labels(outcome).inc()


def judge(status_code: int | None) -> Outcome | None:
    """``delivered`` for 2xx, ``failed`` for an answer not worth repeating (3xx, 4xx but
    408 and 429), None (retry, while the event is young enough) otherwise: 5xx, 408, 429,
    or no answer at all."""
    if status_code is None:
        return None
    if 200 <= status_code < 300:
        return "delivered"
    if status_code >= 500 or status_code in _RETRIED_STATUSES:
        return None
    return "failed"


def backoff_s(attempts: int, settings: WebhookSettings, rand: Callable[[], float]) -> float:
    """The wait after the ``attempts``-th failed attempt: ``base * 2**(attempts-1)``
    capped at ``cap``, its second half drawn at random ("equal jitter": never less than
    half the schedule, so retries stay spread and still back off)."""
    delay = min(settings.backoff_cap_s, settings.backoff_base_s * 2 ** max(attempts - 1, 0))
    return delay / 2 + rand() * delay / 2


def signed_headers(event_id: str, payload: str, keys: list[str], now: float) -> dict[str, str]:
    """The Standard Webhooks headers of ``payload``: one ``v1,`` signature per key."""
    stamp = datetime.fromtimestamp(int(now), tz=UTC)
    signatures = " ".join(Webhook(k).sign(event_id, stamp, payload) for k in keys)
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now)),
        "webhook-signature": signatures,
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }


class WebhookSender:
    """Claims due deliveries and sends them on ``batch_size`` threads."""

    def __init__(
        self,
        settings: WebhookSettings,
        outbox: WebhookOutbox,
        store: WebhookStore,
        client: httpx.Client,
        *,
        resolver: Resolver = system_resolver,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.outbox, self.store, self.client = outbox, store, client
        self._resolver, self._clock, self._rand = resolver, clock, rand
        self._token = secrets.token_hex(16)
        self._pool = ThreadPoolExecutor(settings.batch_size, thread_name_prefix="webhook")
        self._free = settings.batch_size
        self._lock = threading.Lock()
        self._slot_freed = threading.Event()

    # ---- the loop -------------------------------------------------------------------

    def serve(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` is set; sweep for lost events every ``sweep_interval_s``."""
        s = self.settings
        next_sweep = 0.0
        while not stop.is_set():
            now = self._clock()
            if now >= next_sweep:
                next_sweep = now + s.sweep_interval_s
                self._sweep(now)
            try:
                claimed, free = self.dispatch()
            except Exception:  # the database is away: try again after a poll interval
                log.warning("could not claim webhook deliveries", exc_info=True)
                claimed, free = 0, 1
            if free == 0:  # every thread busy: wait for one to finish
                self._slot_freed.wait(s.poll_interval_s)
                self._slot_freed.clear()
            elif claimed < free:  # the outbox has nothing more due now
                stop.wait(s.poll_interval_s)
        self._pool.shutdown(wait=True)

    def _sweep(self, now: float) -> None:
        try:
            queued = self.outbox.sweep(now - self.settings.sweep_window_s, now)
        except Exception:
            log.warning("could not sweep for ended jobs without webhooks", exc_info=True)
            return
        if queued:
            log.info("queued %d webhook deliveries the sweep found missing", queued)

    def dispatch(self) -> tuple[int, int]:
        """Claim as many due deliveries as there are free threads and start them;
        (claimed, free threads before the claim)."""
        with self._lock:
            free = self._free
        if free == 0:
            return 0, 0
        lease = self.settings.timeout_s + LEASE_MARGIN_S
        claimed = self.outbox.claim(self._token, free, lease, self._clock())
        for delivery in claimed:
            with self._lock:
                self._free -= 1
            self._pool.submit(self._run, delivery)
        return len(claimed), free

    def _run(self, delivery: Claimed) -> None:
        try:
            self.deliver(delivery)
        except Exception:  # the claim lapses and the attempt is made again
            log.exception("webhook delivery %d failed unexpectedly", delivery.id)
        finally:
            with self._lock:
                self._free += 1
            self._slot_freed.set()

    # ---- one attempt ----------------------------------------------------------------

    def deliver(self, delivery: Claimed) -> Attempt:
        """One attempt of ``delivery``, stored and counted."""
        s = self.settings
        started = self._clock()
        t0 = time.monotonic()
        status_code, error = self._post(delivery, started)
        duration = time.monotonic() - t0
        outcome = judge(status_code)
        next_at = None
        if outcome is None:
            next_at = self._clock() + backoff_s(delivery.attempts + 1, s, self._rand)
            outcome = "retry" if next_at <= delivery.created_at + s.max_age_s else "failed"
        attempt = Attempt(outcome, started, duration, (status_code, error), next_at)
        self.outbox.record(delivery, self._token, attempt)
        record_outcome(outcome)
        if outcome != "delivered":
            log.info(
                "webhook %s to %s: %s (%s), attempt %d",
                delivery.event_id,
                delivery.url,
                outcome,
                error or status_code,
                delivery.attempts + 1,
            )
        return attempt

    def _post(self, delivery: Claimed, now: float) -> tuple[int | None, str | None]:
        """The receiver's status code, or None and why there was none."""
        s = self.settings
        try:
            keys = self.store.signing_secrets(delivery.owner, s.rotation_grace_s, now)
            headers = signed_headers(delivery.event_id, delivery.payload, keys, now)
            url = httpx.URL(delivery.url)
            address = pin_destination(delivery.url, s, self._resolver)
            request = pinned_request(
                self.client, "POST", url, address, headers, s.timeout_s, delivery.payload.encode()
            )
            response = self.client.send(request, stream=True)
            response.close()  # the body is not read: a receiver's answer is its status
            return response.status_code, None
        except URLFetchError as exc:
            return None, f"destination refused or unresolved: {exc}"[:500]
        except httpx.TimeoutException:
            return None, "timeout"
        except httpx.HTTPError as exc:
            return None, type(exc).__name__


def serve(settings: Settings, stop: threading.Event | None = None) -> int:
    """``omniqueue webhooks serve``: the sender until SIGTERM/SIGINT (or ``stop``)."""
    import signal

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    engine = make_engine(settings.database)
    sessions = make_sessionmaker(engine)
    s = settings.webhooks
    client = httpx.Client(trust_env=False, follow_redirects=False, timeout=s.timeout_s)
    sender = WebhookSender(s, WebhookOutbox(sessions), WebhookStore(sessions), client)
    log.info(
        "webhook sender ready (%d threads, private destinations %s)",
        s.batch_size,
        "allowed" if s.allow_private else "refused",
    )
    serve_port(settings.metrics, "webhooks serve")
    try:
        sender.serve(stop)
    finally:
        client.close()
        engine.dispose()
    return 0
