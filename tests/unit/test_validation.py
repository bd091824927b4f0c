"""Create-request parsing and validation (pure, no services)."""

from __future__ import annotations

import pytest

from api.audio_validation import parse_generation, resolve_audio
from api.content import parse_range
from api.job_stream import parse_cursor
from api.payload import check_values, loads
from api.validation import parse_create, resolve
from models.catalog import BUILTIN_SPECS
from models.errors import InvalidRequest, ModelNotFound, RangeNotSatisfiable
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
    assert r.options.model_dump() == {"guidance_scale": 7.5}
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


def test_a_bound_set_by_the_server_names_its_setting(settings: Settings) -> None:
    """Past a limit of the server's (not the model's), the error says which setting it
    is, so the operator knows what to raise; the model's own bounds name no setting."""
    with pytest.raises(InvalidRequest) as info:
        _resolve(settings, seconds="21")
    assert (
        info.value.message == "seconds must be at most 20 (this server's OMNIQ_LIMITS__MAX_SECONDS)"
    )
    assert info.value.param == "seconds"
    with pytest.raises(InvalidRequest, match=r"longer than 20 seconds .*MAX_SECONDS"):
        _resolve(settings, num_frames=241, fps=12)
    small = settings.model_copy(
        update={"limits": settings.limits.model_copy(update={"max_width": 96, "max_frames": 24})}
    )
    with pytest.raises(InvalidRequest, match=r"OMNIQ_LIMITS__MAX_WIDTH\)$") as info:
        _resolve(small, width=128, height=64)
    assert "MAX_HEIGHT" not in info.value.message
    with pytest.raises(InvalidRequest, match=r"OMNIQ_LIMITS__MAX_FRAMES\)$"):
        _resolve(small, num_frames=30, fps=12)
    with pytest.raises(InvalidRequest) as info:  # the model's own bound
        _resolve(settings, size="15x15")
    assert "OMNIQ_" not in info.value.message


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
        ({"n": "5"}, "n"),
        ({"n": "0"}, "n"),
        ({"extra_params": "{not json"}, "extra_params"),
        ({"extra_params": '{"camera": 3}'}, "extra_params.camera"),
        ({"extra_params": '{"camera": "orbit"}'}, "extra_params.camera"),
        ({"extra_params": '{"motion": 99}'}, "extra_params.motion"),
        ({"timeout": "0"}, "timeout"),
        ({"unknown_field": "1"}, "unknown_field"),
        ({"prompt": "   "}, "prompt"),
        ({"size": "\uff16\uff14x48"}, "size"),  # full-width digits
        ({"size": "9" * 5000 + "x48"}, "size"),
        ({"seconds": True}, "seconds"),
        ({"seed": False}, "seed"),
        ({"fps": True}, "fps"),
        ({"num_frames": True}, "num_frames"),
        ({"extra_params": "[" * 100_000 + "]" * 100_000}, "extra_params"),
        ({"extra_params": '{"motion": ' + "9" * 5000 + "}"}, "extra_params.motion"),
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


