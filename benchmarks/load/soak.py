"""Soak: many small jobs, a share cancelled or deleted at random moments, then a search for
anything left behind (prints one JSON object on stdout).

    python -m benchmarks.load.soak --jobs 500
    python -m benchmarks.load.soak --jobs 40 --settle 5      # a quick run

Starts ``python -m cli.main up`` on a free port with its own temporary data directory
(the worker's temp dir inside it, through ``OMNIQ_WORKER__TMP_DIR``), runs a warm-up of
10 jobs, takes the RSS of the API and worker processes (children of ``up``, found by
their command line), then runs ``--jobs`` jobs from ``--concurrency`` client threads:
small shape (64x48, 8 frames, 3–5 steps), ``--cancel-share`` of them cancelled after a
random delay of 0–1.5 s (a third of those through ``DELETE`` instead of ``/cancel``).
Every random choice comes from ``--seed``.

Once every job is terminal it waits ``--settle`` s (the reconciler and the temp sweep
run every 10 s), measures RSS again and counts what should be zero:

- ``omniq-*`` temp directories in the worker's temp dir;
- open multipart uploads in the bucket;
- orphan objects: every key under ``videos/<id>/`` for a job that is failed, cancelled or
  deleted (404), and for a completed job any key besides ``output/{attempt}/video.mp4``
  and ``output/{attempt}/thumbnail.jpg`` of the attempt that completed it;
- Redis keys ``oq:*`` without a TTL (the total key count and the broker's keys — Celery's
  ``_kombu.*``, queues, ``unacked`` — are reported separately).

S3 and Valkey are reached on the ports their ``up`` child processes listen on, with the
embedded stack's fixed credentials (cli.embedded.EmbeddedS3's defaults). Then ``up`` is
stopped with SIGINT (it must exit 0) and the data directory removed. Progress: stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from benchmarks.common import parser, pct
from benchmarks.embedded_stack import (
    S3_BUCKET,
    LogWatcher,
    Stack,
    report,
    say,
)

OUTPUT_NAMES = ("video.mp4", "thumbnail.jpg")  # under output/{attempt}/
RSS_TARGET_MB = 20.0


def rss_mb(stack: Stack) -> dict[str, float]:
    """RSS of the API process and of each (realtime) worker process with any children, MiB."""
    out: dict[str, float] = {}
    procs = stack.children()
    for role in ("api", "worker", "realtime_worker"):
        for i, proc in enumerate(procs[role]):
            total = proc.memory_info().rss
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += child.memory_info().rss
            out[role if role == "api" else f"{role}{i}"] = round(total / 2**20, 1)
    return out


class Soak:
    def __init__(self, client: httpx.Client, args: argparse.Namespace) -> None:
        self.client = client
        self.args = args
        self.done = 0
        self._lock = threading.Lock()

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        body = {
            "prompt": f"soak {spec['i']}: a small green kite",
            "size": self.args.size,
            "num_frames": self.args.frames,
            "num_inference_steps": spec["steps"],
            "seed": spec["i"],
        }
        t0 = time.time()
        resp = self.client.post("/v1/videos", json=body)
        resp.raise_for_status()
        job_id = resp.json()["id"]
        result: dict[str, Any] = {"id": job_id, "action": spec["action"]}
        if spec["action"] != "none":
            time.sleep(spec["delay"])
            if spec["action"] == "cancel":
                r = self.client.post(f"/v1/videos/{job_id}/cancel")
                result["answer"] = r.json().get("status") if r.status_code == 200 else r.status_code
            else:
                r = self.client.delete(f"/v1/videos/{job_id}")
                result["answer"] = r.status_code
            result["action_status_code"] = r.status_code
        while True:
            r = self.client.get(f"/v1/videos/{job_id}")
            if r.status_code == 404:
                result["outcome"] = "deleted"
                break
            r.raise_for_status()
            video = r.json()
            if video["status"] == "completed":
                result["outcome"] = "completed"
                break
            if video["status"] == "failed":
                code = (video.get("error") or {}).get("code")
                result["outcome"] = "cancelled" if code == "cancelled" else f"failed:{code}"
                break
            time.sleep(self.args.poll)
        result["end_to_end_s"] = time.time() - t0
        with self._lock:
            self.done += 1
            if self.done % 50 == 0:
                say(f"{self.done} jobs terminal")
        return result


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    specs = []
    for i in range(args.jobs):
        steps = rng.randint(args.min_steps, args.max_steps)
        r = rng.random()
        if r < args.cancel_share * (1 - args.delete_part):
            action = "cancel"
        elif r < args.cancel_share:
            action = "delete"
        else:
            action = "none"
        specs.append({"i": i, "steps": steps, "action": action, "delay": rng.uniform(0, 1.5)})
    return specs


def count_temp_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("omniq-*"))


def check_objects(stack: Stack, client: httpx.Client, job_ids: list[str]) -> dict[str, Any]:
    s3 = stack.s3_client()
    uploads: list[dict[str, Any]] = []
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=S3_BUCKET):
        uploads.extend(page.get("Uploads", []) or [])
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET):
        keys.extend(o["Key"] for o in page.get("Contents", []) or [])
    by_job: dict[str, set[str]] = defaultdict(set)
    other_keys = []
    for key in keys:
        m = re.match(r"^videos/([^/]+)/(.+)$", key)
        if m:
            by_job[m.group(1)].add(m.group(2))
        else:
            other_keys.append(key)
    status_of: dict[str, str] = {}
    attempt_of: dict[str, int] = {}
    for job_id in sorted(set(job_ids) | set(by_job)):
        r = client.get(f"/v1/videos/{job_id}")
        if r.status_code == 404:
            status_of[job_id] = "deleted"
        else:
            r.raise_for_status()
            video = r.json()
            attempt_of[job_id] = video.get("attempt") or 0
            code = (video.get("error") or {}).get("code")
            status_of[job_id] = video["status"] if video["status"] != "failed" else f"failed:{code}"
    orphans: list[str] = []
    orphan_by_status: Counter[str] = Counter()
    missing_output: list[str] = []
    not_terminal = [j for j, s in status_of.items() if s in ("queued", "in_progress")]
    for job_id, status in status_of.items():
        present = by_job.get(job_id, set())
        if status == "completed":
            expected = {f"output/{attempt_of[job_id]}/{name}" for name in OUTPUT_NAMES}
            extra = present - expected
            if expected - present:
                missing_output.append(job_id)
        elif status in ("queued", "in_progress"):
            extra = set()
        else:
            extra = present
        for name in sorted(extra):
            orphans.append(f"videos/{job_id}/{name}  ({status})")
            orphan_by_status[status.split(":")[0]] += 1
    return {
        "open_multipart_uploads": len(uploads),
        "open_multipart_upload_keys": [u["Key"] for u in uploads][:20],
        "objects_total": len(keys),
        "orphan_objects": len(orphans),
        "orphan_objects_by_job_status": dict(orphan_by_status),
        "orphan_examples": orphans[:20],
        "keys_outside_videos_prefix": other_keys[:20],
        "completed_jobs_missing_output": len(missing_output),
        "completed_missing_examples": missing_output[:10],
        "jobs_not_terminal": len(not_terminal),
        "job_status_counts": dict(Counter(s for s in status_of.values())),
    }


def check_redis(stack: Stack) -> dict[str, Any]:
    r = redis.Redis(host="127.0.0.1", port=stack.valkey_port())
    try:
        keys = [k.decode() for k in r.scan_iter(match="*", count=1000)]
        oq_keys, oq_no_ttl, broker = [], [], []
        patterns: dict[str, list[int]] = defaultdict(list)
        for key in sorted(keys):
            ttl = r.ttl(key)
            if key.startswith("oq:"):
                oq_keys.append(key)
                patterns[re.sub(r"(?<=:)[^:]{12,}(?=:|$)", "*", key)].append(ttl)
                if ttl == -1:
                    oq_no_ttl.append(key)
                continue
            raw_type = r.type(key)
            kind = raw_type.decode() if isinstance(raw_type, bytes) else str(raw_type)
            size = {
                "list": r.llen,
                "hash": r.hlen,
                "set": r.scard,
                "zset": r.zcard,
                "string": r.strlen,
            }.get(kind, lambda _k: None)(key)
            broker.append({"key": key, "type": kind, "size": size, "ttl": ttl})
        used_memory = r.info("memory").get("used_memory_human")
    finally:
        r.close()
    return {
        "total_keys": len(keys),
        "oq_keys": len(oq_keys),
        "oq_keys_without_ttl": len(oq_no_ttl),
        "oq_keys_without_ttl_examples": oq_no_ttl[:20],
        "oq_key_patterns": {
            pat: {"count": len(ttls), "ttl_min_s": min(ttls), "ttl_max_s": max(ttls)}
            for pat, ttls in sorted(patterns.items())
        },
        "used_memory_human": used_memory,
        "broker_keys": len(broker),
        "broker_key_list": broker[:40],
    }


def log_problems(logs: LogWatcher, stack: Stack) -> dict[str, Any]:
    logs.poll()
    text = stack.log_path.read_text(errors="replace").splitlines()
    warn = [ln for ln in text if " WARNING " in ln or " ERROR " in ln or "Traceback" in ln]
    return {
        "worker_outcomes": dict(Counter(o for _, o in logs.released.values())),
        "celery_task_results": dict(Counter(o for _, o in logs.task_results.values())),
        "warning_error_lines": len(warn),
        "warning_error_examples": warn[:10],
    }


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--size", default="64x48")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--min-steps", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=5)
    p.add_argument("--cancel-share", type=float, default=0.3, help="share cancelled/deleted")
    p.add_argument(
        "--delete-part",
        type=float,
        default=1 / 3,
        help="part of the cancelled ones that use DELETE instead of /cancel",
    )
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--settle", type=float, default=15.0, help="wait after the last job, s")
    p.add_argument("--poll", type=float, default=0.1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--keep-log", default=None, help="copy up's stderr here before cleanup")
    args = p.parse_args()

    specs = plan(args)
    sys_tmp = Path(tempfile.gettempdir())
    sys_tmp_before = set(count_temp_dirs(sys_tmp))
    stack = Stack(args.workers)
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "workers": args.workers,
        "request": {
            "size": args.size,
            "num_frames": args.frames,
            "num_inference_steps": f"{args.min_steps}-{args.max_steps}",
        },
        "seed": args.seed,
        "planned_actions": dict(Counter(s["action"] for s in specs)),
    }
    t_start = time.time()
    with stack.running(out, args.keep_log) as logs:
        limits = httpx.Limits(max_connections=args.concurrency + 2)
        with httpx.Client(base_url=stack.url, timeout=60, trust_env=False, limits=limits) as client:
            soak = Soak(client, args)
            say(f"warm-up: {args.warmup} jobs")
            warm_specs = [
                {"i": 10**6 + i, "steps": args.max_steps, "action": "none", "delay": 0}
                for i in range(args.warmup)
            ]
            with ThreadPoolExecutor(args.concurrency) as pool:
                warm = list(pool.map(soak.run_job, warm_specs))
            soak.done = 0
            rss_start = rss_mb(stack)
            say(f"RSS after warm-up: {rss_start}")
            samples: list[dict[str, Any]] = []
            stop_sampling = threading.Event()

            def sample() -> None:
                while not stop_sampling.wait(15):
                    samples.append(
                        {"t_s": round(time.time() - t0, 1), "done": soak.done, **rss_mb(stack)}
                    )

            t0 = time.time()
            threading.Thread(target=sample, daemon=True).start()
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(soak.run_job, specs))
            wall = time.time() - t0
            stop_sampling.set()
            rss_jobs_end = rss_mb(stack)
            say(
                f"all {len(results)} jobs terminal after {wall:.1f} s; RSS {rss_jobs_end}; "
                f"settling {args.settle:.0f} s"
            )
            time.sleep(args.settle)
            rss_end = rss_mb(stack)
            growth = {k: round(rss_end[k] - rss_start.get(k, 0.0), 1) for k in rss_end}
            outcomes = Counter(r["outcome"] for r in results)
            by_action: dict[str, Counter[str]] = defaultdict(Counter)
            for r in results:
                by_action[r["action"]][r["outcome"]] += 1
            completed_e2e = [r["end_to_end_s"] for r in results if r["outcome"] == "completed"]
            out.update(
                {
                    "wall_s": round(wall, 1),
                    "jobs_per_minute": round(len(results) / wall * 60, 1),
                    "completed_per_minute": round(outcomes["completed"] / wall * 60, 1),
                    "outcomes": dict(outcomes),
                    "outcomes_by_action": {k: dict(v) for k, v in by_action.items()},
                    "completed_end_to_end_s": {
                        "p50": round(pct(completed_e2e, 0.5), 3),
                        "p95": round(pct(completed_e2e, 0.95), 3),
                        "mean": round(statistics.fmean(completed_e2e), 3),
                    }
                    if completed_e2e
                    else None,
                    "rss_mb": {
                        "after_warmup": rss_start,
                        "after_jobs": rss_jobs_end,
                        "after_settle": rss_end,
                        "growth": growth,
                        "target_growth_mb": RSS_TARGET_MB,
                        "within_target": all(v <= RSS_TARGET_MB for v in growth.values()),
                        "samples": samples,
                    },
                }
            )
            temp_left = count_temp_dirs(stack.tmp_dir)
            job_ids = [r["id"] for r in warm + results]
            # Other processes on the machine (test suites) may use the system temp dir too:
            # a new omniq-<id>-* there is ours only if <id> is one of our jobs.
            ours = set(job_ids)
            sys_tmp_new = sorted(set(count_temp_dirs(sys_tmp)) - sys_tmp_before)
            sys_tmp_ours = [n for n in sys_tmp_new if n[len("omniq-") :].rsplit("-", 1)[0] in ours]
            s3 = check_objects(stack, client, job_ids)
            rds = check_redis(stack)
            out["leaks"] = {
                "temp_dirs": len(temp_left),
                "temp_dir_examples": temp_left[:20],
                "new_omniq_dirs_in_system_tmp_ours": len(sys_tmp_ours),
                "new_omniq_dirs_in_system_tmp_foreign": [
                    n for n in sys_tmp_new if n not in sys_tmp_ours
                ][:10],
                **s3,
                "redis": rds,
                "log": log_problems(logs, stack),
            }
            zero = {
                "temp_dirs": len(temp_left) == 0 and not sys_tmp_ours,
                "open_multipart_uploads": s3["open_multipart_uploads"] == 0,
                "orphan_objects": s3["orphan_objects"] == 0,
                "completed_jobs_missing_output": s3["completed_jobs_missing_output"] == 0,
                "jobs_not_terminal": s3["jobs_not_terminal"] == 0,
                "redis_oq_keys_without_ttl": rds["oq_keys_without_ttl"] == 0,
            }
            out["zero_checks"] = zero
            out["all_zero"] = all(zero.values())
            say(f"zero checks: {zero}")
    return report(out, total_wall_s=round(time.time() - t_start, 1))


if __name__ == "__main__":
    sys.exit(main())
