"""The worker's GPU memory gauges on a real CUDA device: ``serve_metrics`` (as a worker
with ``OMNIQ_METRICS__WORKER_PORT`` starts it) registers the GPU collector for
``cuda:0``; after allocating tensors of known sizes, a scrape of its port must report
them (``omniqueue_gpu_memory_allocated_bytes`` and ``_peak_bytes``).

    python -m benchmarks.gpu.metrics        # on a machine with CUDA

Meant for a GPU host whose python3 has torch and prometheus-client but not the
rest of the worker's dependencies: the few modules :mod:`workers.common.metrics` imports for its
job accounting (the ORM, the settings) are stood in for here, so this checks the GPU
collector and the metrics server only. Prints JSON; exits 1 if a gauge is off.
"""

from __future__ import annotations

import argparse
import enum
import json
import socket
import sys
import types
import urllib.request

MIB = 2**20


def _stand_ins() -> None:
    """Stand-ins for the modules :mod:`workers.common.metrics` imports besides prometheus-client
    (its job accounting needs them, the GPU gauges do not)."""

    class JobStatus(enum.StrEnum):
        COMPLETED = "completed"
        FAILED = "failed"

    class ErrorCode(enum.StrEnum):
        CANCELLED = "cancelled"

    values: dict[str, dict[str, object]] = {
        "models.db": {"Job": object, "JobStatus": JobStatus},
        "models.errors": {"ErrorCode": ErrorCode},
        "storage.jobs": {"JobStore": object},
        "storage.settings": {"Settings": object},
    }
    for name, attrs in values.items():
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__dict__.update(attrs)
            sys.modules[name] = module


def main() -> int:
    # No options; argparse for --help alone (benchmarks.common's parser would import more
    # of the project than the image has).
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    ).parse_args()
    import torch

    _stand_ins()
    from prometheus_client.parser import text_string_to_metric_families

    from workers.common.metrics import serve_metrics

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = types.SimpleNamespace(
        metrics=types.SimpleNamespace(enabled=True, worker_port=port, worker_host="127.0.0.1"),
        worker=types.SimpleNamespace(device="cuda:0"),
        realtime=types.SimpleNamespace(slots=2),
    )
    assert serve_metrics(settings) == port  # type: ignore[arg-type]
    kept = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda:0")
    torch.cuda.reset_peak_memory_stats()  # what the executor does when a job starts
    passing = torch.empty(1024 * MIB, dtype=torch.uint8, device="cuda:0")
    del passing
    torch.cuda.synchronize()
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    gauges = {
        s.name: (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("omniqueue_gpu_memory")
    }
    allocated = gauges["omniqueue_gpu_memory_allocated_bytes"]
    peak = gauges["omniqueue_gpu_memory_peak_bytes"]
    ok = (
        allocated[0] == {"device": "cuda:0"}
        and 256 * MIB <= allocated[1] < 300 * MIB
        and 1280 * MIB <= peak[1] < 1400 * MIB
    )
    report = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "allocated_mib": round(allocated[1] / MIB, 1),
        "peak_mib": round(peak[1] / MIB, 1),
        "expected": "allocated 256 MiB (the kept tensor), peak 1280 MiB (kept + passing)",
        "ok": ok,
        "exposition": [ln for ln in text.splitlines() if "omniqueue_gpu" in ln],
    }
    del kept
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
