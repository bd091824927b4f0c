"""The resolution of a ``WS /v1/realtime/video`` ``session.start`` into the rollout it
asks for (pure): :func:`resolve_start` validates the message against the wire schema
(:class:`~models.realtime_video.SessionStart`), fills what it leaves out from
:class:`StartRules` and caps it with the named model's :class:`StartLimits`; a refusal is
a :class:`~models.errors.StartRejected` with the ``error.code`` and ``param`` to send.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from models.catalog import ModelSpec
from models.errors import StartRejected, must_be_within
from models.realtime_video import SessionStart, VideoConfig, VideoErrorCode, describe_error
from models.realtime_video_chunks import ChunkLattice, is_camera_block


@dataclass(frozen=True)
class StartLimits:
    """What one served model (``ModelSpec``) and the server allow a session to ask for,
    and the model's own rules: its chunk and size lattices, its defaults (None: the
    server's, :class:`StartRules`), and whether it takes camera actions."""

    max_width: int = 1920
    max_height: int = 1920
    max_frames: int | None = None
    max_fps: float | None = None
    lattice: ChunkLattice = field(default_factory=ChunkLattice)
    size_multiple: int = 16
    default_width: int | None = None
    default_height: int | None = None
    default_fps: float | None = None
    default_num_frames: int | None = None
    camera_control: bool = True
    # denoise steps of each chunk (``num_inference_steps``)
    min_steps: int = 1
    max_steps: int = 200
    default_steps: int | None = None

    @classmethod
    def of(cls, spec: ModelSpec) -> StartLimits:
        """The rules of a world model's ``ModelSpec``: lattices, caps and defaults (its
        ``default_seconds`` at its ``default_fps``, rounded down to whole chunks)."""
        lattice = ChunkLattice(first=spec.frame_offset, every=spec.frame_multiple)
        frames = round(spec.default_seconds * spec.default_fps)
        chunks = max(1, lattice.chunks_for_frames(frames))
        width, height = spec.default_size
        return cls(
            max_width=spec.max_width,
            max_height=spec.max_height,
            max_frames=spec.max_frames,
            max_fps=spec.max_fps,
            lattice=lattice,
            size_multiple=spec.size_multiple,
            default_width=width,
            default_height=height,
            default_fps=float(spec.default_fps),
            default_num_frames=lattice.frames_for_chunks(chunks),
            camera_control=spec.camera_control,
            min_steps=spec.min_steps,
            max_steps=spec.max_steps,
            default_steps=spec.default_steps,
        )


@dataclass(frozen=True)
class StartRules:
    """What :func:`resolve_start` resolves a ``session.start`` against: the defaults of
    what it leaves out, the models it may name, and the caps."""

    default_width: int = 832
    default_height: int = 480
    default_fps: float = 16.0
    default_num_frames: int = 81
    default_steps: int = 4
    max_chunks: int | None = None
    models: Collection[str] | None = None  # accepted ``model`` values; None: any
    # the model a start without ``model`` gets, and each model's caps (``max_frames``…)
    default_model: str | None = None
    model_limits: Mapping[str, StartLimits] = field(default_factory=dict)
    # the longest rollout (``num_frames / fps``) the server serves; None: no limit
    max_session_s: float | None = None


def resolve_start(message: dict[str, Any], rules: StartRules) -> tuple[SessionStart, VideoConfig]:
    """Validate a ``session.start`` and resolve its rollout; raises ``StartRejected``.

    Explicit fields win over ``size`` / ``seconds``, which win over the defaults;
    ``num_frames`` is rounded down to whole chunks; ``rules.model_limits`` of
    ``start.model`` (or ``rules.default_model``) cap it.
    """
    start = _validated(message)
    model, limits = _model_limits(start, rules)
    width, height = _size(start, model, limits, rules)
    fps = _fps(start, limits, rules)
    chunks = _chunks(start, fps, limits, rules)
    _check_camera_script(start, chunks, model, limits)
    _check_image_reference(start)
    steps = _steps(start, model, limits, rules)
    config = VideoConfig(
        width=width,
        height=height,
        fps=fps,
        num_frames=limits.lattice.frames_for_chunks(chunks),
        chunks=chunks,
        num_inference_steps=steps,
    )
    return start, config


