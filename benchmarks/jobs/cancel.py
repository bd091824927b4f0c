"""Cancel latency by stage on a fresh embedded stack (prints one JSON object on stdout).

    python -m benchmarks.jobs.cancel                # 10 cancels per stage, 832x480x24, 20 steps
    python -m benchmarks.jobs.cancel --per-stage 3  # a quick run

Starts ``python -m cli.main up`` on a free port with its own temporary data directory,
runs ``--calibration`` jobs to completion before and again after the cancels (stage
durations, mean step time; the machine is shared, so its speed drifts), then for each
stage — queued, prepare, denoise-early/-middle/-late, decode, encode, upload — submits
jobs one at a time, polls ``GET /v1/videos/{id}`` every ``--poll`` s until the job
reaches that stage (denoise-early/-middle/-late: ``step`` >= 2, N/2, N-2 while steps
remain), and cancels it (``POST /v1/videos/{id}/cancel``). A job seen past the stage is
an attempt that missed (reported as ``missed``); the worker writes ``step`` at most every
``progress_interval_s``, so late denoise steps are often not seen.

Latency is measured from just before the cancel request to the moment the worker
released the job: the worker logs ``job <id>: cancelled`` (logger ``workers.jobs.executor``)
after it removed the job's temp directory and S3 objects; ``up`` passes its children's
stderr through, so the script reads that line (millisecond timestamp, local time) from
up's stderr. A queued job is never held by a worker: its latency is the cancel request's
round trip (the job is terminal once the API answers), and the script checks that the
worker later dropped its message (Celery logs ``… succeeded …: 'skipped'``). For each
cancel the job's last recorded ``stage`` is reported as well (``worker_stage_at_cancel``:
the worker's later writes are refused), which shows when a cancel landed after the worker
had moved on from what the poll saw.

Targets: p95 <= mean step time + 50 ms (step time from the calibration jobs) for the
stages where the executor checks between steps or parts, and inside prepare and decode
(the adapters call ``checkpoint()`` between render chunks / VAE and text-encoder blocks);
encode is a single PyAV call a cancel cannot interrupt, so it is compared with its own mean
duration (+ 50 ms) instead.

At the end it checks that nothing was left behind: ``omniq-*`` temp directories (the
worker's temp dir is put inside the data dir with ``OMNIQ_WORKER__TMP_DIR``), objects
under the cancelled jobs' S3 prefixes and open multipart uploads. Then it stops ``up``
with SIGINT (it must exit 0) and removes the data directory. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import httpx

from benchmarks.common import parser, pct
from benchmarks.embedded_stack import (
    S3_BUCKET,
    LogWatcher,
    Stack,
    report,
    say,
)

STAGES = (
    "queued",
    "prepare",
    "denoise-early",
    "denoise-middle",
    "denoise-late",
    "decode",
    "encode",
    "upload",
)
# Stages whose work is one call the executor cannot interrupt (compared with their duration).
# Single calls a cancel cannot interrupt (compared with their own duration). prepare and
# decode stop at the adapters' checkpoint() calls, so they are held to one step + 50 ms.
UNINTERRUPTIBLE = {"encode": "encode"}
STAGE_ORDER = ["queue", "prepare", "denoise", "decode", "encode", "upload", "done"]


def summary_ms(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "p50": round(pct(values, 0.5) * 1000, 1),
        "p95": round(pct(values, 0.95) * 1000, 1),
        "max": round(max(values) * 1000, 1),
        "mean": round(statistics.fmean(values) * 1000, 1),
    }


class Bench:
    def __init__(self, client: httpx.Client, logs: LogWatcher, args: argparse.Namespace) -> None:
        self.client = client
        self.logs = logs
        self.args = args
        self.seed = 1000

    def body(self) -> dict[str, Any]:
        self.seed += 1
        return {
            "prompt": "cancel benchmark: a red ball bouncing over a blue ocean",
            "size": self.args.size,
            "num_frames": self.args.frames,
            "num_inference_steps": self.args.steps,
            "seed": self.seed,
        }

    def create(self) -> dict[str, Any]:
        resp = self.client.post("/v1/videos", json=self.body())
        resp.raise_for_status()
        video: dict[str, Any] = resp.json()
        return video

    def get(self, job_id: str) -> dict[str, Any]:
        resp = self.client.get(f"/v1/videos/{job_id}")
        resp.raise_for_status()
        video: dict[str, Any] = resp.json()
        return video

    def wait_terminal(self, job_id: str, poll: float) -> dict[str, Any]:
        while True:
            video = self.get(job_id)
            if video["status"] in ("completed", "failed"):
                return video
            time.sleep(poll)

    # ---- calibration ----------------------------------------------------------------

    def calibrate(self, count: int, label: str) -> list[dict[str, float]]:
        """Run ``count`` jobs to completion (polled like the cancel runs); their durations."""
        durations: list[dict[str, float]] = []
        for i in range(count):
            video = self.wait_terminal(self.create()["id"], self.args.poll)
            if video["status"] != "completed":
                raise RuntimeError(f"calibration job failed: {video.get('error')}")
            d = video["stage_durations"]
            durations.append(d)
            say(
                f"calibration ({label}) {i + 1}/{count}: "
                + ", ".join(f"{k} {v:.3f}" for k, v in d.items())
            )
        return durations

    # ---- cancel at a running stage ----------------------------------------------------

    def _reached(self, stage: str, video: dict[str, Any]) -> bool | None:
        """True: cancel now; False: not yet; None: the job is already past ``stage``."""
        n = self.args.steps
        if video["status"] in ("completed", "failed"):
            return None
        if video["status"] != "in_progress":
            return False
        current = video.get("stage") or "queue"
        if stage.startswith("denoise-"):
            want_stage = "denoise"
            min_step = {"denoise-early": 2, "denoise-middle": n // 2, "denoise-late": n - 2}[stage]
        else:
            want_stage, min_step = stage, 0
        pos, want = STAGE_ORDER.index(current), STAGE_ORDER.index(want_stage)
        if pos < want:
            return False
        if pos > want:
            return None
        step = video.get("step") or 0
        if want_stage == "denoise" and step >= n:
            return None  # every step has run: the next thing the worker does is decode
        return step >= min_step

    def cancel_running(self, stage: str) -> dict[str, Any]:
        """One attempt: create, poll until ``stage``, cancel, wait for the worker's release."""
        job_id = self.create()["id"]
        seen: dict[str, Any] = {}
        while True:
            video = self.get(job_id)
            reached = self._reached(stage, video)
            if reached:
                seen = video
                break
            if reached is None:
                final = self.wait_terminal(job_id, 0.05)
                self.logs.wait_released(job_id)
                return {
                    "id": job_id,
                    "missed": f"job was at {video['status']}/{video['stage']}",
                    "final_status": final["status"],
                }
            time.sleep(self.args.poll)
        t_cancel = time.time()
        resp = self.client.post(f"/v1/videos/{job_id}/cancel")
        t_answer = time.time()
        resp.raise_for_status()
        answer = resp.json()
        released = self.logs.wait_released(job_id)
        if released is None:
            raise RuntimeError(f"worker never logged the end of {job_id}")
        t_release, outcome = released
        result = {
            "id": job_id,
            "seen_stage": seen["stage"],
            "seen_step": seen.get("step"),
            "cancel_answer_status": answer["status"],
            "worker_outcome": outcome,
            "cancel_rtt_s": t_answer - t_cancel,
        }
        if answer["status"] == "completed" or outcome != "cancelled":
            result["missed"] = f"cancel came too late (answer {answer['status']}, worker {outcome})"
            return result
        final = self.get(job_id)
        result["final_status"] = final["status"]
        result["final_error"] = (final.get("error") or {}).get("code")
        # The stage the worker had last recorded when the cancel landed (its later writes
        # are refused): where the worker really was, which may be past what the poll saw.
        result["final_stage"] = final.get("stage")
        result["latency_s"] = t_release - t_cancel
        return result

    # ---- cancel while queued ----------------------------------------------------------

    def cancel_queued(self, count: int) -> list[dict[str, Any]]:
        """Cancel ``count`` jobs that wait behind a running blocker job."""
        results: list[dict[str, Any]] = []
        blocker: str | None = None
        while len(results) < count:
            if blocker is None or self.get(blocker)["status"] != "in_progress":
                if blocker is not None:
                    self.logs.wait_released(blocker)
                blocker = self.create()["id"]
                while self.get(blocker)["status"] == "queued":
                    time.sleep(self.args.poll)
                continue
            job = self.create()
            video = self.get(job["id"])
            if video["status"] != "queued" or self.get(blocker)["status"] != "in_progress":
                continue  # not waiting behind the blocker after all; try again
            t_cancel = time.time()
            resp = self.client.post(f"/v1/videos/{job['id']}/cancel")
            t_answer = time.time()
            resp.raise_for_status()
            answer = resp.json()
            results.append(
                {
                    "id": job["id"],
                    "cancel_answer_status": answer["status"],
                    "final_error": (answer.get("error") or {}).get("code"),
                    "latency_s": t_answer - t_cancel,
                }
            )
        if blocker is not None:
            self.client.post(f"/v1/videos/{blocker}/cancel").raise_for_status()
            self.logs.wait_released(blocker)
        # The worker gets each cancelled job's message after the blocker and drops it.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.logs.poll()
            if all(r["id"] in self.logs.task_results for r in results):
                break
            time.sleep(0.1)
        for r in results:
            r["worker_result"] = self.logs.task_results.get(r["id"], (None, None))[1]
        return results


