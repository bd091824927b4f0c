"""One-row reads of the request path on a pooled DBAPI cursor, without SQLAlchemy's
execution machinery.

A Core ``SELECT`` through a ``Connection`` builds an execution context, a cursor result
and its metadata (from ``cursor.description``, which psycopg rebuilds as column objects
on every query): on PostgreSQL that was two thirds of a status read's database time, the
driver's own work the other third. :class:`RawSelect` compiles a statement once for the
engine's dialect and runs it on the pool's DBAPI connection directly; rows come back as
tuples in the statement's column order with each column type's result processor applied
(SQLite's JSON and booleans; none on psycopg, which decodes them itself), i.e. the values
the same statement gives through SQLAlchemy.

What :class:`sqlalchemy.engine.Connection` does on a driver error is kept: the error is
raised as SQLAlchemy's (``OperationalError`` …), and a disconnect invalidates the pool's
connections of that generation, so a server restart costs the statements in flight, not
one failed read per pooled connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, Select, exc


class RawSelect:
    """``statement`` compiled for ``engine``; :meth:`one` runs it on a pooled DBAPI
    cursor. Its bind parameters must need no conversion by their type on this dialect
    (strings, integers: checked here), since none is applied."""

    def __init__(self, engine: Engine, statement: Select[Any]) -> None:
        dialect = engine.dialect
        compiled = statement.compile(dialect=dialect)
        for name, bind in compiled.binds.items():
            if bind.type.dialect_impl(dialect).bind_processor(dialect) is not None:
                raise ValueError(f"bind parameter {name!r} needs a conversion on {dialect.name}")
        self._engine = engine
        self._sql = compiled.string
        # the order of the parameters for positional paramstyles (SQLite's ``?``); None
        # for named ones (psycopg's ``%(name)s``)
        self._positions = compiled.positiontup
        self._types = [column.type for column in statement.selected_columns]
        self._processors: list[tuple[int, Callable[[Any], Any]]] | None = None
        # psycopg begins a transaction before a SELECT unless in autocommit: a BEGIN and
        # a ROLLBACK round trip around each read. SQLite's driver begins none for a SELECT.
        self._autocommit = dialect.name != "sqlite"

    def one(self, params: Mapping[str, Any]) -> Sequence[Any] | None:
        """The first row for ``params``, or None."""
        args: Any = params if self._positions is None else [params[k] for k in self._positions]
        with self._cursor(args) as cursor:
            cursor.execute(self._sql, args)
            row = cursor.fetchone()
            if row is None:
                return None
            processors = self._processors
            if processors is None:
                processors = self._processors = self._result_processors(cursor.description)
        if not processors:
            return row
        values = list(row)
        for i, process in processors:
            values[i] = process(values[i])
        return values

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
    def _cursor(self, args: Any) -> Iterator[Any]:
        """A cursor of a pooled connection (in autocommit on a server database), given
        back to the pool after the block; a driver error is raised as SQLAlchemy's."""
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
        try:
            if cursor is not None:
                cursor.close()
            if self._autocommit and fairy.is_valid:
                dbapi_conn.autocommit = False  # as the pool's other users expect it
        except Exception as error:  # a broken connection: not back into the pool
            fairy.invalidate(error)
        finally:
            fairy.close()