# ---- api/payload.py: what any decoded body may hold ----------------------------------


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ('{"seed": ' + "9" * 5000 + "}", "seed"),
        ('{"seed": -' + "9" * 5000 + "}", "seed"),
        ('{"extra_params": {"a": [1, ' + "9" * 50 + "]}}", "extra_params.a"),
        ('{"timeout": NaN}', "timeout"),
        ('{"timeout": -Infinity}', "timeout"),
        ('{"extra_params": {"strength": 1e999}}', "extra_params.strength"),
        ('{"prompt": "a\\ud800b"}', "prompt"),
        ('{"prompt": "a\\u0000b"}', "prompt"),
        ('{"extra_params": {"k\\u0000": 1}}', "extra_params.k\0"),
        ('{"prompt": "p", "lora": ' + "[" * 100_000 + "]" * 100_000 + "}", "lora"),
        ('{"lora": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}", "lora" + ".a" * 31),
        ("[" * 100_000 + "]" * 100_000, None),
        ("{not json", None),
        (b"\xff\xfe{", None),
    ],
)
def test_odd_json_is_a_400_naming_the_field(text: str, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as info:
        loads(text)
    assert info.value.param == param
    assert info.value.status_code == 400


def test_ordinary_json_is_unchanged() -> None:
    text = '{"prompt": "caf\u00e9 \U0001f600", "seed": 123456789012345678901234567890, "f": 1.5e3}'
    assert loads(text) == {"prompt": "café 😀", "seed": 123456789012345678901234567890, "f": 1500.0}


def test_form_fields_are_checked_too() -> None:
    check_values({"prompt": "fine", "seconds": "4"})
    with pytest.raises(InvalidRequest) as info:
        check_values({"prompt": "a\0b"})
    assert info.value.param == "prompt"


@pytest.mark.parametrize(
    ("header", "query", "expected"),
    [
        (None, None, "0-0"),
        ("", "", "0-0"),
        ("1700000000000-3", "garbage", "1700000000000-3"),
        (None, "42", "42"),
        (None, f"{2**64 - 1}-{2**64 - 1}", f"{2**64 - 1}-{2**64 - 1}"),
    ],
)
def test_event_cursors_that_are_stream_ids(
    header: str | None, query: str | None, expected: str
) -> None:
    assert parse_cursor(header, query) == expected


@pytest.mark.parametrize(
    ("header", "query", "param"),
    [
        ("garbage", None, "Last-Event-ID"),
        (None, "1-2-3", "last_event_id"),
        (None, f"{2**64}-0", "last_event_id"),
        (None, "\uff11-0", "last_event_id"),
        (None, "9" * 5000, "last_event_id"),
    ],
)
def test_other_event_cursors_are_refused(header: str | None, query: str | None, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_cursor(header, query)
    assert info.value.param == param


@pytest.mark.parametrize(
    "header", ["bytes=0-" + "9" * 5000, "bytes=" + "9" * 20 + "-", "bytes=-" + "9" * 20]
)
def test_a_range_position_too_long_to_parse_is_416(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable) as info:
        parse_range(header, 1000)
    assert info.value.param == "Range"
    assert info.value.size == 1000


def test_ranges_still_parse() -> None:
    assert parse_range("bytes=0-" + "9" * 19, 1000) == (0, 999)
    assert parse_range("bytes=-10", 1000) == (990, 999)
    with pytest.raises(InvalidRequest):
        parse_range("bytes=\uff10-1", 1000)


def test_an_audio_length_past_the_server_s_limit_names_it(settings: Settings) -> None:
    """reference/audio makes up to 60 s, the server 20 by default: past 20 the error
    names the setting; the model's own bound names none."""
    with pytest.raises(InvalidRequest) as info:
        resolve_audio(parse_generation({"prompt": "rain", "seconds": 30}), BUILTIN_SPECS, settings)
    assert info.value.message.endswith("(this server's OMNIQ_LIMITS__MAX_SECONDS)")
    assert info.value.param == "seconds"
    roomy = settings.model_copy(
        update={"limits": settings.limits.model_copy(update={"max_seconds": 600.0})}
    )
    with pytest.raises(InvalidRequest) as info:
        resolve_audio(parse_generation({"prompt": "rain", "seconds": 61}), BUILTIN_SPECS, roomy)
    assert "at most 60 for reference/audio" in info.value.message
    assert "OMNIQ_" not in info.value.message


def test_a_range_of_one_value_is_said_as_that_value() -> None:
    """Issue 45: "must be between 5 and 5" where a minimum equals its maximum."""
    from models.errors import must_be_within

    assert must_be_within("num_inference_steps", 5, 5) == "num_inference_steps must be 5"
    assert must_be_within("n", 1, 4) == "n must be between 1 and 4"
    assert must_be_within("sample_rate", 8000, 384000) == (
        "sample_rate must be between 8000 and 384000"
    )
    assert must_be_within("lora.scale", -0.5, 0.5) == "lora.scale must be between -0.5 and 0.5"
    assert must_be_within("lora.scale", -0.0, 0.0) == "lora.scale must be 0"
    assert (
        must_be_within("timeout", 0, 30, " seconds") == "timeout must be between 0 and 30 seconds"
    )


def test_a_model_of_fixed_steps_says_its_one_value() -> None:
    """A job for a model whose steps are fixed (min = max) is refused with "must be 5",
    not "must be between 5 and 5"."""
    from api.validation import resolve_steps

    fixed = BUILTIN_SPECS["reference/video"].model_copy(
        update={"min_steps": 5, "max_steps": 5, "default_steps": 5}
    )
    limits = Settings().limits
    assert resolve_steps(None, fixed, limits) == 5
    with pytest.raises(InvalidRequest) as info:
        resolve_steps(3, fixed, limits)
    assert info.value.message == "num_inference_steps must be 5"
    assert info.value.param == "num_inference_steps"
