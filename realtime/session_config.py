"""``session.update``: merge a partial session into the current one and refuse, naming the
``param``, any value this server cannot honour and any key it does not know (the session
is then left unchanged).

The beta Realtime session shape (``openai.types.beta.realtime.SessionUpdateEvent``),
still sent by many clients, is accepted as aliases of the GA fields: ``turn_detection``
→ ``audio.input.turn_detection``, ``input_audio_format`` / ``output_audio_format``
(``pcm16``, ``g711_ulaw``, ``g711_alaw``) → ``audio.{input,output}.format``,
``modalities`` → ``output_modalities`` (``["audio", "text"]`` is GA's ``["audio"]``:
audio with its transcript), ``voice`` / ``speed`` → ``audio.output.*``,
``input_audio_transcription`` / ``input_audio_noise_reduction`` → ``audio.input.*``,
``max_response_output_tokens`` → ``max_output_tokens``; ``instructions`` is the same in
both. Where a client sends both spellings the GA one wins. An error about an aliased value
names the key the client sent."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

import models.realtime as wire
from models.errors import SessionConfigError

# beta key → the GA path it stands for
_ALIASES: dict[str, tuple[str, ...]] = {
    "turn_detection": ("audio", "input", "turn_detection"),
    "input_audio_format": ("audio", "input", "format"),
    "output_audio_format": ("audio", "output", "format"),
    "modalities": ("output_modalities",),
    "voice": ("audio", "output", "voice"),
    "speed": ("audio", "output", "speed"),
    "input_audio_transcription": ("audio", "input", "transcription"),
    "input_audio_noise_reduction": ("audio", "input", "noise_reduction"),
    "max_response_output_tokens": ("max_output_tokens",),
}
_BETA_FORMATS: dict[str, dict[str, Any]] = {
    "pcm16": {"type": "audio/pcm", "rate": wire.SAMPLE_RATE},
    "g711_ulaw": {"type": "audio/pcmu"},
    "g711_alaw": {"type": "audio/pcma"},
}
# GA session fields this server does not implement and that would change the answer:
# accepted only at their "off" value
_GA_DEFAULTS: dict[str, tuple[Any, ...]] = {"prompt": (None,)}
# set by the server (a client echoing the session object back may send them), or GA
# hints with no effect on the audio here (tracing, truncation, include): ignored
_READ_ONLY = frozenset(
    {"object", "capabilities", "resume_token", "tracing", "truncation", "include"}
)


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_update(
    current: wire.RealtimeSession, update: dict[str, Any], model: str
) -> wire.RealtimeSession:
    """The session after ``update``; raises :class:`SessionConfigError`."""
    ga, renames = _from_beta(update)
    try:
        return _apply(current, ga, model)
    except SessionConfigError as exc:
        for prefix, sent in renames.items():
            if exc.param == prefix or exc.param.startswith(prefix + "."):
                # a beta format is one string: its error names that key
                suffix = "" if sent.endswith("_audio_format") else exc.param[len(prefix) :]
                param = sent + suffix
                message = exc.message.replace(exc.param, param)
                raise SessionConfigError(param, message, exc.code) from exc
        raise


def _apply(
    current: wire.RealtimeSession, update: dict[str, Any], model: str
) -> wire.RealtimeSession:
    if "id" in update and update["id"] != current.id:
        raise SessionConfigError("session.id", "session.id is read-only", "invalid_value")
    for key, allowed in _GA_DEFAULTS.items():
        if key in update and update[key] not in allowed:
            message = f"session.{key} is not supported by this server"
            raise SessionConfigError(f"session.{key}", message, "unsupported_value")
    base = current.model_dump(exclude={"capabilities", "resume_token"})
    known = {k: v for k, v in update.items() if k not in _READ_ONLY and k not in _GA_DEFAULTS}
    try:
        merged = wire.RealtimeSession.model_validate(_deep_merge(base, known))
    except ValidationError as exc:
        err = exc.errors()[0]
        param = "session." + ".".join(str(p) for p in err["loc"])
        raise SessionConfigError(param, f"{param}: {err['msg']}", "invalid_value") from exc
    problem = _unsupported(update, merged, model)
    if problem is not None:
        raise SessionConfigError(*problem, "unsupported_value")
    unknown = _unknown_key(known, wire.RealtimeSession, "session")
    if unknown is not None:
        raise SessionConfigError(unknown, f"Unknown parameter: '{unknown}'.", "unknown_parameter")
    merged.capabilities = current.capabilities
    merged.resume_token = current.resume_token
    return merged


def _from_beta(update: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``update`` in the GA shape, and GA param → the beta param the client sent."""
    beta: dict[str, Any] = {}
    renames: dict[str, str] = {}
    rest = {k: v for k, v in update.items() if k not in _ALIASES}
    for key, path in _ALIASES.items():
        if key not in update:
            continue
        value = update[key]
        if key.endswith("_audio_format"):
            if not isinstance(value, str) or value not in _BETA_FORMATS:
                formats = ", ".join(_BETA_FORMATS)
                message = f"session.{key}: use one of {formats} (this server takes pcm16)"
                raise SessionConfigError(f"session.{key}", message, "invalid_value")
            value = _BETA_FORMATS[value]
        elif key == "modalities" and isinstance(value, list) and set(value) == {"audio", "text"}:
            value = ["audio"]  # beta's audio + transcript is GA's ["audio"]
        nested: dict[str, Any] = {path[-1]: value}
        for part in reversed(path[:-1]):
            nested = {part: nested}
        beta = _deep_merge(beta, nested)
        renames["session." + ".".join(path)] = f"session.{key}"
    ga = _deep_merge(beta, rest)  # the GA spelling wins where both are sent
    direct = {"session." + ".".join(p) for k, p in _ALIASES.items() if _has(rest, p)}
    return ga, {ga_param: sent for ga_param, sent in renames.items() if ga_param not in direct}


