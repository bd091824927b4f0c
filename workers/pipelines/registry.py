"""Served model → pipeline adapter, built and loaded once per worker process.

Typed by kind: a model's spec says which interface of ``workers/pipelines/base.py`` runs
it (``ModelSpec.kind``), :func:`build_adapter` refuses an adapter class that does not
implement that interface, and each caller asks for the kind it drives: the executor for
a :class:`Pipeline` (:meth:`PipelineRegistry.job`), the session runners for a
:class:`WorldPipeline` (:meth:`~PipelineRegistry.world`) or a :class:`VoicePipeline`
(:meth:`~PipelineRegistry.voice`).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from models.catalog import PipelineKind
from models.errors import InvalidJobInput
from models.memory_plan import MemoryReport, refused_combination
from models.registry import CatalogError, ServedModel
from storage.settings import LoraSettings
from workers.pipelines.base import (
    AnyPipeline,
    Pipeline,
    SupportsLoRA,
    SupportsMemoryPlan,
    SupportsWarmUp,
    VoicePipeline,
    WorldPipeline,
)
from workers.pipelines.load_failure import LoadFailure, load_failure, missing_weights

log = logging.getLogger(__name__)

_DIFFUSERS = "workers.pipelines.diffusers"
# Adapter ids of the registry file → "module:Class".
ADAPTERS: dict[str, str] = {
    "reference.video": "workers.pipelines.reference_video:ReferenceVideoPipeline",
    "reference.world": "workers.pipelines.reference_world:ReferenceWorldPipeline",
    "reference.voice": "workers.pipelines.reference_voice:ReferenceVoicePipeline",
    "reference.audio": "workers.pipelines.reference_audio:ReferenceAudioPipeline",
    "reference.speech": "workers.pipelines.reference_speech:ReferenceSpeechPipeline",
    "diffusers.wan": f"{_DIFFUSERS}.wan.adapter:WanAdapter",
    "diffusers.ltx": f"{_DIFFUSERS}.ltx.adapter:LTXAdapter",
    "diffusers.cogvideox": f"{_DIFFUSERS}.cogvideox.adapter:CogVideoXAdapter",
    "diffusers.ltx2": f"{_DIFFUSERS}.ltx2.adapter:LTX2Adapter",
    "diffusers.stable_audio": f"{_DIFFUSERS}.stable_audio.adapter:StableAudioAdapter",
    "diffusers.longcat_audio": f"{_DIFFUSERS}.longcat_audio.adapter:LongCatAudioAdapter",
    "diffusers.minimax_h3": f"{_DIFFUSERS}.minimax_h3.adapter:MiniMaxH3Adapter",
    "diffusers.helios": f"{_DIFFUSERS}.helios.adapter:HeliosWorldAdapter",
}

# The interface each kind of model is run through.
INTERFACES: dict[PipelineKind, type[Any]] = {
    "job": Pipeline,
    "world": WorldPipeline,
    "voice": VoicePipeline,
}


def adapter_class(model: ServedModel) -> type[Any]:
    """The adapter class a registry entry names, checked against its kind's interface."""
    target = ADAPTERS.get(model.adapter, model.adapter)
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    interface = INTERFACES[model.spec.kind]
    if not (isinstance(cls, type) and issubclass(cls, interface)):
        raise CatalogError(
            f"model {model.name!r} is a {model.spec.kind} model, so its adapter "
            f"{model.adapter!r} must subclass {interface.__module__}.{interface.__name__}"
        )
    return cls


def build_adapter(model: ServedModel) -> AnyPipeline:
    """Instantiate the adapter a registry entry names (not loaded yet), through its
    class's ``build`` (:class:`workers.pipelines.base.Adapter`)."""
    pipe: AnyPipeline = adapter_class(model).build(model)
    pipe.spec = model.spec
    return pipe


def check_plan(model: ServedModel) -> None:
    """Refuse a memory plan that does not combine with the rest of ``model``'s entry
    (:func:`models.memory_plan.refused_combination`: both features named); a benchmark
    asks it before it starts a stack (``benchmarks/gpu/plans.py``)."""
    plan = model.spec.memory
    if plan is None:
        return
    why = refused_combination(
        plan,
        lora=model.spec.supports_lora,
        streaming=model.spec.streaming,
        compile=model.compile,
        devices=model.devices,
    )
    if why is not None:
        raise CatalogError(f"model {model.name!r}: {why}")


