"""A video job's keyframes or source clip, as the diffusers video families (Wan, LTX,
LTX-2, CogVideoX) read them off a request, before any family's own conditioning:

* which workflow the inputs ask for: none ``t2v``, a first frame ``i2v``, a first and a
  last ``flf2v``, one source video ``v2v`` (:func:`keyframes_of`), refused naming the
  wire field that asked for a workflow the entry does not serve;
* the keyframes as the PIL images ``__call__`` takes (``image``, ``last_image``; LTX's
  and LTX-2's conditions), the source clip's frames as its ``video``;
* the inputs of a ``v2v`` whose ``strength`` is the share of the schedule run
  (``WanVideoToVideoPipeline`` / ``CogVideoXVideoToVideoPipeline``: :func:`v2v_inputs`),
  and a workflow's pipeline over the loaded modules (:func:`pipeline_over`; an image
  entry's ``t2v`` jobs: :func:`text_over_image`);
* the grey inputs of a warm-up of each workflow.

What each family makes of them (latents, masks, conditions) stays in its own modules:
wan/i2v.py, wan/v2v.py, ltx/workflows.py, ltx/condition.py, ltx2/i2v.py, cogvideox/workflows.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from PIL import Image

from models.catalog import Workflow
from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest, MediaReference
from workers.pipelines.diffusers.shared.common import call_default

# The workflows a job asks for with files (keyframes or a source video).
REFERENCE_WORKFLOWS: tuple[Workflow, ...] = ("i2v", "flf2v", "v2v")
# The wire field that asks for each workflow (named when a model does not serve it).
WORKFLOW_FIELDS: dict[Workflow, str] = {
    "t2v": "input_reference",  # a model without t2v needs one
    "i2v": "input_reference",
    "flf2v": "input_references",
    "v2v": "input_reference",
}

P = TypeVar("P")


@dataclass(frozen=True)
class Keyframes:
    """A job's keyframes as ``__call__`` takes them (``image``, ``last_image``)."""

    workflow: Workflow
    first: Image.Image
    last: Image.Image | None = None


@dataclass(frozen=True)
class SourceVideo:
    """A v2v job's source clip: uint8 T×H×W×3 frames at the client's size."""

    frames: np.ndarray

    def images(self, count: int) -> list[Image.Image]:
        """Its first ``count`` frames as ``__call__``'s ``video`` takes them."""
        return [_image(frame) for frame in self.frames[:count]]


def _image(frame: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(frame))


def takes_references(workflows: list[Workflow]) -> bool:
    """Whether an entry serving ``workflows`` takes input files (keyframes or a clip)."""
    return bool(set(REFERENCE_WORKFLOWS) & set(workflows))


def keyframes_of(
    request: GenerationRequest, name: str, workflows: list[Workflow]
) -> Keyframes | SourceVideo | None:
    """The job's workflow from its keyframes (a first frame: ``i2v``; and a last one:
    ``flf2v``; none: ``t2v``, returned as None) or its one source video (``v2v``),
    refused naming the field that asked for a workflow the model does not serve. A last
    frame alone names no workflow (the API refuses ``frame_indices`` ``[-1]`` first)."""
    refs = request.references
    if refs:
        if len(refs) != 1 or refs[0].kind != "video" or refs[0].frames is None:
            what = "keyframes or one source video" if "v2v" in workflows else "keyframes"
            raise InvalidJobInput(f"{name} takes {what}, not references", param="input_references")
        if "v2v" not in workflows:
            served = ", ".join(workflows)
            raise InvalidJobInput(f"{name} serves {served}, not v2v", param="input_reference")
        return SourceVideo(refs[0].frames)
    first, last = request.reference_image, request.last_image
    if first is None and last is not None:
        raise InvalidJobInput(
            f"{name} anchors a last frame only beside a first one",
            param="extra_params.frame_indices",
        )
    workflow: Workflow = "t2v" if first is None else "i2v" if last is None else "flf2v"
    if workflow not in workflows:
        served = ", ".join(workflows)
        raise InvalidJobInput(
            f"{name} serves {served}, not {workflow}", param=WORKFLOW_FIELDS[workflow]
        )
    if first is None:
        return None
    return Keyframes(workflow, _image(first), None if last is None else _image(last))


def job_workflow(keys: Keyframes | SourceVideo | None) -> Workflow:
    """The workflow :func:`keyframes_of`'s answer runs."""
    if keys is None:
        return "t2v"
    return "v2v" if isinstance(keys, SourceVideo) else keys.workflow


def v2v_inputs(
    view: Any, request: GenerationRequest, source: SourceVideo
) -> tuple[list[Image.Image], float]:
    """(the source's first ``num_frames`` frames, ``strength``: the request's, else
    ``__call__``'s default) as the ``__call__`` of ``view`` (``WanVideoToVideoPipeline``,
    ``CogVideoXVideoToVideoPipeline``: ``strength`` is the share of the steps run) takes
    them; a clip shorter than the job, or a strength that leaves no step, is refused."""
    frames = source.frames
    if len(frames) < request.num_frames:
        raise InvalidJobInput(
            f"input_reference has {len(frames)} frames; the job makes {request.num_frames}",
            param="input_reference",
        )
    strength = float(request.extra.get("strength", call_default(view, "strength")))
    if int(request.num_inference_steps * strength) < 1:
        raise InvalidJobInput(
            f"strength {strength:g} runs none of {request.num_inference_steps} steps",
            param="extra_params.strength",
        )
    return source.images(request.num_frames), strength


def pipeline_over(cls: Callable[..., P], pipe: Any, scheduler: Any, **config: Any) -> P:
    """Pipeline class ``cls`` (another workflow's) over ``pipe``'s tokenizer, text encoder,
    VAE and transformer with ``scheduler`` (and ``config``: more components or
    arguments): the same weights, hooks and compiled blocks, ``cls``'s own checks, noise
    and ``__call__`` steps."""
    return cls(
        tokenizer=pipe.tokenizer,
        text_encoder=pipe.text_encoder,
        vae=pipe.vae,
        transformer=pipe.transformer,
        scheduler=scheduler,
        **config,
    )


def text_over_image(
    pipe: Any, workflows: list[Workflow], image_class: type, text_pipeline: Callable[[Any], P]
) -> P | None:
    """What an entry's ``t2v`` jobs run where it loads its family's image-to-video
    pipeline ``image_class`` (Wan's TI2V-5B, LTX-Video's i2v checkpoints):
    ``text_pipeline(pipe)``, the family's text-to-video pipeline over the loaded modules;
    None where ``pipe`` runs them itself or the entry serves no ``t2v``."""
    if "t2v" not in workflows or not isinstance(pipe, image_class):
        return None
    return text_pipeline(pipe)


def warm_up_inputs(request: GenerationRequest, workflow: Workflow) -> GenerationRequest:
    """``request`` (a warm-up's) with grey inputs asking for ``workflow``: a first frame
    (``i2v``), a first and a last (``flf2v``), a clip of the job's length (``v2v``)."""
    grey = np.full((request.height, request.width, 3), 128, dtype=np.uint8)
    if workflow in ("i2v", "flf2v"):
        request.reference_image = grey
        request.last_image = grey if workflow == "flf2v" else None
    elif workflow == "v2v":
        clip = np.repeat(grey[None], request.num_frames, axis=0)
        request.references = [MediaReference(kind="video", frames=clip, fps=request.fps)]
    return request
