"""Served model name → pipeline adapter, loaded once per worker process."""

from __future__ import annotations

import threading
from collections.abc import Callable

from workers.pipelines.base import Pipeline


def _reference_video() -> Pipeline:
    from workers.pipelines.reference_video import ReferenceVideoPipeline

    return ReferenceVideoPipeline()


FACTORIES: dict[str, Callable[[], Pipeline]] = {"reference/video": _reference_video}


class PipelineRegistry:
    """Builds and loads each served pipeline on first use, then shares it across jobs."""

    def __init__(self, models: list[str], device: str) -> None:
        unknown = [m for m in models if m not in FACTORIES]
        if unknown:
            raise ValueError(f"no pipeline adapter for {', '.join(unknown)}")
        self.models = list(models)
        self.device = device
        self._loaded: dict[str, Pipeline] = {}
        self._lock = threading.Lock()

    def get(self, model: str) -> Pipeline:
        with self._lock:
            pipe = self._loaded.get(model)
            if pipe is None:
                if model not in self.models:
                    raise ValueError(f"model {model!r} is not served by this worker")
                pipe = FACTORIES[model]()
                pipe.load(self.device)
                self._loaded[model] = pipe
            return pipe

    def load_all(self) -> None:
        for model in self.models:
            self.get(model)
