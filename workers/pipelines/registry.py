"""Served model → pipeline adapter, built and loaded once per worker process."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from models.catalog import ServedModel
from workers.pipelines.base import Pipeline

# Adapter ids of the registry file → "module:Class".
ADAPTERS: dict[str, str] = {
    "reference.video": "workers.pipelines.reference_video:ReferenceVideoPipeline",
    "reference.world": "workers.pipelines.reference_world:ReferenceWorldPipeline",
    "reference.voice": "workers.pipelines.reference_voice:ReferenceVoicePipeline",
    "reference.audio": "workers.pipelines.reference_audio:ReferenceAudioPipeline",
    "diffusers.wan": "workers.pipelines.diffusers.wan:WanAdapter",
    "diffusers.ltx": "workers.pipelines.diffusers.ltx:LTXAdapter",
    "diffusers.cogvideox": "workers.pipelines.diffusers.cogvideox:CogVideoXAdapter",
    "diffusers.ltx2": "workers.pipelines.diffusers.ltx2:LTX2Adapter",
    "diffusers.stable_audio": "workers.pipelines.diffusers.stable_audio:StableAudioAdapter",
}


def build_adapter(model: ServedModel) -> Pipeline:
    """Instantiate the adapter a registry entry names (not loaded yet)."""
    target = ADAPTERS.get(model.adapter, model.adapter)
    module_name, _, class_name = target.partition(":")
    cls: Any = getattr(importlib.import_module(module_name), class_name)
    if model.adapter.startswith("reference."):
        pipe: Pipeline = cls(**model.adapter_options)
    else:
        pipe = cls(path=model.path, dtype=model.dtype, spec=model.spec, **model.adapter_options)
    pipe.spec = model.spec
    return pipe


class PipelineRegistry:
    """Builds and loads each served pipeline on first use, then shares it across jobs."""

    def __init__(self, models: dict[str, ServedModel], device: str) -> None:
        self.models = dict(models)
        self.device = device
        self._loaded: dict[str, Pipeline] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Pipeline:
        with self._lock:
            pipe = self._loaded.get(name)
            if pipe is None:
                model = self.models.get(name)
                if model is None:
                    raise ValueError(f"model {name!r} is not served by this worker")
                pipe = build_adapter(model)
                pipe.load(model.device or self.device)
                self._loaded[name] = pipe
            return pipe

    def load_all(self) -> None:
        for name in self.models:
            self.get(name)
