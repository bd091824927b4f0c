"""The database as the commands that manage it (``keys``, ``webhooks``) open it: a
database that is missing, unreachable or without its tables is one line saying what to
do (run ``omniqueue migrate``), never a traceback, and looking creates nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from storage.settings import DatabaseSettings

# PostgreSQL's SQLSTATEs of a schema that is missing or older than the code.
_UNDEFINED = {"42P01": "table", "42703": "column"}
_SQLITE_UNDEFINED = ("no such table", "no such column", "has no column named")


class DatabaseUnusable(Exception):
    """The database cannot serve the command; the message says why and what to run."""


def shown(url: str) -> str:
    """``url`` fit to print: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except exc.ArgumentError:
        return "(an invalid URL)"


def database_name(url: str) -> str:
    """The database as a person names it: a SQLite file's path, else the URL (its
    password hidden)."""
    path = sqlite_file(url)
    return str(path) if path is not None else shown(url)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None: another database, or SQLite in memory)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(str(parsed.database))


def create_sqlite_dir(url: str) -> None:
    """Create the directory of a SQLite URL's file (``omniqueue migrate`` makes the
    database; SQLite itself creates the file but not its directory)."""
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def explain(error: exc.DBAPIError, url: str) -> str | None:
    """The one line for an error that means "not migrated" or "not reachable"; None for
    any other (a bug, left to its traceback)."""
    orig = error.orig
    sqlstate = getattr(orig, "sqlstate", None)
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if sqlstate in _UNDEFINED or any(s in text for s in _SQLITE_UNDEFINED):
        return (
            f"the database at {shown(url)} has no schema yet, or an older one ({text}): "
            "run `omniqueue migrate`"
        )
    if isinstance(error, exc.OperationalError):
        return f"cannot use the database at {shown(url)}: {text}"
    return None


@contextmanager
def opened(settings: DatabaseSettings) -> Iterator[sessionmaker[Session]]:
    """Sessions of the configured database for the ``with`` block. A SQLite file that
    does not exist is refused before anything is created (no empty directory or file is
    left behind); errors of a missing schema or an unreachable server inside the block
    become :class:`DatabaseUnusable`."""
    from storage.db import make_engine, make_sessionmaker

    path = sqlite_file(settings.url)
    if path is not None and not path.is_file():
        raise DatabaseUnusable(
            f"no database at {path}: run `omniqueue migrate` to create it "
            "(`omniqueue up` does), or set OMNIQ_DATABASE__URL"
        )
    engine = make_engine(settings)
    try:
        yield make_sessionmaker(engine)
    except exc.DBAPIError as error:
        message = explain(error, settings.url)
        if message is None:
            raise
        raise DatabaseUnusable(message) from None
    finally:
        engine.dispose()


def schema_missing(settings: DatabaseSettings) -> str | None:
    """What ``omniqueue api`` and ``worker`` check before they start: one line when the
    database has no schema (a SQLite file that does not exist, or no ``jobs`` table);
    None when it has one, and also when it cannot be reached now (the process starts and
    retries, as a worker cut off from its database does)."""
    from sqlalchemy import text

    from storage.db import make_engine

    path = sqlite_file(settings.url)
    if path is not None and not path.is_file():
        return (
            f"no database at {path}: run `omniqueue migrate` to create it "
            "(`omniqueue up` does), or set OMNIQ_DATABASE__URL"
        )
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1 FROM jobs WHERE 1 = 0"))
    except exc.DBAPIError as error:
        message = explain(error, settings.url)
        return message if message is not None and "run `omniqueue migrate`" in message else None
    finally:
        engine.dispose()
    return None
