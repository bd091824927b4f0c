"""Wan's image workflows (``WanImageToVideoPipeline``): which workflows a loaded
checkpoint can serve and the keyframes' latent condition, for ``WanAdapter`` (wan/adapter.py),
which runs them in its own step loop (a job's keyframes: keyframes.py).

* ``i2v``: a first frame. Wan 2.1 I2V (its transformer also takes the CLIP image
  encoder's features), Wan 2.2 I2V A14B (two transformers, no image encoder), Wan 2.2
  TI2V-5B (``expand_timesteps``: the first latent frame is the keyframe's, at timestep 0).
* ``flf2v``: a first and a last frame (``last_image``). Wan 2.1 FLF2V (its transformer
  takes both frames' image features, ``pos_embed_seq_len``, so it serves flf2v only) and
  Wan 2.2 I2V A14B.
  diffusers has no last-frame-only conditioning, and TI2V-5B ignores ``last_image``.
* ``t2v`` beside them (TI2V-5B): ``WanPipeline``'s loop over the same modules.
* ``v2v`` (wan/v2v.py) beside ``t2v`` on a one-transformer text-to-video checkpoint.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from diffusers import WanImageToVideoPipeline, WanPipeline

from models.catalog import Workflow
from workers.pipelines.diffusers.shared.keyframes import Keyframes, pipeline_over

IMAGE_WORKFLOWS: tuple[Workflow, ...] = ("i2v", "flf2v")


def keyframe_latents(
    pipe: Any,
    keys: Keyframes,
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
    image = processor.preprocess(keys.first, height=height, width=width)
    image = image.to(device, dtype=torch.float32)
    last = None
    if keys.last is not None:
        last = processor.preprocess(keys.last, height=height, width=width)
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
    return pipeline_over(
        WanPipeline,
        pipe,
        pipe.scheduler,
        transformer_2=pipe.transformer_2,
        boundary_ratio=pipe.config.boundary_ratio,
        expand_timesteps=pipe.config.expand_timesteps,
    )
