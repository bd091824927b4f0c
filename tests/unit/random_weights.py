"""The registry side of the benchmark-only loading mode (``weights = "random"``) that
every such test module shares: its one entry at test sizes, and the refusal a worker
gives it unless ``OMNIQ_WORKER__RANDOM_WEIGHTS`` allows it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from models.registry import CatalogError, parse_registry
from storage.settings import Settings
from workers.pipelines.registry import PipelineRegistry


def random_registry(toml: str, options: dict[str, Any], **kw: Any) -> PipelineRegistry:
    """A worker's registry of the one entry in ``toml``, with these adapter options."""
    (model,) = parse_registry(toml).values()
    model = model.model_copy(update={"adapter_options": options})
    return PipelineRegistry({model.name: model}, "cpu", **kw)


def assert_refused_by_default(registry: PipelineRegistry, load: Callable[[], object]) -> None:
    """The worker setting is off by default, ``load()`` says which setting allows it,
    and nothing was loaded."""
    assert Settings().worker.random_weights is False
    with pytest.raises(CatalogError, match="OMNIQ_WORKER__RANDOM_WEIGHTS"):
        load()
    assert registry._loaded == {}