class PipelineRegistry:
    """Builds and loads each served pipeline on first use, then shares it across jobs.

    ``lora`` (an ``OMNIQ_LORA`` settings group) gives every model that lists ``lora`` in
    its parameters an adapter cache of its own before it loads (its adapter must be
    :class:`~workers.pipelines.base.SupportsLoRA`); ``fetch(uri)`` reads ``s3://``
    adapters. Without it such a model's LoRA jobs fail with ``invalid_lora``.
    ``random_weights`` (OMNIQ_WORKER__RANDOM_WEIGHTS) lets entries with ``weights =
    "random"`` load (benchmarks only); off, they are refused. A model with a memory plan
    (FP8 weights, offloading: ``models/memory_plan.py``) is refused at load where the plan
    does not combine with the rest of its entry, before its adapter is built; the reports
    of those that load are :attr:`memory`, by name."""

    def __init__(
        self,
        models: dict[str, ServedModel],
        device: str,
        *,
        lora: LoraSettings | None = None,
        fetch: Callable[[str], bytes] | None = None,
        random_weights: bool = False,
    ) -> None:
        self.models = dict(models)
        self.random_weights = random_weights
        self.device = device
        self.lora = lora
        self.fetch = fetch
        self._loaded: dict[str, AnyPipeline] = {}
        self._lock = threading.Lock()
        # What each loaded model's adapter did with its memory plan (FP8, offload).
        self.memory: dict[str, MemoryReport] = {}

    def get(self, name: str) -> AnyPipeline:
        """The loaded adapter of a served model, whatever its kind."""
        with self._lock:
            pipe = self._loaded.get(name)
            if pipe is None:
                model = self.models.get(name)
                if model is None:
                    raise ValueError(f"model {name!r} is not served by this worker")
                if model.weights == "random" and not self.random_weights:
                    raise CatalogError(
                        f"model {name!r}: weights = 'random' builds seeded random weights "
                        "(benchmarks only); this worker refuses it unless "
                        "OMNIQ_WORKER__RANDOM_WEIGHTS=true"
                    )
                check_plan(model)
                pipe = build_adapter(model)
                if model.spec.memory is not None and not isinstance(pipe, SupportsMemoryPlan):
                    raise CatalogError(
                        f"model {name!r}: {model.spec.memory.describe()}: its adapter "
                        f"{model.adapter!r} applies no memory plan (the diffusers adapters do)"
                    )
                if self.lora is not None and model.spec.supports_lora:
                    self._use_lora(pipe)
                pipe.load(model.device or self.device)
                if isinstance(pipe, SupportsWarmUp):
                    pipe.warm_up()  # compiled blocks: the registry's shapes
                self._loaded[name] = pipe
                if isinstance(pipe, SupportsMemoryPlan) and (report := pipe.memory_report()):
                    self.memory[name] = report
            return pipe

    def _use_lora(self, pipe: AnyPipeline) -> None:
        assert self.lora is not None
        if not isinstance(pipe, SupportsLoRA):
            raise CatalogError(f"model {pipe.spec.name!r} lists lora, but its adapter takes none")
        from workers.pipelines.diffusers.shared.lora import LoraCache

        s = self.lora
        pipe.use_lora(
            LoraCache(
                max_adapters=s.cache_adapters,
                max_bytes=s.cache_bytes,
                max_rank=s.max_rank,
                fetch=self.fetch,
            )
        )

    def job(self, name: str) -> Pipeline:
        """The job pipeline of ``name`` (``/v1/videos``, ``/v1/audio/generations``)."""
        pipe = self.get(name)
        if not isinstance(pipe, Pipeline):
            raise InvalidJobInput(f"model {name!r} is not a job model", param="model")
        return pipe

    def world(self, name: str) -> WorldPipeline[Any]:
        """The world pipeline of ``name`` (world sessions)."""
        pipe = self.get(name)
        if not isinstance(pipe, WorldPipeline):
            raise InvalidJobInput(f"model {name!r} is not a world model", param="model")
        return pipe

    def voice(self, name: str) -> VoicePipeline[Any]:
        """The voice pipeline of ``name`` (realtime voice sessions)."""
        pipe = self.get(name)
        if not isinstance(pipe, VoicePipeline):
            raise InvalidJobInput(f"model {name!r} is not a voice model", param="model")
        return pipe

    def replace(self, name: str, pipe: AnyPipeline) -> None:
        """Serve ``name`` through ``pipe`` from now on (a worker group's rank 0 wraps its
        loaded adapters)."""
        with self._lock:
            if name not in self.models:
                raise ValueError(f"model {name!r} is not served by this worker")
            self._loaded[name] = pipe

    def load_all(self) -> None:
        for name in self.models:
            self.get(name)

    def load_each(self) -> dict[str, LoadFailure]:
        """Load every model on its own. One that cannot load leaves :attr:`models` (this
        worker does not serve it) and its :class:`LoadFailure` is returned by name, while
        the others load; missing weights are found before the adapter is imported."""
        failed: dict[str, LoadFailure] = {}
        for name, model in list(self.models.items()):
            failure = missing_weights(model)
            if failure is None:
                try:
                    self.get(name)
                except Exception as exc:
                    failure = load_failure(model, exc)
                    log.error("model %r cannot load: %s", name, failure.reason, exc_info=True)
            else:
                log.error("model %r cannot load: %s", name, failure.reason)
            if failure is not None:
                failed[name] = failure
                with self._lock:
                    del self.models[name]
        return failed
