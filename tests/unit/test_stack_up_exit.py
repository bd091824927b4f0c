"""A benchmark's embedded stack (benchmarks/embedded_stack.py's Stack) ends the benchmark
within seconds when ``omniqueue up`` exits on its own (a worker that gives up after failed
starts takes the stack down), with a clear error and the last 40 lines of up's log on
stderr, instead of waiting out its timeouts (issue 43 item 6: a GPU benchmark waited until
its time limit).

Each case runs in a subprocess (tests import no benchmark) with a stand-in for up: a Python
one-liner that prints up's "is up" line, writes numbered lines to its stderr (up's log) and
exits with status 3, or waits for the SIGINT of a normal stop (before its "is up" line too:
a worker that never loads, as the H3 frontier's group-offload points met on an H100)."""

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
if mode != "hangs":  # a worker that never loads: up never says it is up
    print("omniqueue is up: http://127.0.0.1:9", flush=True)
if mode in ("stays", "hangs"):
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


def child(script: str, *args: str) -> tuple[dict[str, Any], str]:
    """Run ``script`` in a child Python with ``args``: the JSON of its last line of
    output, and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def run(case: str) -> tuple[dict[str, Any], str]:
    return child(CHILD, case, FAKE_UP)


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


POINT = textwrap.dedent(
    """
    import argparse, json, sys, tempfile, time
    from pathlib import Path
    from benchmarks.embedded_stack import Stack
    from benchmarks.gpu import h3_frontier

    mode, fake, logs = sys.argv[1], sys.argv[2], sys.argv[3]
    made = []

    def stack(work, registry, model, device, workers, log_path):
        made.append(Stack(0, command=[sys.executable, "-c", fake, mode], log_path=log_path))
        return made[-1]

    h3_frontier.random_weights_stack = stack
    h3_frontier.registry_text = lambda args, lora: ""
    args = argparse.Namespace(
        keep_logs=logs, label="bf16-group-24", ready_timeout=2.0, device="cpu", jobs=1
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = h3_frontier.run_point(args, Path(tmp))
    out["waited_s"] = time.monotonic() - started
    out["log_path"] = str(made[0].log_path)
    print(json.dumps(out))
    """
)


def run_point(mode: str, logs: Path) -> tuple[dict[str, Any], str]:
    """One frontier point (h3_frontier.run_point) over the stand-in for up, its ready
    timeout 2 s, its logs written under ``logs``."""
    return child(POINT, mode, FAKE_UP, str(logs))


LAST_40 = [f"log line {i}" for i in range(21, 61)]


def test_a_frontier_point_whose_worker_never_loads_ends_at_its_timeout(tmp_path: Path) -> None:
    """up never says it is up: the point ends after its ready timeout (not the GPU call's
    limit), with its error and up's last 40 lines in its record and on stderr, and up's
    log in the output directory, written there as it ran."""
    out, stderr = run_point("hangs", tmp_path)
    assert out["error"].startswith("RuntimeError: up did not come up within 2 s"), out
    assert out["waited_s"] < 15
    assert out["up_log_tail"] == LAST_40
    assert out["log_path"] == str(tmp_path / "up_bf16-group-24.log")
    assert (tmp_path / "up_bf16-group-24.log").read_text().splitlines()[-1] == "log line 60"
    assert "point bf16-group-24: RuntimeError: up did not come up within 2 s" in stderr
    lines = stderr.splitlines()
    assert "log line 21" in lines and "log line 60" in lines
    assert "log line 20" not in lines[lines.index("log line 21") - 1 :]


def test_a_frontier_point_whose_up_exits_ends_at_once(tmp_path: Path) -> None:
    """up exits while loading: the point ends within seconds, up's last lines said once
    (by the stack's watcher) and kept in the record."""
    out, stderr = run_point("no-url", tmp_path)
    assert out["error"].startswith("UpExited: omniqueue up exited with status 3"), out
    assert out["waited_s"] < 5 and out["up_exit_code"] == 3
    assert out["up_log_tail"] == LAST_40
    assert stderr.count("log line 60") == 1
