"""Webhook delivery delay: from a job's end to its signed event at the receiver.

    python -m benchmarks.jobs.webhooks --jobs 100 --workers 2

Starts its own embedded stack (``omniqueue up``: SQLite, the webhook sender process,
private destinations allowed on loopback) and a receiver on this machine
(``tests/integration/webhook_receiver.py``), submits ``--jobs`` small video jobs at once,
each with ``webhook_url`` pointing at the receiver, and waits for every event. A job's
delay is the arrival of its event minus the job's ``completed_at`` as its row stores it
(written by the worker's final UPDATE; same machine, same clock). Every event is checked
with ``standardwebhooks`` against the server's secret. Prints JSON: p50/p95/p99/max of the
delay in ms, and the sender's poll interval, which bounds the wait of an idle sender.
"""

from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, select
from standardwebhooks import Webhook

from benchmarks.common import machine, parser, summary
from models.db import Job
from storage.outbox import event_id
from tests.embedded_up import start_up, stop_up
from tests.integration.webhook_receiver import running_receiver


def _completed_at(data_dir: Path, ids: list[str]) -> dict[str, float]:
    engine = create_engine(f"sqlite:///{data_dir / 'omniqueue.db'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(Job.id, Job.completed_at).where(Job.id.in_(ids)))
            return {job_id: float(at) for job_id, at in rows if at is not None}
    finally:
        engine.dispose()


def run(url: str, jobs: int, body: dict[str, Any], hook: str) -> dict[str, Any]:
    """Submit ``jobs`` jobs at once (16 connections); their ids and the server's secret."""
    with httpx.Client(base_url=url, timeout=120) as client:
        secret = client.get("/v1/webhooks/secret").json()["key"]

        def submit(_: int) -> str:
            resp = client.post("/v1/videos", json={**body, "webhook_url": hook})
            resp.raise_for_status()
            return str(resp.json()["id"])

        with ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(submit, range(jobs)))
    return {"ids": ids, "secret": secret}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument(
        "--poll-interval", type=float, default=0.5, help="OMNIQ_WEBHOOKS__POLL_INTERVAL_S"
    )
    args = p.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="oq-webhooks-bench-"))
    env = {"OMNIQ_WEBHOOKS__POLL_INTERVAL_S": str(args.poll_interval)}
    body = {"prompt": "webhooks", "size": "64x48", "seconds": "0.5", "fps": 16,
            "num_inference_steps": args.steps}  # fmt: skip
    up, url = start_up(data_dir, env=env, args=("--workers", str(args.workers)))
    try:
        with running_receiver() as receiver:
            started = time.time()
            sent = run(url, args.jobs, body, receiver.url + "/ok")
            events = {event_id(job): job for job in sent["ids"]}
            got = receiver.wait(lambda r: {x.webhook_id for x in r} >= events.keys(), timeout=600)
            wall = time.time() - started
        ended = _completed_at(data_dir, sent["ids"])
        verifier = Webhook(sent["secret"])
        arrival: dict[str, float] = {}
        for receipt in got:
            job = events.get(receipt.webhook_id)
            if job is not None and job not in arrival:
                assert verifier.verify(receipt.body, receipt.headers)["data"]["id"] == job
                arrival[job] = receipt.at
        delays = [(arrival[job] - ended[job]) * 1000 for job in sent["ids"]]
        print(
            json.dumps(
                {
                    "jobs": args.jobs,
                    "workers": args.workers,
                    "request": body,
                    "poll_interval_s": args.poll_interval,
                    "delivery_delay_ms": summary(delays),
                    "duplicates": len(got) - len(events),
                    "wall_s": round(wall, 1),
                    "machine": machine(),
                },
                indent=2,
            )
        )
    finally:
        stop_up(up, data_dir)


if __name__ == "__main__":
    main()
