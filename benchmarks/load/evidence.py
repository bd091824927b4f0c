"""The evidence keys of issue 23 from the runs that measured them (prints one JSON object;
``--out`` also writes it): the soaks' and the overload run's ``benchmarks/load/run.py``
reports, and the H200 out-of-memory report of ``benchmarks/gpu/oom.py``.

    python -m benchmarks.load.evidence --soak a.json --soak b.json --overload o.json \\
        --gpu-soak g.json --oom oom.json --out docs/evidence/load_2026-12-02.json

- ``soak_lost_jobs``: lost jobs summed over every level of every soak;
- ``soak_rss_slope_mb_per_min_max``: the largest RSS slope of any stack process in any
  soak level (after the level's warm-up), the embedded data stores (Valkey, SeaweedFS)
  included; ``soak_rss_slope_mb_per_min_by_process``: each process's largest, and
  ``soak_rss_slope_mb_per_min_max_omniqueue``: the largest of omniqueue's own processes
  (API, workers, webhook sender);
- ``overload_status_p99_ms``: the status-read p99 of the overload run's highest level
  (and ``overload_health_p99_ms``, ``overload_create_max_ms`` beside it);
- ``eta_error_p95_s``, ``eta_error_median_s``: of the soak level with the most estimates
  (each run's figures are under ``runs``);
- ``oom_recovered``: from the OOM report;
- ``gpu_soak_memory_slope_mib_per_min``: the GPU soak's worker memory slope.

A key whose run was not given is null.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import emit, parser

# Processes of the embedded stack that are not omniqueue's: its data stores.
_DATA_STORES = frozenset({"valkey", "weed"})


def _levels(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list(report.get("levels") or [])


def _run(path: Path, report: dict[str, Any]) -> dict[str, Any]:
    """What one load report contributes, level by level."""
    return {
        "file": path.name,
        "stack": report.get("stack"),
        "saturation_rps": (report.get("saturation") or {}).get("rps"),
        "levels": [
            {
                "level": lv.get("level"),
                "duration_s": lv.get("duration_s"),
                "offered_rps": lv.get("offered_rps"),
                "achieved_rps": lv.get("achieved_rps"),
                "arrivals": lv.get("arrivals"),
                "jobs_by_outcome": lv.get("jobs_by_outcome"),
                "lost_jobs": lv.get("lost_jobs"),
                "terminal_mismatches": lv.get("terminal_mismatches"),
                "rss_slope_mb_per_min": lv.get("rss_slope_mb_per_min"),
                "gpu_memory_slope_mib_per_min": lv.get("gpu_memory_slope_mib_per_min"),
                "status_read_ms": lv.get("status_read_ms"),
                "health_ms": lv.get("health_ms"),
                "create_latency_max_ms": lv.get("create_latency_max_ms"),
                "queue_time_s": lv.get("queue_time_s"),
                "e2e_s": lv.get("e2e_s"),
                "eta_error_s": lv.get("eta_error_s"),
                "queue_full_refusals": lv.get("queue_full_refusals"),
                "ttl_expired": lv.get("ttl_expired"),
                "end_state": lv.get("end_state"),
            }
            for lv in _levels(report)
        ],
    }


def evidence(
    soaks: list[tuple[Path, dict[str, Any]]],
    overload: tuple[Path, dict[str, Any]] | None,
    gpu_soak: tuple[Path, dict[str, Any]] | None,
    oom: dict[str, Any] | None,
) -> dict[str, Any]:
    soak_levels = [lv for _, r in soaks for lv in _levels(r)]
    by_process: dict[str, float] = {}
    for lv in soak_levels:
        for name, slope in (lv.get("rss_slope_mb_per_min") or {}).items():
            if isinstance(slope, (int, float)):
                role = name.split(":")[0].split("#")[0]
                by_process[role] = max(slope, by_process.get(role, slope))
    slopes = list(by_process.values())
    ours = [v for k, v in by_process.items() if k not in _DATA_STORES]
    etas = [lv["eta_error_s"] for lv in soak_levels if lv.get("eta_error_s")]
    eta = max(etas, key=lambda e: e.get("n") or 0, default=None)
    top = _levels(overload[1])[-1] if overload and _levels(overload[1]) else {}
    gpu_levels = _levels(gpu_soak[1]) if gpu_soak else []
    out: dict[str, Any] = {
        "soak_lost_jobs": sum(lv.get("lost_jobs") or 0 for lv in soak_levels)
        if soak_levels
        else None,
        "soak_rss_slope_mb_per_min_max": round(max(slopes), 3) if slopes else None,
        "soak_rss_slope_mb_per_min_max_omniqueue": round(max(ours), 3) if ours else None,
        "soak_rss_slope_mb_per_min_by_process": by_process or None,
        "overload_status_p99_ms": (top.get("status_read_ms") or {}).get("p99"),
        "overload_health_p99_ms": (top.get("health_ms") or {}).get("p99"),
        "overload_create_max_ms": top.get("create_latency_max_ms"),
        "overload_level": top.get("level"),
        "eta_error_p95_s": None if eta is None else eta.get("p95"),
        "eta_error_median_s": None if eta is None else eta.get("median"),
        "eta_error_n": None if eta is None else eta.get("n"),
        "oom_recovered": None if oom is None else oom.get("oom_recovered"),
        "oom_to_terminal_ms": None if oom is None else oom.get("oom_to_terminal_ms"),
        "gpu_soak_memory_slope_mib_per_min": gpu_levels[0].get("gpu_memory_slope_mib_per_min")
        if gpu_levels
        else None,
        "gpu_soak_lost_jobs": sum(lv.get("lost_jobs") or 0 for lv in gpu_levels)
        if gpu_levels
        else None,
    }
    runs = [_run(p, r) for p, r in soaks]
    runs += [_run(*overload)] if overload else []
    runs += [_run(*gpu_soak)] if gpu_soak else []
    out["runs"] = runs
    return out


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--soak", type=Path, action="append", default=[])
    p.add_argument("--overload", type=Path, default=None)
    p.add_argument("--gpu-soak", type=Path, default=None)
    p.add_argument("--oom", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()

    def load(path: Path | None) -> tuple[Path, dict[str, Any]] | None:
        return None if path is None else (path, json.loads(path.read_text()))

    soaks = [x for x in map(load, a.soak) if x is not None]
    oom = load(a.oom)
    report = evidence(soaks, load(a.overload), load(a.gpu_soak), oom[1] if oom else None)
    emit(report, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
