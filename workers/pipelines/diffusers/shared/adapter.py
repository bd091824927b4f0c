"""The base of every diffusers job adapter (``DiffusersAdapter``): what the families share
between the executor's calls and their own ``__call__`` mirror.

A family's adapter subclasses it directly and writes ``_prepare`` (what ``__call__`` does
before its denoising loop), ``_step`` (one loop iteration) and ``decode``; this class
loads the pipeline (from the registry entry's settings, entry.py), installs per-request
LoRA, the cancel gates and the compiled blocks, and wraps each job: references refused
where the entry serves none, its quality tier and LoRA adapter in place for the job and
out again at ``end``, its blocks compiled for its shape before the first step. The
helpers a family's steps call (RNG, scheduler copy, guidance, VAE decode) are common.py's.
"""

from __future__ import annotations

import abc
import copy
import logging
from typing import Any, ClassVar, Generic, Self, TypeVar, Unpack, cast, get_args

import torch

from models.catalog import FAMILY_SPECS, Workflow
from models.errors import InvalidJobInput, InvalidLora
from models.memory_plan import MemoryReport
from models.registry import ServedModel, WarmupShape
from workers.pipelines.base import GenerationRequest, LoraSlot, Pipeline, StepState
from workers.pipelines.blocks import BlockGate
from workers.pipelines.diffusers.shared import attention, cache_tiers
from workers.pipelines.diffusers.shared.common import DiffusersState, clone_generator
from workers.pipelines.diffusers.shared.compiled import graphs_made
from workers.pipelines.diffusers.shared.entry import DiffusersEntry, EntryOptions, entry_options
from workers.pipelines.diffusers.shared.keyframes import takes_references, warm_up_inputs
from workers.pipelines.diffusers.shared.loading import (
    DTYPE_KWARG,
    RandomWeights,
    install_checkpoints,
    own_weights,
)
from workers.pipelines.diffusers.shared.memory import MemoryLayout
from workers.pipelines.parallel import Parallel

log = logging.getLogger(__name__)

S = TypeVar("S", bound=DiffusersState)


