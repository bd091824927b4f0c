"""A signal wakes the worker's event loop (``workers/runtime/signal_wakeup.py``): the
hub's reader gets a byte the moment the signal arrives, and draining it empties it."""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from workers.runtime.signal_wakeup import wake_on_signals


class Hub:
    def __init__(self) -> None:
        self.readers: dict[int, tuple[Callable[..., None], tuple[Any, ...]]] = {}

    def add_reader(self, fd: int, callback: Callable[..., None], *args: Any) -> None:
        self.readers[fd] = (callback, args)


def test_a_signal_makes_the_hubs_reader_readable_at_once() -> None:
    hub = Hub()
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        wake_on_signals(sender=SimpleNamespace(hub=hub))
        ((fd, (drain, args)),) = hub.readers.items()
        assert select.select([fd], [], [], 0)[0] == []  # nothing before a signal
        os.kill(os.getpid(), signal.SIGUSR1)
        assert select.select([fd], [], [], 1.0)[0] == [fd]
        drain(*args)
        assert select.select([fd], [], [], 0)[0] == []
    finally:
        write = signal.set_wakeup_fd(-1)
        for end in (write, *hub.readers):
            os.close(end)
        signal.signal(signal.SIGUSR1, previous)


def test_a_pool_without_an_event_loop_is_left_alone() -> None:
    wake_on_signals(sender=SimpleNamespace(hub=None))
    assert signal.set_wakeup_fd(-1) == -1  # none was set
