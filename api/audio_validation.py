"""Audio request validation: the three request shapes (generations, OpenAI speech,
vLLM-Omni generate) → one :class:`models.job_specs.AudioSpec`, checked against the model's
spec.

Pure functions, no I/O: errors are :class:`InvalidRequest` naming the parameter as the
client spelled it (``input`` for speech, ``audio_length`` for generate), raised before
anything is stored.
"""

from __future__ import annotations

import math
import re
from typing import Any

from api.payload import loads
from api.validation import (
    check_negative_prompt,
    check_prompts,
    default_model,
    job_fields,
    parse_model,
    resolve_steps,
    server_limit,
)
from models.audio import (
    AUDIO_FORMATS,
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    SAMPLE_RATES,
    SPEECH_LANGUAGES,
    AudioCreate,
    AudioGenerate,
    SpeechCreate,
)
from models.catalog import ModelSpec
from models.errors import InvalidRequest, ModelNotFound, must_be_within
from models.job_specs import AudioSpec
from storage.settings import Settings

# Fields that carry JSON text in multipart bodies.
_JSON_FIELDS = ("extra_params",)
# Field aliases clients send to /v1/audio/generations.
_ALIASES = {"input": "prompt", "audio_length": "seconds"}
# vLLM-Omni speech fields that change the output: refused for models that do not declare
# them in ModelSpec.parameters (what each asks for, for the error message).
_OUTPUT_FIELDS = {
    "ref_audio": "voice cloning from reference audio",
    "ref_text": "the transcript of a voice-cloning reference",
    "ref_audio_2": "a second reference speaker",
    "speaker_embedding": "voice cloning from a speaker embedding",
    "x_vector_only_mode": "voice cloning from a speaker embedding",
    "ambient_sound": "ambient sound synthesis",
    "word_timestamps": "per-word timestamps",
}
# vLLM-Omni's codec hints, kept for models that declare them; their defaults (no first
# chunk size, the whole text at once) are what every model here does.
_HINT_FIELDS = ("initial_codec_chunk_frames", "non_streaming_mode")
_INT64_MAX = 2**63 - 1
# Speech: seconds per word and a fixed lead, at speed 1 (see speech_seconds).
_SECONDS_PER_WORD = 0.4
_SPEECH_LEAD_S = 0.3


def parse_generation(raw: dict[str, Any]) -> AudioCreate:
    """JSON or multipart fields of ``POST /v1/audio/generations`` → :class:`AudioCreate`."""
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        name = _ALIASES.get(key, key)
        if name in _JSON_FIELDS and isinstance(value, str):
            value = loads(value, key) if value.strip() else {}
        if isinstance(value, str) and value == "" and name != "prompt":
            continue  # an empty form field means "not given"
        if name in fields:
            raise InvalidRequest(f"{key} is given more than once (or with its alias)", param=key)
        fields[name] = value
    return parse_model(AudioCreate, fields)


