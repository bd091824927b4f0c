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

import argparse
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from storage.paths import (
    DATA_DIR_ENV,
    DATABASE_FILE,
    DATABASE_URL_ENV,
    default_data_dir,
    default_database_url,
)

__all__ = [
    "DATABASE_FILE",
    "DATABASE_URL_ENV",
    "DATA_DIR_ENV",
    "add_database_options",
    "default_data_dir",
    "default_database_url",
    "use_database",
    "use_default_database",
]


def use_default_database(env: MutableMapping[str, str] | None = None) -> None:
    """Set ``OMNIQ_DATABASE__URL`` to :func:`default_database_url` in ``env`` (this
    process's environment) unless the database is configured there already
    (``OMNIQ_DATABASE__URL``, or ``OMNIQ_DATABASE`` as JSON; any letter case, as the
    settings read them). Through the environment, not a settings object, so that the
    processes this one starts (a worker group's ranks, Alembic) read the same database.

    The settings object's own default is the same file (``storage/paths.py``); setting it
    in the environment makes the processes this one starts agree even if their ``HOME``
    or ``XDG_DATA_HOME`` differ.
    """
    env = os.environ if env is None else env
    if any(name.upper() in (DATABASE_URL_ENV, "OMNIQ_DATABASE") for name in env):
        return
    env[DATABASE_URL_ENV] = default_database_url(env)


def add_database_options(parser: Any) -> None:
    """``--data-dir`` and ``--database-url`` on a command that opens the database
    (``migrate``, ``keys …``, ``webhooks …``), meaning what they mean to ``omniqueue up``:
    a stack started with ``--data-dir DIR`` is managed with the same ``--data-dir DIR``."""
    group = parser.add_argument_group("database")
    group.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="the database of the stack started with omniqueue up --data-dir DIR (its "
        f"{DATABASE_FILE}) (default: ${DATABASE_URL_ENV}, else the per-user data dir's)",
    )
    group.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="this database, as omniqueue up --database-url URL; over --data-dir "
        "(default: none, as --data-dir)",
    )


def use_database(args: argparse.Namespace, env: MutableMapping[str, str] | None = None) -> None:
    """Choose the command's database as ``omniqueue up`` does: ``--database-url``, else
    the SQLite file of ``--data-dir`` (which is also its ``OMNIQ_DATA_DIR``), each over
    ``OMNIQ_DATABASE__URL``; with neither, :func:`use_default_database`. Set in the
    environment, so the processes the command starts use the same database."""
    env = os.environ if env is None else env
    data_dir = getattr(args, "data_dir", None)
    url = getattr(args, "database_url", None)
    if data_dir is not None:
        env[DATA_DIR_ENV] = str(Path(data_dir).expanduser().resolve())
        url = url or default_database_url(env)
    if url is None:
        use_default_database(env)
        return
    for name in [n for n in env if n.upper() == DATABASE_URL_ENV]:
        del env[name]  # the names are case-insensitive: no other spelling may override it
    env[DATABASE_URL_ENV] = url
