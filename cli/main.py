"""omniqueue runs a queue of generative video and audio jobs: the API, workers and
their services (up, api, worker, migrate, keys, webhooks, loras), and a client of its
HTTP API (video, audio, speech, status, list, cancel, download, models).

examples:
  omniqueue up                                        the whole stack on this machine
  omniqueue video "a red ball bouncing at sunset" --seconds 2 --size 480x272 -o ball.mp4
  omniqueue list
  omniqueue keys create --name my-app
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from cli import keys, verbs, webhooks
from cli.database import DatabaseUnusable, create_sqlite_dir
from cli.help import HelpFormatter, command
from cli.paths import add_database_options, default_data_dir, default_database_url, use_database
from storage.settings import Settings, get_settings
from workers.runtime.processes import exiting


def _metrics_mode(settings: Settings, *, api: bool) -> None:
    """Choose where this process keeps its metrics, before ``prometheus_client`` is
    imported (it reads ``PROMETHEUS_MULTIPROC_DIR`` then): an API process in the files of
    ``OMNIQ_METRICS__MULTIPROC_DIR`` when set, a worker always in memory (it serves its
    own port, and must not count into an API's directory)."""
    directory = settings.metrics.multiproc_dir
    if api and settings.metrics.enabled and directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    elif not api:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)


def _schema_missing(command: str, settings: Any) -> bool:
    """Say so in one line (and return True) when the database has no schema yet."""
    from cli.database import schema_missing

    message = schema_missing(settings.database)
    if message is not None:
        print(f"omniqueue {command}: {message}", file=sys.stderr)
    return message is not None


def _cmd_api(args: argparse.Namespace) -> int:
    settings = get_settings()
    _metrics_mode(settings, api=True)
    import uvicorn

    from api.access_log import log_config
    from api.app import create_app
    from api.http_deadlines import deadline_protocol

    host = args.host or settings.host
    port = args.port or settings.port
    settings.check_auth_binding(host)
    settings.check_secrets()  # create_app checks them too; a configuration error comes first
    if _schema_missing("api", settings):
        return 1
    # h11 with deadlines for receiving headers and body (slow clients are closed)
    http = deadline_protocol(settings.http.header_timeout_s, settings.http.body_timeout_s)
    config = uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        log_level="info",
        log_config=log_config(),
        access_log=settings.http.access_log,
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        http=http,
        ws_per_message_deflate=settings.http.ws_compression,
    )
    sockets = [_shared_socket(host, port)] if settings.http.reuse_port else None
    uvicorn.Server(config).run(sockets=sockets)
    exiting()
    return 0


