"""Compiled blocks: each denoiser block's ``forward`` through ``torch.compile``.

What diffusers' ``compile_repeated_blocks`` does, with one difference that keeps step
execution intact: it compiles ``block.forward``, not the block's ``__call__``. Module
hooks run in ``__call__`` around ``forward``, so they stay eager, outside the compiled
region:

* the per-block cancel gates (``workers/pipelines/blocks.py``, forward pre-hooks): a
  cancel inside a step still lands before the next block;
* the cache tiers' hooks (``cache_tiers.py``), which replace ``forward`` with a wrapper
  around the compiled one for the length of a job and restore it after.

Every block of a class shares one compiled graph per input shape (dynamo treats the
block's parameters as inputs), so a 30-block Wan compiles one graph, not 30. Shapes are
static (``dynamic=False``): each shape bucket of the registry (``warmup``) compiles once
at worker start; a job of another shape compiles once in its own ``prepare``; a second
job of a shape already seen compiles nothing (``recompiles`` counts it, from dynamo's
own counter of the graphs it made). A family whose lengths come from the request makes
them symbolic instead (:class:`BlockCompiler`'s ``dynamic``: H3, LongCat).

A compile failure never fails a job: the blocks go back to eager for the rest of the
process, with the reason logged and counted (``omniqueue_compile_fallbacks_total``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from workers.pipelines.blocks import denoiser_blocks

log = logging.getLogger(__name__)

# Raised by dynamo/inductor when a graph cannot be made (not by the model's own code),
# or when a block met dynamo's recompile limit: with ``fullgraph`` that is an error
# (``FailOnRecompileLimitHit``), not dynamo's silent eager fallback.
_COMPILE_ERRORS: tuple[type[BaseException], ...] = ()
try:  # the names moved between torch releases; take those this one has
    from torch._dynamo import exc as _dynamo_exc

    _COMPILE_ERRORS = tuple(
        getattr(_dynamo_exc, name)
        for name in (
            "BackendCompilerFailed",
            "Unsupported",
            "InternalTorchDynamoError",
            "FailOnRecompileLimitHit",
        )
        if hasattr(_dynamo_exc, name)
    )
except ImportError:  # pragma: no cover - torch without dynamo
    pass


def graphs_made() -> int:
    """How many graphs dynamo has compiled in this process (its ``unique_graphs``)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compiled_forward(
    module: torch.nn.Module,
    *,
    backend: str,
    mode: str | None,
    failed: Callable[[], str | None],
    give_up: Callable[[str], None],
    fullgraph: bool = True,
    dynamic: bool | None = False,
    clone_output: bool = False,
) -> Callable[..., Any]:
    """``module``'s forward through ``torch.compile`` (static shapes unless ``dynamic``
    says otherwise: None is dynamo's automatic dynamic), eager once ``failed()`` says so;
    a compile error calls ``give_up`` and runs that call eager. ``clone_output``: the
    compiled call's tensor output is cloned (see :class:`BlockCompiler`)."""
    eager = type(module).forward.__get__(module)
    compiled = torch.compile(
        eager, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode
    )

    def forward(*args: Any, **kwargs: Any) -> Any:
        if failed() is not None:
            return eager(*args, **kwargs)
        try:
            out = compiled(*args, **kwargs)
        except _COMPILE_ERRORS as exc:
            give_up(f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400])
            return eager(*args, **kwargs)
        return out.clone() if clone_output and isinstance(out, torch.Tensor) else out

    forward.__wrapped__ = eager  # type: ignore[attr-defined]
    forward._omniq_compiled = True  # type: ignore[attr-defined]
    return forward


