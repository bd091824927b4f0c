"""``omniqueue keys``: create, list, update and revoke API keys.

    omniqueue keys create --name NAME [--creates-per-minute N] [--max-active-jobs N]
                                      [--max-sessions N]
    omniqueue keys update KEY_ID [--creates-per-minute N|default] [...]
    omniqueue keys list
    omniqueue keys revoke KEY_ID

A quota given as ``N`` is the key's own (0: unlimited for this key); ``default`` (or a
quota never given) follows the server default ``OMNIQ_QUOTAS__*`` (``docs/limits.md``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cli.database import database_name, opened
from cli.help import command, command_group
from cli.paths import add_database_options
from storage.settings import get_settings

# (flag, ApiKey column, help)
_QUOTAS = (
    ("--creates-per-minute", "creates_per_minute", "job create requests per minute"),
    ("--max-active-jobs", "max_active_jobs", "jobs queued or running at once"),
    ("--max-sessions", "max_sessions", "realtime sessions connected at once"),
)
DEFAULT = "default"


def _quota(text: str) -> int | str:
    if text == DEFAULT:
        return DEFAULT
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number or {DEFAULT!r}: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"0 (unlimited) or more, not {value}")
    return value


def add_parser(sub: Any) -> None:
    """The ``keys`` command and its subcommands on the top-level ``sub`` parsers."""
    ksub = command_group(
        sub,
        "keys",
        help="manage API keys and their quotas (in the database)",
        description="""Create, list, update and revoke API keys, straight in the database:
        --database-url or --data-dir as given to omniqueue up, else OMNIQ_DATABASE__URL,
        else the per-user data dir's; each command says which. A key is printed once and
        stored hashed. A quota given as N is the key's own (0:
        unlimited); 'default' follows the server's OMNIQ_QUOTAS__* (docs/limits.md).""",
        dest="keys_cmd",
        func=run,
        uses_database=True,
    )
    kc = command(
        ksub,
        "create",
        help="create a key (printed once)",
        description="Create a key: the secret on stdout (shown only this once), its id on stderr.",
    )
    kc.add_argument("--name", required=True, help="a label for the key (required)")
    ku = command(ksub, "update", help="change a key's quotas", description="Change a key's quotas.")
    ku.add_argument("key_id", help="the key's id (key_…, from omniqueue keys list)")
    for parser in (kc, ku):
        for flag, _, what in _QUOTAS:
            parser.add_argument(
                flag,
                type=_quota,
                default=None,
                help=f"{what}; 0 unlimited, '{DEFAULT}' the server's "
                f"(default: {'unchanged' if parser is ku else DEFAULT})",
            )
    command(
        ksub,
        "list",
        help="list keys",
        description="List every key: id, prefix, active or revoked, name, quotas.",
    )
    kr = command(
        ksub,
        "revoke",
        help="revoke a key",
        description="Revoke a key: requests with it get 401 from then on.",
    )
    kr.add_argument("key_id", help="the key's id (key_…)")
    for parser in ksub.choices.values():
        add_database_options(parser)


def _given(args: argparse.Namespace) -> dict[str, int | None]:
    """The quotas given on the command line (``default`` → None: the server's)."""
    given = {}
    for _, name, _ in _QUOTAS:
        value = getattr(args, name)
        if value is not None:
            given[name] = None if value == DEFAULT else int(value)
    return given


def _limits(row: Any) -> str:
    parts = []
    for _, name, _ in _QUOTAS:
        value = getattr(row, name)
        parts.append(f"{name}={DEFAULT if value is None else value}")
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    from storage.keys import ApiKeyStore

    database = get_settings().database
    where = f"in {database_name(database.url)}"
    with opened(database) as sessions:
        store = ApiKeyStore(sessions)
        if args.keys_cmd == "create":
            row, secret = store.create(args.name, **_given(args))
            print(secret)
            print(
                f"created {row.id} ({row.name}) {where}; the key is shown only once",
                file=sys.stderr,
            )
        elif args.keys_cmd == "update":
            updated = store.update(args.key_id, **_given(args))
            if updated is None:
                print(f"no key {args.key_id} {where}", file=sys.stderr)
                return 1
            print(f"{updated.id}\t{_limits(updated)}")
        elif args.keys_cmd == "list":
            rows = store.list()
            if not rows:
                print(f"no keys {where} (omniqueue keys create --name NAME)", file=sys.stderr)
            for row in rows:
                state = "revoked" if row.revoked_at else "active"
                print(f"{row.id}\t{row.prefix}…\t{state}\t{row.name}\t{_limits(row)}")
        else:
            if not store.revoke(args.key_id):
                print(f"no active key {args.key_id} {where}", file=sys.stderr)
                return 1
            print(f"revoked {args.key_id} {where}", file=sys.stderr)
    return 0