def _validated(message: dict[str, Any]) -> SessionStart:
    """``message`` against the wire schema; a refusal names the first invalid field,
    with the ``error.code`` of what it is (format, camera script, image, size, length)."""
    C = VideoErrorCode
    try:
        return SessionStart.model_validate(message)
    except ValidationError as exc:
        loc, code = exc.errors()[0]["loc"], C.INVALID_REQUEST
        if loc[:1] == ("format",):
            code = C.UNSUPPORTED_FORMAT
        elif loc[:2] == ("extra_params", "camera_action_script"):
            code = C.INVALID_CAMERA_ACTION_SCRIPT
        elif loc[:1] == ("image_reference",):
            code = C.INVALID_IMAGE_REFERENCE
        elif loc[:1] in (("width",), ("height",), ("size",)):
            code = C.INVALID_SIZE
        elif loc[:1] in (("num_frames",), ("seconds",)):
            code = C.INVALID_NUM_FRAMES
        param = ".".join(str(part) for part in loc) or None
        detail = f"Invalid session.start: {describe_error(exc)}"
        raise StartRejected(code, detail, param) from None


def _model_limits(start: SessionStart, rules: StartRules) -> tuple[str | None, StartLimits]:
    """The model the start names (or the server's default) and its limits; refused when
    the server serves no world model, or not the one named."""
    if rules.models is not None and not rules.models:  # the server serves none
        detail = (
            "this server serves no world model (a streaming video model, such as "
            "reference/world), so /v1/realtime/video has nothing to run"
        )
        raise StartRejected(VideoErrorCode.MODEL_NOT_FOUND, detail, "model")
    if rules.models is not None and start.model is not None and start.model not in rules.models:
        detail = f"unknown model {start.model!r}"
        raise StartRejected(VideoErrorCode.MODEL_NOT_FOUND, detail, "model")
    model = start.model or rules.default_model
    return model, rules.model_limits.get(model or "", StartLimits())


def _size(
    start: SessionStart, model: str | None, limits: StartLimits, rules: StartRules
) -> tuple[int, int]:
    """Width and height: ``width`` / ``height``, else ``size``, else the defaults; in
    multiples of the model's ``size_multiple`` and within its largest."""
    C = VideoErrorCode
    width, height = start.width, start.height
    size_param = "size"
    if start.size is not None and (width is None or height is None):
        w, sep, h = start.size.lower().partition("x")
        if not (sep and _ascii_digits(w) and _ascii_digits(h)) or len(w) > 5 or len(h) > 5:
            raise StartRejected(C.INVALID_SIZE, "size must be WIDTHxHEIGHT", "size")
        width, height = int(w) if width is None else width, int(h) if height is None else height
    else:
        size_param = "width" if start.width is not None else "height"
    width = _first(width, limits.default_width, rules.default_width)
    height = _first(height, limits.default_height, rules.default_height)
    multiple = limits.size_multiple
    if width <= 0 or height <= 0 or width % multiple or height % multiple:
        detail = f"width and height must be positive multiples of {multiple}"
        raise StartRejected(C.INVALID_SIZE, detail, size_param)
    if width > limits.max_width or height > limits.max_height:
        detail = f"{model} renders at most {limits.max_width}x{limits.max_height}"
        raise StartRejected(C.INVALID_SIZE, detail, size_param)
    return width, height


def _fps(start: SessionStart, limits: StartLimits, rules: StartRules) -> float:
    fps = start.fps or limits.default_fps or rules.default_fps
    if limits.max_fps is not None and fps > limits.max_fps:
        detail = f"fps must be at most {limits.max_fps:g}"
        raise StartRejected(VideoErrorCode.INVALID_REQUEST, detail, "fps")
    return fps


