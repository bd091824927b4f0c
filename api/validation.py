"""Create-request validation: parse → normalize aliases → check against the model's limits.

Pure functions, no I/O: they raise :class:`InvalidRequest` naming the offending parameter,
so a bad request is refused before anything is stored.
"""

from __future__ import annotations

import math
import re
import secrets
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError

from api.payload import loads
from models.audio import AudioCreate
from models.catalog import ModelSpec, QualityTier
from models.errors import InvalidRequest, ModelNotFound, must_be_within
from models.job_specs import SamplerOptions, VideoSpec
from models.videos import VideoCreate
from models.webhooks import EVENT_TYPES, JobWebhook
from storage.settings import LimitSettings, Settings
from storage.webhooks import check_events, check_webhook_url

# Optional numeric/boolean fields passed to a pipeline that declares them in
# ``ModelSpec.parameters``; for other models they are accepted and ignored.
PIPELINE_OPTIONS = tuple(SamplerOptions.model_fields)
# MiniMax-H3's latent-mask editing inputs (refused: see refuse_latent_mask_editing).
LATENT_MASK_FIELDS = ("source_video", "source_audio", "video_noise_mask", "audio_noise_mask")
# Field aliases real clients send.
_ALIASES = {"num_outputs_per_prompt": "n"}
# Multipart fields that carry JSON text.
_JSON_FIELDS = ("extra_params", "lora")
# ASCII digits only (``int()`` would take full-width ones); 5 digits is past every limit.
_SIZE_RE = re.compile(r"^\s*([0-9]{1,5})\s*[xX*]\s*([0-9]{1,5})\s*$")


def refuse_latent_mask_editing(names: Any) -> None:
    """MiniMax-H3's latent-mask editing (``source_video``, ``source_audio``,
    ``video_noise_mask``, ``audio_noise_mask``) is not in diffusers' blocks, so no model
    here does it: a request that asks for it is refused rather than run as a plain
    generation."""
    asked = sorted(set(names) & set(LATENT_MASK_FIELDS))
    if asked:
        raise InvalidRequest(
            f"latent-mask editing ({', '.join(asked)}) is not supported: no served model edits "
            "a source video or audio",
            param="source_video",
        )


def parse_create(raw: dict[str, Any]) -> VideoCreate:
    """Raw JSON or multipart fields → :class:`VideoCreate` (aliases folded, JSON decoded)."""
    refuse_latent_mask_editing(raw)
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        name = _ALIASES.get(key, key)
        if name in _JSON_FIELDS and isinstance(value, str):
            value = _json_text(name, key, value)
        if isinstance(value, str) and value == "" and name != "prompt":
            continue  # an empty form field means "not given"
        fields[name] = value
    if isinstance(fields.get("extra_params"), dict):
        refuse_latent_mask_editing(fields["extra_params"])
    return parse_model(VideoCreate, fields)


def _json_text(name: str, key: str, text: str) -> Any:
    """The value of a JSON-text field (a multipart form sends ``extra_params`` and ``lora``
    so): empty is not given (``extra_params``: ``{}``). A ``lora`` that is not JSON at all
    (``my-style``) stays the string it is, so that :class:`~models.videos.LoraRequest`
    says what lora must be, rather than "must be valid JSON"."""
    try:
        value = loads(text, key) if text.strip() else None
    except InvalidRequest:
        if name == "lora" and not text.lstrip().startswith(("{", "[")):
            return text
        raise
    return {} if value is None and name == "extra_params" else value


_M = TypeVar("_M", bound=BaseModel)


def parse_model(cls: type[_M], fields: dict[str, Any]) -> _M:
    """Validate ``fields`` as ``cls``; the first error becomes an :class:`InvalidRequest`
    naming its parameter (``unknown_parameter`` / ``missing`` / ``invalid_value``)."""
    try:
        return cls.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        if err["type"] == "extra_forbidden":
            raise InvalidRequest(
                f"unknown parameter: {param}", param=param, code="unknown_parameter"
            ) from exc
        if err["type"] == "missing":
            raise InvalidRequest(f"{param} is required", param=param, code="missing") from exc
        raise InvalidRequest(f"{param}: {err['msg']}", param=param) from exc


