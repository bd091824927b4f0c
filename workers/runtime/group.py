"""Worker groups: one job across several devices, one process per rank.

    omniqueue worker --devices cuda:0,cuda:1        (or OMNIQ_WORKER__DEVICES)

The command's own process supervises the group. It starts one process per device (rank r
on ``devices[r]``, joined by ``torch.distributed``: NCCL on GPUs, gloo on CPUs) and, when
any rank dies, kills the others and starts the whole group again, with the backoff and
give-up policy of ``omniqueue up`` (``workers/runtime/supervisor.py``). Nothing is left waiting in a
collective or holding device memory, and the job the group was running, whose heartbeat
stopped with rank 0, is taken over by the next group to claim it (``worker_lost`` once the
attempt limit is reached). A rank that hangs instead of dying is caught by the
collectives' timeout (``OMNIQ_WORKER__COLLECTIVE_TIMEOUT_S``): rank 0 then exits, and the
same restart follows.

Rank 0 alone talks to the broker, the database and S3: it is an ordinary job worker
(``workers/runtime/celery_app.py``) whose pipelines are :class:`GroupPipeline`, which sends each
call to the other ranks (one pipe each) before running its own share of it. The other
ranks load the same models on their device, apply the model's strategy
(``workers/pipelines/parallel.py``) and do what rank 0 sends: prepare, step, end. So every decision
is rank 0's: whether the next step runs (its executor checks ownership and the deadline
between steps, then sends ``step`` or ``end``), and, inside a step, whether to stop before
the next block (the block gates agree on rank 0's answer; ``workers/pipelines/blocks.py``).
Only rank 0 decodes; the others drop their state when the denoise loop ends.
"""

from __future__ import annotations

import datetime
import gc
import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from storage.settings import Settings, get_settings
from workers.common.memory import apply_memory_fraction
from workers.pipelines.base import (
    DecodeStream,
    GenerationRequest,
    Media,
    Pipeline,
    StepState,
    SupportsDecodeStream,
    SupportsPreview,
    step_stops,
)
from workers.pipelines.blocks import StepAborted
from workers.pipelines.parallel import GroupParallel, GroupRank, enable
from workers.pipelines.registry import PipelineRegistry
from workers.pipelines.run_ahead import configure_checkpoints
from workers.runtime.context import WorkerContext, worker_models
from workers.runtime.processes import exiting, free_port
from workers.runtime.supervisor import GaveUp, Supervisor

log = logging.getLogger(__name__)

# Rank 0's exit status when the group broke under it (a rank gone or hung).
GROUP_LOST = 75
TICK_S = 0.2  # how often the supervisor looks at its ranks


# ---- what rank 0 sends --------------------------------------------------------------


@dataclass(frozen=True)
class Prepare:
    model: str
    request: GenerationRequest


@dataclass(frozen=True)
class Step:
    index: int


@dataclass(frozen=True)
class End:
    """The job is over for the other ranks (decode is rank 0's, or it stopped)."""


@dataclass(frozen=True)
class Ended:
    """A rank's answer to :class:`End`: it dropped the job's state."""

    memory_allocated: int  # bytes on its device afterwards (0 on CPUs)


Command = Prepare | Step | End


def _group_lost(why: str) -> None:
    """Rank 0 cannot go on with this group: exit, so the supervisor restarts the group and
    the job is taken over (an exception here would fail the job instead)."""
    log.error("worker group lost: %s; exiting for a restart", why)
    logging.shutdown()
    os._exit(GROUP_LOST)


def _is_collective_error(exc: BaseException) -> bool:
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("gloo", "NCCL", "Connection closed by peer", "timed out")
    )