def _chunks(start: SessionStart, fps: float, limits: StartLimits, rules: StartRules) -> int:
    """The rollout's chunks: ``num_frames``, else ``seconds`` at ``fps``, else the
    defaults, rounded down to whole chunks; at least one, and within every cap."""
    num_frames, frames_param = start.num_frames, "num_frames"
    if num_frames is None and start.seconds is not None:
        num_frames, frames_param = round(start.seconds * fps), "seconds"
    num_frames = _first(num_frames, limits.default_num_frames, rules.default_num_frames)
    lattice = limits.lattice
    chunks = lattice.chunks_for_frames(num_frames)
    if chunks < 1:
        detail = f"num_frames must be at least {lattice.first} (one chunk)"
        raise StartRejected(VideoErrorCode.INVALID_NUM_FRAMES, detail, frames_param)
    top = _max_chunks(rules.max_chunks, limits.max_frames, rules.max_session_s, fps, lattice)
    if top is not None and chunks > top:
        most = lattice.frames_for_chunks(top) if top else 0
        detail = f"num_frames must be at most {most} at {fps:g} fps"
        detail += " (the model's max_frames and the server's session time limit)"
        raise StartRejected(VideoErrorCode.INVALID_NUM_FRAMES, detail, frames_param)
    return chunks


def _check_camera_script(
    start: SessionStart, chunks: int, model: str | None, limits: StartLimits
) -> None:
    """A ``camera_action_script``: only for a model with camera conditioning, one block
    of w/a/s/d lists per chunk."""
    script = start.extra_params.camera_action_script
    if script is None:
        return
    code = VideoErrorCode.INVALID_CAMERA_ACTION_SCRIPT
    script_param = "extra_params.camera_action_script"
    if not limits.camera_control:
        detail = f"{model} takes no camera_action_script: it has no camera conditioning"
        raise StartRejected(code, detail, script_param)
    if len(script) != chunks:
        detail = f"camera_action_script needs one entry per chunk ({chunks}), got {len(script)}"
        raise StartRejected(code, detail, script_param)
    for index, actions in enumerate(script):
        if not is_camera_block(actions):
            detail = f"camera_action_script[{index}] must be three lists of w/a/s/d"
            raise StartRejected(code, detail, f"{script_param}.{index}")


def _check_image_reference(start: SessionStart) -> None:
    image = start.image_reference
    if image is not None and not image.image_url.startswith(("http://", "https://", "data:")):
        detail = "image_url must be an http(s) or data: URL"
        code = VideoErrorCode.INVALID_IMAGE_REFERENCE
        raise StartRejected(code, detail, "image_reference.image_url")


def _steps(start: SessionStart, model: str | None, limits: StartLimits, rules: StartRules) -> int:
    steps = _first(start.num_inference_steps, limits.default_steps, rules.default_steps)
    if not limits.min_steps <= steps <= limits.max_steps:
        within = must_be_within("num_inference_steps", limits.min_steps, limits.max_steps)
        detail = f"{within} for {model}, got {steps}"
        raise StartRejected(VideoErrorCode.INVALID_REQUEST, detail, "num_inference_steps")
    return steps


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _first(*values: Any) -> Any:
    """The first of ``values`` that is not None (the last is the server's default)."""
    return next((v for v in values if v is not None), values[-1])


def _max_chunks(
    max_chunks: int | None,
    max_frames: int | None,
    max_session_s: float | None,
    fps: float,
    lattice: ChunkLattice,
) -> int | None:
    """The most chunks allowed by every cap given (None: no cap)."""
    caps = [] if max_chunks is None else [max_chunks]
    for frames in (max_frames, None if max_session_s is None else int(max_session_s * fps)):
        if frames is not None:
            caps.append(lattice.chunks_for_frames(frames))
    return min(caps) if caps else None
