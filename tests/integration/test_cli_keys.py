"""``omniqueue migrate`` and ``omniqueue keys`` on a SQLite database; startup refusals;
the per-user default database, and one line for a database that is missing or not
migrated."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from storage.db import make_engine, make_sessionmaker
from storage.keys import ApiKeyStore
from storage.settings import DatabaseSettings
from tests.integration.conftest import new_pg_database
from tests.integration.stack import REPO

pytestmark = pytest.mark.integration


def _omniqueue(
    *args: str, env: dict[str, str], cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMNIQ_")}
    base["OMNIQ_DATABASE__URL"] = f"sqlite:///{tmp_path / 'keys.db'}"
    base["PYTHONPATH"] = str(REPO)
    return base


def test_keys_create_list_revoke(env: dict[str, str], tmp_path: Path) -> None:
    assert _omniqueue("migrate", env=env).returncode == 0
    created = _omniqueue("keys", "create", "--name", "ci-bot", env=env)
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("oq-") and len(secret) > 30
    key_id = created.stderr.split()[1]
    assert key_id.startswith("key_")

    listed = _omniqueue("keys", "list", env=env).stdout
    assert key_id in listed and "active" in listed and "ci-bot" in listed
    assert secret not in listed

    # stored hashed: the secret itself is nowhere in the database file
    db = sqlite3.connect(tmp_path / "keys.db")
    rows = db.execute("SELECT * FROM api_keys").fetchall()
    db.close()
    assert rows and all(secret not in str(row) for row in rows)

    url = env["OMNIQ_DATABASE__URL"]
    engine = make_engine(DatabaseSettings(url=url))
    store = ApiKeyStore(make_sessionmaker(engine))
    assert store.verify(secret) is not None
    assert _omniqueue("keys", "revoke", key_id, env=env).returncode == 0
    assert store.verify(secret) is None
    engine.dispose()
    assert "revoked" in _omniqueue("keys", "list", env=env).stdout
    again = _omniqueue("keys", "revoke", key_id, env=env)
    assert again.returncode == 1 and "no active key" in again.stderr


def test_auth_off_is_refused_off_loopback(env: dict[str, str]) -> None:
    env = {**env, "OMNIQ_AUTH": "off"}
    result = _omniqueue("api", "--host", "0.0.0.0", "--port", "1", env=env)
    assert result.returncode == 2
    assert "OMNIQ_AUTH=off is only allowed on a loopback address" in result.stderr


def test_placeholder_secret_is_refused_in_production(env: dict[str, str]) -> None:
    env = {**env, "OMNIQ_S3__SECRET_ACCESS_KEY": "minioadmin", "OMNIQ_MODE": "production"}
    result = _omniqueue("api", "--host", "127.0.0.1", "--port", "1", env=env)
    assert result.returncode == 2
    assert "placeholder" in result.stderr


def test_keys_quotas_are_set_listed_and_reset(env: dict[str, str]) -> None:
    assert _omniqueue("migrate", env=env).returncode == 0
    created = _omniqueue(
        "keys",
        "create",
        "--name",
        "tenant",
        "--creates-per-minute",
        "30",
        "--max-active-jobs",
        "0",
        env=env,
    )
    assert created.returncode == 0, created.stderr
    key_id = created.stderr.split()[1]
    listed = _omniqueue("keys", "list", env=env).stdout
    assert "creates_per_minute=30 max_active_jobs=0 max_sessions=default" in listed

    updated = _omniqueue(
        "keys",
        "update",
        key_id,
        "--creates-per-minute",
        "default",
        "--max-sessions",
        "2",
        env=env,
    )
    assert updated.returncode == 0, updated.stderr
    assert updated.stdout.split("\t") == [
        key_id,
        "creates_per_minute=default max_active_jobs=0 max_sessions=2\n",
    ]
    bad = _omniqueue("keys", "update", key_id, "--max-sessions", "-1", env=env)
    assert bad.returncode == 2 and "0 (unlimited) or more" in bad.stderr
    missing = _omniqueue("keys", "update", "key_nope", "--max-sessions", "1", env=env)
    assert missing.returncode == 1 and "no key key_nope" in missing.stderr


@pytest.fixture
def home(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment with no database configured and HOME in ``tmp_path``; a working
    directory elsewhere in it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMNIQ_")}
    base.pop("XDG_DATA_HOME", None)
    base.update({"HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)})
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    return base, tmp_path


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1 and result.stdout == "", result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback
    return lines[0]


def test_keys_without_a_database_say_to_migrate_and_create_nothing(
    home: tuple[dict[str, str], Path],
) -> None:
    env, tmp = home
    for command in (["keys", "list"], ["webhooks", "list"], ["keys", "create", "--name", "x"]):
        line = _one_line(_omniqueue(*command, env=env, cwd=tmp / "work"))
        expected = tmp / "home" / ".local" / "share" / "omniqueue" / "omniqueue.db"
        assert line == (
            f"omniqueue: no database at {expected}: run `omniqueue migrate` to create it "
            "(`omniqueue up` does), or set OMNIQ_DATABASE__URL"
        )
    # nothing was created: no ./omniqueue-data, no empty per-user directory
    assert sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*")) == ["home", "work"]


def test_the_per_user_database_is_found_from_any_directory(
    home: tuple[dict[str, str], Path],
) -> None:
    env, tmp = home
    assert _omniqueue("migrate", env=env, cwd=tmp / "work").returncode == 0
    assert (tmp / "home" / ".local" / "share" / "omniqueue" / "omniqueue.db").is_file()
    created = _omniqueue("keys", "create", "--name", "anywhere", env=env, cwd=tmp / "work")
    assert created.returncode == 0, created.stderr
    listed = _omniqueue("keys", "list", env=env, cwd=tmp)
    assert "anywhere" in listed.stdout
    assert sorted(p.name for p in tmp.iterdir()) == ["home", "work"]
    assert list((tmp / "work").iterdir()) == []


def test_a_database_without_its_schema_is_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    sqlite3.connect(tmp_path / "keys.db").close()  # the file, no tables
    url = env["OMNIQ_DATABASE__URL"]
    for command in (["keys", "list"], ["webhooks", "list"], ["webhooks", "deliveries", "video_x"]):
        line = _one_line(_omniqueue(*command, env=env))
        assert line.startswith(f"omniqueue: the database at {url} has no schema yet"), line
        assert line.endswith(": run `omniqueue migrate`"), line
    with new_pg_database() as pg:
        line = _one_line(_omniqueue("keys", "list", env={**env, "OMNIQ_DATABASE__URL": pg}))
        assert 'relation "api_keys" does not exist' in line, line
        assert line.endswith(": run `omniqueue migrate`"), line
        missing = pg.rsplit("/", 1)[0] + "/oq_no_such_database"
        line = _one_line(_omniqueue("keys", "list", env={**env, "OMNIQ_DATABASE__URL": missing}))
        assert line.startswith("omniqueue: cannot use the database at "), line
        assert 'database "oq_no_such_database" does not exist' in line, line


def test_api_and_worker_without_a_schema_say_to_migrate(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """``omniqueue api`` and ``worker`` check the schema before they start: a missing
    SQLite file or a database without its tables is one line, exit 1, nothing created."""
    for command in (["api", "--port", "1"], ["worker"]):
        line = _one_line(_omniqueue(*command, env=env))
        assert line == (
            f"omniqueue {command[0]}: no database at {tmp_path / 'keys.db'}: run "
            "`omniqueue migrate` to create it (`omniqueue up` does), or set OMNIQ_DATABASE__URL"
        )
    assert not (tmp_path / "keys.db").exists()
    with new_pg_database() as pg:
        line = _one_line(_omniqueue("worker", env={**env, "OMNIQ_DATABASE__URL": pg}))
        assert line.startswith("omniqueue worker: the database at ") and "no schema yet" in line
        assert line.endswith(": run `omniqueue migrate`"), line


def test_keys_take_the_data_dir_of_up_and_say_which_database(
    home: tuple[dict[str, str], Path],
) -> None:
    """A stack started with ``up --data-dir DIR`` keeps its keys in DIR/omniqueue.db:
    ``keys create`` wrote to the per-user database without saying so, and the stack
    refused that key. ``--data-dir`` means what it means to ``up`` (even over
    OMNIQ_DATABASE__URL, as for ``up``), and every keys command names its database."""
    env, tmp = home
    stack_dir = tmp / "stack-data"
    stack_db = stack_dir / "omniqueue.db"
    elsewhere = {**env, "OMNIQ_DATABASE__URL": f"sqlite:///{tmp / 'other.db'}"}
    assert _omniqueue("migrate", "--data-dir", str(stack_dir), env=elsewhere).returncode == 0
    assert stack_db.is_file() and not (tmp / "other.db").exists()
    created = _omniqueue(
        "keys", "create", "--data-dir", str(stack_dir), "--name", "stack", env=elsewhere
    )
    assert created.returncode == 0, created.stderr
    assert "created key_" in created.stderr and f"in {stack_db};" in created.stderr
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{stack_db}"))
    try:  # the stack's database has it
        assert ApiKeyStore(make_sessionmaker(engine)).verify(created.stdout.strip()) is not None
    finally:
        engine.dispose()
    listed = _omniqueue("keys", "list", "--database-url", f"sqlite:///{stack_db}", env=env)
    assert "stack" in listed.stdout
    # without a database option: the per-user data directory's, named in the refusal
    line = _one_line(_omniqueue("keys", "create", "--name", "x", env=env, cwd=tmp / "work"))
    assert str(tmp / "home" / ".local" / "share" / "omniqueue" / "omniqueue.db") in line
    added = _omniqueue("webhooks", "list", "--data-dir", str(stack_dir), env=env, cwd=tmp / "work")
    assert added.returncode == 0, added.stderr


def test_up_with_a_bad_registry_exits_2_before_starting_anything(
    home: tuple[dict[str, str], Path],
) -> None:
    """docs/cli.md: 2 for a bad configuration (it was 1)."""
    env, tmp = home
    registry = tmp / "models.json"
    registry.write_text('{"model": [{"name": "x", "adapter": "diffusers.wan"}]}')
    data = tmp / "data"
    result = _omniqueue(
        "up", "--data-dir", str(data), env={**env, "OMNIQ_MODEL_REGISTRY": str(registry)}
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"omniqueue up: {registry}: the model registry must be a TOML file, and this one is "
        "JSON (Invalid statement (at line 1, column 1)): write a [[model]] table per model "
        '(docs/configuration.md, "The model registry file")'
    ]
    assert [p.name for p in data.iterdir()] == ["omniqueue.lock"]  # no service started