def resolve_audio(
    req: AudioCreate,
    specs: dict[str, ModelSpec],
    settings: Settings,
    *,
    options: dict[str, Any] | None = None,
    stream_pcm: bool | None = None,
    prompt_param: str = "prompt",
    seconds_param: str = "seconds",
    seconds_given: bool = True,
) -> AudioSpec:
    """Check a parsed request against the named audio model and the server's limits.
    ``options`` are speech options (speed, voice, instructions), kept for models that
    declare them in ``ModelSpec.parameters``; so is ``duration_seconds``, the length the
    client gave (``seconds_given``: not speech's word-count estimate), for models that
    otherwise size the clip themselves (LongCat estimates it from the text)."""
    limits = settings.limits
    model = req.model or default_model(specs, "audio")
    spec = specs.get(model)
    if spec is None:
        raise ModelNotFound(
            f"model {model!r} is not served here; GET /v1/models lists the served models"
            if model
            else "no audio model is served here",
            param="model",
        )
    if spec.modality != "audio":
        raise InvalidRequest(
            f"model {model!r} makes {spec.modality}, not audio: use /v1/videos", param="model"
        )
    if spec.streaming:
        raise InvalidRequest(f"model {model!r} serves realtime sessions only", param="model")

    check_prompts(req.prompt, req.negative_prompt, limits, prompt_param)
    check_negative_prompt(req.negative_prompt, spec)

    fmt = req.response_format.strip().lower()
    if fmt not in AUDIO_FORMATS:
        raise InvalidRequest(
            f"response_format must be one of {', '.join(AUDIO_FORMATS)}", param="response_format"
        )
    seconds = spec.default_seconds if req.seconds is None else req.seconds
    top = max_seconds(spec, settings)
    if not math.isfinite(seconds) or not 0 < seconds <= top:
        # the server's limit, when it is tighter than the model's own
        server = spec.max_seconds is None or settings.limits.max_seconds < spec.max_seconds
        where = server_limit("OMNIQ_LIMITS__MAX_SECONDS") if server and seconds > top else ""
        raise InvalidRequest(
            f"{seconds_param} must be above 0 and at most {top:g} for {model}{where}",
            param=seconds_param,
        )
    seconds = max(round(seconds, 3), 0.001)

    steps = resolve_steps(req.num_inference_steps, spec, limits)
    _check_rate(req.sample_rate, fmt)
    if req.channels is not None and req.channels not in (1, 2):
        raise InvalidRequest("channels must be 1 or 2", param="channels")

    kept: dict[str, Any] = {}
    if req.guidance_scale is not None:
        if not math.isfinite(req.guidance_scale) or req.guidance_scale < 0:
            raise InvalidRequest(
                "guidance_scale must be a non-negative number", param="guidance_scale"
            )
        if "guidance_scale" in spec.parameters:
            kept["guidance_scale"] = req.guidance_scale
    for name, value in (options or {}).items():
        if value is not None and name in spec.parameters:
            kept[name] = value
    if seconds_given and req.seconds is not None and "duration_seconds" in spec.parameters:
        kept["duration_seconds"] = seconds

    return AudioSpec(
        **job_fields(req, model, spec, limits, steps=steps, options=kept),
        duration_ms=max(1, round(seconds * 1000)),
        response_format=fmt,
        sample_rate=req.sample_rate,
        channels=req.channels,
        stream_pcm=fmt == "pcm" if stream_pcm is None else stream_pcm,
    )


def max_seconds(spec: ModelSpec, settings: Settings) -> float:
    top = settings.limits.max_seconds
    return min(top, spec.max_seconds) if spec.max_seconds is not None else top


def _check_rate(rate: int | None, fmt: str) -> None:
    if rate is None:
        return
    allowed = SAMPLE_RATES[fmt]
    if allowed is not None and rate not in allowed:
        choices = ", ".join(str(r) for r in allowed)
        raise InvalidRequest(f"sample_rate for {fmt} must be one of {choices}", param="sample_rate")
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        message = must_be_within("sample_rate", MIN_SAMPLE_RATE, MAX_SAMPLE_RATE)
        raise InvalidRequest(message, param="sample_rate")


def _generation(body: SpeechCreate | AudioGenerate, **fields: Any) -> AudioCreate:
    """The generations request a speech or generate body asks for: ``input`` as the
    prompt, every field the body has under a generations name (``model``, ``seed``,
    ``num_inference_steps``, …), then ``fields``."""
    same = body.model_dump(include=set(AudioCreate.model_fields))
    return AudioCreate(prompt=body.input, **same | fields)


# ---- OpenAI speech ----------------------------------------------------------------------


def speech_seconds(text: str, speed: float) -> float:
    """How long a clip ``text`` becomes: a lead plus 0.4 s per word, divided by ``speed``."""
    words = max(1, len(re.findall(r"\w+", text)))
    return (_SPEECH_LEAD_S + _SECONDS_PER_WORD * words) / speed


def speech_model(specs: dict[str, ModelSpec]) -> str:
    """``/v1/audio/speech``'s default: the first served text-to-speech model, else the
    first served audio model ("" if none)."""
    speakers = (n for n, s in specs.items() if s.text_to_speech and not s.streaming)
    return next(speakers, "") or default_model(specs, "audio")


def parse_speech(raw: dict[str, Any]) -> SpeechCreate:
    """JSON or multipart fields of ``POST /v1/audio/speech`` → :class:`SpeechCreate`."""
    if "voice" in raw and "speaker" in raw:
        raise InvalidRequest("give voice or speaker (its alias), not both", param="speaker")
    return parse_model(SpeechCreate, raw)


