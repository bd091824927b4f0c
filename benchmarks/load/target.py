"""The stack that ``benchmarks/load/run.py`` loads: an embedded ``omniqueue up`` it starts
and stops, or one already running (``--base-url``), and the handles its end-of-level
checks read (the worker temp dir, Redis, S3, the database)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from benchmarks.embedded_stack import S3_BUCKET, Stack
from benchmarks.load.watch import (
    StackProcesses,
    jobs_by_status,
    redis_keys_without_ttl,
    s3_leftovers,
    temp_dirs,
)


class Target:
    """The stack under load and how to reach what the checks read."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stack: Stack | None = None
        self.url = args.base_url or ""
        self.processes = StackProcesses(
            pids=[int(x) for x in args.pids.split(",") if x.strip()] or None
        )
        self.tmp_dir: Path | None = args.worker_tmp_dir
        self.redis_url: str | None = args.redis_url
        self.worker_log: Path | None = args.worker_log
        self.engine: Any = None
        self.s3: Any = None
        self.bucket = S3_BUCKET

    def describe(self) -> dict[str, Any]:
        a = self.args
        return {
            "kind": "external" if a.base_url else "embedded",
            "url": self.url,
            "workers": None if a.base_url else a.workers,
            "api_processes": None if a.base_url else a.api_processes,
            "database": (a.database_url or "sqlite").split("://")[0].split("+")[0],
            "redis": "external" if a.redis_url else "embedded valkey",
            "env": a.env,
        }

    def start(self) -> None:
        from sqlalchemy import create_engine

        a = self.args
        if a.base_url is None:
            up_args = ["--realtime-workers", "0", "--api-processes", str(a.api_processes)]
            if a.database_url:
                up_args += ["--database-url", a.database_url]
            if a.redis_url:
                up_args += ["--redis-url", a.redis_url]
            env = dict(item.split("=", 1) for item in a.env)
            self.stack = Stack(a.workers, env=env, args=tuple(up_args))
            self.stack.start()
            self.url = self.stack.url
            self.processes = StackProcesses(up_pid=self.stack.pid)
            self.tmp_dir = self.stack.tmp_dir
            self.worker_log = self.stack.log_path
            self.redis_url = a.redis_url or f"redis://127.0.0.1:{self.stack.valkey_port()}/0"
            self.s3 = self.stack.s3_client()
            db = a.database_url or f"sqlite:///{self.stack.data_dir / 'omniqueue.db'}"
        else:
            if a.up_pid is not None:
                self.processes = StackProcesses(up_pid=a.up_pid, pids=self.processes.pids)
            db = a.database_url
            self.s3 = self._env_s3()
        self.engine = create_engine(db) if db else None

    def _env_s3(self) -> Any:
        endpoint = os.environ.get("OMNIQ_S3__ENDPOINT_URL")
        if not endpoint:
            return None
        import boto3
        from botocore.config import Config

        self.bucket = os.environ.get("OMNIQ_S3__BUCKET", S3_BUCKET)
        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=os.environ.get("OMNIQ_S3__ACCESS_KEY_ID"),
            aws_secret_access_key=os.environ.get("OMNIQ_S3__SECRET_ACCESS_KEY"),
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )

    def end_state(self, restarts: dict[str, int]) -> dict[str, Any]:
        def safe(fn: Any, *fa: Any) -> Any:
            try:
                return fn(*fa)
            except Exception as exc:  # a check that cannot run is reported, not fatal
                return {"error": f"{type(exc).__name__}: {exc}"[:300]}

        return {
            "temp_dirs": temp_dirs(self.tmp_dir),
            "redis": safe(redis_keys_without_ttl, self.redis_url),
            "s3": safe(s3_leftovers, self.s3, self.bucket, self.engine)
            if self.s3 is not None and self.engine is not None
            else None,
            "db_jobs_by_status": safe(jobs_by_status, self.engine) if self.engine else None,
            "worker_restarts": restarts,
        }

    def db_status(self, ids: list[str]) -> dict[str, str] | None:
        if self.engine is None or not ids:
            return None
        from sqlalchemy import bindparam, text

        out: dict[str, str] = {}
        query = text("SELECT id, status FROM jobs WHERE id IN :ids").bindparams(
            bindparam("ids", expanding=True)
        )
        with self.engine.connect() as conn:
            for start in range(0, len(ids), 500):
                out.update(dict(conn.execute(query, {"ids": ids[start : start + 500]}).all()))
        return out

    def stop(self, out: dict[str, Any]) -> None:
        if self.engine is not None:
            self.engine.dispose()
        if self.stack is not None:
            self.stack.shutdown(out, self.args.keep_log)
