"""A model that cannot load is named with one line an operator can act on, and the worker
serves the others: the reasons (:mod:`workers.pipelines.load_failure`), the registry's
``load_each``, and when the workers' records make a model unavailable
(:class:`storage.worker_presence.Availability`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from models.catalog import FAMILY_SPECS, REFERENCE_VIDEO
from models.registry import BUILTIN_MODELS, CatalogError, ServedModel
from storage.worker_presence import Availability
from workers.pipelines.load_failure import LoadFailure, load_failure, missing_weights
from workers.pipelines.reference_video import ReferenceVideoPipeline
from workers.pipelines.registry import PipelineRegistry


def _entry(path: Path | str | None, name: str = "acme/wan", **fields: Any) -> ServedModel:
    spec = FAMILY_SPECS["diffusers.wan"].model_copy(update={"name": name})
    where = None if path is None else str(path)
    return ServedModel(name=name, adapter="diffusers.wan", path=where, spec=spec, **fields)


def test_a_path_that_does_not_exist_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "Wan2.1-T2V-1.3B-Diffusers"
    assert missing_weights(_entry(missing)) == LoadFailure(f"path {missing} does not exist")


def test_a_component_folder_the_index_lists_is_named(tmp_path: Path) -> None:
    (tmp_path / "vae").mkdir()
    index = {
        "_class_name": "WanPipeline",
        "vae": ["diffusers", "AutoencoderKLWan"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": [None, None],  # optional, left out: not missing
    }
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    failure = missing_weights(_entry(tmp_path))
    assert failure == LoadFailure(
        f"path {tmp_path}: no transformer/ folder, which its model_index.json lists"
    )
    (tmp_path / "transformer").mkdir()
    assert missing_weights(_entry(tmp_path)) is None  # the rest is the load's to find
    (tmp_path / "model_index.json").write_text("{not json")
    assert "model_index.json is not readable JSON" in str(missing_weights(_entry(tmp_path)))


def test_nothing_is_looked_for_without_a_checkpoint_path(tmp_path: Path) -> None:
    assert missing_weights(_entry(None)) is None
    assert missing_weights(_entry(tmp_path / "none", weights="random")) is None
    assert missing_weights(BUILTIN_MODELS["reference/video"]) is None


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        # diffusers' own words, as raised by WanPipeline.from_pretrained (0.42)
        (
            ValueError(
                'The provided pretrained_model_name_or_path "/w/wan" is neither a valid local '
                "path nor a valid repo id. Please check the parameter."
            ),
            "path /w/wan does not exist",
        ),
        (
            OSError("Error no file named model_index.json found in directory /w/wan."),
            "path /w/wan: no model_index.json",
        ),
        (
            OSError(
                "Error no file named diffusion_pytorch_model.bin found in directory /w/wan/vae."
            ),
            "path /w/wan: no vae/diffusion_pytorch_model.bin",
        ),
        # transformers' words for a tokenizer or text encoder folder
        (
            OSError("/w/wan/text_encoder does not appear to have a file named config.json."),
            "path /w/wan: no text_encoder/config.json",
        ),
        (
            FileNotFoundError(2, "No such file or directory", "/elsewhere/lora.safetensors"),
            "path /w/wan: no /elsewhere/lora.safetensors",
        ),
    ],
)
def test_what_diffusers_did_not_find_becomes_the_reason(error: Exception, reason: str) -> None:
    assert load_failure(_entry("/w/wan"), error) == LoadFailure(reason)


def test_a_missing_module_and_a_refused_entry_are_configuration() -> None:
    missing = ModuleNotFoundError("No module named 'diffusers'", name="diffusers")
    failure = load_failure(_entry("/w/wan"), missing)
    assert failure == LoadFailure("path /w/wan: the Python module 'diffusers' is not installed")
    refused = CatalogError("model 'acme/wan': weights = 'random' builds seeded random weights")
    assert load_failure(_entry("/w/wan"), refused) == LoadFailure(str(refused))


def test_any_other_error_is_named_by_its_class_only_and_may_pass() -> None:
    failure = load_failure(_entry("/w/wan"), RuntimeError("secret token abc123 in a URL"))
    assert not failure.config  # a restart may help: a job worker that loaded nothing exits 1
    assert failure.reason == (
        "path /w/wan: RuntimeError while loading (the worker's log has the traceback)"
    )

    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name
        pass

    oom = load_failure(_entry("/w/wan"), OutOfMemoryError("CUDA out of memory. Tried…"))
    assert oom == LoadFailure("path /w/wan: out of memory while loading", config=False)


class _Broken(ReferenceVideoPipeline):
    def load(self, device: str) -> None:
        raise RuntimeError("weights are corrupt")


def test_load_each_serves_what_loads_and_names_what_does_not(tmp_path: Path) -> None:
    broken = ServedModel(
        name="acme/broken",
        adapter=f"{__name__}:_Broken",
        spec=REFERENCE_VIDEO.model_copy(update={"name": "acme/broken"}),
    )
    models = {
        "reference/video": BUILTIN_MODELS["reference/video"],
        "acme/missing": _entry(tmp_path / "missing", name="acme/missing"),
        "acme/broken": broken,
    }
    registry = PipelineRegistry(models, "cpu")
    failed = registry.load_each()
    assert failed == {
        "acme/missing": LoadFailure(f"path {tmp_path / 'missing'} does not exist"),
        "acme/broken": LoadFailure(
            f"adapter {__name__}:_Broken: RuntimeError while loading "
            "(the worker's log has the traceback)",
            config=False,
        ),
    }
    assert list(registry.models) == ["reference/video"]  # served: only what loaded
    assert isinstance(registry.job("reference/video"), ReferenceVideoPipeline)
    with pytest.raises(ValueError, match="not served by this worker"):
        registry.get("acme/missing")


def test_a_model_is_unavailable_only_with_failures_and_no_live_worker() -> None:
    assert Availability(0).reason is None  # nothing known: its jobs wait for a worker
    assert Availability(1, ("path /a does not exist",)).reason is None  # one serves it
    reasons = ("path /b does not exist", "path /a does not exist", "path /b does not exist")
    assert Availability(0, reasons).reason == "path /a does not exist; path /b does not exist"
    many = tuple(f"path /{i} does not exist" for i in range(5))
    assert Availability(0, many).reason is not None
    assert Availability(0, many).reason.endswith("; and 2 more")  # type: ignore[union-attr]
