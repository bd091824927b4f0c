"""The ``omniqueue`` command: server entry points, key management, the embedded stack and a
client.

    omniqueue up [--host] [--port] [--data-dir] [--workers N]   embedded stack, one command
                 [--api-processes N] [--api-replicas N] [--database-url URL]
                 [--redis-url URL]
                 [--worker-devices cuda:0,cuda:1] [--group cuda:2,cuda:3 ...]
    omniqueue api [--host] [--port]                             the HTTP API
    omniqueue worker [--name] [--models] [--device]             one GPU worker process
    omniqueue worker --devices cuda:0,cuda:1                    one job across N GPUs
    omniqueue migrate                                           alembic upgrade head
    omniqueue keys create --name NAME | list | revoke KEY_ID    API keys (cli/keys.py)
    omniqueue keys update KEY_ID --max-active-jobs N ...        a key's quotas
    omniqueue webhooks serve | add URL [--key] [--events] | list | remove ID | deliveries JOB
    omniqueue generate "prompt" [...]                           submit, watch, download
    omniqueue loras                                             the LoRA adapter catalog
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

from cli import keys
from storage.settings import Settings, get_settings


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
    if settings.worker.group_size > 1:
        if args.realtime:
            print("omniqueue worker: --realtime runs on one device, not --devices", file=sys.stderr)
            return 2
        from workers.group import run_group

        return run_group(settings, args.name)
    from workers.celery_app import serve

    return serve(settings, args.name, realtime=bool(args.realtime))


def _cmd_migrate(_: argparse.Namespace) -> int:
    from migrations.runner import upgrade

    settings = get_settings()
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
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    from cli.generate import run_generate

    return run_generate(
        args.prompt,
        url=args.url,
        api_key=args.api_key,
        seconds=args.seconds,
        size=args.size,
        steps=args.steps,
        seed=args.seed,
        model=args.model,
        output=args.output,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omniqueue", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser(
        "up",
        help="run the embedded stack (Valkey, SQLite, S3, API, workers)",
        description="Run the whole stack on this machine: embedded Valkey, SQLite and S3 "
        "under --data-dir, the API on --host:--port (the playground at /), job and realtime "
        "workers. Ctrl-C stops everything.",
    )
    up.add_argument(
        "--host", default="127.0.0.1", help="address the API binds to (default: %(default)s)"
    )
    up.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the API's port; clients then need --url / OMNIQ_URL http://HOST:PORT "
        "(default: %(default)s)",
    )
    up.add_argument(
        "--data-dir",
        default="omniqueue-data",
        help="where the database, Valkey and S3 files live (default: %(default)s)",
    )
    up.add_argument(
        "--workers",
        type=int,
        default=1,
        help="job worker processes on the default device (default: %(default)s)",
    )
    up.add_argument(
        "--worker-devices",
        default=None,
        help="one worker per device (cuda:0,cuda:1,…) instead of --workers on one device",
    )
    up.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="DEVICES",
        help="also a worker group on these devices (cuda:0,cuda:1); repeat for more groups",
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
        help="an existing database (e.g. PostgreSQL) instead of SQLite in the data dir",
    )
    up.add_argument(
        "--redis-url",
        default=None,
        help="an existing Redis (redis://host:port/db) instead of the embedded Valkey",
    )
    up.set_defaults(func=_cmd_up)

    api = sub.add_parser("api", help="serve the HTTP API")
    api.add_argument("--host", default=None)
    api.add_argument("--port", type=int, default=None)
    api.set_defaults(func=_cmd_api)

    worker = sub.add_parser("worker", help="run one worker process (one per GPU)")
    worker.add_argument("--name", default="worker")
    worker.add_argument("--models", default=None, help="comma-separated served models")
    worker.add_argument("--device", default=None, help="cpu, cuda, cuda:1, …")
    worker.add_argument(
        "--devices",
        default=None,
        help="a worker group: one job across these devices (cuda:0,cuda:1), a process each",
    )
    worker.add_argument(
        "--realtime",
        action="store_true",
        help="serve realtime sessions of streaming models (OMNIQ_REALTIME__SLOTS threads)",
    )
    worker.set_defaults(func=_cmd_worker)

    mig = sub.add_parser("migrate", help="upgrade the database schema to the latest revision")
    mig.set_defaults(func=_cmd_migrate)

    keys.add_parser(sub)

    loras = sub.add_parser("loras", help="list the LoRA adapters of the lora roots")
    loras.set_defaults(func=_cmd_loras)

    from cli import webhooks

    webhooks.add_parser(sub)

    gen = sub.add_parser("generate", help="generate a video and download it")
    gen.add_argument("prompt")
    gen.add_argument("--seconds", default=None)
    gen.add_argument("--size", default=None, help="WIDTHxHEIGHT")
    gen.add_argument("--steps", type=int, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--model", default=None)
    gen.add_argument("-o", "--output", default=None)
    gen.add_argument("--url", default=None, help="API base URL (env OMNIQ_URL)")
    gen.add_argument("--api-key", default=None, help="API key (env OMNIQ_API_KEY)")
    gen.set_defaults(func=_cmd_generate)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as exc:  # configuration errors: say what to fix, no traceback
        print(f"omniqueue: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Settings", "build_parser", "main"]