def resolve(req: VideoCreate, specs: dict[str, ModelSpec], settings: Settings) -> VideoSpec:
    """Check a parsed request against the named model's spec and the server's limits:
    the job's spec (without ``reference_key``, which names the job)."""
    limits = settings.limits
    model = req.model or default_model(specs, "video")
    spec = specs.get(model)
    if spec is None:
        raise ModelNotFound(
            f"model {model!r} is not served here; GET /v1/models lists the served models",
            param="model",
        )
    if spec.modality != "video":
        raise InvalidRequest(
            f"model {model!r} makes {spec.modality}, not video: use /v1/audio/generations",
            param="model",
        )
    if spec.streaming:
        raise InvalidRequest(
            f"model {model!r} streams realtime sessions: use WS /v1/realtime/video",
            param="model",
        )

    check_prompts(req.prompt, req.negative_prompt, limits)
    width, height = _resolve_size(req, spec, settings)
    fps, num_frames = _resolve_timing(req, spec, settings)

    steps = resolve_steps(req.num_inference_steps, spec, limits)
    if not 1 <= req.n <= spec.max_outputs:
        raise InvalidRequest(f"{must_be_within('n', 1, spec.max_outputs)} for {model}", param="n")
    if req.lora is not None and not spec.supports_lora:
        raise InvalidRequest(f"model {model!r} does not support LoRA", param="lora")
    quality = resolve_quality(req.quality, spec)
    if spec.no_cfg and req.guidance_scale is not None and req.guidance_scale > 1.0:
        raise InvalidRequest(
            f"{model} runs without classifier-free guidance: guidance_scale must be at most 1",
            param="guidance_scale",
        )
    check_negative_prompt(req.negative_prompt, spec)
    options: dict[str, Any] = {}
    for name in PIPELINE_OPTIONS:
        value = getattr(req, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"{name} must be a finite number", param=name)
        if value is not None and name in spec.parameters:
            options[name] = value

    fields = job_fields(req, model, spec, limits, steps=steps, options=SamplerOptions(**options))
    if fields["seed"] + req.n > 2**63:
        raise InvalidRequest(f"seed must be below 2**63 - {req.n - 1} for n={req.n}", param="seed")
    return VideoSpec(
        **fields,
        n=req.n,
        width=width,
        height=height,
        fps=fps,
        num_frames=num_frames,
        has_audio=spec.has_audio,
        quality=quality,
    )


def resolve_quality(requested: str | None, spec: ModelSpec) -> QualityTier:
    """``quality``: "lossless" (every step in full) unless the model offers the tier."""
    if requested is None:
        return "lossless"
    if not spec.offers(requested):
        offered = ", ".join(spec.offered_tiers)
        raise InvalidRequest(
            f"model {spec.name!r} offers quality {offered}, not {requested!r}",
            param="quality",
        )
    return cast(QualityTier, requested)


def check_negative_prompt(negative_prompt: str | None, spec: ModelSpec) -> None:
    """A negative prompt acts only on a model that declares it (classifier-free guidance
    with a negative branch): for another (MiniMax-H3, guidance-distilled) it is a 400,
    not dropped. Clients send it only when the user typed one."""
    if negative_prompt and "negative_prompt" not in spec.parameters:
        raise InvalidRequest(
            f"model {spec.name!r} takes no negative_prompt (it runs without a negative "
            "guidance branch)",
            param="negative_prompt",
        )


def check_prompts(
    prompt: str, negative_prompt: str | None, limits: LimitSettings, param: str = "prompt"
) -> None:
    """The prompt (named ``param`` as the client spelled it) is not blank, and neither it
    nor the negative prompt is longer than the server allows."""
    if not prompt.strip():
        raise InvalidRequest(f"{param} must not be empty", param=param)
    if len(prompt) > limits.max_prompt_chars:
        raise InvalidRequest(
            f"{param} is longer than {limits.max_prompt_chars} characters", param=param
        )
    if negative_prompt and len(negative_prompt) > limits.max_prompt_chars:
        raise InvalidRequest(
            f"negative_prompt is longer than {limits.max_prompt_chars} characters",
            param="negative_prompt",
        )


