"""API keys: created once, shown once, stored as a sha256 hash; each with its own quotas
(NULL: the server default, 0: unlimited; see ``api/quotas.py``)."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from models.db import ApiKey

SECRET_PREFIX = "oq-"  # an API key's secret starts with it (storage.constants.KEY_PREFIX is Redis')
# The per-key quota columns a create or an update may set.
QUOTA_FIELDS = ("creates_per_minute", "max_active_jobs", "max_sessions")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeyStore:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def create(self, name: str, **quotas: int | None) -> tuple[ApiKey, str]:
        """Create a key with its own ``quotas`` (:data:`QUOTA_FIELDS`; unset or None: the
        server default); returns the row and the secret, which is never stored."""
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        row = ApiKey(
            id="key_" + secrets.token_hex(8),
            name=name,
            prefix=secret[:10],
            key_hash=hash_key(secret),
            created_at=time.time(),
            **_quotas(quotas),
        )
        with self._sessions() as s:
            s.add(row)
            s.commit()
        return row, secret

    def list(self) -> list[ApiKey]:
        with self._sessions() as s:
            return list(s.scalars(select(ApiKey).order_by(ApiKey.created_at)))

    def update(self, key_id: str, **quotas: int | None) -> ApiKey | None:
        """Set the key's ``quotas`` (a value: the key's own; None: back to the server
        default); fields not given keep theirs. The updated row, None without such a key.
        API processes read a key's quotas with the key, on every request."""
        with self._sessions() as s:
            row = s.get(ApiKey, key_id)
            if row is None:
                return None
            for name, value in _quotas(quotas).items():
                setattr(row, name, value)
            s.commit()
            s.refresh(row)
            s.expunge(row)
            return row

    def revoke(self, key_id: str) -> bool:
        with self._sessions() as s:
            res = s.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
                .values(revoked_at=time.time())
            )
            s.commit()
            return int(res.rowcount) == 1  # type: ignore[attr-defined]

    def verify(self, secret: str) -> ApiKey | None:
        """The live key with this secret, or None."""
        with self._sessions() as s:
            row = s.scalars(select(ApiKey).where(ApiKey.key_hash == hash_key(secret))).first()
        if row is None or row.revoked_at is not None:
            return None
        return row


def _quotas(values: dict[str, int | None]) -> dict[str, int | None]:
    unknown = set(values) - set(QUOTA_FIELDS)
    if unknown:
        raise TypeError(f"not a key quota: {', '.join(sorted(unknown))}")
    for name, value in values.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} must be 0 (unlimited) or more, not {value}")
    return values