def resolve_speech(
    body: SpeechCreate, specs: dict[str, ModelSpec], settings: Settings
) -> AudioSpec:
    """``POST /v1/audio/speech`` → a mono 24 kHz (unless ``sample_rate``) audio job whose
    length follows the text (:func:`speech_seconds`, capped at the model's maximum)."""
    speed = 1.0 if body.speed is None else body.speed
    if not math.isfinite(speed) or not 0.25 <= speed <= 4.0:
        raise InvalidRequest("speed must be between 0.25 and 4.0", param="speed")
    voice = body.voice.get("id") if isinstance(body.voice, dict) else body.voice
    if isinstance(body.voice, dict) and not isinstance(voice, str):
        raise InvalidRequest("voice must be a name or an object with an 'id'", param="voice")
    fmt = body.response_format.strip().lower()
    if body.stream_format == "sse" and fmt != "pcm":
        raise InvalidRequest(
            "stream_format 'sse' sends PCM16: use response_format 'pcm'", param="stream_format"
        )
    stream = _stream(body, fmt)
    if body.instructions and len(body.instructions) > settings.limits.max_prompt_chars:
        raise InvalidRequest("instructions is too long", param="instructions")
    model = body.model or speech_model(specs)
    spec = specs.get(model)
    options = {"speed": speed, "voice": voice, "instructions": body.instructions}
    seconds = speech_seconds(body.input, speed)
    if spec is not None and spec.modality == "audio" and not spec.streaming:  # else: model error
        options |= _speech_extensions(body, spec)
        seconds = min(seconds, max_seconds(spec, settings))
    if body.duration_seconds is not None:  # the clip length asked for (resolve_audio checks it)
        seconds = body.duration_seconds
    req = _generation(
        body,
        model=model or None,
        seconds=seconds,
        response_format=fmt,
        sample_rate=body.sample_rate or 24_000,
        channels=1,
        extra_params=body.extra_params or {},
    )
    return resolve_audio(
        req,
        specs,
        settings,
        options=options,
        stream_pcm=stream,
        prompt_param="input",
        seconds_param="seconds" if body.duration_seconds is None else "duration_seconds",
        seconds_given=body.duration_seconds is not None,
    )


def _stream(body: SpeechCreate, fmt: str) -> bool:
    """Whether the PCM goes out as it is decoded. ``pcm`` streams unless the body says
    ``"stream": false`` (then the whole clip comes at once); vLLM-Omni's ``"stream": true``
    asks for exactly that stream, so it needs ``pcm`` (and ``sse`` needs a stream)."""
    if body.stream and fmt != "pcm":
        raise InvalidRequest(
            "stream sends PCM16 as it is decoded: use response_format 'pcm'", param="stream"
        )
    if "stream" in body.model_fields_set and not body.stream:
        if body.stream_format == "sse":
            raise InvalidRequest(
                "stream_format 'sse' is a stream: drop stream=false", param="stream"
            )
        return False
    return fmt == "pcm"


def _language(value: str | None, spec: ModelSpec) -> dict[str, str]:
    """``language``: the option of a model that declares it (an ISO 639-1 code of
    :data:`SPEECH_LANGUAGES`); for another model, only the languages it speaks from its
    text (``ModelSpec.spoken_languages``: English, and Chinese for LongCat), or "Auto",
    are taken, as what it does anyway. Anything else is a 400 naming it."""
    if value is None or value.strip().lower() in ("", "auto"):
        return {}
    code = SPEECH_LANGUAGES.get(value.strip().lower())
    if "language" in spec.parameters:
        if code is None:
            names = "English, Chinese, Japanese, Korean, French, German, Spanish, Italian, "
            raise InvalidRequest(
                f"language {value!r} is not one of {names}Portuguese, Russian or Auto",
                param="language",
            )
        return {"language": code}
    if code not in spec.spoken_languages:
        spoken = ", ".join(spec.spoken_languages)
        raise InvalidRequest(
            f"model {spec.name!r} speaks {spoken} only (from its text): language {value!r} "
            "cannot act (omit it, or send one of those, or 'Auto')",
            param="language",
        )
    return {}


