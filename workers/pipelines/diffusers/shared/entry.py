"""What every diffusers adapter is built from (the job adapters' ``common.DiffusersAdapter``
and Helios' world adapter, which as a ``WorldPipeline`` cannot share that base): a
registry entry's local ``path`` or an injected ``pipe``, its dtype and spec, the prompt
length, the compiled-blocks settings and warm-up shapes, and the random-weights mode."""

from __future__ import annotations

from typing import Any, Self

import torch

from models.catalog import FAMILY_SPECS, ModelSpec
from models.registry import CompileMode, ServedModel, WarmupShape
from workers.pipelines.blocks import BlockGate
from workers.pipelines.diffusers.shared.compiled import BlockCompiler
from workers.pipelines.diffusers.shared.loading import parse_dtype


class DiffusersEntry:
    """Mixed in before the interface: the constructor both kinds of diffusers adapter
    take, and ``build`` from a registry entry."""

    family: str = ""

    def __init__(
        self,
        path: str | None = None,
        *,
        dtype: str = "bfloat16",
        pipe: Any = None,
        spec: ModelSpec | None = None,
        max_sequence_length: int | None = None,
        compile: CompileMode | None = None,
        compile_backend: str = "inductor",
        compile_mode: str | None = None,
        warmup: list[WarmupShape] | None = None,
        random_weights: bool = False,
    ) -> None:
        if path is None and pipe is None and not random_weights:
            raise ValueError(f"{type(self).__name__} needs a local path or a pipe")
        self.path = path
        # A registry entry's ``weights = "random"`` (benchmarks only: the families'
        # ``*_random.py``).
        self.random_weights = random_weights
        self.dtype = parse_dtype(dtype)
        self.pipe: Any = pipe
        self.spec = spec if spec is not None else FAMILY_SPECS[self.family]
        # None: the pipeline's ``__call__`` default (Wan 512, LTX 128, CogVideoX 226,
        # Helios 512).
        self.max_sequence_length = max_sequence_length
        self.device = torch.device("cpu")
        # Cancel points between the denoiser's blocks (installed by ``load``).
        self.gate = BlockGate(self.device)
        # Compiled blocks (compiled.py): None = "blocks" on CUDA, "off" elsewhere.
        self.compile = compile
        self.warmup = list(warmup or [])
        self.compiler = BlockCompiler(
            backend=compile_backend,
            mode=compile_mode,
            observe=self._compiled,
            fell_back=self._compile_failed,
        )

    @classmethod
    def build(cls, model: ServedModel) -> Self:
        """``cls(path=…, dtype=…, spec=…)`` with the entry's compiled-blocks settings,
        random-weights mode and ``adapter_options``."""
        return cls(
            path=model.path,
            dtype=model.dtype,
            spec=model.spec,
            compile=model.compile,
            compile_backend=model.compile_backend,
            compile_mode=model.compile_mode,
            warmup=model.warmup,
            random_weights=model.weights == "random",
            **model.adapter_options,
        )

    def _compiled(self, when: str, seconds: float) -> None:
        """The blocks compiled for a shape in ``seconds`` (``when``: warm-up or prepare).
        By default not recorded."""

    def _compile_failed(self, reason: str) -> None:
        """Compiling failed for ``reason``: the blocks run eager. By default not
        recorded."""
