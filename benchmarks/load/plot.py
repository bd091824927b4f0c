"""The load generator's figure (``benchmarks/load/run.py --png``): end-to-end and status-read
latency, queue depth and RSS over the run, one panel each, levels marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(path: Path, series: dict[str, Any], title: str) -> None:
    """``series``: ``levels`` [(name, start_s, end_s)], ``e2e`` [(t, s)], ``status_reads``
    [(t, ms)], ``health`` [(t, ms)], ``queue`` [(t, depth | None, in_flight)], ``rss``
    {process: [(t, MiB)]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, queue, rss) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    fig.suptitle(title)
    if series["e2e"]:
        t, v = zip(*series["e2e"], strict=True)
        lat.scatter(t, v, s=6, label="end-to-end (s, completed jobs)", color="tab:blue")
    lat.set_ylabel("end-to-end, s")
    reads = lat.twinx()
    for key, color in (("status_reads", "tab:orange"), ("health", "tab:green")):
        if series[key]:
            t, v = zip(*series[key], strict=True)
            reads.scatter(t, v, s=2, alpha=0.4, color=color, label=f"{key} (ms)")
    reads.set_ylabel("probe, ms")
    reads.set_yscale("log")
    handles = lat.get_legend_handles_labels()
    extra = reads.get_legend_handles_labels()
    lat.legend(handles[0] + extra[0], handles[1] + extra[1], loc="upper left", fontsize=8)

    if series["queue"]:
        times = [s[0] for s in series["queue"]]
        depth = [s[1] if s[1] is not None else float("nan") for s in series["queue"]]
        queue.plot(times, depth, label="queued jobs (omniqueue_queue_depth)")
        queue.plot(times, [s[2] for s in series["queue"]], label="client requests in flight")
    queue.set_ylabel("jobs")
    queue.legend(loc="upper left", fontsize=8)

    for name, points in sorted(series["rss"].items()):
        if points:
            t, v = zip(*points, strict=True)
            rss.plot(t, v, label=name)
    rss.set_ylabel("RSS, MiB")
    rss.set_xlabel("seconds since the run's start")
    rss.legend(loc="upper left", fontsize=7, ncol=3)

    for ax in (lat, queue, rss):
        for name, start, end in series["levels"]:
            ax.axvline(start, color="grey", linestyle="--", linewidth=0.8)
            ax.axvline(end, color="grey", linestyle=":", linewidth=0.8)
            if ax is lat:
                ax.text(
                    start,
                    1.0,
                    f" {name}",
                    transform=ax.get_xaxis_transform(),
                    fontsize=8,
                    va="bottom",
                )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