def _has(update: dict[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = update
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _unknown_key(update: dict[str, Any], model: type[BaseModel], where: str) -> str | None:
    """The first key of ``update`` that ``model`` (recursively) does not declare."""
    for key, value in update.items():
        field = model.model_fields.get(key)
        if field is None:
            return f"{where}.{key}"
        nested = _model_of(field.annotation)
        if nested is not None and isinstance(value, dict):
            found = _unknown_key(value, nested, f"{where}.{key}")
            if found is not None:
                return found
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _unsupported(
    update: dict[str, Any], merged: wire.RealtimeSession, model: str
) -> tuple[str, str] | None:
    if update.get("type", "realtime") != "realtime":
        return "session.type", "only 'realtime' sessions are served here"
    if "model" in update and update["model"] != model:
        return "session.model", "the model is fixed when the session is created"
    if merged.output_modalities != ["audio"]:
        return (
            "session.output_modalities",
            "this model answers with audio (and its transcript): use ['audio']",
        )
    for side in ("input", "output"):
        fmt = getattr(merged.audio, side).format
        if fmt.type != "audio/pcm":
            return (
                f"session.audio.{side}.format.type",
                f"{fmt.type!r} is not supported; use 'audio/pcm' (PCM16, 24 kHz, mono)",
            )
        if fmt.rate not in (None, wire.SAMPLE_RATE):
            return f"session.audio.{side}.format.rate", "only 24000 Hz is supported"
    td = merged.audio.input.turn_detection
    if td is not None and td.type != "server_vad":
        return (
            "session.audio.input.turn_detection.type",
            f"{td.type!r} is not supported; use 'server_vad' or null",
        )
    if merged.audio.output.voice not in wire.VOICES:
        return (
            "session.audio.output.voice",
            f"unknown voice {merged.audio.output.voice!r}; one of {', '.join(wire.VOICES)}",
        )
    if merged.audio.input.transcription:
        return (
            "session.audio.input.transcription",
            "input transcription is not available on this model",
        )
    if merged.audio.input.noise_reduction:
        return "session.audio.input.noise_reduction", "noise reduction is not available"
    if merged.tools:
        return "session.tools", "this model does not call tools (MCP or functions)"
    return None
