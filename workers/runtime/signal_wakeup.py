"""A signal wakes the worker's event loop at once.

Celery's SIGTERM and SIGINT handlers only mark the worker as stopping; its event loop
(kombu's hub) looks at the mark between two polls, and an idle worker's poll waits up to a
second for its next timer. So every warm shutdown of an idle worker began with that
second, and ``omniqueue up``, the worker group's supervisor and the tests wait for it on
every stop and restart. Python's signal wake-up file descriptor (``signal.set_wakeup_fd``)
gets a byte the moment a signal arrives; the hub polls its other end, so the poll returns
and the loop sees the mark.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any


def wake_on_signals(sender: Any = None, **_: Any) -> None:
    """Celery's ``worker_ready`` receiver (``sender``: the consumer, ``hub`` its event
    loop; None with a pool that runs no loop, which then keeps Celery's own behaviour)."""
    hub = getattr(sender, "hub", None)
    if hub is None or threading.current_thread() is not threading.main_thread():
        return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    hub.add_reader(read, _drain, read)


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, InterruptedError):
        os.read(fd, 512)
