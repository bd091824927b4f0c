"""A benchmark's embedded stack (benchmarks/embedded_stack.py's Stack) ends the benchmark
within seconds when ``omniqueue up`` exits on its own (a worker that gives up after failed
starts takes the stack down), with a clear error and the last 40 lines of up's log on
stderr, instead of waiting out its timeouts (issue 43 item 6: a GPU benchmark waited until
its time limit).

Each case runs in a subprocess (tests import no benchmark) with a stand-in for up: a Python
one-liner that prints up's "is up" line, writes numbered lines to its stderr (up's log) and
exits with status 3, or waits for the SIGINT of a normal stop."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

FAKE_UP = """
import signal, sys, time
mode = sys.argv[1]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # for sigwait below
for i in range(1, 61):
    print(f"log line {i}", file=sys.stderr, flush=True)
if mode == "no-url":
    sys.exit(3)
print("omniqueue is up: http://127.0.0.1:9", flush=True)
if mode == "stays":
    signal.sigwait({signal.SIGINT})
    sys.exit(0)
time.sleep(0.5)
sys.exit(3)
"""

CHILD = textwrap.dedent(
    """
    import json, signal, sys, time
    from benchmarks.embedded_stack import Stack, UpExited

    case, fake = sys.argv[1], sys.argv[2]
    mode = {"no-url": "no-url", "normal-stop": "stays"}.get(case, "exits")
    if case == "ready-without-signal":  # only the polling check can notice
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    stack = Stack(0, command=[sys.executable, "-c", fake, mode])
    out, result = {}, {"error": None}
    started = time.monotonic()
    try:
        stack.start(timeout=120)
        if case == "sleep":
            time.sleep(60)  # a wait that knows nothing of up
        elif case == "ready-without-signal":
            stack.workers_ready(1, timeout=60)
        elif case == "normal-stop":
            stack.close(out)
            time.sleep(1.5)  # no late error once up was stopped
    except UpExited as exc:
        result["error"] = str(exc)
    finally:
        if "up_exit_code" not in out:
            stack.close(out)
    result["waited_s"] = time.monotonic() - started
    result["up_exit_code"] = out.get("up_exit_code")
    print(json.dumps(result))
    """
)


def run(case: str) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, case, FAKE_UP],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def assert_reported(result: dict[str, Any], stderr: str) -> None:
    assert (
        result["error"] == "omniqueue up exited with status 3 while the benchmark still needed it"
    )
    assert result["waited_s"] < 5, result
    assert result["up_exit_code"] == 3
    assert "error: omniqueue up exited with status 3" in stderr
    lines = stderr.splitlines()
    assert "log line 21" in lines and "log line 60" in lines  # the last 40 lines
    assert "log line 20" not in lines[lines.index("log line 21") - 1 :]
    assert stderr.count("error: omniqueue up exited") == 1  # reported once


def test_a_blocked_wait_ends_when_up_exits() -> None:
    """The main thread sleeps 60 s; the watcher wakes it with UpExited."""
    assert_reported(*run("sleep"))


def test_workers_ready_notices_without_the_signal() -> None:
    """SIGUSR1 taken by the benchmark: the waits that poll (workers_ready) still stop."""
    assert_reported(*run("ready-without-signal"))


def test_up_exiting_before_it_is_up() -> None:
    """No "is up" line and up gone: start() fails at once, not after its 120 s."""
    result, stderr = run("no-url")
    assert_reported(result, stderr)


def test_a_normal_stop_is_no_error() -> None:
    result, stderr = run("normal-stop")
    assert result["error"] is None
    assert result["up_exit_code"] == 0
    assert "error:" not in stderr
