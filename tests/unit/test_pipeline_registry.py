"""The typed pipeline registry and the seams around the adapters.

A model's kind follows from its spec; the registry refuses an adapter class that does not
implement that kind's interface and hands each caller only the kind it asks for; the
runners and the reference pipelines import nothing private, and nothing from a reference
pipeline.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from models.catalog import (
    REFERENCE_AUDIO,
    REFERENCE_VIDEO,
    REFERENCE_VOICE,
    REFERENCE_WORLD,
    ModelSpec,
)
from models.registry import BUILTIN_MODELS, CatalogError, ServedModel
from workers.pipelines.base import Pipeline, VoicePipeline, WorldPipeline
from workers.pipelines.registry import PipelineRegistry, build_adapter

ROOT = Path(__file__).resolve().parents[2]


def test_kind_follows_from_the_spec() -> None:
    assert REFERENCE_VIDEO.kind == "job"
    assert REFERENCE_AUDIO.kind == "job"
    assert REFERENCE_WORLD.kind == "world"
    assert REFERENCE_VOICE.kind == "voice"
    assert ModelSpec(name="m", modality="audio", streaming=True).kind == "voice"
    assert ModelSpec(name="m", streaming=True).kind == "world"


def test_each_builtin_adapter_implements_its_kind() -> None:
    interface = {"job": Pipeline, "world": WorldPipeline, "voice": VoicePipeline}
    for model in BUILTIN_MODELS.values():
        assert isinstance(build_adapter(model), interface[model.spec.kind]), model.name


@pytest.mark.parametrize(
    ("spec", "adapter", "interface"),
    [
        # A job pipeline served as a streaming world model…
        (REFERENCE_WORLD, "workers.pipelines.reference_video:ReferenceVideoPipeline", "World"),
        # …a world model served as a voice model, and a voice model served for jobs.
        (REFERENCE_VOICE, "workers.pipelines.reference_world:ReferenceWorldPipeline", "Voice"),
        (REFERENCE_VIDEO, "workers.pipelines.reference_voice:ReferenceVoicePipeline", ""),
    ],
)
def test_an_adapter_of_the_wrong_interface_is_refused(
    spec: ModelSpec, adapter: str, interface: str
) -> None:
    model = ServedModel(
        name="acme/x", adapter=adapter, spec=spec.model_copy(update={"name": "acme/x"})
    )
    with pytest.raises(
        CatalogError, match=rf"'acme/x' is a {spec.kind} model.*{interface}Pipeline"
    ):
        build_adapter(model)


def test_each_caller_gets_only_its_kind() -> None:
    registry = PipelineRegistry(dict(BUILTIN_MODELS), "cpu")
    assert isinstance(registry.job("reference/video"), Pipeline)
    assert isinstance(registry.world("reference/world"), WorldPipeline)
    assert isinstance(registry.voice("reference/voice"), VoicePipeline)
    with pytest.raises(ValueError, match="'reference/world' is not a voice model"):
        registry.voice("reference/world")
    with pytest.raises(ValueError, match="'reference/voice' is not a world model"):
        registry.world("reference/voice")
    with pytest.raises(ValueError, match="'reference/world' is not a job model"):
        registry.job("reference/world")
    with pytest.raises(ValueError, match="'acme/none' is not served"):
        registry.world("acme/none")


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from module import name`` in ``path``."""
    tree = ast.parse(path.read_text())
    return [
        (node.module or "", alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ] + [
        (alias.name, "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]


def test_no_module_imports_a_reference_pipeline_or_a_private_name() -> None:
    """A new model is one adapter against ``base.py``: the runners, the executor and the
    other adapters need nothing from a reference pipeline, and no module reaches into
    another's private helpers."""
    offenders = []
    for path in sorted((ROOT / "workers").rglob("*.py")):
        for module, name in _imports(path):
            if module.startswith("workers.pipelines.reference_") or (
                module.startswith(("workers", "models", "storage")) and name.startswith("_")
            ):
                offenders.append(f"{path.relative_to(ROOT)}: {module} {name}".strip())
    assert offenders == []


def test_pipeline_modules_stay_small() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for p in (ROOT / "workers" / "pipelines").rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 600} == {}