class GroupPipeline(Pipeline):
    """Rank 0's face of a model served by a group: each call goes to the other ranks,
    then runs here on this rank's share."""

    def __init__(
        self, name: str, inner: Pipeline, links: list[Connection], timeout_s: float
    ) -> None:
        self.name = name
        self.inner = inner
        self.spec = inner.spec
        self.links = links
        self.timeout_s = timeout_s
        self._active = False  # the other ranks hold a job's state

    def load(self, device: str) -> None:
        """Loaded by the registry before it was wrapped."""

    def _send(self, command: Command) -> None:
        for link in self.links:
            try:
                link.send(command)
            except (BrokenPipeError, EOFError, OSError) as exc:
                _group_lost(f"a rank's pipe is closed ({exc!r})")

    def prepare(self, request: GenerationRequest) -> StepState:
        self._end()  # a previous job that never reached end()
        self._send(Prepare(self.name, request))
        self._active = True
        return self.inner.prepare(request)

    def step(self, state: StepState) -> None:
        self._send(Step(state.step_index))
        try:
            self.inner.step(state)
        except Exception as exc:
            if isinstance(self.inner, GroupRank) and self.inner.gate.agreed(exc):
                raise  # a stop every rank agreed on: they all left the step at this block
            # Anything else left the other ranks inside a collective this rank will not
            # join: only a restart frees them (the job is then taken over).
            what = "a collective failed" if _is_collective_error(exc) else "rank 0 failed"
            _group_lost(f"{what} in step {state.step_index} ({exc!r})")

    def decode(self, state: StepState) -> Media:
        self._end()  # the others free their memory while this rank decodes
        return self.inner.decode(state)

    def decode_stream(self, state: StepState) -> DecodeStream | None:
        """The inner adapter's streamed decode, if it has one (None: ``decode``)."""
        self._end()
        if not isinstance(self.inner, SupportsDecodeStream):
            return None
        return self.inner.decode_stream(state)

    def preview(self, state: StepState) -> Any:
        return self.inner.preview(state) if isinstance(self.inner, SupportsPreview) else None

    def end(self) -> None:
        self._end()
        self.inner.end()

    def _end(self) -> None:
        """Tell the other ranks the job is over and wait until they dropped its state."""
        if not self._active:
            return
        self._active = False
        self._send(End())
        deadline = time.monotonic() + self.timeout_s
        for rank, link in enumerate(self.links, start=1):
            if not link.poll(max(0.0, deadline - time.monotonic())):
                _group_lost(f"rank {rank} did not end its job within {self.timeout_s:g} s")
            try:
                answer = link.recv()
            except (EOFError, OSError) as exc:
                _group_lost(f"rank {rank} is gone ({exc!r})")
            if not isinstance(answer, Ended):
                _group_lost(f"rank {rank} answered {type(answer).__name__} to end")


# ---- one rank -------------------------------------------------------------------------