def job_fields(
    req: VideoCreate | AudioCreate,
    model: str,
    spec: ModelSpec,
    limits: LimitSettings,
    *,
    steps: int,
    options: SamplerOptions | dict[str, Any],
) -> dict[str, Any]:
    """The fields every kind of job spec has (``models.job_specs._Spec``), resolved alike:
    a drawn seed when none was given, the timeout within the server's range, the
    ``extra_params`` checked against the model, the webhook (in that order, so is the
    first error)."""
    return {
        "model": model,
        "prompt": req.prompt,
        "seed": resolve_seed(req.seed),
        "num_inference_steps": steps,
        "timeout_s": resolve_timeout(req.timeout, limits),
        "ttl_s": resolve_ttl(req.ttl, limits),
        "negative_prompt": req.negative_prompt,
        "options": options,
        "extra": check_extra(req.extra_params, spec),
        "webhook": resolve_webhook(req.webhook_url, req.webhook_events, spec.modality),
    }


def resolve_webhook(url: str | None, events: list[str] | None, kind: str) -> JobWebhook | None:
    """``webhook_url`` and ``webhook_events`` of a create request: an absolute http(s) URL
    without credentials, and event names of the job's kind (default: all), as
    :mod:`storage.webhooks` checks them. Whether its host may be called is the guard's to
    say, before the insert (:meth:`api.jobs_service.JobService.insert`)."""
    if url is None:
        if events is not None:
            raise InvalidRequest("webhook_events needs a webhook_url", param="webhook_events")
        return None
    check_webhook_url(url, "webhook_url")
    if events is None:
        return JobWebhook(url=url)
    return JobWebhook(url=url, events=check_events(events, EVENT_TYPES[kind], "webhook_events"))


def resolve_steps(requested: int | None, spec: ModelSpec, limits: LimitSettings) -> int:
    """``num_inference_steps``: the model's default, within its and the server's range."""
    steps = spec.default_steps if requested is None else requested
    top = min(spec.max_steps, limits.max_steps)
    if not spec.min_steps <= steps <= top:
        raise InvalidRequest(
            must_be_within("num_inference_steps", spec.min_steps, top),
            param="num_inference_steps",
        )
    return steps


def resolve_seed(requested: int | None) -> int:
    """A negative or missing seed draws one (a job's, a world session's)."""
    seed = requested if requested is not None and requested >= 0 else secrets.randbelow(2**31)
    if seed >= 2**63:
        raise InvalidRequest("seed must be below 2**63", param="seed")
    return seed


def resolve_timeout(requested: float | None, limits: LimitSettings) -> float:
    timeout = requested if requested is not None else limits.default_job_timeout_s
    if not 0 < timeout <= limits.max_job_timeout_s:
        raise InvalidRequest(
            f"timeout must be between 0 and {limits.max_job_timeout_s} seconds", param="timeout"
        )
    return timeout


def resolve_ttl(requested: float | None, limits: LimitSettings) -> int | None:
    """``ttl``: whole seconds from creation, 1 to ``OMNIQ_LIMITS__MAX_TTL_S``; None when
    the create gives none (the model's default applies: ``api/queue_admission.py``)."""
    if requested is None:
        return None
    whole = math.isfinite(requested) and requested == int(requested)
    if not whole or not 1 <= requested <= limits.max_ttl_s:
        raise InvalidRequest(
            f"ttl must be a whole number of seconds between 1 and {limits.max_ttl_s}",
            param="ttl",
        )
    return int(requested)


def default_model(specs: dict[str, ModelSpec], modality: str) -> str:
    """The first served job model (not a streaming one) of ``modality``; "" if none."""
    return next((n for n, s in specs.items() if not s.streaming and s.modality == modality), "")


def _resolve_size(req: VideoCreate, spec: ModelSpec, settings: Settings) -> tuple[int, int]:
    if req.size is not None:
        m = _SIZE_RE.match(req.size)
        if not m:
            raise InvalidRequest("size must look like '832x480' (WIDTHxHEIGHT)", param="size")
        width, height = int(m.group(1)), int(m.group(2))
        param = "size"
    elif req.width is not None or req.height is not None:
        if req.width is None or req.height is None:
            missing = "height" if req.width is not None else "width"
            raise InvalidRequest("width and height must be given together", param=missing)
        width, height, param = req.width, req.height, "width"
    else:
        return spec.default_size
    max_w = min(spec.max_width, settings.limits.max_width)
    max_h = min(spec.max_height, settings.limits.max_height)
    if not (spec.min_size <= width <= max_w and spec.min_size <= height <= max_h):
        servers = [
            name
            for name, asked, mine, model in (
                ("OMNIQ_LIMITS__MAX_WIDTH", width, settings.limits.max_width, spec.max_width),
                ("OMNIQ_LIMITS__MAX_HEIGHT", height, settings.limits.max_height, spec.max_height),
            )
            if mine < model and asked > mine
        ]
        raise InvalidRequest(
            f"size {width}x{height} is outside {spec.min_size}..{max_w} x "
            f"{spec.min_size}..{max_h} for {spec.name}{server_limit(*servers)}",
            param=param,
        )
    step = spec.size_multiple
    if width % step or height % step:
        raise InvalidRequest(
            f"width and height must be multiples of {step} for {spec.name}", param=param
        )
    return width, height


