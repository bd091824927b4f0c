"""``applied_params`` (models/applied.py) per model family: the sampler fields vLLM-Omni's
ComfyUI node and diffusion benchmark always send, validated as the API does and read back
from the stored spec, name exactly the fields each family declares (docs/api.md's table).
Pure: no services."""

from __future__ import annotations

import pytest

from api.audio_validation import (
    parse_generate,
    parse_generation,
    parse_speech,
    resolve_audio,
    resolve_generate,
    resolve_speech,
)
from api.validation import parse_create, resolve
from models.applied import applied_params
from models.catalog import BUILTIN_SPECS, FAMILY_SPECS, ModelSpec
from models.errors import InvalidRequest
from storage.settings import Settings
from tests.helpers import tts_benchmark_body

# What the node's diffusion sampling params and the benchmark's extra body send (strings,
# as multipart forms carry them), with a negative prompt.
SAMPLER = {
    "guidance_scale": "7.5",
    "true_cfg_scale": "1.0",
    "flow_shift": "5.0",
    "vae_use_slicing": "False",
    "vae_use_tiling": "false",
    "negative_prompt": "blurry",
}


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def _specs() -> dict[str, ModelSpec]:
    families = {name: spec.model_copy(update={"name": name}) for name, spec in FAMILY_SPECS.items()}
    return {**BUILTIN_SPECS, **families}


@pytest.mark.parametrize(
    ("model", "applied"),
    [
        ("reference/video", ["guidance_scale", "negative_prompt"]),
        (
            "diffusers.wan",
            [
                "guidance_scale",
                "flow_shift",
                "vae_use_slicing",
                "vae_use_tiling",
                "negative_prompt",
            ],
        ),
        (
            "diffusers.ltx",
            ["guidance_scale", "vae_use_slicing", "vae_use_tiling", "negative_prompt"],
        ),
        (
            "diffusers.cogvideox",
            ["guidance_scale", "vae_use_slicing", "vae_use_tiling", "negative_prompt"],
        ),
        (
            "diffusers.ltx2",
            ["guidance_scale", "vae_use_slicing", "vae_use_tiling", "negative_prompt"],
        ),
        ("diffusers.minimax_h3", ["flow_shift"]),  # guidance-distilled: no CFG, no negative
    ],
)
def test_video_families_apply_what_they_declare(
    settings: Settings, model: str, applied: list[str]
) -> None:
    specs = _specs()
    sent = {"prompt": "a cat", "model": model, **SAMPLER}
    if "negative_prompt" not in applied:  # sent only when typed: refused, not dropped
        with pytest.raises(InvalidRequest) as refused:
            resolve(parse_create(sent), specs, settings)
        assert refused.value.param == "negative_prompt"
        del sent["negative_prompt"]
    spec = resolve(parse_create(sent), specs, settings)
    stored = spec.model_dump(mode="json")
    assert applied_params(stored, specs[model].parameters) == applied
    assert "true_cfg_scale" not in applied  # no family's pipeline takes it


def test_extras_lora_and_a_cache_tier_are_listed(settings: Settings) -> None:
    raw = {"prompt": "a cat", "extra_params": {"motion": 2.0}, "guidance_scale": 3}
    spec = resolve(parse_create(raw), BUILTIN_SPECS, settings)
    applied = applied_params(spec.model_dump(mode="json"), ["guidance_scale"])
    assert applied == ["guidance_scale", "extra_params.motion"]
    stored = {
        "options": {"flow_shift": 3.0},
        "quality": "fast",
        "lora": {"name": "s", "path": "/l"},
    }
    assert applied_params(stored, None) == ["flow_shift", "lora", "quality"]


def test_an_old_row_answers_from_its_spec_alone() -> None:
    """A row written before applied_params existed (options a plain dict): its options
    were kept only if declared then too; its negative prompt counts where the served
    model declares one (or when the model is not served any more)."""
    row = {"options": {"guidance_scale": 5.0, "vae_use_tiling": None}, "negative_prompt": "x"}
    assert applied_params(row, None) == ["guidance_scale", "negative_prompt"]
    assert applied_params(row, ["guidance_scale"]) == ["guidance_scale"]
    assert applied_params({}, None) == []


def test_audio_jobs_list_their_options(settings: Settings) -> None:
    specs = _specs()
    # vLLM-Omni's TTS benchmark body (default_voice of Qwen3-TTS-CustomVoice's config).
    body = tts_benchmark_body(input="Hello there.")
    spec = resolve_speech(parse_speech(body), specs, settings)
    assert spec.stream_pcm and spec.options["language"] == "en"
    assert applied_params(spec.model_dump(mode="json"), None) == ["speed", "voice", "language"]
    music = resolve_audio(
        parse_generation({"prompt": "a tune", "guidance_scale": 2, "negative_prompt": "drums"}),
        specs,
        settings,
    )
    assert applied_params(music.model_dump(mode="json"), None) == [
        "guidance_scale",
        "negative_prompt",
    ]
    spoken = parse_generation({"prompt": "hi", "model": "reference/speech", "negative_prompt": "x"})
    with pytest.raises(InvalidRequest) as refused:
        resolve_audio(spoken, specs, settings)
    assert refused.value.param == "negative_prompt"


def test_generate_refuses_a_speed_the_model_cannot_take(settings: Settings) -> None:
    """vLLM-Omni's /v1/audio/generate: ``speed`` reaches reference/audio (it declares it);
    Stable Audio has none, so a speed other than 1 is a 400 naming it, not dropped."""
    specs = _specs()
    kept = resolve_generate(parse_generate({"input": "rain", "speed": 1.5}), specs, settings)
    assert applied_params(kept.model_dump(mode="json"), None) == ["speed"]
    same = parse_generate({"input": "rain", "model": "diffusers.stable_audio", "speed": 1.0})
    assert applied_params(resolve_generate(same, specs, settings).model_dump(), None) == []
    fast = parse_generate({"input": "rain", "model": "diffusers.stable_audio", "speed": 1.5})
    with pytest.raises(InvalidRequest) as refused:
        resolve_generate(fast, specs, settings)
    assert refused.value.param == "speed"


@pytest.mark.parametrize(
    ("model", "language", "ok"),
    [
        ("diffusers.longcat_audio", "Chinese", True),  # it reads Chinese text as it is
        ("diffusers.longcat_audio", "en", True),
        ("diffusers.longcat_audio", "French", False),
        ("reference/audio", "Chinese", False),
    ],
)
def test_a_language_the_model_speaks_from_its_text_is_taken(
    settings: Settings, model: str, language: str, ok: bool
) -> None:
    """A model without a ``language`` input takes a hint of a language it speaks anyway
    (``spoken_languages``), sending nothing to it; another is a 400 naming ``language``."""
    body = parse_speech({"model": model, "input": "你好，世界。", "language": language})
    if ok:
        spec = resolve_speech(body, _specs(), settings)
        assert "language" not in spec.options
        return
    with pytest.raises(InvalidRequest) as info:
        resolve_speech(body, _specs(), settings)
    assert info.value.param == "language"
