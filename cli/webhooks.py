"""``omniqueue webhooks …``: the sender process and an API key's endpoints.

    omniqueue webhooks serve                                   the webhook sender
    omniqueue webhooks add URL [--key KEY_ID] [--events a,b]   every event of a key's jobs
    omniqueue webhooks list [--key KEY_ID]
    omniqueue webhooks remove ENDPOINT_ID
    omniqueue webhooks deliveries JOB_ID                       what was sent, attempt by attempt

Without ``--key`` an endpoint belongs to ``local``, the owner of every job while auth is
off. The URL passes the same checks as a request's ``webhook_url`` (the URL guard
included, under this process's ``OMNIQ_WEBHOOKS__ALLOW_PRIVATE``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.database import opened
from cli.help import command, command_group
from cli.paths import add_database_options
from models.errors import InvalidRequest
from models.webhooks import ALL_EVENT_TYPES
from storage.constants import LOCAL_OWNER
from storage.settings import Settings, get_settings


def add_parser(sub: Any) -> None:
    """The ``webhooks`` command and its subcommands, on ``omniqueue``'s subparsers."""
    wsub = command_group(
        sub,
        "webhooks",
        help="the webhook sender and per-key webhook endpoints",
        description="""Run the webhook sender, and manage the endpoints that get an API
        key's job events (signed, Standard Webhooks; docs/webhooks.md), straight in the
        database (--database-url or --data-dir as given to omniqueue up, else
        OMNIQ_DATABASE__URL, else the per-user data dir's).""",
        dest="webhooks_cmd",
        func=run,
        uses_database=True,
    )
    command(
        wsub,
        "serve",
        help="run the webhook sender (omniqueue up runs one)",
        description="Run the webhook sender: it delivers queued job events and retries "
        "failed deliveries until they expire.",
    )
    add = command(
        wsub,
        "add",
        help="send a key's job events to URL",
        description="Send the job events of an API key's jobs to URL; prints the endpoint's id.",
    )
    add.add_argument("url", help="an absolute http(s) URL the destination guard allows")
    add.add_argument(
        "--key", default=LOCAL_OWNER, help="API key id (local: every job while auth is off)"
    )
    add.add_argument(
        "--events",
        default=None,
        help=f"comma-separated event types (default: all of {','.join(ALL_EVENT_TYPES)})",
    )
    ls = command(
        wsub,
        "list",
        help="list endpoints",
        description="List endpoints: id, owner, events, URL.",
    )
    ls.add_argument("--key", default=None, help="only this API key's (default: every key's)")
    rm = command(
        wsub,
        "remove",
        help="remove an endpoint",
        description="Remove an endpoint: its key's job events are no longer sent there.",
    )
    rm.add_argument("endpoint_id", help="the endpoint's id (from webhooks list)")
    dl = command(
        wsub,
        "deliveries",
        help="a job's webhook deliveries and their attempts",
        description="Print a job's webhook deliveries, one JSON line each, with their attempts.",
    )
    dl.add_argument("job_id", help="a job id (video_… or audio_…)")
    for parser in wsub.choices.values():
        add_database_options(parser)


def run(args: argparse.Namespace) -> int:
    settings = get_settings()
    if args.webhooks_cmd == "serve":
        from workers.services.webhooks import serve

        return serve(settings)

    with opened(settings.database) as sessions:
        run_command = {"add": _add, "list": _list, "remove": _remove, "deliveries": _deliveries}
        return run_command[args.webhooks_cmd](args, sessions, settings)


def _add(args: argparse.Namespace, sessions: Any, settings: Settings) -> int:
    from storage.keys import ApiKeyStore
    from storage.webhooks import WebhookStore, check_destination, check_events

    if args.key != LOCAL_OWNER and args.key not in {k.id for k in ApiKeyStore(sessions).list()}:
        print(f"no API key {args.key} (omniqueue keys list)", file=sys.stderr)
        return 1
    try:
        check_destination(args.url, settings.webhooks, "URL")
        events = None
        if args.events is not None:
            names = [e.strip() for e in args.events.split(",") if e.strip()]
            events = check_events(names, ALL_EVENT_TYPES, "--events")
    except InvalidRequest as exc:
        print(f"omniqueue webhooks add: {exc.message}", file=sys.stderr)
        return 2
    row = WebhookStore(sessions).add_endpoint(args.key, args.url, events)
    print(row.id)
    print(f"added {row.id}: events of {row.owner}'s jobs go to {row.url}", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace, sessions: Any, _settings: Settings) -> int:
    from storage.webhooks import WebhookStore

    for row in WebhookStore(sessions).endpoints(args.key):
        events = ",".join(row.events) if row.events is not None else "all"
        print(f"{row.id}\t{row.owner}\t{events}\t{row.url}")
    return 0


def _remove(args: argparse.Namespace, sessions: Any, _settings: Settings) -> int:
    from storage.webhooks import WebhookStore

    if not WebhookStore(sessions).remove_endpoint(args.endpoint_id):
        print(f"no endpoint {args.endpoint_id}", file=sys.stderr)
        return 1
    print(f"removed {args.endpoint_id}", file=sys.stderr)
    return 0


def _deliveries(args: argparse.Namespace, sessions: Any, _settings: Settings) -> int:
    """One JSON line per delivery of the job's event, its attempts included."""
    from storage.outbox import WebhookOutbox

    for delivery in WebhookOutbox(sessions).deliveries(args.job_id):
        delivery.pop("payload")
        print(json.dumps(delivery))
    return 0
