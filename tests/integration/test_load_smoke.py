"""``python -m benchmarks.load.run`` end to end on a short run: the embedded stack at 50 %
of a declared 2 jobs/s for 10 s; the report has every key, sane values and no lost job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LEVEL_KEYS = {
    "offered_rps",
    "achieved_rps",
    "creates_by_http_status",
    "refusals_by_code",
    "queue_full_refusals",
    "jobs_by_outcome",
    "by_behaviour",
    "ttl_expired",
    "lost_jobs",
    "idempotency_mismatches",
    "terminal_mismatches",
    "queue_time_s",
    "e2e_s",
    "create_p99_ms",
    "create_latency_max_ms",
    "status_read_ms",
    "health_ms",
    "eta_error_s",
    "rss_slope_mb_per_min",
    "gpu_memory_slope_mib_per_min",
    "queue_depth",
    "end_state",
    "generator",
    "checks",
}


def test_short_load_run(tmp_path: Path) -> None:
    out, png = tmp_path / "load.json", tmp_path / "load.png"
    argv = [sys.executable, "-m", "benchmarks.load.run", "--saturation-rps", "2", "--levels", "0.5"]
    argv += ["--duration", "10", "--settle", "2", "--out", str(out), "--png", str(png)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["saturation"] == {"measured": False, "rps": 2.0}
    assert report["up_exit_code"] == 0 and not report["interrupted"]
    (level,) = report["levels"]
    assert set(level) >= LEVEL_KEYS
    assert level["arrivals"] > 0 and level["offered_rps_target"] == 1.0
    assert level["lost_jobs"] == 0 and level["idempotency_mismatches"] == 0
    assert level["terminal_mismatches"] == 0
    assert level["jobs_by_outcome"].get("completed", 0) > 0
    assert level["gpu_memory_slope_mib_per_min"] is None  # CPU workers
    assert level["health_ms"]["n"] > 100 and level["health_ms"]["p50"] is not None
    assert level["create_latency_max_ms"] < 1000
    end = level["end_state"]
    assert end["temp_dirs"] == 0 and end["redis"]["without_ttl"] == 0
    assert end["s3"]["open_multipart_uploads"] == 0 and end["s3"]["orphan_objects"] == 0
    assert set(level["rss_slope_mb_per_min"]) >= {"valkey", "weed", "webhooks"}
    assert png.stat().st_size > 10_000
