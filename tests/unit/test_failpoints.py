"""The ``hold`` failpoint: blocks until the test takes it out of the file, so a fault
test waits for its scenario, not for a ``sleep`` sized for the slowest machine."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.helpers import write_failpoints
from workers.common.failpoints import Failpoints


def test_hold_blocks_until_the_file_releases_it(tmp_path: Path) -> None:
    path = tmp_path / "failpoints.json"
    write_failpoints(path, {"upload@j1@attempt1": "hold"})
    points = Failpoints(path)
    points.hit("upload", lambda: True, attempt=2, job_id="j1")  # another attempt: no hold
    released = threading.Event()

    def hit() -> None:
        points.hit("upload", lambda: True, attempt=1, job_id="j1")
        released.set()

    thread = threading.Thread(target=hit, daemon=True)
    thread.start()
    assert not released.wait(0.5)  # held
    write_failpoints(path, {"step:1": "hold"})  # other points may stay
    start = time.monotonic()
    assert released.wait(5)
    assert time.monotonic() - start < 1.0
    thread.join(5)
