"""Webhook destinations and signing secrets: the checks every destination URL passes, the
per-key endpoints (``omniqueue webhooks add``) and the per-key secrets
(``GET /v1/webhooks/secret``).

A destination is checked twice: its shape when it is given (:func:`check_webhook_url`,
pure) and its host by the URL guard (:func:`check_destination`: every address it resolves
to must be public unless ``OMNIQ_WEBHOOKS__ALLOW_PRIVATE``), at registration and again at
each delivery (``workers/services/webhooks.py`` connects to the address it checked).
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Iterable, Sequence

import httpx
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from models.db import WebhookEndpoint, WebhookSigningSecret
from models.errors import InvalidRequest, URLFetchError
from models.webhooks import MAX_URL_LENGTH, SECRET_PREFIX
from storage.settings import WebhookSettings
from storage.url_guard import IPAddress, Policy, Resolver, pin, system_resolver


def check_webhook_url(url: str, param: str) -> None:
    """A destination URL's shape: absolute http(s), a host, no credentials, at most
    :data:`models.webhooks.MAX_URL_LENGTH` characters (no DNS: :func:`check_destination`)."""
    if len(url) > MAX_URL_LENGTH:
        raise InvalidRequest(f"{param} is longer than {MAX_URL_LENGTH} characters", param=param)
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise InvalidRequest(f"{param} is not a valid URL", param=param) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidRequest(f"{param} must be an absolute http(s) URL", param=param)
    if parsed.userinfo:
        raise InvalidRequest(f"{param} must not carry credentials", param=param)


def check_events(names: Iterable[str], allowed: Sequence[str], param: str) -> tuple[str, ...]:
    """``names`` (at least one, each in ``allowed``), without repeats."""
    out = tuple(dict.fromkeys(names))
    if not out:
        raise InvalidRequest(f"{param} must name at least one event", param=param)
    for name in out:
        if name not in allowed:
            raise InvalidRequest(
                f"{param}: {name!r} is not an event here (one of {', '.join(allowed)})",
                param=param,
            )
    return out


def guard_policy(settings: WebhookSettings) -> Policy:
    return "any" if settings.allow_private else "public"


def pin_destination(
    url: str, settings: WebhookSettings, resolver: Resolver = system_resolver
) -> IPAddress:
    """The address to connect to for ``url``, after the URL guard checked every address
    its host resolves to (:func:`storage.url_guard.pin`); :class:`URLFetchError` if not."""
    return pin(
        httpx.URL(url),
        policy=guard_policy(settings),
        resolver=resolver,
        timeout_s=settings.timeout_s,
    )


def check_destination(
    url: str, settings: WebhookSettings, param: str, resolver: Resolver = system_resolver
) -> None:
    """400 naming ``param`` unless the URL guard lets ``url``'s host be called now."""
    check_webhook_url(url, param)
    try:
        pin_destination(url, settings, resolver)
    except URLFetchError:
        hint = "" if settings.allow_private else " (private and loopback hosts are refused)"
        raise InvalidRequest(
            f"{param} is not a destination this server calls{hint}",
            param=param,
            code="invalid_webhook_url",
        ) from None


def new_secret() -> str:
    """``whsec_`` and 24 random bytes in base64, the Standard Webhooks form."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


class WebhookStore:
    """Per-key endpoints and signing secrets (small tables, ORM sessions)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    # ---- endpoints ------------------------------------------------------------------

    def add_endpoint(
        self, owner: str, url: str, events: Sequence[str] | None = None
    ) -> WebhookEndpoint:
        row = WebhookEndpoint(
            id="we_" + secrets.token_hex(8),
            owner=owner,
            url=url,
            events=list(events) if events is not None else None,
            created_at=time.time(),
        )
        with self._sessions() as s:
            s.add(row)
            s.commit()
        return row

    def endpoints(self, owner: str | None = None) -> list[WebhookEndpoint]:
        q = select(WebhookEndpoint).order_by(WebhookEndpoint.created_at)
        if owner is not None:
            q = q.where(WebhookEndpoint.owner == owner)
        with self._sessions() as s:
            return list(s.scalars(q))

    def remove_endpoint(self, endpoint_id: str) -> bool:
        with self._sessions() as s:
            res = s.execute(delete(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id))
            s.commit()
            return int(res.rowcount) == 1  # type: ignore[attr-defined]

    # ---- secrets --------------------------------------------------------------------

    def secret(self, owner: str) -> str:
        """The owner's signing secret, created on first use (a race keeps the first)."""
        with self._sessions() as s:
            row = s.get(WebhookSigningSecret, owner)
            if row is not None:
                return row.secret
            s.add(WebhookSigningSecret(owner=owner, secret=new_secret(), created_at=time.time()))
            try:
                s.commit()
            except IntegrityError:
                s.rollback()
            found = s.get(WebhookSigningSecret, owner, populate_existing=True)
            assert found is not None
            return found.secret

    def rotate(self, owner: str) -> str:
        """A new secret for the owner; the old one keeps signing for the grace period."""
        self.secret(owner)
        fresh = new_secret()
        with self._sessions() as s:
            t = WebhookSigningSecret
            s.execute(
                update(t)
                .where(t.owner == owner)
                .values(previous_secret=t.secret, secret=fresh, rotated_at=time.time())
            )
            s.commit()
        return fresh

    def signing_secrets(self, owner: str, grace_s: float, now: float | None = None) -> list[str]:
        """The secrets an event of ``owner`` is signed with: the current one, and the one
        before while it is within ``grace_s`` of the rotation (two signatures)."""
        with self._sessions() as s:
            row = s.get(WebhookSigningSecret, owner)
        if row is None:
            return [self.secret(owner)]
        out = [row.secret]
        now = time.time() if now is None else now
        rotated = row.rotated_at
        if row.previous_secret and rotated is not None and now - rotated < grace_s:
            out.append(row.previous_secret)
        return out
