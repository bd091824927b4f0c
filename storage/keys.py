"""API keys: created once, shown once, stored as a sha256 hash."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from models.db import ApiKey

KEY_PREFIX = "oq-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeyStore:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def create(self, name: str) -> tuple[ApiKey, str]:
        """Create a key; returns the row and the secret, which is never stored."""
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        row = ApiKey(
            id="key_" + secrets.token_hex(8),
            name=name,
            prefix=secret[:10],
            key_hash=hash_key(secret),
            created_at=time.time(),
        )
        with self._sessions() as s:
            s.add(row)
            s.commit()
        return row, secret

    def list(self) -> list[ApiKey]:
        with self._sessions() as s:
            return list(s.scalars(select(ApiKey).order_by(ApiKey.created_at)))

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
