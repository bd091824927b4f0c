"""How the embedded S3 server's memory grows with the objects it stores, without omniqueue:
SeaweedFS (``weed server -s3``, as ``omniqueue up`` starts it) in a fresh directory, and
``--objects`` puts of a job's two artifacts (a 19.5 kB video, a 0.8 kB thumbnail) from 4
threads, weed's RSS read every ``--every`` objects. ``--go-env`` runs weed with a Go
runtime setting (``GOGC=50,GOMEMLIMIT=128MiB``) to see how much of the growth is garbage.

    python -m benchmarks.load.s3_memory --objects 16000
    python -m benchmarks.load.s3_memory --objects 16000 --go-env GOGC=50,GOMEMLIMIT=128MiB

Prints JSON: the RSS curve (objects stored, MiB) and the growth per 1,000 objects after
the first quarter (a least-squares slope, as ``benchmarks/load/run.py`` fits RSS over time).
The soaks of docs/PERFORMANCE.md ("Load above saturation") store about 400 objects a
minute, so KiB per object × 0.4 is their MB/min.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import emit, machine, parser
from cli.embedded import EmbeddedS3
from tests.loadgen.stats import slope


class _TunedS3(EmbeddedS3):
    def __init__(self, data_dir: Path, go_env: dict[str, str]) -> None:
        super().__init__(data_dir)
        self.go_env = go_env

    def environment(self) -> dict[str, str]:
        return super().environment() | self.go_env


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--objects", type=int, default=16000, help="objects to store (pairs × 2)")
    ap.add_argument("--every", type=int, default=1000, help="read RSS every this many objects")
    ap.add_argument("--go-env", default="", help="weed's Go settings: NAME=VALUE,…")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    go_env = dict(kv.split("=", 1) for kv in args.go_env.split(",") if kv)
    video, thumb = os.urandom(19_500), os.urandom(800)
    with tempfile.TemporaryDirectory(prefix="oq-s3-memory-") as tmp:
        s3 = _TunedS3(Path(tmp), go_env)
        s3.start()
        try:
            client = s3.client()
            weed = psutil.Process(s3.pid)

            def rss() -> float:
                procs = [weed, *weed.children(recursive=True)]
                return round(sum(p.memory_info().rss for p in procs) / 2**20, 1)

            def put(i: int) -> None:
                prefix = f"videos/v{i}/output/1/"
                client.put_object(Bucket=s3.bucket, Key=prefix + "video.mp4", Body=video)
                client.put_object(Bucket=s3.bucket, Key=prefix + "thumbnail.jpg", Body=thumb)

            curve: list[tuple[int, float]] = [(0, rss())]
            started = time.monotonic()
            pairs, step = args.objects // 2, max(args.every // 2, 1)
            with ThreadPoolExecutor(4) as pool:
                for first in range(0, pairs, step):
                    list(pool.map(put, range(first, min(first + step, pairs))))
                    curve.append((2 * min(first + step, pairs), rss()))
            took = time.monotonic() - started
        finally:
            s3.stop()
    warm = [(float(n), mib) for n, mib in curve if n >= args.objects / 4]
    per_object = slope(warm)
    report: dict[str, Any] = {
        "machine": machine(),
        "go_env": go_env,
        "objects": args.objects,
        "put_s": round(took, 1),
        "rss_mib": curve,
        "kib_per_object_after_warmup": None if per_object is None else round(per_object * 1024, 2),
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
