"""Where omniqueue keeps its files when nothing says otherwise: one absolute per-user
directory, the same from any working directory.

    $OMNIQ_DATA_DIR                      when set (the Dockerfile sets /var/lib/omniqueue)
    $XDG_DATA_HOME/omniqueue             when XDG_DATA_HOME is an absolute path
    ~/.local/share/omniqueue             otherwise

``omniqueue up`` keeps its database, Valkey and S3 files there (``--data-dir``), and every
command that opens the database (``api``, ``worker``, ``migrate``, ``keys``, ``webhooks``)
defaults to the SQLite file in it, so ``omniqueue keys list`` after ``omniqueue up`` finds
the stack's keys from any directory. ``OMNIQ_DATABASE__URL`` still overrides it.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

DATA_DIR_ENV = "OMNIQ_DATA_DIR"
DATABASE_URL_ENV = "OMNIQ_DATABASE__URL"
DATABASE_FILE = "omniqueue.db"


def default_data_dir(env: MutableMapping[str, str] | None = None) -> Path:
    """The absolute per-user data directory (module docstring); nothing is created."""
    env = os.environ if env is None else env
    if env.get(DATA_DIR_ENV):
        return Path(env[DATA_DIR_ENV]).expanduser().resolve()
    xdg = env.get("XDG_DATA_HOME", "")
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".local" / "share"
    return base / "omniqueue"


def default_database_url(env: MutableMapping[str, str] | None = None) -> str:
    """The SQLite file in :func:`default_data_dir`, as a SQLAlchemy URL."""
    return f"sqlite:///{default_data_dir(env) / DATABASE_FILE}"


def use_default_database(env: MutableMapping[str, str] | None = None) -> None:
    """Set ``OMNIQ_DATABASE__URL`` to :func:`default_database_url` in ``env`` (this
    process's environment) unless the database is configured there already
    (``OMNIQ_DATABASE__URL``, or ``OMNIQ_DATABASE`` as JSON; any letter case, as the
    settings read them). Through the environment, not a settings object, so that the
    processes this one starts (a worker group's ranks, Alembic) read the same database.

    The settings object's own default (``storage/settings.py``) is a path relative to the
    working directory; every ``omniqueue`` command that opens the database calls this
    first, so that default is never used from the command line.
    """
    env = os.environ if env is None else env
    if any(name.upper() in (DATABASE_URL_ENV, "OMNIQ_DATABASE") for name in env):
        return
    env[DATABASE_URL_ENV] = default_database_url(env)