class BlockCompiler:
    """Compiles the denoiser blocks of one pipeline and keeps account of it.

    ``observe`` is called with the compile time of each shape (warm-up or prepare);
    ``fell_back`` with the reason when compiling failed. ``dynamic`` is the blocks'
    ``torch.compile(dynamic=…)``: False (static, the default) for families whose shapes
    come from the registry's few buckets; None (dynamo's automatic dynamic: the first
    shape static, the second one graph with the changed sizes symbolic, which every later
    size reuses) where a request's own content sets a length, as H3's prompt sets its
    packed sequence's; True (every size symbolic from the first graph on) where a family
    controls the first shape (LongCat's warm-up). ``clone_outputs``: each block's output
    is cloned, which CUDA graphs (``mode="reduce-overhead"``) need where one compiled
    block's output is the next one's input (pytorch/pytorch#152887: the replay would
    overwrite it); off unless a family turns it on (LongCat does for that mode)."""

    def __init__(
        self,
        *,
        backend: str = "inductor",
        mode: str | None = None,
        observe: Callable[[str, float], None] | None = None,
        fell_back: Callable[[str], None] | None = None,
        dynamic: bool | None = False,
    ) -> None:
        self.backend = backend
        self.mode = mode
        self.dynamic = dynamic
        self.clone_outputs = False
        self.last_made = 0  # graphs the last ``ensure`` that ran made
        self.enabled = False
        self.failed: str | None = None  # why compiling was given up, once it was
        self.shapes: set[tuple[Any, ...]] = set()  # input shapes compiled so far
        self._observe = observe
        self._fell_back = fell_back
        self._blocks: list[torch.nn.Module] = []

    def install(self, pipe: Any) -> int:
        """Compile the ``forward`` of every denoiser block of ``pipe`` (lazily: each shape
        compiles at its first call). Returns the number of blocks."""
        self._blocks = denoiser_blocks(pipe)
        for block in self._blocks:
            block.forward = self._wrap(block)
        self.enabled = bool(self._blocks)
        return len(self._blocks)

    def _wrap(self, block: torch.nn.Module) -> Callable[..., Any]:
        return compiled_forward(
            block,
            backend=self.backend,
            mode=self.mode,
            failed=lambda: self.failed,
            give_up=self.give_up,
            dynamic=self.dynamic,
            clone_output=self.clone_outputs,
        )

    def compile_module(self, module: torch.nn.Module, name: str) -> None:
        """Compile ``module``'s forward too (a VAE decoder), with a failure of its own: it
        falls back to eager alone (logged), the blocks stay compiled. Its graphs may break
        (``fullgraph`` off); its cancel points move to its own call
        (:func:`~workers.pipelines.diffusers.shared.loading.hoist_checkpoints`)."""
        from workers.pipelines.diffusers.shared.loading import hoist_checkpoints

        hoist_checkpoints(module)
        failed: list[str] = []

        def give_up(reason: str) -> None:
            failed.append(reason)
            log.warning("compiled %s: falling back to eager: %s", name, reason)

        module.forward = compiled_forward(
            module,
            backend=self.backend,
            mode=self.mode,
            failed=lambda: failed[0] if failed else None,
            give_up=give_up,
            fullgraph=False,
        )

    def give_up(self, reason: str) -> None:
        """Run the blocks eager from now on (a compile failed: logged and counted)."""
        if self.failed is not None:
            return
        self.failed = reason
        log.warning("compiled blocks: falling back to eager: %s", reason)
        if self._fell_back is not None:
            self._fell_back(reason)

    def ensure(self, key: tuple[Any, ...], run: Callable[[], None], why: str) -> float:
        """Compile for the input shape ``key`` unless done: ``run`` makes one forward pass
        at that shape. Returns the seconds it took (0 when nothing was compiled)."""
        if not self.enabled or self.failed is not None or key in self.shapes:
            return 0.0
        started = time.monotonic()
        before = graphs_made()
        run()
        seconds = time.monotonic() - started
        self.shapes.add(key)
        made = self.last_made = graphs_made() - before
        log.info("compiled blocks for %s (%s): %d graph(s) in %.1f s", key, why, made, seconds)
        if self._observe is not None and self.failed is None:
            self._observe(why, seconds)
        return seconds
