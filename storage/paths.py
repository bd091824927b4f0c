"""Where omniqueue keeps its files when nothing says otherwise: one absolute per-user
directory, the same from any working directory.

    $OMNIQ_DATA_DIR                      when set (the Dockerfile sets /var/lib/omniqueue)
    $XDG_DATA_HOME/omniqueue             when XDG_DATA_HOME is an absolute path
    ~/.local/share/omniqueue             otherwise

The settings' defaults (``Settings.data_dir``, ``DatabaseSettings.url``: the SQLite file
in it) and the command line (``cli/paths.py``) read it from here.
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
