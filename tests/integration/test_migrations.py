"""Alembic migrations behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from migrations.runner import downgrade, upgrade
from models.db import Base
from tests.integration.conftest import _drop_pg_database, _new_pg_database

pytestmark = pytest.mark.integration

TABLES = {"api_keys", "jobs", "artifacts"}


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrate.db'}"
        return
    name, url = _new_pg_database()
    try:
        yield url
    finally:
        _drop_pg_database(name)


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    upgrade(database_url)
    assert _tables(database_url) == TABLES
    downgrade(database_url, "base")
    assert _tables(database_url) == set()
    upgrade(database_url)
    assert _tables(database_url) == TABLES

    # The migrated schema is exactly what the ORM declares.
    engine = create_engine(database_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []
