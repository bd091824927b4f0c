"""Wan's image workflows (``WanImageToVideoPipeline``): which workflows a loaded
checkpoint can serve, a job's keyframes, and their latent condition, for ``WanAdapter``
(wan.py), which runs them in its own step loop.

* ``i2v``: a first frame. Wan 2.1 I2V (its transformer also takes the CLIP image
  encoder's features), Wan 2.2 I2V A14B (two transformers, no image encoder), Wan 2.2
  TI2V-5B (``expand_timesteps``: the first latent frame is the keyframe's, at timestep 0).
* ``flf2v``: a first and a last frame (``last_image``). Wan 2.1 FLF2V (its transformer
  takes both frames' image features, ``pos_embed_seq_len``, so it serves flf2v only) and
  Wan 2.2 I2V A14B.
  diffusers has no last-frame-only conditioning, and TI2V-5B ignores ``last_image``.
* ``t2v`` beside them (TI2V-5B): ``WanPipeline``'s loop over the same modules.
* ``v2v`` (wan_v2v.py) beside ``t2v`` on a one-transformer text-to-video checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from diffusers import WanImageToVideoPipeline, WanPipeline
from PIL import Image

from models.catalog import Workflow
from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.wan_v2v import SourceVideo

IMAGE_WORKFLOWS: tuple[Workflow, ...] = ("i2v", "flf2v")
# The wire field that asks for each workflow (named when a model does not serve it).
WORKFLOW_FIELDS: dict[str, str] = {
    "t2v": "input_reference",  # a model without t2v needs one
    "i2v": "input_reference",
    "flf2v": "input_references",
    "v2v": "input_reference",
}


@dataclass(frozen=True)
class Keyframes:
    """A job's keyframes as ``__call__`` takes them (``image``, ``last_image``)."""

    workflow: Workflow
    first: Image.Image
    last: Image.Image | None = None

    def latents(
        self,
        pipe: Any,
        height: int,
        width: int,
        num_frames: int,
        device: torch.device,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``__call__``'s step 5: the keyframes preprocessed to the canvas, then
        ``prepare_latents`` (the noise from ``generator``, the keyframes' VAE condition);
        (latents, condition, TI2V-5B's first-frame mask or None)."""
        processor = pipe.video_processor
        image = processor.preprocess(self.first, height=height, width=width)
        image = image.to(device, dtype=torch.float32)
        last = None
        if self.last is not None:
            last = processor.preprocess(self.last, height=height, width=width)
            last = last.to(device, dtype=torch.float32)
        channels = pipe.vae.config.z_dim
        out = pipe.prepare_latents(
            image, 1, channels, height, width, num_frames, torch.float32, device, generator,
            None, last,
        )  # fmt: skip
        if pipe.config.expand_timesteps:
            latents, condition, mask = out
            return latents, condition, mask
        latents, condition = out
        return latents, condition, None


def _image(frame: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(frame))


def keyframes_of(
    request: GenerationRequest, name: str, workflows: list[Workflow]
) -> Keyframes | SourceVideo | None:
    """The job's workflow from its keyframes (a first frame: ``i2v``; and a last one:
    ``flf2v``; none: ``t2v``, returned as None) or its one source video (``v2v``),
    refused naming the field that asked for a workflow the model does not serve."""
    refs = request.references
    if refs:
        if len(refs) != 1 or refs[0].kind != "video" or refs[0].frames is None:
            why = f"{name} takes keyframes or one source video, not references"
            raise InvalidJobInput(why, param="input_references")
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


def check_workflows(name: str, pipe: Any, workflows: list[Workflow]) -> None:
    """Refuse to serve a workflow the loaded components cannot run (``ValueError`` at
    load, naming the model): t2v on an image-to-video transformer, an image workflow on
    a text-to-video one, Wan 2.1's image features without its image encoder, flf2v where
    the transformer takes one image's features or the checkpoint ignores ``last_image``."""
    unknown = sorted(set(workflows) - {"t2v", "v2v", *IMAGE_WORKFLOWS})
    if unknown:
        raise ValueError(f"{name}: Wan serves t2v, i2v, flf2v and v2v, not {', '.join(unknown)}")
    main = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
    channels, z_dim = main.config.in_channels, pipe.vae.config.z_dim
    expand = bool(pipe.config.expand_timesteps)
    for text in {"t2v", "v2v"} & set(workflows):
        if channels != z_dim:
            raise ValueError(
                f"{name}: {text} needs a text-to-video transformer; this one takes {channels} "
                "input channels (an image-to-video checkpoint's)"
            )
    if "v2v" in workflows and (expand or pipe.transformer is None or pipe.transformer_2):
        raise ValueError(
            f"{name}: v2v runs WanVideoToVideoPipeline: one transformer, no expand_timesteps"
        )
    if not set(IMAGE_WORKFLOWS) & set(workflows):
        return
    if not isinstance(pipe, WanImageToVideoPipeline):  # (load checked the class already)
        raise ValueError(f"{name}: i2v and flf2v run WanImageToVideoPipeline")
    pipe = cast(Any, pipe)
    if not expand and channels != 2 * z_dim + pipe.vae_scale_factor_temporal:
        raise ValueError(
            f"{name}: i2v needs an image-to-video transformer ({channels} input channels "
            "is a text-to-video one's)"
        )
    image_dim = pipe.transformer.config.image_dim if pipe.transformer is not None else None
    if image_dim is not None and (pipe.image_encoder is None or pipe.image_processor is None):
        raise ValueError(f"{name}: this transformer takes image features: load image_encoder")
    pairs = image_dim is not None and pipe.transformer.config.pos_embed_seq_len is not None
    if "i2v" in workflows and pairs:
        raise ValueError(
            f"{name}: this first/last-frame transformer (pos_embed_seq_len) takes two "
            "images' features: serve flf2v"
        )
    if "flf2v" in workflows:
        if expand:
            raise ValueError(f"{name}: expand_timesteps (TI2V-5B) conditions on a first frame only")
        if image_dim is not None and not pairs:
            raise ValueError(
                f"{name}: flf2v needs a first/last-frame transformer (pos_embed_seq_len): "
                "this one takes one image's features"
            )


def text_pipeline(pipe: Any) -> WanPipeline:
    """``WanPipeline`` over the modules of an image-to-video pipeline (TI2V-5B's t2v):
    the same weights, hooks and compiled blocks, ``WanPipeline``'s own checks and noise."""
    return WanPipeline(
        tokenizer=pipe.tokenizer,
        text_encoder=pipe.text_encoder,
        vae=pipe.vae,
        scheduler=pipe.scheduler,
        transformer=pipe.transformer,
        transformer_2=pipe.transformer_2,
        boundary_ratio=pipe.config.boundary_ratio,
        expand_timesteps=pipe.config.expand_timesteps,
    )
