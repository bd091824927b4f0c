"""Keyframes and omni-references of a workflow model (MiniMax-H3), checked before anything
is stored.

A model that declares ``workflows`` takes its inputs as vLLM-Omni's ComfyUI node sends
them: ``input_reference`` (one keyframe) and ``input_references`` (repeated file parts, in
order), with ``extra_params``:

* ``task``: ``t2va`` (no files), ``fl2va`` (keyframes) or ``ref2va`` (references). Without
  it: no files is ``t2va``; ``frame_indices`` or a model that serves ``fl2va`` makes
  ``fl2va``; else ``ref2va``.
* ``frame_indices``: where each keyframe is anchored, ``[0]``, ``[-1]`` or ``[0, -1]``
  (default: ``[0]`` for one keyframe, ``[0, -1]`` for two).
* ``aspect_ratio``: a named ratio that sets the canvas (:func:`canvas_size`).

A video model whose ``workflows`` are ``t2v``, ``i2v`` and/or ``flf2v`` (Wan) takes the
same fields: no file is ``t2v``; one keyframe at ``[0]`` is ``i2v``; two at ``[0, -1]``
are ``flf2v`` (:func:`keyframe_plan`). Its keyframes are fitted to the job's canvas as a
plain ``input_reference`` is (scaled to cover it, centre-cropped).

Each file is sniffed by content: an image (PNG, JPEG, WebP), a video (with its
soundtrack, if any) or an audio clip. References obey the model's limits (9 images, 3
videos, 3 audio clips, 12 in all, audio never alone; clips no longer than the model's
longest video); keyframes are images. Every refusal is a 400 naming its field.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Literal

import av
from PIL import Image

from api.inputs import reference_frame_png, sniff
from models.catalog import VIDEO_WORKFLOWS, ModelSpec, Workflow
from models.errors import InvalidRequest
from models.job_specs import VideoSpec
from models.videos import VideoCreate
from storage.settings import LimitSettings

RefKind = Literal["image", "video", "audio"]
MAX_BY_KIND: dict[RefKind, int] = {"image": 9, "video": 3, "audio": 3}
MAX_REFERENCES = 12
KEYFRAME_INDICES = ([0], [-1], [0, -1])
MIN_ASPECT, MAX_ASPECT = 1 / 4, 4.0
# Named ratios → (width, height) parts.
RATIOS: dict[str, tuple[int, int]] = {
    "21:9": (21, 9),
    "16:9": (16, 9),
    "4:3": (4, 3),
    "1:1": (1, 1),
    "3:4": (3, 4),
    "9:16": (9, 16),
}


@dataclass(frozen=True)
class Reference:
    """One checked input: what it is, the bytes to store (PNG for an image, the file as
    sent for a clip), its content type and, for a keyframe, its anchor (0 or -1)."""

    kind: RefKind
    data: bytes
    content_type: str
    frame_index: int | None = None
    aspect: tuple[int, int] | None = None  # an image's (width, height)


@dataclass(frozen=True)
class Plan:
    workflow: Workflow
    references: list[Reference]


def canvas_size(
    aspect_w: float, aspect_h: float, short_edge: int, max_pixels: int, multiple: int
) -> tuple[int, int]:
    """(width, height) of the canvas for an aspect ratio, as MiniMax-H3 resolves it: the
    short edge at ``short_edge``, the area capped at ``max_pixels``, both sides rounded to
    ``multiple`` (diffusers' ``resolve_canvas_size``)."""
    ratio = aspect_w / aspect_h
    width, height = (
        (short_edge * ratio, float(short_edge))
        if ratio >= 1
        else (
            float(short_edge),
            short_edge / ratio,
        )
    )
    if width * height > max_pixels:
        scale = (max_pixels / (width * height)) ** 0.5
        width, height = width * scale, height * scale
    return (
        max(multiple, round(width / multiple) * multiple),
        max(multiple, round(height / multiple) * multiple),
    )


def workflow_of(spec: ModelSpec, extra: dict[str, Any], files: int) -> Workflow:
    """The workflow a request asks for (see the module doc), refused when the model does
    not serve it."""
    task = extra.get("task")
    if task is None:
        if files == 0:
            task = "t2va"
        elif "frame_indices" in extra or "fl2va" in spec.workflows:
            task = "fl2va"
        else:
            task = "ref2va"
    if task not in spec.workflows:
        param = "extra_params.task" if "task" in extra else "input_references"
        served = ", ".join(spec.workflows)
        raise InvalidRequest(f"{spec.name} serves {served}, not {task}", param=param)
    if task == "t2va" and files:
        raise InvalidRequest("t2va takes no input references", param="input_references")
    if task != "t2va" and not files:
        raise InvalidRequest(f"{task} needs input references", param="input_references")
    return task


def plan(
    spec: ModelSpec,
    extra: dict[str, Any],
    files: list[bytes],
    limits: LimitSettings,
    size: tuple[int, int] | None = None,
) -> Plan:
    """Check every file against the workflow and the model's limits; a video model's
    keyframes (:func:`keyframe_plan`) are fitted to ``size`` (width, height)."""
    if _keyframes_only(spec):
        if size is None:
            raise ValueError("a video model's keyframes need the job's size")
        return keyframe_plan(spec, extra, files, limits, size)
    workflow = workflow_of(spec, extra, len(files))
    longest = spec.max_frames / spec.default_fps
    refs = [
        inspect(data, limits, longest, f"input_references[{i}]") for i, data in enumerate(files)
    ]
    if workflow == "fl2va":
        return Plan(workflow, _keyframes(refs, extra.get("frame_indices")))
    if "frame_indices" in extra:
        raise InvalidRequest(
            "frame_indices is for fl2va keyframes", param="extra_params.frame_indices"
        )
    _check_counts(refs)
    return Plan(workflow, refs)


def keyframe_plan(
    spec: ModelSpec,
    extra: dict[str, Any],
    files: list[bytes],
    limits: LimitSettings,
    size: tuple[int, int],
) -> Plan:
    """A video model's keyframes (:func:`keyframe_workflow`), each stored as a PNG of the
    job's size (cover, centre crop, as a plain ``input_reference``); or, for a model that
    serves ``v2v``, one video file without ``frame_indices``: its source video, checked
    as a reference clip is and stored as sent."""
    if _source_video(spec, extra, files):
        keyframe_workflow(spec, extra, len(files), video=True)
        longest = spec.max_frames / spec.default_fps
        source = inspect(files[0], limits, longest, "input_reference")
        if source.kind != "video":
            raise InvalidRequest("input_reference has no video stream", param="input_reference")
        return Plan("v2v", [source])
    workflow, indices = keyframe_workflow(spec, extra, len(files))
    width, height = size
    refs = [
        Reference(
            "image",
            reference_frame_png(data, width, height, limits, f"input_references[{i}]"),
            "image/png",
            index,
            (width, height),
        )
        for i, (data, index) in enumerate(zip(files, indices, strict=True))
    ]
    return Plan(workflow, refs)


def _source_video(spec: ModelSpec, extra: dict[str, Any], files: list[bytes]) -> bool:
    """One video file without ``frame_indices``, sent to a model that serves ``v2v``."""
    one = len(files) == 1 and "frame_indices" not in extra
    return one and "v2v" in spec.workflows and sniff(files[0]) == "video/mp4"


def keyframe_workflow(
    spec: ModelSpec, extra: dict[str, Any], files: int, video: bool = False
) -> tuple[Workflow, list[int]]:
    """A video model's workflow and keyframe anchors from the count of its files: none is
    ``t2v``, ``[0]`` is ``i2v``, ``[0, -1]`` is ``flf2v`` (``frame_indices`` defaults to
    ``[0]`` for one file and ``[0, -1]`` for two). diffusers' Wan pipelines anchor a last
    frame only beside a first one, so ``[-1]`` alone is refused naming
    ``extra_params.frame_indices``; a workflow the model does not serve names the field
    that asked for it. ``video``: the one file is a source video (``v2v``), and only
    ``v2v`` takes ``extra_params.strength``."""
    indices = extra.get("frame_indices")
    served = ", ".join(spec.workflows)
    if video:
        if extra.get("strength", 1.0) <= 0:  # no family runs a v2v job of strength 0
            raise InvalidRequest(
                "strength must be above 0 (0 would keep nothing of the job)",
                param="extra_params.strength",
            )
        return "v2v", []
    if "strength" in extra:
        raise InvalidRequest(
            "strength is v2v's: send one source video (an MP4 input_reference)",
            param="extra_params.strength",
        )
    if not files:
        if indices is not None:
            raise InvalidRequest(
                "frame_indices places keyframes, and none was sent",
                param="extra_params.frame_indices",
            )
        if "t2v" not in spec.workflows:
            raise InvalidRequest(
                f"model {spec.name!r} serves {served}: it needs an input_reference",
                param="input_reference",
            )
        return "t2v", []
    param = "input_reference" if files == 1 else "input_references"
    if files > 2:
        raise InvalidRequest(f"{spec.name} takes one or two keyframes ({files} sent)", param=param)
    if indices is None:
        indices = [0] if files == 1 else [0, -1]
    if indices not in KEYFRAME_INDICES or len(indices) != files:
        raise InvalidRequest(
            f"frame_indices must be [0] or [0, -1], one per keyframe ({files} sent)",
            param="extra_params.frame_indices",
        )
    if indices == [-1]:
        raise InvalidRequest(
            f"{spec.name} anchors a last frame only beside a first one: send [0, -1]",
            param="extra_params.frame_indices",
        )
    workflow: Workflow = "i2v" if indices == [0] else "flf2v"
    if workflow not in spec.workflows:
        what = "an input_reference" if workflow == "i2v" else "a first and a last frame"
        raise InvalidRequest(
            f"model {spec.name!r} does not take {what} (it serves {served})", param=param
        )
    return workflow, list(indices)


def check_workflow(spec: ModelSpec, extra: dict[str, Any], files: int) -> None:
    """Refuse the request's workflow for ``files`` inputs before any is fetched or read (a
    model that serves ``v2v`` is checked once its one file is read: it may be a video)."""
    if _keyframes_only(spec):
        if files == 1 and "v2v" in spec.workflows and "frame_indices" not in extra:
            return
        keyframe_workflow(spec, extra, files)
    else:
        workflow_of(spec, extra, files)


def _keyframes_only(spec: ModelSpec) -> bool:
    """A video model's workflows (Wan): keyframes at 0 and -1, no references."""
    return bool(spec.workflows) and set(spec.workflows) <= set(VIDEO_WORKFLOWS)


def _keyframes(refs: list[Reference], indices: list[int] | None) -> list[Reference]:
    if len(refs) > 2:
        raise InvalidRequest("fl2va takes one or two keyframes", param="input_references")
    for i, ref in enumerate(refs):
        if ref.kind != "image":
            raise InvalidRequest("a keyframe must be an image", param=f"input_references[{i}]")
    if indices is None:
        indices = [0] if len(refs) == 1 else [0, -1]
    if indices not in KEYFRAME_INDICES or len(indices) != len(refs):
        raise InvalidRequest(
            f"frame_indices must be [0], [-1] or [0, -1], one per keyframe ({len(refs)} sent)",
            param="extra_params.frame_indices",
        )
    return [
        Reference(r.kind, r.data, r.content_type, index, r.aspect)
        for r, index in zip(refs, indices, strict=True)
    ]


def _check_counts(refs: list[Reference]) -> None:
    if len(refs) > MAX_REFERENCES:
        raise InvalidRequest(
            f"at most {MAX_REFERENCES} references in all ({len(refs)} sent)",
            param="input_references",
        )
    for kind, cap in MAX_BY_KIND.items():
        count = sum(1 for r in refs if r.kind == kind)
        if count > cap:
            raise InvalidRequest(
                f"at most {cap} {kind} references ({count} sent)", param="input_references"
            )
    if refs and all(r.kind == "audio" for r in refs):
        raise InvalidRequest(
            "audio references need an image or a video beside them", param="input_references"
        )


def inspect(data: bytes, limits: LimitSettings, longest_s: float, param: str) -> Reference:
    """Sniff and decode one file: an image (stored as PNG), or a video or audio clip
    (stored as sent, after its streams and length were checked)."""
    image = _image(data, limits, param)
    if image is not None:
        return image
    try:
        with av.open(io.BytesIO(data)) as container:
            has_video = bool(container.streams.video)
            has_audio = bool(container.streams.audio)
            seconds = _seconds(container)
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise InvalidRequest(
            f"{param} is not an image, video or audio file we can read", param=param
        ) from exc
    if not (has_video or has_audio):
        raise InvalidRequest(f"{param} has no video or audio stream", param=param)
    cap = min(longest_s, limits.max_reference_seconds)
    if seconds > cap:
        raise InvalidRequest(f"{param} lasts {seconds:.1f} s, longer than {cap:g} s", param=param)
    if has_video:
        return Reference("video", data, "video/mp4")
    return Reference("audio", data, "application/octet-stream")


def _image(data: bytes, limits: LimitSettings, param: str) -> Reference | None:
    try:
        img = Image.open(io.BytesIO(data))
    except (OSError, Image.DecompressionBombError):
        return None
    with img:
        if img.format not in ("PNG", "JPEG", "WEBP"):
            return None
        if img.width * img.height > limits.max_reference_pixels:
            raise InvalidRequest(f"{param} has too many pixels", param=param)
        try:
            out = io.BytesIO()
            img.convert("RGB").save(out, format="PNG")
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"{param} is not a readable image", param=param) from exc
        return Reference("image", out.getvalue(), "image/png", aspect=(img.width, img.height))


