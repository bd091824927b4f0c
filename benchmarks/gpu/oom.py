"""A real out-of-memory on the GPU (issue 23, part 4): a worker capped by
``OMNIQ_WORKER__MEMORY_FRACTION`` gets a job that cannot fit; it must end ``failed`` with
code ``oom`` within the step where the allocation failed, no client may see it
``in_progress`` once it failed, the worker's device memory must return to its baseline,
and the next job must complete.

    python -m benchmarks.gpu.oom                  # on the H200 (benchmarks/device/gpu_oom.sh)
    python -m benchmarks.gpu.oom --device cpu --layers 1 --small-size 64x48 --small-frames 5 \
        --steps 2 --job-timeout-s 900 --budget-s 1800   # a smoke run, no OOM (the real
        # Wan VAE decodes on the CPU: many minutes on a small machine)

1. **Sizes.** A Wan2.1-T2V-1.3B-architecture pipeline with random bf16 weights is built,
   saved with its registry entry (``compile = "off"``) and loaded back as the worker loads
   it (``benchmarks/gpu/common.py``). In this process: the weights' memory, the peak of
   the small job (the raw ``pipe(...)``, decode included, as reserved by the allocator),
   and the peak of one denoise step of the large job through ``WanAdapter``. The cap is
   set halfway between the small job's peak and the large step's (``--fraction``
   overrides it); the run stops at once when the large step does not need more.
2. **The stack.** ``omniqueue up`` with one worker on the GPU under that fraction. A
   small job (completes; the worker's ``cuda memory allocated`` line after it is the
   baseline); the large job, whose ``GET /v1/videos/{id}`` a thread reads every
   ``--poll-ms`` (20) from its creation until a second after it ended; then the next
   small job.

The worker logs ``job <id>: out of memory in step <k> of <n> at <T1>; failed at <T2>``:
T1 is when the executor caught the allocation failure, T2 just after the job's row was
failed (its ``completed_at``, read from the stack's SQLite database, lies between).
``oom_to_terminal_ms`` is the first read that saw ``failed`` (when its answer arrived)
minus T1. ``in_progress_reads_after_oom`` counts the reads sent after T1 that saw
``in_progress``; of those, the ones sent before T2 read the row while the fail was being
written (``in_progress_reads_in_fail_window``), the others after it had been written
(``in_progress_reads_after_failed``, with any ``in_progress`` after a ``failed`` read:
must be 0). ``oom_recovered`` is 1 when the large job failed ``oom`` in a denoise step,
no read after its fail saw it running, memory after it equals the baseline within 1 MiB
and the next job completed.

Every wait has a timeout, and the whole run ``--budget-s``: past it the run stops the
stack and exits non-zero.
"""

from __future__ import annotations

import argparse
import re
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import parser
from benchmarks.embedded_stack import LogWatcher, Stack, say
from benchmarks.gpu.common import (
    MODEL,
    emit,
    free_memory,
    generation_request,
    header,
    job_body,
    raw_call,
    save_wan,
)

OOM_RE = re.compile(
    r"job (\S+): out of memory in (?:step (\d+) of (\d+)|stage (\w+)) "
    r"at (\d+\.\d+); failed at (\d+\.\d+)"
)
FRACTION_RE = re.compile(r"memory fraction ([\d.]+) of ([\d.]+) GiB: ([\d.]+) GiB")
MIB = 2**20


class OutOfBudget(Exception):
    """The run passed ``--budget-s`` (raised by SIGALRM in the main thread)."""


def _shape(args: argparse.Namespace, which: str) -> argparse.Namespace:
    """The small or the large job as ``gpu_common``'s helpers take a shape."""
    width, height = (int(x) for x in getattr(args, f"{which}_size").split("x"))
    return argparse.Namespace(
        width=width,
        height=height,
        frames=getattr(args, f"{which}_frames"),
        steps=args.steps,
        guidance=args.guidance,
        layers=args.layers,
    )


# ---- 1. sizes -------------------------------------------------------------------------


