"""Database engine and sessions (SQLite for the embedded stack, PostgreSQL in production)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from storage.settings import DatabaseSettings


def make_engine(db: DatabaseSettings) -> Engine:
    """Create the engine; SQLite gets WAL, a busy timeout and foreign keys."""
    url = make_url(db.url)
    # Both pools keep ``pool_size`` connections and allow as many again under a burst.
    # SQLite's default (5 + 10 overflow) closed every connection beyond five on return,
    # so concurrent reads kept opening files and re-running the PRAGMAs below.
    kwargs: dict[str, Any] = {
        "echo": db.echo,
        "pool_size": db.pool_size,
        "max_overflow": db.pool_size,
    }
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        # No pre-ping: a local file does not drop connections, and the ping was one
        # extra statement per checkout.
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.get_backend_name() == "postgresql":
        kwargs["connect_args"] = _link_bounds(db)
    engine = create_engine(url, **kwargs)
    _ping_when_idle(engine, db.ping_idle_s)
    return engine


def _link_bounds(db: DatabaseSettings) -> dict[str, Any]:
    """libpq's bounds on a dead link: the connect timeout, unacknowledged bytes
    (``tcp_user_timeout``, ms) and keepalives on idle connections, so that a partition
    between a process and PostgreSQL fails its statements in bounded time."""
    probe = max(1, round(db.link_timeout_s / 3))
    return {
        "connect_timeout": db.connect_timeout_s,
        "tcp_user_timeout": round(db.link_timeout_s * 1000),
        "keepalives": 1,
        "keepalives_idle": probe,
        "keepalives_interval": probe,
        "keepalives_count": 3,
    }


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Pessimistic disconnect handling for connections idle over ``idle_s`` only
    (SQLAlchemy's ``pool_pre_ping`` pings on every checkout). Raising
    ``DisconnectionError`` makes the pool drop the connection and check out another
    (up to three tries); a connection that fails while in use invalidates the whole pool,
    so a server restart costs at most the statements in flight."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("checked_in", float("-inf")) <= idle_s:
            return
        try:
            cur = dbapi_conn.cursor()
            try:
                cur.execute("SELECT 1")
            finally:
                cur.close()
            if not getattr(dbapi_conn, "autocommit", True):
                dbapi_conn.rollback()  # the ping's transaction, not the caller's
        except Exception as error:
            raise exc.DisconnectionError() from error


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