def _speech_extensions(body: SpeechCreate, spec: ModelSpec) -> dict[str, Any]:
    """vLLM-Omni's speech fields → options for ``spec``. A field that would change the
    output is refused (400 naming it) unless the model declares it in ``parameters``:
    ``max_new_tokens`` (a cap on generated codec tokens, which no token-free model has),
    ``instructions``, a ``duration_seconds`` for a text-to-speech model that sizes the
    clip by its text, a ``language`` the model does not speak (:func:`_language`), a first
    codec chunk size (``initial_codec_chunk_frames`` above 0) and ``non_streaming_mode:
    false`` (text streamed into the model: every model here takes the whole text, which
    ``true`` asks for)."""
    if body.max_new_tokens is not None and not 1 <= body.max_new_tokens <= _INT64_MAX:
        raise InvalidRequest("max_new_tokens must be a positive integer", param="max_new_tokens")
    frames = body.initial_codec_chunk_frames
    if frames is not None and not 0 <= frames <= _INT64_MAX:
        raise InvalidRequest(
            "initial_codec_chunk_frames must be a non-negative integer",
            param="initial_codec_chunk_frames",
        )
    refused = {
        "max_new_tokens": body.max_new_tokens is not None,
        "instructions": bool(body.instructions),
        "duration_seconds": body.duration_seconds is not None and spec.text_to_speech,
        "initial_codec_chunk_frames": bool(frames),
        "non_streaming_mode": body.non_streaming_mode is False,
    }
    for name, asked in refused.items():
        if asked and name not in spec.parameters:
            raise InvalidRequest(f"{name} cannot act on model {spec.name!r}", param=name)
    task = body.task_type
    if task not in (None, "CustomVoice") and "task_type" not in spec.parameters:
        what = "voice design" if task == "VoiceDesign" else "voice cloning"
        raise InvalidRequest(
            f"task_type {task!r} ({what}) is not supported by model {spec.name!r}; "
            "omit it or use 'CustomVoice'",
            param="task_type",
        )
    for name, what in _OUTPUT_FIELDS.items():
        value = getattr(body, name)
        if value not in (None, False) and name not in spec.parameters:
            raise InvalidRequest(
                f"{name} ({what}) is not supported by model {spec.name!r}", param=name
            )
    fields = (*_HINT_FIELDS, *_OUTPUT_FIELDS, "task_type", "max_new_tokens")
    return {name: getattr(body, name) for name in fields} | _language(body.language, spec)


# ---- vLLM-Omni generate -----------------------------------------------------------------


def parse_generate(raw: dict[str, Any]) -> AudioGenerate:
    """JSON or multipart fields of ``POST /v1/audio/generate`` → :class:`AudioGenerate`."""
    return parse_model(AudioGenerate, raw)


def resolve_generate(
    body: AudioGenerate, specs: dict[str, ModelSpec], settings: Settings
) -> AudioSpec:
    """``POST /v1/audio/generate`` (vLLM-Omni): ``audio_length`` seconds starting at
    ``audio_start`` (models declaring ``audio_start_in_s`` get the window as extras)."""
    if body.stream_format not in (None, "audio"):
        raise InvalidRequest("stream_format must be 'audio'", param="stream_format")
    speed = 1.0 if body.speed is None else body.speed
    if not math.isfinite(speed) or not 0.25 <= speed <= 4.0:
        raise InvalidRequest("speed must be between 0.25 and 4.0", param="speed")
    start = body.audio_start or 0.0
    if not math.isfinite(start) or start < 0:
        raise InvalidRequest("audio_start must be a non-negative number", param="audio_start")
    extra = dict(body.extra_params)
    model = body.model or default_model(specs, "audio")
    spec = specs.get(model)
    if speed != 1.0 and spec is not None and "speed" not in spec.parameters:
        raise InvalidRequest(f"speed cannot act on model {model!r}", param="speed")
    if start and spec is not None:
        if "audio_start_in_s" not in spec.extra_params:
            raise InvalidRequest(f"model {model!r} does not take audio_start", param="audio_start")
        extra["audio_start_in_s"] = start
        length = body.audio_length if body.audio_length is not None else spec.default_seconds
        extra["audio_end_in_s"] = start + length
    req = _generation(body, seconds=body.audio_length, extra_params=extra)
    return resolve_audio(
        req,
        specs,
        settings,
        options={"speed": speed},
        stream_pcm=False,
        prompt_param="input",
        seconds_param="audio_length",
    )
