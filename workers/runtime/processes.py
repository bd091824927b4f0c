"""Process helpers every tier that starts processes uses: a reserved TCP port
(:mod:`workers.runtime.ports`), and children
in a process group of their own that die with the thread that started them.

Worker groups (:mod:`workers.runtime.group`) pick their rendezvous port and supervise their
ranks with these; ``omniqueue up`` and its embedded services (:mod:`cli.embedded`) start
and stop their children with them. They live with the workers because the worker image
installs neither the ``embedded`` extra nor anything ``cli`` alone needs: a worker may
import from here, never from ``cli``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from workers.runtime.ports import HOST, free_port

__all__ = ["HOST", "child_popen_kwargs", "free_port", "kill_process_group"]

_PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, resolved in the parent (never after fork); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


def child_popen_kwargs(death_signal: int = signal.SIGTERM) -> dict[str, Any]:
    """``Popen`` arguments for a managed child: its own session (so it is its own process
    group and a terminal's Ctrl-C does not reach it) and, on Linux, ``death_signal`` when
    the thread that started it dies (best effort: start children from the main thread)."""
    prctl = _prctl()
    if prctl is None:
        return {"start_new_session": True}
    parent = os.getpid()

    def _die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return {"start_new_session": True, "preexec_fn": _die_with_parent}


def kill_process_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group led by ``pid``; quiet when it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def exiting() -> None:
    """A server process whose work is done: nothing it holds needs collecting any more, so
    its objects go out of the collector's sight (``gc.freeze``) and the interpreter's last
    collections skip them. With torch and diffusers imported, a worker's exit spent 1.2 s
    collecting, 0.2 s so; every stop and restart of a worker waited for it. Only where the
    process's command returns, never in one that goes on (the tests call ``cli.main``)."""
    gc.freeze()
