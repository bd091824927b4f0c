"""The load generator's pure parts (tests/loadgen/workload.py, stats.py; benchmarks/load/
drives them): the arrival processes, the workload file's checks, the percentile-with-n
rule, the slope; and the evidence script (``python -m benchmarks.load.evidence``) run as a
subprocess, since tests import no benchmark."""

from __future__ import annotations

import itertools
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.loadgen.stats import min_samples, percentiles, slope, slope_per_minute
from tests.loadgen.workload import (
    BEHAVIOURS,
    Profile,
    WorkloadError,
    arrival_times,
    load_workload,
    parse_workload,
    plan_level,
)

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"shape": [{"size": "64x48", "steps": 4, "seconds": 0.5}]}


def test_poisson_rate_and_gaps_for_a_seed() -> None:
    rate, duration = 5.0, 2000.0
    times = arrival_times(rate, duration, random.Random(7))
    assert abs(len(times) / duration - rate) < 0.05 * rate
    assert times == sorted(times) and times[0] >= 0 and times[-1] < duration
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # exponential gaps: mean 1/rate, standard deviation equal to the mean
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / rate, rel=0.08)
    assert arrival_times(rate, duration, random.Random(7)) == times  # seeded


def test_step_profile_alternates_rates() -> None:
    profile = Profile(kind="step", factors=(0.5, 1.5), period_s=10.0)
    times = arrival_times(10.0, 2000.0, random.Random(3), profile)
    low = sum(1 for t in times if int(t // 10) % 2 == 0)
    high = len(times) - low
    assert low / 1000 == pytest.approx(5.0, rel=0.06)  # 100 windows of 10 s at 5/s
    assert high / 1000 == pytest.approx(15.0, rel=0.06)
    assert len(times) / 2000 == pytest.approx(10.0, rel=0.05)  # mean kept


def test_burst_profile_keeps_the_mean_rate() -> None:
    times = arrival_times(2.0, 50.0, random.Random(0), Profile(kind="burst", burst_size=10))
    assert len(times) == 100
    assert times[:10] == [0.0] * 10 and times[10:20] == [5.0] * 10


def test_no_arrivals_at_zero_rate_and_bad_profiles_refused() -> None:
    assert arrival_times(0.0, 10.0, random.Random(0)) == []
    with pytest.raises(ValueError, match="profile"):
        Profile(kind="sine")
    with pytest.raises(ValueError, match="factors"):
        Profile(kind="step", factors=(-1.0,))


def test_the_repo_workload_parses() -> None:
    workload = load_workload(ROOT / "benchmarks" / "load" / "workloads" / "cpu_mixed.toml")
    assert workload.name == "cpu_mixed"
    assert set(workload.behaviours) == set(BEHAVIOURS)
    assert all(w > 0 for w in workload.behaviours.values())
    assert workload.ttl_s and 0 < workload.ttl_share < 1
    body = workload.shapes[0].body()
    assert body["size"] == "64x48" and body["num_inference_steps"] == 4


def test_minimal_workload_defaults() -> None:
    workload = parse_workload(MINIMAL)
    assert workload.behaviours["poll"] == 1 and sum(workload.behaviours.values()) == 1
    assert workload.ttl_share == 0 and workload.ttl_s is None


def test_plan_follows_the_shares() -> None:
    data = {
        **MINIMAL,
        "behaviours": {"poll": 3, "audio": 1},
        "ttl": {"share": 0.5, "seconds": 10},
    }
    plan = plan_level(parse_workload(data), 20.0, 200.0, random.Random(1))
    audio = sum(1 for a in plan if a.behaviour == "audio") / len(plan)
    with_ttl = sum(1 for a in plan if a.ttl == 10) / len(plan)
    assert audio == pytest.approx(0.25, abs=0.03)
    assert with_ttl == pytest.approx(0.5, abs=0.03)
    assert {a.behaviour for a in plan} == {"poll", "audio"}


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({**MINIMAL, "behaviours": {"pol": 1}}, "behaviours.pol: unknown key"),
        ({**MINIMAL, "behaviours": {"poll": -1}}, "behaviours.poll: must be >= 0"),
        ({**MINIMAL, "behaviours": {"poll": 0}}, "behaviours: every share is 0"),
        ({**MINIMAL, "extra": 1}, "extra: unknown key"),
        ({}, "shape: at least one"),
        ({"shape": [{"size": "64x48"}]}, r"shape\[0\].steps: missing"),
        ({"shape": [{"size": "64-48", "steps": 4}]}, r"shape\[0\].size: must be WxH"),
        ({"shape": [{"size": "64x48", "steps": 0}]}, r"shape\[0\].steps: must be an integer"),
        ({"shape": [{"size": "64x48", "steps": True}]}, r"shape\[0\].steps"),
        ({"shape": [{"size": "64x48", "steps": 2, "colour": "red"}]}, r"shape\[0\].colour"),
        (
            {"shape": [{"size": "64x48", "steps": 2, "seconds": 1, "num_frames": 8}]},
            r"shape\[0\].seconds: give seconds or num_frames",
        ),
        ({**MINIMAL, "ttl": {"share": 0.5}}, "ttl.seconds: missing"),
        ({**MINIMAL, "ttl": {"share": 2, "seconds": 5}}, "ttl.share: must be at most 1"),
        ({**MINIMAL, "cancel": {"delay_s": [3, 1]}}, "cancel.delay_s: low 3.0 is above high"),
        ({**MINIMAL, "cancel": {"delay_s": 2}}, r"cancel.delay_s: must be \[low, high\]"),
        ({**MINIMAL, "audio": {"steps": "4"}}, "audio.steps: must be an integer"),
        ({**MINIMAL, "poll_interval_s": 0}, "poll_interval_s: must be > 0"),
    ],
)
def test_workload_errors_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(WorkloadError, match=f"^mix.toml: {key}"):
        parse_workload(data, where="mix.toml")


