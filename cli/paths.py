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
    "default_data_dir",
    "default_database_url",
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
