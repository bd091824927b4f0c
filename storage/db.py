"""Database engine and sessions (SQLite for the embedded stack, PostgreSQL in production)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
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
    return create_engine(url, pool_pre_ping=True, **kwargs)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
