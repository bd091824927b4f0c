"""What a registry entry configures in a diffusers adapter of either kind (the job adapters'
``DiffusersAdapter``, adapter.py, and Helios' world adapter, helios/adapter.py, which as a
``WorldPipeline`` cannot share that base): the keyword arguments both constructors take
(:class:`EntryOptions`, filled from a registry entry by :func:`entry_options`) and the
settings they keep of them (:class:`DiffusersEntry`: the weights' local ``path`` or the
random-weights mode, their dtype, the prompt length, the compiled-blocks settings and
warm-up shapes).

Each adapter holds its settings as ``entry``, a part of it rather than a base class: a
reader of an adapter's ``prepare`` opens its own module and its base's, never a third
class for the constructor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from models.catalog import ModelSpec
from models.memory_plan import MemoryPlan
from models.registry import CompileMode, ServedModel, WarmupShape
from workers.pipelines.diffusers.shared.compiled import BlockCompiler
from workers.pipelines.diffusers.shared.loading import parse_dtype


class EntryOptions(TypedDict, total=False):
    """The keyword arguments of a diffusers adapter's constructor besides ``path`` (and
    its family's own): a registry entry's settings, or an injected ``pipe`` (tests,
    benchmarks: used as it is, dtype included)."""

    dtype: str
    pipe: Any
    spec: ModelSpec | None
    max_sequence_length: int | None
    compile: CompileMode | None
    compile_backend: str
    compile_mode: str | None
    warmup: list[WarmupShape] | None
    random_weights: bool
    memory: MemoryPlan | None


def entry_options(model: ServedModel) -> dict[str, Any]:
    """A registry entry as a diffusers adapter's constructor takes it: ``path``, ``dtype``,
    ``spec``, the compiled-blocks settings, the random-weights mode, the memory plan (FP8,
    offload) and the entry's ``adapter_options`` (the family's own arguments)."""
    return {
        "path": model.path,
        "dtype": model.dtype,
        "spec": model.spec,
        "compile": model.compile,
        "compile_backend": model.compile_backend,
        "compile_mode": model.compile_mode,
        "warmup": model.warmup,
        "random_weights": model.weights == "random",
        "memory": model.spec.memory,
        **model.adapter_options,
    }


@dataclass(frozen=True)
class DiffusersEntry:
    """The settings a diffusers adapter keeps of its constructor's arguments."""

    path: str | None
    dtype: torch.dtype
    # A registry entry's ``weights = "random"`` (benchmarks only: the families'
    # ``random_weights.py``).
    random_weights: bool
    # None: the pipeline's ``__call__`` default (Wan 512, LTX 128, CogVideoX 226,
    # Helios 512).
    max_sequence_length: int | None
    # Compiled blocks (compiled.py): None = "blocks" on CUDA, "off" elsewhere.
    compile: CompileMode | None
    compile_backend: str
    compile_mode: str | None
    # The shapes compiled at worker start (the registry's ``warmup``).
    warmup: list[WarmupShape]
    # FP8 weights and offloading (memory.py); None: as loaded, on the device.
    memory: MemoryPlan | None = None

    @classmethod
    def of(cls, adapter: str, path: str | None, options: EntryOptions) -> DiffusersEntry:
        """The settings of ``adapter`` (its class name) built with ``path`` and
        ``options``; refused without a local path, an injected pipe or random weights."""
        random_weights = options.get("random_weights", False)
        if path is None and options.get("pipe") is None and not random_weights:
            raise ValueError(f"{adapter} needs a local path or a pipe")
        return cls(
            path=path,
            dtype=parse_dtype(options.get("dtype", "bfloat16")),
            random_weights=random_weights,
            max_sequence_length=options.get("max_sequence_length"),
            compile=options.get("compile"),
            compile_backend=options.get("compile_backend", "inductor"),
            compile_mode=options.get("compile_mode"),
            warmup=list(options.get("warmup") or []),
            memory=options.get("memory"),
        )

    def seq_len(self, default: int) -> int:
        """The prompt length: the entry's ``max_sequence_length``, else ``default`` (the
        pipeline's ``__call__`` default)."""
        return default if self.max_sequence_length is None else self.max_sequence_length

    def compiles_blocks(self, device: torch.device) -> bool:
        """Whether the denoiser's blocks compile on ``device`` (``compile``, or on CUDA
        when the entry does not say, unless its blocks stream: ``offload = "group"``)."""
        streamed = self.memory is not None and self.memory.offload == "group"
        default = "blocks" if device.type == "cuda" and not streamed else "off"
        return (self.compile or default) == "blocks"

    def compiler(
        self,
        observe: Callable[[str, float], None] | None = None,
        fell_back: Callable[[str], None] | None = None,
    ) -> BlockCompiler:
        """The block compiler of these settings; ``observe`` and ``fell_back`` record how
        long a shape compiled and why compiling failed (by default neither is)."""
        return BlockCompiler(
            backend=self.compile_backend,
            mode=self.compile_mode,
            observe=observe,
            fell_back=fell_back,
        )
