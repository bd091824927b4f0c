"""The served-model registry file and how settings resolve served models."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.registry import CatalogError, parse_registry, served_models
from storage.settings import Settings

REGISTRY = """
[[model]]
name = "Wan-AI/Wan2.1-T2V-1.3B"
adapter = "diffusers.wan"
path = "/weights/wan"
dtype = "bfloat16"
device = "cuda:1"
[model.spec]
max_width = 1280
default_steps = 30

[[model]]
name = "my/custom"
adapter = "mypkg.adapters:Custom"
"""


def test_registry_entries_start_from_their_family_spec() -> None:
    reg = parse_registry(REGISTRY)
    wan = reg["Wan-AI/Wan2.1-T2V-1.3B"]
    assert (wan.adapter, wan.path, wan.dtype, wan.device) == (
        "diffusers.wan",
        "/weights/wan",
        "bfloat16",
        "cuda:1",
    )
    assert wan.spec.name == "Wan-AI/Wan2.1-T2V-1.3B"
    assert (wan.spec.max_width, wan.spec.default_steps) == (1280, 30)
    assert (wan.spec.frame_multiple, wan.spec.frame_offset, wan.spec.size_multiple) == (4, 1, 16)
    assert wan.spec.snap_frames(80) == 81
    assert reg["my/custom"].spec.name == "my/custom"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[model]]\nname = 'a'\n", r"model\[0\] needs 'adapter'$"),
        ("[[model]]\npath = '/w'\n", r"model\[0\] needs 'name' and 'adapter'$"),
        ("[[model]]\nname = 'a'\nadapter = 'nope'\n", "unknown adapter 'nope'"),
        (
            "[[model]]\nname='a'\nadapter='diffusers.wan'\n[model.spec]\nmax_width='wide'\n",
            r"model\[0\] \(a\): max_width: Input should be a valid integer",
        ),
        (
            "[[model]]\nname='a'\nadapter='diffusers.wan'\n[[model]]\nname='a'\nadapter='diffusers.ltx'\n",
            r"model\[1\]: duplicate model name 'a'",
        ),
        (
            "not = [toml",
            r"^model registry: the model registry must be a TOML file, and this one is not "
            r"valid TOML \(.+ \(at line 1, column 8\)\): write a \[\[model\]\] table",
        ),
    ],
)
def test_bad_registry_files_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        parse_registry(text)


def test_served_models_defaults() -> None:
    builtin = list(served_models(None, {}))
    assert builtin[:2] == ["reference/video", "reference/world"]  # video's default first
    assert "reference/audio" in builtin
    reg = parse_registry(REGISTRY)
    assert list(served_models(None, reg)) == list(reg)
    assert list(served_models(["reference/video", "my/custom"], reg)) == [
        "reference/video",
        "my/custom",
    ]
    with pytest.raises(CatalogError, match="sora-2"):
        served_models(["sora-2"], reg)


def test_settings_read_the_registry_file(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(REGISTRY)
    settings = Settings(model_registry=path, models=["Wan-AI/Wan2.1-T2V-1.3B"])
    assert list(settings.served_models()) == ["Wan-AI/Wan2.1-T2V-1.3B"]
    with pytest.raises(ValueError, match="cannot read"):
        Settings(model_registry=tmp_path / "missing.toml").served_models()


W = "[[model]]\nname = 'w'\nadapter = 'diffusers.wan'\npath = '/w'\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("devices = 2\n", "needs a parallel strategy"),
        ("parallel = 'cfg'\n", "needs devices > 1"),
        ("devices = 4\nparallel = 'cfg'\n", "exactly 2 devices"),
        (
            "devices = 2\nparallel = 'tensor'\n",
            "parallel: Input should be 'cfg', 'ulysses' or 'ring'",
        ),
        ("devices = 2\nparallel = 'ulysses'\ndevice = 'cuda:1'\n", "worker group"),
        ("devices = 0\n", "devices: Input should be greater than or equal to 1"),
    ],
)
def test_group_entries_are_checked(extra: str, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        parse_registry(W + extra)


def test_workers_serve_only_the_models_of_their_group_size(tmp_path: Path) -> None:
    from workers.runtime.context import worker_models

    registry = tmp_path / "models.toml"
    registry.write_text(W + "\n" + W.replace("'w'", "'w2'") + "devices = 2\nparallel = 'cfg'\n")
    one = Settings(model_registry=registry)  # type: ignore[call-arg]
    assert list(worker_models(one)) == ["w"]
    group = Settings(model_registry=registry, worker={"devices": ["cuda:0", "cuda:1"]})  # type: ignore[call-arg]
    assert list(worker_models(group)) == ["w2"]
    named = Settings(model_registry=registry, worker={"models": ["w2"]})  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"w2 \(2\)"):
        worker_models(named)


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ('comple = "off"\n', "model[0] (x): unknown key 'comple' (did you mean 'compile'?)"),
        ("[model.spec]\nmax_widht = 832\n",
         "model[0] (x) spec: unknown key 'max_widht' (did you mean 'max_width'?)"),
        ("flavour = 1\n", "model[0] (x): unknown key 'flavour'"),
    ],
)  # fmt: skip
def test_an_unknown_registry_key_is_refused_naming_it_the_file_and_the_closest(
    entry: str, error: str
) -> None:
    """A misspelt key was silently ignored, and the setting it meant never applied."""
    text = f'[[model]]\nname = "x"\nadapter = "diffusers.wan"\npath = "/w"\n{entry}'
    with pytest.raises(CatalogError) as refused:
        parse_registry(text, "/etc/omniqueue/models.toml")
    assert str(refused.value) == f"/etc/omniqueue/models.toml: {error}"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            '[[model]]\nname = "x"\nadaptor = "diffusers.wan"\n',
            "model[0] (x): unknown key 'adaptor' (did you mean 'adapter'?)",
        ),
        (
            '[[model]]\nnme = "x"\nadapter = "diffusers.wan"\n',
            "model[0]: unknown key 'nme' (did you mean 'name'?)",
        ),
        (
            '[[model]]\nname = "x"\nadapter = "diffusers.wan"\n[[model.warmup]]\nwidht = 8\n',
            "model[0] (x) warmup[0]: unknown key 'widht' (did you mean 'width'?)",
        ),
        (
            '[[models]]\nname = "x"\nadapter = "diffusers.wan"\n',
            "unknown key 'models' (did you mean 'model'?)",
        ),
        (
            '[model]\nname = "x"\nadapter = "diffusers.wan"\n',
            "'model' must be an array of tables: write [[model]] (two brackets) above each "
            "entry, not [model]",
        ),
    ],
    ids=["adaptor", "nme", "warmup", "models", "single-brackets"],
)
def test_a_mistake_anywhere_in_the_file_is_named_with_its_fix(text: str, error: str) -> None:
    """Issue 45: a misspelt ``adapter`` or a ``[model]`` table gave "needs 'name' and
    'adapter'", and a misspelt top-level table served the built-in models in silence."""
    with pytest.raises(CatalogError) as refused:
        parse_registry(text, "models.toml")
    assert str(refused.value) == f"models.toml: {error}"


def test_a_json_registry_is_told_to_be_toml() -> None:
    text = '{"model": [{"name": "x", "adapter": "diffusers.wan"}]}'
    with pytest.raises(CatalogError) as refused:
        parse_registry(text, "models.json")
    message = str(refused.value)
    assert message.startswith(
        "models.json: the model registry must be a TOML file, and this one is JSON"
    )
    assert "[[model]]" in message


def test_a_family_spec_naming_no_modelspec_field_is_refused() -> None:
    """ModelSpec ignores unknown keywords; the shared diffusers video spec must not let a
    misspelt family field pass that way."""
    from models.catalog import _diffusers_video

    with pytest.raises(TypeError, match=r"diffusers\.x: no ModelSpec field frame_offsett"):
        _diffusers_video("diffusers.x", frame_offsett=2)
    assert _diffusers_video("diffusers.x", default_fps=12).default_fps == 12