def _join(rank: int, world: int, device: str, port: int, timeout_s: float) -> None:
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(
        "nccl" if kind == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _load_group(registry: PipelineRegistry, rank: int, world: int) -> dict[str, Any]:
    """Load every model on this rank and apply its strategy, in the same order on every
    rank (building a context-parallel mesh is collective)."""
    loaded = {}
    for name in sorted(registry.models):
        model = registry.models[name]
        pipe = registry.get(name)
        assert model.parallel is not None
        enable(pipe, GroupParallel(rank=rank, world=world, strategy=model.parallel))
        loaded[name] = pipe
    return loaded


def _follow(rank: int, pipes: dict[str, Any], link: Connection) -> None:
    """A rank other than 0: do what rank 0 sends until its pipe closes."""
    state: Any = None
    pipe: Any = None
    failed = False  # this rank's prepare of the current job raised

    def go_on(block: int) -> None:
        return None  # rank 0 decides; the block gates carry its answer here

    while True:
        try:
            command = link.recv()
        except (EOFError, OSError):
            log.info("rank %d: rank 0 is gone; exiting", rank)
            return
        if isinstance(command, Prepare):
            pipe = pipes[command.model]
            failed = False
            try:
                state = pipe.prepare(command.request)
            except Exception:  # rank 0 prepares the same request: it fails the job
                log.warning("rank %d: prepare failed", rank, exc_info=True)
                state, failed = None, True
        elif isinstance(command, Step):
            if state is None and failed:
                # Rank 0 prepared what this rank could not: it would wait in this step's
                # collectives forever. Exit; the group restarts and the job is retried.
                log.error("rank %d: prepare failed where rank 0's did not; exiting", rank)
                sys.exit(1)
            if state is None:
                continue  # stopped already; rank 0's end follows
            try:
                with step_stops(go_on):
                    pipe.step(state)
            except StepAborted as exc:
                log.info("rank %d: step %d aborted: %s", rank, command.index, exc)
                state = None
        else:
            state, failed = None, False
            if pipe is not None:
                pipe.end()  # the job's cache tier off this rank's pipe too
            gc.collect(0)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            allocated = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
            link.send(Ended(memory_allocated=allocated))


def _rank_main(
    rank: int, devices: list[str], port: int, links: list[Connection], name: str
) -> None:
    """Entry point of one rank's process (spawned by :func:`run_group`)."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s %(name)s: [rank {rank}] %(message)s",
    )
    settings = get_settings()
    worker = settings.worker.model_copy(update={"device": devices[rank], "devices": devices})
    settings = settings.model_copy(update={"worker": worker})
    world = len(devices)
    _join(rank, world, devices[rank], port, worker.collective_timeout_s)
    log.info("rank %d of %d on %s joined (pid %d)", rank, world, devices[rank], os.getpid())
    if rank == 0:
        from workers.runtime.celery_app import serve

        def wrap(context: WorkerContext) -> None:
            for model, pipe in _load_group(context.pipelines, 0, world).items():
                group = GroupPipeline(model, pipe, links, worker.collective_timeout_s)
                context.pipelines.replace(model, group)

        code = serve(settings, f"{name}-group", prepare=wrap)
        exiting()
        sys.exit(code)
    # A stop (Ctrl-C, SIGTERM to the process group) is rank 0's to handle: it finishes
    # its job, which needs this rank, and this rank exits when rank 0's pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    models = worker_models(settings)
    apply_memory_fraction(worker.memory_fraction, [devices[rank]])  # rank 0's: in serve
    configure_checkpoints(worker.checkpoint_lookahead)  # rank 0's: in serve, too
    registry = PipelineRegistry(models, devices[rank])
    registry.load_each()  # a model rank 0 cannot load (the same files) is left out here too
    _follow(rank, _load_group(registry, rank, world), links[0])
    exiting()


# ---- the supervisor -------------------------------------------------------------------


class _Group:
    """The rank processes of one start of the group."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.devices = list(settings.worker.devices)
        self.name = name
        self.procs: list[Any] = []
        self._ctx = multiprocessing.get_context("spawn")

    def start(self) -> None:
        port = free_port()
        world = len(self.devices)
        pipes = [self._ctx.Pipe() for _ in range(world - 1)]
        leader_ends = [a for a, _ in pipes]
        self.procs = []
        for rank in range(world):
            links = leader_ends if rank == 0 else [pipes[rank - 1][1]]
            proc = self._ctx.Process(
                target=_rank_main,
                args=(rank, self.devices, port, links, self.name),
                name=f"{self.name}-rank{rank}",
            )
            proc.start()
            self.procs.append(proc)
        for a, b in pipes:  # the ranks hold them now
            a.close()
            b.close()

    def exit_code(self) -> int | None:
        """None while every rank runs; once one is gone, the others are killed (a rank
        alone would wait in its next collective) and the first exit code is returned."""
        codes = [p.exitcode for p in self.procs]
        dead = [c for c in codes if c is not None]
        if not dead:
            return None
        self.kill()
        return dead[0]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in self.procs:
            proc.join(10)

    def stop(self, timeout_s: float) -> None:
        """Graceful: rank 0 finishes its job (Celery's warm shutdown), the others follow
        when its pipes close; whatever is left after ``timeout_s`` is killed."""
        if self.procs and self.procs[0].exitcode is None:
            os.kill(self.procs[0].pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()


def run_group(settings: Settings, name: str) -> int:
    """Run and supervise a worker group until SIGTERM/SIGINT; the exit status."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not worker_models(settings):
        size = settings.worker.group_size
        print(f"omniqueue worker: no job model is served for {size} devices", file=sys.stderr)
        return 2
    # The ranks read their settings from the environment: pass on what the command set.
    os.environ["OMNIQ_WORKER__DEVICES"] = ",".join(settings.worker.devices)
    if settings.worker.models:
        os.environ["OMNIQ_WORKER__MODELS"] = ",".join(settings.worker.models)
    group = _Group(settings, name)
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    supervisor = Supervisor(lambda line: log.warning("%s", line), label="omniqueue worker group")
    group.start()
    log.info("worker group %s on %s started", name, ",".join(group.devices))
    supervisor.add(f"worker group {name}", group.exit_code, group.start)
    try:
        while not stopping:
            supervisor.check()
            time.sleep(TICK_S)
    except GaveUp as exc:
        log.error("%s", exc)
        group.kill()
        return 1
    group.stop(timeout_s=settings.worker.collective_timeout_s)
    return 0
