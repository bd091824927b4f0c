"""How one rank of a worker group takes its share of a denoise step.

A served model's ``parallel`` strategy (``models/registry.py``) is applied to its loaded
adapter on every rank (:func:`enable`):

* ``cfg``: classifier-free guidance's two transformer passes run on two ranks at once,
  rank 0 the conditional one and rank 1 the unconditional one, and each rank gathers the
  other's prediction (:meth:`Parallel.cfg_pair`). Each pass is the one a single device
  runs, so the result is bit-identical to it. Adapters that run CFG as two passes use it
  (Wan); without guidance both ranks run the one pass (the block gates need every rank to
  run the same blocks).
* ``ulysses`` / ``ring``: diffusers' context parallelism (``ContextParallelConfig``) on
  each denoiser: the token sequence is split across the ranks, attention all-to-all
  (Ulysses) or passed around a ring. Every family whose transformer ships a ``_cp_plan``
  in diffusers runs it (Wan, LTX, …); ring needs an attention backend that returns the
  log-sum-exp (flash, cuDNN on GPUs; not PyTorch's native SDPA on CPUs).

Whatever the strategy, every rank ends a step with the same latents (the scheduler steps
the same tensors on every rank), so rank 0 alone decodes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol, runtime_checkable
from unittest import mock

import torch
import torch.distributed as dist

from models.registry import ParallelStrategy
from workers.pipelines.blocks import BlockGate


class Parallel:
    """A single device: both passes here."""

    rank = 0
    world = 1

    def cfg_pair(
        self, cond: Callable[[], torch.Tensor], uncond: Callable[[], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The conditional and the unconditional prediction of one step."""
        return cond(), uncond()


class GroupParallel(Parallel):
    """This rank's place in a worker group."""

    def __init__(
        self, *, rank: int, world: int, strategy: ParallelStrategy, group: Any = None
    ) -> None:
        self.rank = rank
        self.world = world
        self.strategy = strategy
        self.group = group  # the torch.distributed process group (None: the default one)

    def cfg_pair(
        self, cond: Callable[[], torch.Tensor], uncond: Callable[[], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.strategy != "cfg":
            return cond(), uncond()
        mine = (cond if self.rank == 0 else uncond)().contiguous()
        both = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(both, mine, group=self.group)
        return both[0], both[1]


@runtime_checkable
class GroupRank(Protocol):
    """An adapter a worker group can run (every diffusers job adapter): block gates that
    agree on a stop across the group, its share of a step (set by :func:`enable`), and
    the loaded pipe whose denoisers take context parallelism."""

    gate: BlockGate
    parallel: Parallel
    pipe: Any


@runtime_checkable
class SplitsGuidance(GroupRank, Protocol):
    """A group rank that runs classifier-free guidance as two passes through
    ``parallel.cfg_pair`` (Wan), so a ``cfg`` group puts them on two ranks."""

    cfg_parallel: Literal[True]


@contextlib.contextmanager
def _cpu_accelerator() -> Iterator[None]:
    """diffusers 0.42's ``enable_parallelism`` takes each rank's device from
    ``torch.accelerator``, which a CPU-only host does not have (a division by zero); a
    gloo group on CPUs (the test suite's) gets the CPU instead."""
    if torch.accelerator.device_count() > 0:
        yield
        return
    with (
        mock.patch("torch._C._get_accelerator", lambda: torch.device("cpu")),
        mock.patch("torch.accelerator.device_count", lambda: 1),
    ):
        yield


def enable(adapter: object, parallel: GroupParallel) -> None:
    """Apply ``parallel`` to a loaded adapter on this rank (every rank, in the same order:
    building the context-parallel mesh is collective). The adapter's block gates agree on
    stops across the group from now on."""
    if not isinstance(adapter, GroupRank):
        raise TypeError(f"{type(adapter).__name__} has no block gates: it cannot run in a group")
    adapter.parallel = parallel
    adapter.gate.group = parallel.group if parallel.group is not None else dist.group.WORLD
    if parallel.strategy == "cfg":
        if not isinstance(adapter, SplitsGuidance):
            raise TypeError(f"{type(adapter).__name__} does not run guidance as two passes")
        return
    from diffusers import ContextParallelConfig

    from workers.pipelines.diffusers.shared.attention import CUDNN_BACKEND, use_backend

    degree = {f"{parallel.strategy}_degree": parallel.world}
    for name, component in adapter.pipe.components.items():
        if isinstance(component, torch.nn.Module) and name.startswith("transformer"):
            if not getattr(type(component), "_cp_plan", None):
                raise TypeError(f"{type(component).__name__} has no context-parallel plan")
            if parallel.strategy == "ring" and torch.cuda.is_available():
                # ring attention merges partial results by their log-sum-exp, which
                # PyTorch's default SDPA dispatch does not return; cuDNN's does (an entry's
                # attention = "cudnn" has set it at load already, ulysses keeps it)
                use_backend(component, CUDNN_BACKEND)
            with _cpu_accelerator():
                component.enable_parallelism(config=ContextParallelConfig(**degree))  # type: ignore[operator]