def test_unreadable_workload_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[shape]\n")
    with pytest.raises(WorkloadError, match=r"bad\.toml"):
        load_workload(bad)
    good = tmp_path / "mine.toml"
    good.write_text('[[shape]]\nsize = "64x48"\nsteps = 2\n')
    assert load_workload(good).name == "mine"


def test_min_samples_rule() -> None:
    assert min_samples(0.5) == 20
    assert min_samples(0.95) == 200
    assert min_samples(0.99) == 1000


def test_percentiles_are_null_without_enough_samples() -> None:
    assert percentiles([]) == {
        "n": 0,
        "mean": None,
        "max": None,
        "p50": None,
        "p95": None,
        "p99": None,
    }
    few = percentiles([float(i) for i in range(19)])
    assert few["n"] == 19 and few["p50"] is None and few["max"] == 18.0
    some = percentiles([float(i) for i in range(200)])
    assert some["p50"] == pytest.approx(99.5) and some["p95"] is not None
    assert some["p99"] is None
    many = percentiles([float(i) for i in range(1001)])
    assert many["p99"] == pytest.approx(990.0) and many["p95"] == pytest.approx(950.0)


def test_slope_fit() -> None:
    points = [(float(t), 100.0 + 0.5 * t) for t in range(0, 120, 2)]
    assert slope(points) == pytest.approx(0.5)
    assert slope_per_minute(points) == pytest.approx(30.0)
    assert slope(points[:2]) is None  # too few points
    assert slope([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]) is None  # one x
    assert slope_per_minute([]) is None


def test_slope_leaves_out_the_warmup() -> None:
    # a jump at the start (loading) then flat: only the flat part after the warm-up counts
    points = [(float(t), 50.0 if t < 20 else 300.0) for t in range(0, 100, 2)]
    assert slope_per_minute(points, warmup=0.0) > 100
    assert slope_per_minute(points, warmup=0.25) == pytest.approx(0.0)


def evidence(tmp_path: Path, **runs: Any) -> dict[str, Any]:
    """``python -m benchmarks.load.evidence`` over ``runs`` (``soak=[(name, report), ...]``,
    ``overload=``, ``gpu_soak=``, ``oom=``: (name, report)), each report written to a file
    of that name first; its JSON."""
    argv = [sys.executable, "-m", "benchmarks.load.evidence"]
    for option, given in runs.items():
        for name, report in given if isinstance(given, list) else [given]:
            path = tmp_path / name
            path.write_text(json.dumps(report))
            argv += [f"--{option.replace('_', '-')}", str(path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def test_evidence_keys_come_from_the_runs_that_measured_them(tmp_path: Path) -> None:
    def level(lost: int, slopes: dict[str, float], **extra: object) -> dict[str, object]:
        return {"lost_jobs": lost, "rss_slope_mb_per_min": slopes, **extra}

    soak_a = {
        "levels": [level(0, {"api:1#0": 0.2, "embedded-0": 0.7, "weed": 1.5}, eta_error_s={"n": 9})]
    }
    soak_b = {"levels": [level(1, {"api": -0.1}, eta_error_s={"n": 900, "p95": 2, "median": 1})]}
    overload = {
        "levels": [
            level(0, {}, status_read_ms={"p99": 80.0}),
            level(0, {}, status_read_ms={"p99": 21.5}, level=1.2, create_latency_max_ms=300),
        ]
    }
    gpu = {"levels": [level(0, {}, gpu_memory_slope_mib_per_min=0.0)]}
    out = evidence(
        tmp_path,
        soak=[("a.json", soak_a), ("b.json", soak_b)],
        overload=("o.json", overload),
        gpu_soak=("g.json", gpu),
        oom=("oom.json", {"oom_recovered": 1, "oom_to_terminal_ms": 16.1}),
    )
    assert out["soak_lost_jobs"] == 1
    assert out["soak_rss_slope_mb_per_min_max"] == 1.5
    assert out["soak_rss_slope_mb_per_min_max_omniqueue"] == 0.7
    assert out["soak_rss_slope_mb_per_min_by_process"] == {
        "api": 0.2,
        "embedded-0": 0.7,
        "weed": 1.5,
    }
    assert out["overload_status_p99_ms"] == 21.5 and out["overload_level"] == 1.2
    assert out["eta_error_p95_s"] == 2 and out["eta_error_n"] == 900  # the most estimates
    assert out["oom_recovered"] == 1 and out["gpu_soak_memory_slope_mib_per_min"] == 0.0
    assert [r["file"] for r in out["runs"]] == ["a.json", "b.json", "o.json", "g.json"]
    empty = evidence(tmp_path)
    assert empty["soak_lost_jobs"] is None and empty["oom_recovered"] is None