def calibration_summary(durations: list[dict[str, float]], steps: int) -> dict[str, Any]:
    stage_names = ("prepare", "denoise", "decode", "encode", "upload")
    step_times = [d["denoise"] / steps for d in durations]
    return {
        "jobs": len(durations),
        "step_time_ms": {
            "mean": round(statistics.fmean(step_times) * 1000, 1),
            "min": round(min(step_times) * 1000, 1),
            "max": round(max(step_times) * 1000, 1),
        },
        "stage_mean_ms": {
            k: round(statistics.fmean(d[k] for d in durations) * 1000, 1) for k in stage_names
        },
        "stage_max_ms": {k: round(max(d[k] for d in durations) * 1000, 1) for k in stage_names},
    }


def stage_report(
    stage: str, results: list[dict[str, Any]], attempts: int, calib: dict[str, Any]
) -> dict[str, Any]:
    ok = [r for r in results if "latency_s" in r]
    lat = [r["latency_s"] for r in ok]
    step_ms = calib["step_time_ms"]["mean"]
    if stage in UNINTERRUPTIBLE:
        ref_name = f"{UNINTERRUPTIBLE[stage]} stage duration (calibration mean)"
        ref_ms = calib["stage_mean_ms"][UNINTERRUPTIBLE[stage]]
    else:
        ref_name = "mean step time (calibration)"
        ref_ms = step_ms
    summary = summary_ms(lat)
    target = ref_ms + 50
    report: dict[str, Any] = {
        "count": len(ok),
        "attempts": attempts,
        "missed": attempts - len(ok),
        "latency_ms": summary,
        "mean_step_time_ms": step_ms,
        "reference": ref_name,
        "reference_ms": ref_ms,
        "target_ms": round(target, 1),
        "meets_target": bool(summary and summary["p95"] <= target),
        "all_cancelled": all(r.get("final_error") == "cancelled" for r in ok),
    }
    if stage in UNINTERRUPTIBLE:
        report["stage_max_ms_calibration"] = calib["stage_max_ms"][UNINTERRUPTIBLE[stage]]
    if stage == "queued":
        report["measured"] = "cancel request round trip (no worker holds a queued job)"
        report["worker_dropped_message"] = sum(r.get("worker_result") == "skipped" for r in ok)
    else:
        report["measured"] = "cancel request sent → worker logged 'job <id>: cancelled'"
        if stage.startswith("denoise"):
            report["seen_steps"] = [r["seen_step"] for r in ok]
        report["cancel_rtt_ms"] = summary_ms([r["cancel_rtt_s"] for r in ok])
        report["worker_stage_at_cancel"] = [r.get("final_stage") for r in ok]
    report["latencies_ms"] = [round(r["latency_s"] * 1000, 1) for r in ok]
    return report


