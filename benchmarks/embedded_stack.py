"""An embedded ``omniqueue up`` for the benchmark scripts (``jobs/cancel.py``,
``load/soak.py``, ``gpu/*.py``, the load generator): the stack in a subprocess with its own
data directory, its child processes and ports, an S3 client on it, and a reader of its
stderr for the worker's release lines.

up exiting on its own (a worker that gives up after failed starts takes the stack down) ends
the benchmark within a second, whatever it waits on: a watcher thread prints the last lines of
up's log to stderr and raises :class:`UpExited` in the main thread (through SIGUSR1, which
also breaks a blocking sleep or socket read), instead of the benchmark waiting out its
timeouts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import psutil

from benchmarks.common import ROOT
from workers.runtime.processes import free_port

S3_ACCESS_KEY = "omniqueue"  # cli.embedded.EmbeddedS3 defaults; cli.up uses bucket "omniqueue"
S3_SECRET_KEY = "omniqueue-embedded-secret"
S3_BUCKET = "omniqueue"
_T = TypeVar("_T")
UP_TAIL_LINES = 40  # of up's log, printed when up exits on its own
WATCH_INTERVAL_S = 0.25  # how often the watcher looks at up
# Sent by a watcher to the main thread to raise UpExited there. The handler is installed
# once (only where nothing else handles the signal) and stays: a no-op unless a watch failed.
_WAKE_SIGNAL = signal.SIGUSR1
_WATCHES: list[UpWatch] = []  # started and not stopped

# The executor's log lines (its logger is workers.jobs.executor since the workers/ layout
# of issue 42; workers.executor before it).
_EXECUTOR = r"INFO workers\.(?:jobs\.)?executor: "
_LOG_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) " + _EXECUTOR + r"job (\S+): (\w+)\s*$"
)
_STOP_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) "
    + _EXECUTOR
    + r"job (\S+) stops in step (\d+) before block (\d+)"
)
_READY_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*@\S+ ready\.")
_MEMORY_RE = re.compile(_EXECUTOR + r"job (\S+): cuda memory allocated ([\d.]+) MiB")
_SKIP_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO celery\.app\.trace: "
    r"Task omniqueue\.run_job\[(\S+)\] succeeded in \S+: '(\w+)'"
)


def report(out: dict[str, Any], **extra: Any) -> int:
    """Print the benchmark's JSON object (``out`` with ``extra``) on stdout; the script's
    exit status: 0 when up exited 0 (``out["up_exit_code"]``, :meth:`Stack.shutdown`)."""
    out.update(extra)
    print(json.dumps(out, indent=2))
    return 0 if out.get("up_exit_code") == 0 else 1


def git_state() -> dict[str, Any]:
    """The commit the code under test is at, and how many tracked paths differ from it."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "modified_tracked_files": len(dirty.splitlines()) if dirty else 0,
    }


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class UpExited(RuntimeError):
    """``omniqueue up`` exited while the benchmark still needed it."""