class DiffusersAdapter(Pipeline, Generic[S]):
    """Loading and the :class:`Pipeline` calls, run without autograd on the loaded pipe and
    the adapter's own state class (the type argument: ``class LTXAdapter(
    DiffusersAdapter[LTXState])``)."""

    family: str = ""
    # The diffusers pipeline class loaded from ``path`` (``_pipeline_for`` may choose by
    # the entry's workflows).
    pipeline_class: Any = None
    state_class: type[S]
    # The workflows an entry serves when its spec names none (the video families: t2v).
    default_workflows: ClassVar[tuple[Workflow, ...]] = ()
    # Submodules of a component that the pipeline calls directly, not through the
    # component's ``forward`` (component -> child names, at any depth): ``offload =
    # "group"`` hooks each on its own (offload.py), or their weights would stay on the host.
    offload_entry_points: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            args = get_args(base)
            if args and isinstance(args[0], type) and issubclass(args[0], DiffusersState):
                cls.state_class = cast(Any, args[0])

    def __init__(self, path: str | None = None, **options: Unpack[EntryOptions]) -> None:
        """``path``: the pipeline's local directory; ``options`` (entry.py): the registry
        entry's settings, or an injected ``pipe``."""
        self.entry = DiffusersEntry.of(type(self).__name__, path, options)
        spec = options.get("spec")
        self.spec = spec if spec is not None else FAMILY_SPECS[self.family]
        self.pipe: Any = options.get("pipe")
        self.device = torch.device("cpu")
        # FP8 weights and offloading, as the entry plans them (memory.py; ``load``).
        self.memory = MemoryLayout(
            self.spec.name, self.entry.memory, type(self).offload_entry_points
        )
        # Cancel points between the denoiser's blocks (installed by ``load``).
        self.gate = BlockGate(self.device)
        self.compiler = self.entry.compiler(observe=self._compiled, fell_back=self._compile_failed)
        # The workflows the entry serves, the pipeline class they load, and whether a job
        # may send files (keyframes, a source clip); the others are refused in ``prepare``.
        self.workflows: list[Workflow] = list(self.spec.workflows or self.default_workflows)
        self.pipeline_class = self._pipeline_for(self.workflows)
        self.takes_references = takes_references(self.workflows)
        # This process's share of a step (workers/pipelines/parallel.py): all of it, unless
        # a worker group's rank.
        self.parallel = Parallel()
        # Graphs dynamo had made when the running job's prepare ended (None: no job).
        self._graphs_at_denoise: int | None = None
        self.last_recompiles = 0  # graphs made while the last job denoised
        # Per-request LoRA (workers/pipelines/diffusers/shared/lora.py), for models that
        # list ``lora``: set by ``use_lora`` before ``load``; None refuses a job's adapter.
        self.lora: LoraSlot | None = None

    @classmethod
    def build(cls, model: ServedModel) -> Self:
        """The adapter of a registry entry: its path, dtype and spec, compiled-blocks
        settings, random-weights mode and ``adapter_options`` (entry.py)."""
        return cls(**entry_options(model))

    def _pipeline_for(self, workflows: list[Workflow]) -> Any:
        """The diffusers pipeline class an entry serving ``workflows`` loads: the family's
        ``pipeline_class`` unless the family chooses by workflow."""
        return self.pipeline_class

    def use_lora(self, cache: LoraSlot) -> None:
        """Serve per-request LoRA through ``cache`` (its slot goes into the pipe at
        ``load``, before anything compiles the transformer's blocks; called after ``load``,
        the first LoRA job installs it)."""
        self.lora = cache

    def load(self, device: str) -> None:
        """``from_pretrained(path, dtype=…, local_files_only=True)`` (or the injected pipe,
        whose dtype is left as it is), checked to be the family's pipeline class, placed
        on ``device`` as the entry's memory plan says (memory.py: its device refused
        before anything loads; without a plan, moved there whole)."""
        self.memory.check(device, self.pipeline_class)
        attention.refuse_off_cuda(self.spec, device)  # attention = "cudnn" (attention.py)
        if self.pipe is None and self.entry.random_weights:
            if not isinstance(self, RandomWeights):
                raise ValueError(
                    f"{self.spec.name}: {self.family} has no random-weights loading mode"
                )
            self.pipe = self.random_pipeline(device)
        elif self.pipe is None:
            self.pipe = self._from_pretrained()
            if torch.device(device).type == "cpu":
                own_weights(self.pipe)
        if not isinstance(self.pipe, self.pipeline_class):
            raise TypeError(
                f"{type(self).__name__} drives {self.pipeline_class.__name__}, "
                f"got {type(self.pipe).__name__}"
            )
        if self.memory.quantizes:  # FP8 weights are made of the changed ones
            self._change_weights(self.pipe)
        self.memory.place(self.pipe, device)
        self.device = torch.device(device)
        if not self.memory.quantizes:
            self._change_weights(self.pipe)
        attention.install(self.pipe, self.spec)
        if self.lora is not None:
            self.lora.install(self.pipe)
        install_checkpoints(self.pipe)
        self.gate.device = self.device
        self.gate.install(self.pipe)
        offered = set(cache_tiers.family_tiers(self.family))
        unknown = sorted(set(self.spec.quality_tiers) - offered - {"lossless"})
        if unknown:
            raise ValueError(
                f"{self.spec.name}: {self.family} has no quality tier {', '.join(unknown)}"
            )
        if self.entry.compiles_blocks(self.device):
            self.compiler.install(self.pipe)

    def _change_weights(self, pipe: Any) -> None:
        """Where an adapter changes the weights themselves (H3 fuses its deployment's
        LoRA), before the LoRA slot, the gates and the compiled blocks go in: on the
        device once placed, or, where the entry makes FP8 weights, before that, in the
        loaded dtype, so that the FP8 weights are the changed ones. By default nothing."""
        return None

    def memory_report(self) -> MemoryReport | None:
        """What ``load`` did with the entry's memory plan: the FP8 layers and the bytes
        they save, the offload mode (None without a plan)."""
        return self.memory.report

    def _from_pretrained(self) -> Any:
        """The pipeline of ``path`` (a modular pipeline's adapter loads its own way)."""
        return self.pipeline_class.from_pretrained(
            self.entry.path, local_files_only=True, **{DTYPE_KWARG: self.entry.dtype}
        )

    def warm_up(self) -> None:
        """Compile the blocks for each of the registry's ``warmup`` shapes (at worker
        start, before it takes jobs): a short request of that shape is prepared and one
        step of it run on a copy of its state."""
        if not self.compiler.enabled:
            return
        for shape in self.entry.warmup:
            request = self._warm_up_request(shape)
            with torch.no_grad():
                state = self._prepare(self._loaded(), request)
                self._compile_for(state, "warmup")
            del state

    def _warm_up_request(self, shape: WarmupShape) -> GenerationRequest:
        """The short request a warm-up prepares for ``shape``: of the entry's first
        workflow, with grey keyframes for an image one and a grey clip for v2v (an adapter
        whose model needs more than that adds it)."""
        request = GenerationRequest.video(
            prompt="warm-up",
            width=shape.width,
            height=shape.height,
            num_frames=shape.num_frames,
            fps=float(self.spec.default_fps),
            num_inference_steps=2,
            seed=0,
        )
        return warm_up_inputs(request, self.workflows[0]) if self.workflows else request

    def _compile_for(self, state: S, why: str) -> None:
        """Compile the blocks for ``state``'s input shapes unless done: one step of a copy
        of the state (its own scheduler and RNG, so the job's are untouched)."""
        name = type(state).__name__ + state.compile_variant
        key = (name, tuple(state.latents.shape), state.do_cfg)
        pipe = self._loaded()

        def run() -> None:
            trial = copy.copy(state)
            trial.scheduler = copy.deepcopy(state.scheduler)
            trial.generator = clone_generator(state.generator)
            self._step(pipe, trial)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        self.compiler.ensure(key, run, why)

    def _compiled(self, when: str, seconds: float) -> None:
        from workers.common import metrics

        metrics.COMPILE_SECONDS.labels(self.spec.name, when).observe(seconds)

    def _compile_failed(self, reason: str) -> None:
        from workers.common import metrics

        metrics.COMPILE_FALLBACKS.labels(self.spec.name).inc()

    def _loaded(self) -> Any:
        if self.pipe is None:
            raise RuntimeError(f"{type(self).__name__}.load() was not called")
        return self.pipe

    def _state(self, state: StepState) -> S:
        if not isinstance(state, self.state_class):
            name = self.state_class.__name__
            raise TypeError(f"expected a {name}, got {type(state).__name__}")
        return state

    @torch.no_grad()
    def prepare(self, request: GenerationRequest) -> S:
        """Everything ``__call__`` does before its loop, then what the job runs with: the
        blocks compiled for its shape (once per shape), its cache tier installed (removed
        again by ``end``). An adapter that does not ``takes_references`` refuses an input
        reference."""
        has_references = request.reference_image is not None or request.last_image is not None
        if not self.takes_references and (has_references or request.references):
            raise InvalidJobInput(f"{self.spec.name} does not take an input_reference")
        pipe = self._loaded()
        cache_tiers.remove(pipe)  # nothing of an earlier job's tier, whatever happened
        if not self.spec.offers(request.quality):
            raise InvalidJobInput(f"{self.spec.name} has no quality tier {request.quality!r}")
        if self.lora is not None:
            self.lora.activate(pipe, request.lora)  # until end(); None: the base model
        elif request.lora is not None:
            raise InvalidLora(f"{self.spec.name} is not served with LoRA on this worker")
        state = self._prepare(pipe, request)
        self._compile_for(state, "prepare")
        cache_tiers.install(
            pipe, cache_tiers.cache_config(self.family, request.quality, state.num_steps)
        )
        self._graphs_at_denoise = graphs_made() if self.compiler.enabled else None
        return state

    def end(self) -> None:
        """After every job (the executor's ``finally``): the cache tier's hooks and their
        state removed, the job's LoRA adapter (if any) out of the pipe, and what the job
        compiled while it denoised counted."""
        if self.pipe is not None:
            cache_tiers.remove(self.pipe)
            if self.lora is not None:
                self.lora.release(self.pipe)
        start, self._graphs_at_denoise = self._graphs_at_denoise, None
        self.last_recompiles = 0 if start is None else graphs_made() - start
        if self.last_recompiles > 0:
            from workers.common import metrics

            made = self.last_recompiles
            log.warning("%s: %d graph(s) compiled while a job denoised", self.spec.name, made)
            metrics.RECOMPILES.labels(self.spec.name).inc(self.last_recompiles)

    @torch.no_grad()
    def step(self, state: StepState) -> None:
        """One iteration of ``__call__``'s denoising loop."""
        s = self._state(state)
        self.gate.begin_step()
        self._step(self._loaded(), s)
        s.step_index += 1

    @abc.abstractmethod
    def _prepare(self, pipe: Any, request: GenerationRequest) -> S: ...

    @abc.abstractmethod
    def _step(self, pipe: Any, s: S) -> None: ...
