"""``session.update``: merge a partial session into the current one and refuse, naming the
``param``, any value this server cannot honour (the session is then left unchanged)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

import models.realtime as wire


class SessionConfigError(ValueError):
    def __init__(self, param: str, message: str, code: str) -> None:
        super().__init__(message)
        self.param, self.message, self.code = param, message, code


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
    base = current.model_dump(exclude={"capabilities", "resume_token"})
    try:
        merged = wire.RealtimeSession.model_validate(
            _deep_merge(base, {k: v for k, v in update.items() if k != "object"})
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        param = "session." + ".".join(str(p) for p in err["loc"])
        raise SessionConfigError(param, f"{param}: {err['msg']}", "invalid_value") from exc
    problem = _unsupported(update, merged, model)
    if problem is not None:
        raise SessionConfigError(*problem, "unsupported_value")
    merged.capabilities = current.capabilities
    merged.resume_token = current.resume_token
    return merged


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