def _seconds(container: Any) -> float:
    if container.duration is not None:
        return float(container.duration) / av.time_base
    stream = (container.streams.video or container.streams.audio)[0]
    if stream.duration is None or stream.time_base is None:
        return 0.0
    return float(stream.duration * stream.time_base)


def with_canvas(spec: VideoSpec, body: VideoCreate, model: ModelSpec, plan: Plan) -> VideoSpec:
    """The job's canvas: a named ``aspect_ratio``, else (fl2va without a size) the first
    keyframe's own aspect, resolved with the model's ``canvas_short_edge`` and
    ``canvas_max_pixels``; an explicit size must agree with it."""
    if model.canvas_short_edge is None or model.canvas_max_pixels is None:
        return spec
    explicit = body.size is not None or body.width is not None or body.height is not None
    named = spec.extra.get("aspect_ratio")
    param = "extra_params.aspect_ratio"
    if named is not None:
        aspect = RATIOS[named]
    elif plan.workflow == "fl2va" and not explicit and plan.references[0].aspect is not None:
        aspect, param = plan.references[0].aspect, "input_references[0]"
    else:
        return spec
    if not MIN_ASPECT <= aspect[0] / aspect[1] <= MAX_ASPECT:
        raise InvalidRequest("the aspect ratio must be between 1:4 and 4:1", param=param)
    width, height = canvas_size(
        *aspect, model.canvas_short_edge, model.canvas_max_pixels, model.size_multiple
    )
    if explicit and (spec.width, spec.height) != (width, height):
        raise InvalidRequest(
            f"size {spec.width}x{spec.height} does not match aspect_ratio {named} "
            f"({width}x{height} on this model); send one of them",
            param="size",
        )
    return spec.model_copy(update={"width": width, "height": height})
