"""Hot statements run on a pooled DBAPI cursor, without SQLAlchemy's execution machinery.

Each call through a ``Connection`` or an ORM ``Session`` builds an execution context, a
cursor result and its metadata (from ``cursor.description``, which psycopg rebuilds as
column objects on every query), and a ``Session`` adds a transaction: on PostgreSQL a
status read cost 286 µs of CPU that way against 97 µs here, a job's conditional UPDATE
~850 µs and three round trips (BEGIN, UPDATE, COMMIT) against one.

:class:`RawStatement` compiles a Core statement once for the engine's dialect and runs
it on the pool's DBAPI connection: bind values go through their column types' bind
processors (JSON, SQLite's floats) and result values through their result processors
(SQLite's JSON and booleans; psycopg decodes those itself), so rows and written values
are the ones SQLAlchemy gives and writes. On PostgreSQL the connection is in autocommit
for the statement: a single statement is its own transaction, one round trip. SQLite's
driver begins no transaction for a SELECT; a write there is committed at once.

What a ``Connection`` does on a driver error is kept: the error is raised as
SQLAlchemy's (``OperationalError``, ``IntegrityError`` …), and a disconnect invalidates
the pool's connections of that generation, so a server restart costs the statements in
flight, not one failed call per pooled connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Engine, exc
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

_REQUIRED = object()

# by the name the SQL text uses: (the key callers pass the value by, the bind processor
# or None, a fixed value or _REQUIRED)
_Bind = tuple[str, Callable[[Any], Any] | None, Any]


class RawStatement:
    """``statement`` compiled for ``engine``; :meth:`one` (a SELECT's first row, or a
    write's ``RETURNING``), :meth:`all` (a SELECT's rows) and :meth:`rowcount` (a write)
    run it on a pooled DBAPI cursor. Parameters are passed by the names of the
    statement's ``bindparam``s; literals in the statement are bound as SQLAlchemy binds
    them."""

    def __init__(self, engine: Engine, statement: ClauseElement) -> None:
        dialect = engine.dialect
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        if compiled.escaped_bind_names or "POSTCOMPILE" in compiled.string:
            raise ValueError("expanding or escaped bind parameters are not supported")
        binds: dict[str, _Bind] = {}
        for bind, name in compiled.bind_names.items():
            if bind.expanding or bind.callable is not None:
                raise ValueError(f"bind parameter {name!r}: expanding or callable")
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            binds[name] = (bind.key, process, _REQUIRED if bind.required else bind.value)
        self._engine = engine
        self._sql = compiled.string
        self._binds = binds
        # the order of the parameters for positional paramstyles (SQLite's ``?``, where a
        # name may repeat); None for named ones (psycopg's ``%(name)s``)
        self._positions = compiled.positiontup
        # what a SELECT selects or a write returns
        self._types = [c.type for c in getattr(statement, "exported_columns", ())]
        self._processors: list[tuple[int, Callable[[Any], Any]]] | None = None
        self._autocommit = dialect.name != "sqlite"

    def one(self, params: Mapping[str, Any], *, write: bool = False) -> Sequence[Any] | None:
        """The first row for ``params``, or None; ``write`` for an INSERT or UPDATE with
        ``RETURNING`` (committed on SQLite)."""
        args = self._args(params)
        with self._cursor(args, commit=write) as cursor:
            cursor.execute(self._sql, args)
            row = cursor.fetchone()
            if row is None:
                return None
            processors = self._processors
            if processors is None:
                processors = self._processors = self._result_processors(cursor.description)
        return row if not processors else _processed(row, processors)

    def all(self, params: Mapping[str, Any], *, write: bool = False) -> list[Sequence[Any]]:
        """Every row of a SELECT for ``params`` (``write``: of an UPDATE's ``RETURNING``,
        committed on SQLite)."""
        args = self._args(params)
        with self._cursor(args, commit=write) as cursor:
            cursor.execute(self._sql, args)
            rows = cursor.fetchall()
            if not rows:
                return []
            processors = self._processors
            if processors is None:
                processors = self._processors = self._result_processors(cursor.description)
        if not processors:
            return list(rows)
        return [_processed(row, processors) for row in rows]

    def rowcount(self, params: Mapping[str, Any]) -> int:
        """Run a write for ``params`` in its own transaction; the rows it matched."""
        args = self._args(params)
        with self._cursor(args, commit=True) as cursor:
            cursor.execute(self._sql, args)
            return int(cursor.rowcount)

    def _args(self, params: Mapping[str, Any]) -> Any:
        values: dict[str, Any] = {}
        for name, (key, process, fixed) in self._binds.items():
            value = params[key] if fixed is _REQUIRED else fixed
            values[name] = value if process is None else process(value)
        if self._positions is None:
            return values
        return [values[name] for name in self._positions]

    def _result_processors(
        self, description: Sequence[Sequence[Any]]
    ) -> list[tuple[int, Callable[[Any], Any]]]:
        """``(column index, processor)`` for the columns whose type converts the driver's
        value on this dialect (by the driver's type code, as SQLAlchemy's results do)."""
        dialect = self._engine.dialect
        found: list[tuple[int, Callable[[Any], Any]]] = []
        for i, (type_, column) in enumerate(zip(self._types, description, strict=True)):
            process = type_.dialect_impl(dialect).result_processor(dialect, column[1])
            if process is not None:
                found.append((i, process))
        return found

    @contextmanager
    def _cursor(self, args: Any, *, commit: bool) -> Iterator[Any]:
        """A cursor of a pooled connection (in autocommit on a server database), given
        back to the pool after the block; with ``commit`` a SQLite write is committed
        after it. A driver error is raised as SQLAlchemy's."""
        engine = self._engine
        dialect = engine.dialect
        error_class = dialect.loaded_dbapi.Error
        try:
            fairy = engine.raw_connection()
        except error_class as error:  # connecting: what Engine.connect raises
            raise exc.DBAPIError.instance(None, None, error, error_class) from error
        dbapi_conn: Any = fairy.dbapi_connection
        cursor = None
        try:
            if self._autocommit:
                dbapi_conn.autocommit = True
            cursor = fairy.cursor()
            yield cursor
            if commit and not self._autocommit:
                dbapi_conn.commit()
        except error_class as error:
            disconnect = dialect.is_disconnect(error, dbapi_conn, cursor)
            if disconnect:
                # What a Connection does on a disconnect (a private pool method there
                # too): every connection of this generation is stale.
                engine.pool._invalidate(fairy, error)
            raise exc.DBAPIError.instance(
                self._sql, args, error, error_class, connection_invalidated=disconnect
            ) from error
        finally:
            self._give_back(fairy, dbapi_conn, cursor)

    def _give_back(self, fairy: Any, dbapi_conn: Any, cursor: Any) -> None:
        """Close the cursor and return the connection as the pool's other users expect
        it (no autocommit; the pool rolls back what a failed SQLite write left open)."""
        try:
            if cursor is not None:
                cursor.close()
            if self._autocommit and fairy.is_valid:
                dbapi_conn.autocommit = False
        except Exception as error:  # a broken connection: not back into the pool
            fairy.invalidate(error)
        finally:
            fairy.close()


def _processed(row: Sequence[Any], processors: list[tuple[int, Callable[[Any], Any]]]) -> list[Any]:
    values = list(row)
    for i, process in processors:
        values[i] = process(values[i])
    return values