def leftovers(stack: Stack, job_ids: list[str]) -> dict[str, Any]:
    temp_dirs = sorted(p.name for p in stack.tmp_dir.glob("omniq-*"))
    s3 = stack.s3_client()
    objects: list[str] = []
    for job_id in job_ids:
        resp = s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"videos/{job_id}/")
        objects.extend(o["Key"] for o in resp.get("Contents", []) or [])
    uploads = s3.list_multipart_uploads(Bucket=S3_BUCKET).get("Uploads", []) or []
    return {
        "temp_dirs_left": len(temp_dirs),
        "temp_dir_names": temp_dirs[:20],
        "objects_of_cancelled_jobs": len(objects),
        "object_keys": objects[:20],
        "open_multipart_uploads": len(uploads),
        "all_zero": not temp_dirs and not objects and not uploads,
    }


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--per-stage", type=int, default=10, help="cancels per stage")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset")
    p.add_argument("--size", default="832x480")
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--calibration", type=int, default=3, help="completed jobs for step time")
    p.add_argument("--poll", type=float, default=0.005, help="GET interval while waiting, s")
    p.add_argument("--max-attempts", type=int, default=4, help="attempts per cancel, ×per-stage")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--keep-log", default=None, help="copy up's stderr here before cleanup")
    args = p.parse_args()
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(stages) - set(STAGES)
    if unknown:
        p.error(f"unknown stage(s): {', '.join(sorted(unknown))}")

    stack = Stack(args.workers)
    t0 = time.time()
    out: dict[str, Any] = {
        "request": {
            "size": args.size,
            "num_frames": args.frames,
            "num_inference_steps": args.steps,
        },
        "per_stage": args.per_stage,
        "poll_s": args.poll,
        "workers": args.workers,
    }
    with (
        stack.running(out, args.keep_log) as logs,
        httpx.Client(base_url=stack.url, timeout=60, trust_env=False) as client,
    ):
        bench = Bench(client, logs, args)
        say("warm-up job…")
        bench.wait_terminal(bench.create()["id"], 0.05)
        calib_before = bench.calibrate(args.calibration, "before")
        runs: dict[str, tuple[list[dict[str, Any]], int]] = {}
        cancelled_ids: list[str] = []
        for stage in stages:
            if stage == "queued":
                results = bench.cancel_queued(args.per_stage)
                attempts = len(results)
            else:
                results, attempts = [], 0
                while (
                    sum("latency_s" in r for r in results) < args.per_stage
                    and attempts < args.max_attempts * args.per_stage
                ):
                    attempts += 1
                    results.append(bench.cancel_running(stage))
            cancelled_ids += [r["id"] for r in results if "latency_s" in r]
            runs[stage] = (results, attempts)
            lat = summary_ms([r["latency_s"] for r in results if "latency_s" in r])
            say(f"{stage}: {sum('latency_s' in r for r in results)}/{attempts} latency {lat}")
        # Calibrate again at the end: the machine is shared and its speed drifts.
        calib_after = bench.calibrate(args.calibration, "after")
        calib = calibration_summary(calib_before + calib_after, args.steps)
        out["calibration"] = {
            "before": calibration_summary(calib_before, args.steps),
            "after": calibration_summary(calib_after, args.steps),
            "combined": calib,
        }
        by_stage: dict[str, Any] = {}
        for stage, (results, attempts) in runs.items():
            rep = stage_report(stage, results, attempts, calib)
            by_stage[stage] = rep
            say(
                f"{stage}: p95 {(rep['latency_ms'] or {}).get('p95')} ms, "
                f"target {rep['target_ms']} ms → {rep['meets_target']}"
            )
        out["stages"] = by_stage
        time.sleep(1.0)
        out["leftovers"] = leftovers(stack, cancelled_ids)
        say(f"leftovers: {out['leftovers']}")
    return report(out, wall_s=round(time.time() - t0, 1))


if __name__ == "__main__":
    sys.exit(main())