def _resolve_timing(req: VideoCreate, spec: ModelSpec, settings: Settings) -> tuple[float, int]:
    fps = req.fps if req.fps is not None else float(spec.default_fps)
    if not math.isfinite(fps) or fps <= 0:
        raise InvalidRequest("fps must be a positive number", param="fps")
    if fps > spec.max_fps:
        raise InvalidRequest(f"fps must be at most {spec.max_fps}", param="fps")
    if fps < spec.min_fps:
        raise InvalidRequest(f"fps must be at least {spec.min_fps} for {spec.name}", param="fps")
    if req.num_frames is not None:
        requested, param = req.num_frames, "num_frames"
    else:
        secs = req.seconds if req.seconds is not None else spec.default_seconds
        if not math.isfinite(secs) or secs <= 0:
            raise InvalidRequest("seconds must be a positive number", param="seconds")
        if secs > settings.limits.max_seconds:
            raise InvalidRequest(
                f"seconds must be at most {settings.limits.max_seconds:g}"
                f"{server_limit('OMNIQ_LIMITS__MAX_SECONDS')}",
                param="seconds",
            )
        requested, param = max(1, round(secs * fps)), "seconds"
    if requested < 1:
        raise InvalidRequest("num_frames must be at least 1", param=param)
    if requested / fps > settings.limits.max_seconds:
        raise InvalidRequest(
            f"{requested} frames at {fps:g} fps is longer than "
            f"{settings.limits.max_seconds:g} seconds"
            f"{server_limit('OMNIQ_LIMITS__MAX_SECONDS')}",
            param=param,
        )
    num_frames = spec.snap_frames(requested)
    top = min(spec.max_frames, settings.limits.max_frames)
    if not spec.min_frames <= num_frames <= top:
        server = settings.limits.max_frames < spec.max_frames and num_frames > top
        raise InvalidRequest(
            f"{num_frames} frames is outside {spec.min_frames}..{top} for {spec.name}"
            f"{server_limit('OMNIQ_LIMITS__MAX_FRAMES') if server else ''}",
            param=param,
        )
    return fps, num_frames


def server_limit(*settings: str) -> str:
    """How an error names the server settings that set the bound it reports (none: the
    model's own)."""
    if not settings:
        return ""
    return f" (this server's {' and '.join(settings)})"


_CASTS: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_extra(extra: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """``extra_params`` checked against the keys, types, choices and ranges the model declares."""
    out: dict[str, Any] = {}
    for key, value in extra.items():
        kind = spec.extra_params.get(key)
        if kind is None:
            allowed = ", ".join(sorted(spec.extra_params)) or "none"
            raise InvalidRequest(
                f"extra_params.{key} is not an option of {spec.name} (allowed: {allowed})",
                param=f"extra_params.{key}",
            )
        if kind == "ints":
            if not (isinstance(value, list) and all(_is_int(v) for v in value)):
                raise InvalidRequest(
                    f"extra_params.{key} must be a list of integers", param=f"extra_params.{key}"
                )
            out[key] = value
            continue
        want = _CASTS[kind]
        ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise InvalidRequest(
                f"extra_params.{key} must be a {kind}", param=f"extra_params.{key}"
            )
        choices = spec.extra_choices.get(key)
        if choices is not None and value not in choices:
            raise InvalidRequest(
                f"extra_params.{key} must be one of {', '.join(choices)}",
                param=f"extra_params.{key}",
            )
        bounds = spec.extra_ranges.get(key)
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            raise InvalidRequest(
                must_be_within(f"extra_params.{key}", bounds[0], bounds[1]),
                param=f"extra_params.{key}",
            )
        out[key] = value
    return out