def measure(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """Weights, the small job's peak (reserved) and one large step's peak, in bytes."""
    from diffusers import WanPipeline

    from models.catalog import FAMILY_SPECS
    from workers.pipelines.diffusers.wan.adapter import WanAdapter

    cuda = args.device == "cuda"
    pipe = WanPipeline.from_pretrained(model_dir, dtype=torch.bfloat16).to(args.device)
    out: dict[str, Any] = {}
    if cuda:
        torch.cuda.synchronize()
        out["weights_bytes"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    say("sizes: the small job, raw")
    raw_call(pipe, _shape(args, "small"), 1)
    if cuda:
        out["small_peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        out["small_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    if cuda and not args.skip_oom:
        say("sizes: one step of the large job")
        spec = FAMILY_SPECS["diffusers.wan"].model_copy(update={"name": MODEL})
        adapter = WanAdapter(pipe=pipe, dtype="bfloat16", spec=spec, compile="off")
        adapter.load(args.device)
        state: Any = adapter.prepare(generation_request(_shape(args, "large")))
        free_memory()
        torch.cuda.reset_peak_memory_stats()
        adapter.step(state)
        torch.cuda.synchronize()
        out["large_step_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        adapter.end()
        del state, adapter
    del pipe
    free_memory()
    return out


def choose_fraction(args: argparse.Namespace, sizes: dict[str, Any]) -> float | None:
    if args.device != "cuda" or args.skip_oom:
        return None
    if args.fraction is not None:
        return float(args.fraction)
    total = torch.cuda.get_device_properties(0).total_memory
    small = sizes["small_peak_reserved_bytes"]
    large = sizes["large_step_peak_allocated_bytes"]
    if large < small * 1.15:
        raise SystemExit(
            f"the large job's step ({large / 2**30:.1f} GiB) does not need clearly more than "
            f"the small job ({small / 2**30:.1f} GiB): make it larger (--large-frames)"
        )
    return round((small + (large - small) / 2) / total, 4)


# ---- 2. the stack ---------------------------------------------------------------------


class Poller:
    """Reads one job every ``interval`` s on its own connection, from start until
    ``linger`` s after it first read a terminal status (or ``timeout``)."""

    def __init__(self, url: str, vid: str, interval: float, linger: float, timeout: float):
        self.url, self.vid = url, vid
        self.interval, self.linger, self.timeout = interval, linger, timeout
        self.reads: list[tuple[float, float, str, dict[str, Any] | None]] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"poll-{vid}", daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join(self.timeout + self.linger + 10)
        if self._thread.is_alive():
            raise TimeoutError(f"the poller of {self.vid} did not stop")
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        import httpx

        deadline = time.monotonic() + self.timeout
        ended: float | None = None
        try:
            with httpx.Client(base_url=self.url, timeout=10) as client:
                while time.monotonic() < deadline:
                    if ended is not None and time.monotonic() - ended > self.linger:
                        return
                    sent = time.time()
                    body = client.get(f"/v1/videos/{self.vid}").json()
                    self.reads.append((sent, time.time(), body["status"], body.get("error")))
                    if ended is None and body["status"] in ("completed", "failed"):
                        ended = time.monotonic()
                    time.sleep(max(0.0, self.interval - (time.time() - sent)))
            raise TimeoutError(f"{self.vid} did not end within {self.timeout:g} s")
        except BaseException as exc:  # handed to join()
            self.error = exc

    def first(self, status: str) -> tuple[float, float] | None:
        return next(((s, r) for s, r, st, _ in self.reads if st == status), None)


def _wait(client: Any, vid: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/v1/videos/{vid}").json()
        if body["status"] in ("completed", "failed"):
            return dict(body)
        time.sleep(0.05)
    raise TimeoutError(f"{vid} did not end within {timeout:g} s: {body}")


def _memory_after(logs: LogWatcher, vid: str, timeout: float = 30) -> float | None:
    """The worker's ``cuda memory allocated`` line after job ``vid`` (None on CPU)."""
    if not torch.cuda.is_available():
        return None
    mib = logs.wait_for(logs.cuda_allocated_mib, vid, timeout)
    if mib is None:
        raise TimeoutError(f"no memory line after {vid} within {timeout:g} s")
    return mib


def _oom_line(stack: Stack, vid: str, timeout: float = 30) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in OOM_RE.finditer(stack.log_path.read_text(errors="replace")):
            if m.group(1) == vid:
                return m
        time.sleep(0.05)
    raise TimeoutError(f"no out-of-memory line for {vid} within {timeout:g} s")


def _completed_at(stack: Stack, vid: str) -> float | None:
    """The row's ``completed_at`` as stored (the wire rounds it to whole seconds)."""
    conn = sqlite3.connect(stack.data_dir / "omniqueue.db", timeout=5)
    try:
        row = conn.execute("SELECT completed_at FROM jobs WHERE id = ?", (vid,)).fetchone()
    except sqlite3.Error as exc:
        say(f"could not read completed_at of {vid}: {exc}")
        return None
    finally:
        conn.close()
    return None if row is None or row[0] is None else float(row[0])


def stack_phase(
    args: argparse.Namespace, registry: Path, fraction: float | None, out: dict[str, Any]
) -> None:
    """Fills ``out`` as it goes (what it has when a wait times out is reported)."""
    import httpx

    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_MODELS": MODEL,
        "OMNIQ_WORKER__DEVICE": args.device,
        "OMNIQ_WORKER__PREVIEW_EVERY": "0",
        "OMNIQ_HTTP__ACCESS_LOG": "false",  # 50 reads a second: keep the log the worker's
    }
    if fraction is not None:
        env["OMNIQ_WORKER__MEMORY_FRACTION"] = str(fraction)
    stack = Stack(workers=1, env=env, args=("--realtime-workers", "0"))
    small = job_body(_shape(args, "small"), seed=1)
    try:
        stack.start(timeout=args.start_timeout_s)
        logs = LogWatcher(stack.log_path, stack.check)
        with httpx.Client(base_url=stack.url, timeout=30) as client:

            def create(body: dict[str, Any]) -> str:
                resp = client.post("/v1/videos", json=body)
                resp.raise_for_status()
                return str(resp.json()["id"])

            say("small job (baseline)")
            first = _wait(client, create(small), args.job_timeout_s)
            out["first_job_status"] = first["status"]
            if first["status"] != "completed":
                raise RuntimeError(f"the small job did not complete: {first}")
            out["baseline_mib"] = _memory_after(logs, first["id"])
            if m := FRACTION_RE.search(stack.log_path.read_text(errors="replace")):
                out["worker_fraction_line"] = m.group(0)

            if not args.skip_oom:
                say("large job")
                vid = create(job_body(_shape(args, "large"), seed=2))
                poller = Poller(
                    stack.url, vid, args.poll_ms / 1000, 1.0, args.job_timeout_s
                ).start()
                poller.join()
                out.update(_oom_figures(stack, poller, vid))
                out["after_mib"] = _memory_after(logs, vid)

            say("next small job")
            nxt = _wait(client, create(small), args.job_timeout_s)
            out["next_job_status"] = nxt["status"]
            out["next_job_memory_mib"] = _memory_after(logs, nxt["id"])
    finally:
        out["up_exit_code"] = stack.stop(timeout=60)
        if out["up_exit_code"] != 0 or "next_job_status" not in out:
            out["up_log_tail"] = stack.log_tail(6000)
        stack.remove()


def _oom_figures(stack: Stack, poller: Poller, vid: str) -> dict[str, Any]:
    reads = poller.reads
    final = reads[-1]
    out: dict[str, Any] = {
        "large_job_status": final[2],
        "large_job_error": final[3],
        "reads": len(reads),
        "read_interval_ms_mean": (
            round((reads[-1][0] - reads[0][0]) / max(1, len(reads) - 1) * 1000, 1)
        ),
    }
    if final[2] != "failed" or (final[3] or {}).get("code") != "oom":
        return out  # not the outcome under test: oom_recovered is 0
    line = _oom_line(stack, vid)
    oom_at, failed_at = float(line.group(5)), float(line.group(6))
    out["oom_step"] = int(line.group(2)) if line.group(2) else None
    out["oom_stage"] = line.group(4) or "denoise"
    out["oom_line"] = line.group(0)
    first_failed = poller.first("failed")
    assert first_failed is not None
    out["oom_to_terminal_ms"] = round((first_failed[1] - oom_at) * 1000, 1)
    out["oom_to_fail_written_ms"] = round((failed_at - oom_at) * 1000, 2)  # upper bound
    completed_at = _completed_at(stack, vid)
    out["row_completed_at"] = completed_at
    if completed_at is not None:
        out["oom_to_row_completed_at_ms"] = round((completed_at - oom_at) * 1000, 2)
    running_after = [r for r in reads if r[0] > oom_at and r[2] == "in_progress"]
    in_window = [r for r in running_after if r[0] <= failed_at]
    seen_failed = first_failed[0]
    regressed = [r for r in reads if r[0] > seen_failed and r[2] != "failed"]
    out["in_progress_reads_after_oom"] = len(running_after)
    out["in_progress_reads_in_fail_window"] = len(in_window)
    out["in_progress_reads_after_failed"] = len(running_after) - len(in_window) + len(regressed)
    return out


# ---- main -------------------------------------------------------------------------------


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run (tiny, no OOM)")
    p.add_argument("--small-size", default="480x272")
    p.add_argument("--small-frames", type=int, default=9)
    p.add_argument("--large-size", default="1280x720")
    p.add_argument("--large-frames", type=int, default=81)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--guidance", type=float, default=5.0, help="> 1: CFG (two passes a step)")
    p.add_argument("--layers", type=int, default=30, help="of the transformer's 30 blocks")
    p.add_argument("--fraction", type=float, help="the worker's memory fraction (default: chosen)")
    p.add_argument("--skip-oom", action="store_true", help="no large job (the CPU smoke)")
    p.add_argument("--poll-ms", type=float, default=20.0)
    p.add_argument("--start-timeout-s", type=float, default=120.0)
    p.add_argument("--job-timeout-s", type=float, default=90.0)
    p.add_argument("--budget-s", type=int, default=210, help="the whole run, then it fails")
    args = p.parse_args()
    if args.device == "cpu":
        args.skip_oom = True

    def out_of_budget(signum: int, frame: Any) -> None:
        raise OutOfBudget(f"gpu_oom.py ran past its {args.budget_s} s budget")

    signal.signal(signal.SIGALRM, out_of_budget)
    signal.signal(signal.SIGTERM, out_of_budget)  # `timeout`: stop the stack on the way out
    signal.alarm(args.budget_s)
    started = time.monotonic()
    small = _shape(args, "small")
    out: dict[str, Any] = header(small)
    out["shape"] = {"small": vars(small), "large": vars(_shape(args, "large"))}
    out["device"] = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    try:
        say("building the random-weight pipeline")
        model_dir, registry = save_wan(Path(tempfile.mkdtemp(prefix="oq-gpu-oom-")), small)
        free_memory()
        sizes = measure(args, model_dir)
        out["sizes_mib"] = {k: round(v / MIB, 1) for k, v in sizes.items()}
        fraction = choose_fraction(args, sizes)
        out["memory_fraction"] = fraction
        if fraction is not None:
            total = torch.cuda.get_device_properties(0).total_memory
            out["memory_cap_mib"] = round(total * fraction / MIB, 1)
        out["stack"] = {}
        stack_phase(args, registry, fraction, out["stack"])
    except Exception as exc:  # reported in the JSON, and the run fails
        traceback.print_exc()
        out["error"] = repr(exc)
    finally:
        signal.alarm(0)
    s = out.get("stack", {})
    for key in (
        "oom_step",
        "oom_to_terminal_ms",
        "oom_to_fail_written_ms",
        "baseline_mib",
        "after_mib",
        "in_progress_reads_after_oom",
        "in_progress_reads_after_failed",
        "next_job_status",
    ):
        out[key] = s.get(key)
    ok = (
        not args.skip_oom
        and s.get("large_job_status") == "failed"
        and (s.get("large_job_error") or {}).get("code") == "oom"
        and s.get("oom_step") is not None
        and s.get("in_progress_reads_after_failed") == 0
        and s.get("baseline_mib") is not None
        and s.get("after_mib") is not None
        and abs(s["after_mib"] - s["baseline_mib"]) <= 1.0
        and s.get("next_job_status") == "completed"
    )
    out["oom_recovered"] = None if args.skip_oom else int(ok)
    out["run_s"] = round(time.monotonic() - started, 1)
    emit(out, "gpu_oom")
    if "error" in out:
        return 3
    if args.skip_oom:
        return 0 if s.get("next_job_status") == "completed" else 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
