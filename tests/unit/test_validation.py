"""Create-request parsing and validation (pure, no services)."""

from __future__ import annotations

import pytest

from api.validation import parse_create, resolve
from models.catalog import BUILTIN_SPECS
from models.errors import InvalidRequest, ModelNotFound
from storage.settings import Settings


@pytest.fixture
def settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def _resolve(settings: Settings, **raw: object):  # type: ignore[no-untyped-def]
    return resolve(parse_create({"prompt": "a cat", **raw}), BUILTIN_SPECS, settings)


def test_multipart_strings_are_parsed(settings: Settings) -> None:
    r = _resolve(
        settings,
        seconds="2",
        fps="12",
        num_inference_steps="4",
        seed="9",
        size="64x32",
        guidance_scale="7.5",
        vae_use_tiling="True",
        extra_params='{"motion": 2}',
    )
    assert (r.width, r.height, r.fps, r.num_frames, r.seconds) == (64, 32, 12.0, 24, "2")
    assert (r.num_inference_steps, r.seed) == (4, 9)
    # declared by reference/video: passed on; vae_use_tiling is not: accepted and ignored
    assert r.options == {"guidance_scale": 7.5}
    assert r.extra == {"motion": 2.0}


def test_defaults_come_from_the_model(settings: Settings) -> None:
    r = _resolve(settings)
    spec = BUILTIN_SPECS["reference/video"]
    assert (r.width, r.height) == spec.default_size
    assert r.num_frames == round(spec.default_seconds * spec.default_fps)
    assert r.num_inference_steps == spec.default_steps
    assert 0 <= r.seed < 2**31


def test_num_frames_wins_over_seconds_and_reports_real_seconds(settings: Settings) -> None:
    r = _resolve(settings, num_frames=30, fps=12, seconds="9")
    assert r.num_frames == 30 and r.seconds == "2.5"


def test_negative_seed_means_random(settings: Settings) -> None:
    assert _resolve(settings, seed=-1).seed >= 0


def test_width_height_alternative(settings: Settings) -> None:
    r = _resolve(settings, width=128, height=96)
    assert (r.width, r.height) == (128, 96)
    with pytest.raises(InvalidRequest) as info:
        _resolve(settings, width=128)
    assert info.value.param == "height"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ({"size": "wide"}, "size"),
        ({"size": "15x15"}, "size"),
        ({"fps": "0"}, "fps"),
        ({"fps": "nan"}, "fps"),
        ({"guidance_scale": "inf"}, "guidance_scale"),
        ({"seconds": "0"}, "seconds"),
        ({"seconds": "600"}, "seconds"),
        ({"num_inference_steps": "0"}, "num_inference_steps"),
        ({"n": "2"}, "n"),
        ({"extra_params": "{not json"}, "extra_params"),
        ({"extra_params": '{"camera": 3}'}, "extra_params.camera"),
        ({"extra_params": '{"camera": "orbit"}'}, "extra_params.camera"),
        ({"extra_params": '{"motion": 99}'}, "extra_params.motion"),
        ({"timeout": "0"}, "timeout"),
        ({"unknown_field": "1"}, "unknown_field"),
        ({"prompt": "   "}, "prompt"),
    ],
)
def test_bad_values_name_the_parameter(settings: Settings, raw: dict[str, str], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _resolve(settings, **raw)
    assert info.value.param == param
    assert info.value.status_code == 400


def test_unknown_model(settings: Settings) -> None:
    with pytest.raises(ModelNotFound) as info:
        _resolve(settings, model="sora-2")
    assert info.value.code == "model_not_found" and info.value.param == "model"


def test_frame_lattice_snaps_up() -> None:
    spec = BUILTIN_SPECS["reference/video"].model_copy(
        update={"frame_multiple": 4, "frame_offset": 1}
    )
    assert [spec.snap_frames(n) for n in (1, 2, 5, 6, 81)] == [1, 5, 5, 9, 81]


def test_settings_refuse_placeholder_secret_and_open_auth() -> None:
    s = Settings(_env_file=None, s3={"secret_access_key": "minioadmin"})  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="placeholder"):
        s.check_secrets()
    Settings(mode="embedded", s3={"secret_access_key": "minioadmin"}).check_secrets()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loopback"):
        Settings(auth="off").check_auth_binding("0.0.0.0")
    Settings(auth="off").check_auth_binding("127.0.0.1")
