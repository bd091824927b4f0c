"""The fair-share statements by queue depth (prints one JSON object on stdout).

    python -m benchmarks.jobs.fair_share_sql          # 200/2, 2000/2, 10000/2, 10000/100
    python -m benchmarks.jobs.fair_share_sql 5000,20  # QUEUED,KEYS cases of your own

For each case and each database (a SQLite file, and a fresh PostgreSQL database on
``--pg-admin-url``), queues QUEUED jobs of one model spread round-robin over KEYS keys,
runs ``ANALYZE`` on PostgreSQL, then times (median of ``--repeat`` calls, in process):
``JobStore.claim_next`` (the fair claim), ``claim_job`` (the message's own job, as with
``OMNIQ_QUOTAS__FAIR_SHARE=false``), and the queue position of the middle job, fair and
FIFO. Databases are dropped afterwards.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, insert, text

from benchmarks.common import machine, parser
from migrations.runner import upgrade
from models.db import Job
from storage.db import make_engine, make_sessionmaker
from storage.job_statements import JOBS
from storage.jobs import JobStore
from storage.settings import DatabaseSettings
from tests.helpers import video_spec


def _median_ms(fn: Callable[[int], Any], repeat: int) -> float:
    times = []
    for i in range(repeat):
        start = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 2)


def measure(url: str, queued: int, keys: int, repeat: int) -> dict[str, float]:
    upgrade(url)
    engine = make_engine(DatabaseSettings(url=url))
    try:
        t = time.time() - 1e5
        rows = []
        for i in range(queued):
            spec = video_spec(model="m/a")
            job = Job.new(spec, id=f"video_{i}", owner=f"key_{i % keys}", created_at=t + i)
            rows.append({c.key: getattr(job, c.key) for c in JOBS.columns})
        with engine.begin() as conn:
            conn.execute(insert(JOBS), rows)
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE jobs"))
        fair = JobStore(make_sessionmaker(engine), fair_share=True)
        fifo = JobStore(make_sessionmaker(engine))
        middle = f"video_{queued // 2}"

        def position(store: JobStore) -> Callable[[int], Any]:
            return lambda _: store.queue_positions([store.read(middle)])  # type: ignore[list-item]

        return {
            "claim_next_ms": _median_ms(lambda _: fair.claim_next("m/a", "w"), repeat),
            "claim_job_ms": _median_ms(
                lambda i: fair.claim_job(f"video_{queued - 1 - i}", "w"), repeat
            ),
            "fair_position_ms": _median_ms(position(fair), repeat),
            "fifo_position_ms": _median_ms(position(fifo), repeat),
        }
    finally:
        engine.dispose()


def main() -> int:
    p = parser(__doc__)
    p.add_argument("cases", nargs="*", default=["200,2", "2000,2", "10000,2", "10000,100"])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--pg-admin-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = p.parse_args()
    admin = create_engine(args.pg_admin_url, isolation_level="AUTOCOMMIT")
    results: dict[str, Any] = {}
    for case in args.cases:
        queued, keys = (int(n) for n in case.split(","))
        with tempfile.TemporaryDirectory() as tmp:
            results[f"sqlite {queued}/{keys}"] = measure(
                f"sqlite:///{tmp}/fair.db", queued, keys, args.repeat
            )
        name = f"oq_fair_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = args.pg_admin_url.rsplit("/", 1)[0] + "/" + name
            results[f"postgresql {queued}/{keys}"] = measure(url, queued, keys, args.repeat)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        print(f"[fair_share_sql] {case} done", file=sys.stderr, flush=True)
    admin.dispose()
    print(json.dumps({"benchmark": "fair_share_sql", "machine": machine(), **results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