def last_lines(path: Path, count: int = UP_TAIL_LINES) -> str:
    """The last ``count`` lines of the file at ``path`` ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-count:])


class UpWatch:
    """Watches a started ``up`` process (``proc``, its stderr in ``log_path``). When it exits
    before :meth:`stop`, the watcher thread prints the exit status and the last
    ``UP_TAIL_LINES`` lines of the log to stderr once, and raises :class:`UpExited` once in
    the main thread, when :meth:`start` ran there (so that a benchmark blocked in a sleep, a
    socket read or a lock wakes up). :meth:`check` raises it each time it is called after,
    for the waits that poll (and for a benchmark that caught the first one)."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.failure = ""  # the error's message, once up has exited on its own
        self._stopping = threading.Event()
        self._raised = False  # raised through the signal (at most once)
        self._reported = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="up-watch", daemon=True)
        self._signal = False  # the main thread raises UpExited on _WAKE_SIGNAL
        self._main = threading.main_thread().ident

    def start(self) -> UpWatch:
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(_WAKE_SIGNAL) == signal.SIG_DFL:
                signal.signal(_WAKE_SIGNAL, _wake)
            self._signal = signal.getsignal(_WAKE_SIGNAL) is _wake
        _WATCHES.append(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Up's exit from here on is expected (it is being stopped)."""
        self._stopping.set()
        with contextlib.suppress(ValueError):
            _WATCHES.remove(self)

    def check(self) -> None:
        """UpExited when up has exited on its own (the report printed first)."""
        if self._stopping.is_set():
            return
        code = self.proc.poll()
        if code is not None:
            self._report(code)
            self._raised = True  # the signal need not raise it again
            raise UpExited(self.failure)

    def _report(self, code: int) -> bool:
        """Print the error and up's last lines, once; True for the call that did."""
        with self._reported:
            if self.failure:
                return False
            self.failure = (
                f"omniqueue up exited with status {code} while the benchmark still needed it"
            )
            say(
                f"error: {self.failure}; the last {UP_TAIL_LINES} lines of its log "
                f"({self.log_path}):\n{last_lines(self.log_path)}\n(end of up's log)"
            )
            return True

    def _run(self) -> None:
        while not self._stopping.wait(WATCH_INTERVAL_S):
            code = self.proc.poll()
            if code is None:
                continue
            if self._stopping.is_set():
                return
            if self._report(code) and self._signal and self._main is not None:
                signal.pthread_kill(self._main, _WAKE_SIGNAL)
            return

    def raise_failure(self) -> None:
        """UpExited in the calling (main) thread, if up exited on its own and it has not
        been raised yet."""
        if self.failure and not self._stopping.is_set() and not self._raised:
            self._raised = True
            raise UpExited(self.failure)


def _wake(signum: int, frame: FrameType | None) -> None:
    for watch in list(_WATCHES):
        watch.raise_failure()


def log_time(date: str, millis: str) -> float:
    """``2026-11-30 03:03:45`` + ``240`` (logging's asctime, local time) → epoch seconds."""
    return time.mktime(time.strptime(date, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


class Stack:
    """``python -m cli.main up`` in a subprocess, with its own data directory.

    up's stderr (and through it its children's logs) goes to a file the caller can parse.
    While it runs, :class:`UpWatch` ends the benchmark when up exits on its own.
    ``command`` replaces ``python -m cli.main up …`` (a test's stand-in for up).
    ``log_path``: where up's stderr goes as it runs (default: the stack's own directory,
    removed with it), so that a run killed from outside still leaves the log there.
    """

    def __init__(
        self,
        workers: int,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        command: list[str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.workers = workers
        self._args = args  # more arguments of ``up`` (``--realtime-workers 0``, …)
        self._command = command
        self.watch: UpWatch | None = None
        self.base = Path(tempfile.mkdtemp(prefix="oq-bench-"))
        self.data_dir = self.base / "data"
        self.tmp_dir = self.data_dir / "worker-tmp"
        self.log_path = log_path or self.base / "up-stderr.log"
        self.port = free_port()
        self.url = ""
        self.exit_code: int | None = None
        self._extra_env = env or {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    def start(self, timeout: float = 180.0) -> None:
        self.tmp_dir.mkdir(parents=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # cli.up_children.child_env starts from os.environ: OMNIQ_* settings reach api and workers.
        env["OMNIQ_WORKER__TMP_DIR"] = str(self.tmp_dir)
        env.update(self._extra_env)
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        argv = self._command or [
            sys.executable,
            "-m",
            "cli.main",
            "up",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--workers",
            str(self.workers),
            *self._args,
        ]
        say(f"starting: {' '.join(argv[1:])}")
        self._proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
        )
        line: list[bytes] = []
        reader = threading.Thread(
            target=lambda: line.append(self._proc.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        self.watch = UpWatch(self._proc, self.log_path).start()
        deadline = time.monotonic() + timeout
        while reader.is_alive() and time.monotonic() < deadline:
            reader.join(WATCH_INTERVAL_S)
            self.watch.check()
        text = line[0].decode(errors="replace").strip() if line else ""
        m = re.match(r"omniqueue is up: (\S+)", text)
        if not m:
            if not reader.is_alive():  # stdout ended: up is exiting
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(5)
            self.watch.check()
            raise RuntimeError(
                f"up did not come up within {timeout:.0f} s (stdout: {text!r}); the last "
                f"{UP_TAIL_LINES} lines of its log:\n{last_lines(self.log_path)}"
            )
        self.url = m.group(1)
        say(f"up at {self.url} (data {self.data_dir})")

    def workers_ready(self, count: int, timeout: float) -> float:
        """Epoch seconds of the ``count``-th Celery worker's ``… ready.`` line in up's log
        (job and realtime workers alike); RuntimeError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            lines = self.log_path.read_text(errors="replace").splitlines()
            ready = [log_time(m[1], m[2]) for line in lines if (m := _READY_RE.match(line))]
            if len(ready) >= count:
                return sorted(ready)[count - 1]
            time.sleep(0.2)
        raise RuntimeError(
            f"{count} worker(s) not ready within {timeout:.0f} s:\n{self.log_tail()}"
        )

    def check(self) -> None:
        """UpExited when up has exited on its own (for loops that wait on it)."""
        if self.watch is not None:
            self.watch.check()

    def log_tail(self, size: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        return ""

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def children(self) -> dict[str, list[psutil.Process]]:
        """api / worker / realtime_worker / weed / valkey child processes of up."""
        found: dict[str, list[psutil.Process]] = {
            "api": [],
            "worker": [],
            "realtime_worker": [],
            "weed": [],
            "valkey": [],
        }
        for child in psutil.Process(self.pid).children():
            try:
                cmd = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if " api " in f"{cmd} ":
                found["api"].append(child)
            elif " worker " in f"{cmd} ":
                found["realtime_worker" if " --realtime" in cmd else "worker"].append(child)
            elif "weed" in cmd:
                found["weed"].append(child)
            elif "valkey-server" in cmd:
                found["valkey"].append(child)
        return found

    def s3_port(self) -> int:
        """The S3 port of the weed child: its ``-s3.port=`` flag, checked against the
        ports it listens on."""
        (weed,) = self.children()["weed"]
        listening = {c.laddr.port for c in weed.net_connections("tcp") if c.status == "LISTEN"}
        for arg in weed.cmdline():
            if arg.startswith("-s3.port="):
                port = int(arg.split("=", 1)[1])
                if port in listening:
                    return port
        raise RuntimeError(f"no -s3.port among weed's listening ports {sorted(listening)}")

    def valkey_port(self) -> int:
        (valkey,) = self.children()["valkey"]
        ports = {c.laddr.port for c in valkey.net_connections("tcp") if c.status == "LISTEN"}
        if len(ports) != 1:
            raise RuntimeError(f"valkey listens on {sorted(ports)}, expected one port")
        return ports.pop()

    def s3_client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.s3_port()}",
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )

    def stop(self, timeout: float = 120.0) -> int | None:
        """SIGINT up, wait for it; returns its exit code (SIGKILL after ``timeout``: None)."""
        if self.watch is not None:
            self.watch.stop()
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            say("stopping up (SIGINT)…")
            self._proc.send_signal(signal.SIGINT)
            try:
                self.exit_code = self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                say(f"up did not exit within {timeout:.0f} s; killing it")
                self._proc.kill()
                self._proc.wait()
                self.exit_code = None
        else:
            self.exit_code = self._proc.returncode
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._proc = None
        if self._log_file is not None:
            self._log_file.close()
        return self.exit_code

    @contextlib.contextmanager
    def running(self, out: dict[str, Any], keep_log: str | None = None) -> Iterator[LogWatcher]:
        """up for the block, its stderr watched. ``out`` gets the commit and the load
        before up starts, and how it ended after (:meth:`shutdown`), even when the block
        fails."""
        out["git"] = git_state()
        out["loadavg_1m_start"] = round(os.getloadavg()[0], 2)
        try:
            self.start()
            yield LogWatcher(self.log_path, self.check)
        finally:
            self.shutdown(out, keep_log)

    def shutdown(self, out: dict[str, Any], keep_log: str | None = None) -> int | None:
        """Stop up, record how it ended (and the load) in ``out``, remove the data."""
        code = self.stop()
        out["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
        out["up_exit_code"] = code
        out["up_exit_ok"] = code == 0
        self.remove(keep_log)
        return code

    def close(self, out: dict[str, Any], keep_log: str | None = None) -> None:
        """Stop up, its exit code in ``out`` (and its log's tail when it failed), remove
        the data (up's stderr copied to ``keep_log`` first, if given: before up stops too,
        so that a run killed while up stops still leaves it)."""
        if self.watch is not None:
            self.watch.stop()
        if keep_log:
            with contextlib.suppress(OSError):
                shutil.copyfile(self.log_path, keep_log)
        out["up_exit_code"] = self.stop()
        if out["up_exit_code"] != 0:
            out.setdefault("up_log_tail", self.log_tail(4000))  # the caller's, when it kept one
        self.remove(keep_log)

    def remove(self, keep_log: str | None = None) -> None:
        if keep_log:
            with contextlib.suppress(OSError):
                shutil.copyfile(self.log_path, keep_log)
        shutil.rmtree(self.base, ignore_errors=True)


class LogWatcher:
    """Reads up's stderr file incrementally: worker release lines and Celery results."""

    def __init__(self, path: Path, check: Callable[[], None] | None = None) -> None:
        self.path = path
        self._check = check  # Stack.check: raises when up has exited on its own
        self._offset = 0
        self._partial = b""
        self.released: dict[str, tuple[float, str]] = {}  # job id → (epoch, outcome)
        self.task_results: dict[str, tuple[float, str]] = {}
        # job id → (epoch, step, block) where a cancel stopped it inside a step
        self.stopped_in_step: dict[str, tuple[float, int, int]] = {}
        self.cuda_allocated_mib: dict[str, float] = {}  # job id → after the job

    def poll(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
            self._offset = f.tell()
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            line = raw.decode(errors="replace")
            if m := _LOG_RE.match(line):
                self.released[m.group(3)] = (log_time(m.group(1), m.group(2)), m.group(4))
            elif m := _STOP_RE.match(line):
                at = log_time(m.group(1), m.group(2))
                self.stopped_in_step[m.group(3)] = (at, int(m.group(4)), int(m.group(5)))
            elif m := _MEMORY_RE.search(line):
                self.cuda_allocated_mib[m.group(1)] = float(m.group(2))
            elif m := _SKIP_RE.match(line):
                self.task_results[m.group(3)] = (log_time(m.group(1), m.group(2)), m.group(4))

    def wait_for(self, table: dict[str, _T], job_id: str, timeout: float) -> _T | None:
        """``table[job_id]`` (``table``: one of this watcher's) once the log has it; None
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._check is not None:
                self._check()
            self.poll()
            if job_id in table:
                return table[job_id]
            time.sleep(0.02)
        return None

    def wait_released(self, job_id: str, timeout: float = 120.0) -> tuple[float, str] | None:
        return self.wait_for(self.released, job_id, timeout)