def _shared_socket(host: str, port: int) -> socket.socket:
    """A listening address other ``omniqueue api`` processes may bind too (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on accepted
    # sockets whose proto says TCP, and with Nagle on a response's body waited ~40 ms for
    # the client's delayed ACK of its headers on every reused connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _cmd_worker(args: argparse.Namespace) -> int:
    settings = get_settings()
    _metrics_mode(settings, api=False)
    update: dict[str, object] = {}
    if args.models:
        update["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.device:
        update["device"] = args.device
    if args.devices:
        update["devices"] = [d.strip() for d in args.devices.split(",") if d.strip()]
    worker = settings.worker.model_copy(update=update)
    settings = settings.model_copy(update={"worker": worker})
    settings.check_secrets()
    if _schema_missing("worker", settings):
        return 1
    if settings.worker.group_size > 1:
        if args.realtime:
            print("omniqueue worker: --realtime runs on one device, not --devices", file=sys.stderr)
            return 2
        from workers.runtime.group import run_group

        return run_group(settings, args.name)
    from workers.runtime.celery_app import serve

    code = serve(settings, args.name, realtime=bool(args.realtime))
    exiting()
    return code


def _cmd_migrate(args: argparse.Namespace) -> int:
    if args.quiet:  # Alembic's INFO lines: a plugin each (at import), a revision each
        logging.getLogger("alembic").setLevel(logging.WARNING)
    from migrations.runner import upgrade

    settings = get_settings()
    create_sqlite_dir(settings.database.url)
    upgrade(settings.database.url)
    print("database is at the latest revision", file=sys.stderr)
    return 0


def _cmd_loras(_: argparse.Namespace) -> int:
    """The adapters ``lora.name`` may name alone: name and weights file, a line each."""
    from api.loras import catalog

    settings = get_settings()
    if not settings.lora.roots:
        print("no lora roots (set OMNIQ_LORA__ROOTS)", file=sys.stderr)
        return 0
    for entry in catalog(settings.lora):
        print(f"{entry.name}\t{entry.path}")
    return 0


def _devices(text: str | None) -> list[str]:
    return [d.strip() for d in (text or "").split(",") if d.strip()]


def _cmd_up(args: argparse.Namespace) -> int:
    from cli.up import run_up

    worker_devices = _devices(args.worker_devices)
    return run_up(
        host=args.host,
        port=args.port,
        data_dir=Path(args.data_dir),
        workers=len(worker_devices) if worker_devices else args.workers,
        worker_devices=worker_devices,
        groups=[_devices(g) for g in args.group],
        realtime_workers=args.realtime_workers,
        database_url=args.database_url,
        api_processes=args.api_processes,
        api_replicas=args.api_replicas,
        redis_url=args.redis_url,
        drain_timeout=args.drain_timeout,
    )


def _add_up(sub: Any) -> None:
    up = command(
        sub,
        "up",
        help="run the whole stack on this machine (Valkey, SQLite, S3, API, workers)",
        description="""Run the whole stack on this machine: embedded Valkey, SQLite and S3
        under --data-dir, the API on --host:--port (the playground at /), job and realtime
        workers and the webhook sender; a process that dies is restarted. Ctrl-C stops
        everything. Auth is off on loopback.""",
    )
    up.add_argument("--host", default="127.0.0.1", help="address the API binds to")
    up.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the API's port; clients then need --url / OMNIQ_URL http://HOST:PORT",
    )
    up.add_argument(
        "--data-dir",
        default=str(default_data_dir()),
        help="where the database, Valkey and S3 files live; the default is per user "
        "($OMNIQ_DATA_DIR, else $XDG_DATA_HOME/omniqueue, else ~/.local/share/omniqueue)",
    )
    up.add_argument(
        "--workers", type=int, default=1, help="job worker processes on the default device"
    )
    up.add_argument(
        "--worker-devices",
        default=None,
        help="one worker per device (cuda:0,cuda:1,…) instead of --workers on one device "
        "(default: none)",
    )
    up.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="DEVICES",
        help="also a worker group on these devices (cuda:0,cuda:1); repeat for more groups "
        "(default: none)",
    )
    up.add_argument(
        "--realtime-workers",
        type=int,
        default=1,
        help="realtime worker processes (each with OMNIQ_REALTIME__SLOTS session threads)",
    )
    up.add_argument(
        "--api-processes",
        type=int,
        default=1,
        help="API processes sharing the port (SO_REUSEPORT); more use more cores",
    )
    up.add_argument(
        "--api-replicas",
        type=int,
        default=1,
        help="API replicas on ports PORT … PORT+N-1 sharing the stack (any serves any client)",
    )
    up.add_argument(
        "--database-url",
        default=None,
        help="an existing database (e.g. PostgreSQL) instead of SQLite "
        "(default: omniqueue.db in the data dir)",
    )
    up.add_argument(
        "--redis-url",
        default=None,
        help="an existing Redis (redis://host:port/db) instead of the embedded Valkey "
        "(default: none, the embedded one)",
    )
    up.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="S",
        help="on Ctrl-C/SIGTERM, let a running job finish if it ends within S seconds; "
        "past them, or with 0, it goes back to the queue at once for the next start "
        "(default: OMNIQ_WORKER__DRAIN_TIMEOUT_S, 0)",
    )
    up.set_defaults(func=_cmd_up)


def _add_server_commands(sub: Any) -> None:
    """``api``, ``worker``, ``migrate`` and ``loras``: the processes of a deployment."""
    api = command(
        sub,
        "api",
        help="serve the HTTP API (one process; run several behind a load balancer)",
        description="""Serve the HTTP API and the playground: the OpenAI-style
        /v1/videos and /v1/audio/* routes, realtime WebSockets, /metrics. Configured by
        OMNIQ_* variables (docs/configuration.md); the database must be migrated first
        (omniqueue migrate). With OMNIQ_AUTH=off it binds only to loopback.""",
    )
    api.add_argument(
        "--host", default=None, help="address to bind (default: $OMNIQ_HOST, else 127.0.0.1)"
    )
    api.add_argument(
        "--port", type=int, default=None, help="port to bind (default: $OMNIQ_PORT, else 8000)"
    )
    api.set_defaults(func=_cmd_api, uses_database=True)

    worker = command(
        sub,
        "worker",
        help="run one worker process (one per GPU) that takes jobs off the queue",
        description="""Run one Celery worker process that takes jobs of its models off
        the queue and runs them step by step on one device (a solo pool: one job at a
        time), or, with --devices, one job across several GPUs, or, with --realtime,
        realtime sessions. Configured by OMNIQ_* variables like the API.""",
    )
    worker.add_argument("--name", default="worker", help="the worker's name in logs and metrics")
    worker.add_argument(
        "--models",
        default=None,
        help="comma-separated models to serve (default: $OMNIQ_WORKER__MODELS, else every "
        "served model)",
    )
    worker.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:1, … (default: $OMNIQ_WORKER__DEVICE, else cpu)",
    )
    worker.add_argument(
        "--devices",
        default=None,
        help="a worker group: one job across these devices (cuda:0,cuda:1), a process each "
        "(default: none, one device)",
    )
    worker.add_argument(
        "--realtime",
        action="store_true",
        help="serve realtime sessions of streaming models (OMNIQ_REALTIME__SLOTS threads)",
    )
    worker.set_defaults(func=_cmd_worker, uses_database=True)

    mig = command(
        sub,
        "migrate",
        help="create or upgrade the database schema to the latest revision",
        description=f"""Create the database's tables, or upgrade them to the latest
        revision (Alembic), at OMNIQ_DATABASE__URL (default: {default_database_url()}). Run
        it before the API and workers, and after every upgrade of omniqueue; omniqueue up
        runs it itself.""",
    )
    mig.add_argument(
        "--quiet",
        action="store_true",
        help="only Alembic's warnings and errors, not a line per revision (omniqueue up)",
    )
    add_database_options(mig)
    mig.set_defaults(func=_cmd_migrate, uses_database=True)

    loras = command(
        sub,
        "loras",
        help="list the LoRA adapters of the lora roots",
        description="""List the LoRA adapters found under OMNIQ_LORA__ROOTS on this
        machine, a name and its weights file a line: the names a request's lora.name
        (omniqueue video --lora NAME) may give alone.""",
    )
    loras.set_defaults(func=_cmd_loras)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omniqueue",
        description=__doc__,
        epilog=f"""Data: omniqueue up keeps its files in {default_data_dir()}
        ($OMNIQ_DATA_DIR, else $XDG_DATA_HOME/omniqueue, else ~/.local/share/omniqueue);
        the commands that open the database default to its omniqueue.db
        (OMNIQ_DATABASE__URL overrides). `omniqueue COMMAND --help` describes a command;
        docs/cli.md all of them.""",
        formatter_class=HelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    _add_up(sub)
    verbs.add_parsers(sub)
    _add_server_commands(sub)
    keys.add_parser(sub)
    webhooks.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    if getattr(args, "uses_database", False):
        use_database(args)  # --database-url, --data-dir, OMNIQ_DATABASE__URL, the per-user file
    try:
        return int(args.func(args))
    except ValueError as exc:  # configuration errors: say what to fix, no traceback
        print(f"omniqueue: {exc}", file=sys.stderr)
        return 2
    except DatabaseUnusable as exc:  # not migrated, missing, unreachable: what to run
        print(f"omniqueue: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # stdout closed early (omniqueue list | head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Settings", "build_parser", "main"]
