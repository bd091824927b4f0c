"""Cancel points between the denoiser's transformer blocks: a job stops within a block,
not within a step.

A diffusers adapter registers one :class:`BlockGate` as a forward pre-hook on every block
of its denoiser (``transformer.blocks``, ``transformer_blocks``, …). Inside a denoise step
the executor sets the stop question (:func:`~workers.pipelines.base.step_stops`); before
each block the gate

1. on CUDA, keeps the host at most ``lookahead`` blocks ahead of the device
   (:class:`~workers.pipelines.run_ahead.RunAhead`, which the cancel points of prepare
   and decode use too). Kernels are queued asynchronously, so without this bound the host
   queues a whole step within a few milliseconds and a stop raised "at block 3" still
   leaves the rest of the step running on the device. With it, a stop leaves at most
   ``lookahead + 1`` blocks of queued work;
2. asks the question, and raises its answer (``JobLost``, ``JobTimedOut``).

In a worker group (``workers/runtime/group.py``) every rank runs the same blocks, and only rank 0
knows whether the job is still to run. The ranks agree before every block with a
one-element ``all_reduce(MAX)`` of rank 0's answer, so they all stop at the same block and
no rank is left waiting in a collective the others will never join. On CUDA the agreed
flag is read ``lookahead`` blocks later (its device-to-host copy is queued with the block
and has landed once the pacing wait passes it), so the agreement never stalls the queue.

Outside a job step (sessions, tests, a bare ``pipe(...)`` call) the hook is one
context-variable read.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from workers.pipelines.base import StopReason, step_stop
from workers.pipelines.run_ahead import RunAhead


class StepAborted(Exception):
    """Raised on a worker group's other ranks where rank 0 stopped the step."""


def denoiser_blocks(pipe: Any) -> list[torch.nn.Module]:
    """The blocks of a pipeline's denoisers: each element of every ``ModuleList`` that is a
    direct child of a ``transformer*`` or ``unet*`` component (not the lists nested inside
    attention layers, whose elements are single linear layers)."""
    blocks: list[torch.nn.Module] = []
    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        if not name.startswith(("transformer", "unet")):
            continue
        for child in component.children():
            if isinstance(child, torch.nn.ModuleList):
                blocks.extend(child)
    return blocks


class BlockGate:
    """The forward pre-hook of every denoiser block of one adapter (see the module doc)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        # A torch.distributed process group when this adapter runs in a worker group.
        self.group: Any = None
        self.blocks = 0  # blocks entered in the current step
        # Blocks the host may run ahead of the device (``lookahead``). 2 keeps the device
        # fed through a GIL switch (5 ms) at Wan 1.3B's ~6 ms blocks; a stop then waits
        # out at most 3 blocks.
        self.run_ahead = RunAhead(2)
        self._flags: deque[torch.Tensor] = deque()
        self._reason: BaseException | None = None
        self._one: torch.Tensor | None = None
        self._zero: torch.Tensor | None = None

    @property
    def lookahead(self) -> int:
        """Blocks the host may run ahead of the device (a benchmark sets it)."""
        return self.run_ahead.lookahead

    @lookahead.setter
    def lookahead(self, blocks: int) -> None:
        self.run_ahead.lookahead = blocks

    def install(self, pipe: Any) -> int:
        """Hook every denoiser block of ``pipe`` (once); returns how many."""
        blocks = denoiser_blocks(pipe)
        for block in blocks:
            if getattr(block, "_omniq_gate", None) is None:  # another adapter's already
                block.register_forward_pre_hook(self._hook)
                block._omniq_gate = self  # type: ignore[assignment]
        return len(blocks)

    def begin_step(self) -> None:
        """Forget the previous step (its events, flags and answer)."""
        self.blocks = 0
        self.run_ahead.clear()
        self._flags.clear()
        self._reason = None

    def agreed(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the stop this rank's group agreed on in the current step."""
        return self.group is not None and exc is self._reason

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        reason = step_stop()
        if reason is not None:
            self.enter(reason)

    def enter(self, reason: StopReason) -> None:
        """Before one block: pace, ask, agree, raise."""
        self.blocks += 1
        if self.group is None:
            if self.device.type == "cuda":
                self.run_ahead.pace(functools.partial(self._ask, reason))
            self._ask(reason)
            return
        exc = reason(self.blocks)
        if exc is not None and self._reason is None:
            self._reason = exc
        if self._agree(self._reason is not None):
            raise self._reason or StepAborted(f"stopped by rank 0 before block {self.blocks}")

    def _ask(self, reason: StopReason) -> None:
        """Raise ``reason``'s answer for the current block, if it has one."""
        if (exc := reason(self.blocks)) is not None:
            raise exc

    def _agree(self, stop: bool) -> bool:
        """Whether the ranks agreed to stop before this block (rank 0's ``stop`` is the
        one that counts; the others pass False)."""
        if self.device.type != "cuda":
            flag = torch.tensor([int(stop)], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            return bool(flag.item())
        if self._one is None or self._zero is None:
            self._one = torch.ones(1, dtype=torch.int32, device=self.device)
            self._zero = torch.zeros(1, dtype=torch.int32, device=self.device)
        flag = (self._one if stop else self._zero).clone()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True).wait()
        host = torch.empty(1, dtype=torch.int32, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        self._flags.append(host)
        self.run_ahead.pace()  # after the copy is queued: the wait below covers it
        if len(self._flags) <= self.lookahead:
            return False
        # Queued before the block the pacing wait just saw start: it has landed.
        return bool(self._flags.popleft().item())
