"""CogVideoX's image and video workflows: which workflows a loaded checkpoint can serve,
and what ``__call__`` of ``CogVideoXImageToVideoPipeline`` / ``CogVideoXVideoToVideoPipeline``
does before its loop that ``CogVideoXPipeline``'s does not, for ``CogVideoXAdapter``
(cogvideox/adapter.py), which runs all three in its own step loop.

* ``i2v``: a first frame (``image``). CogVideoX-5b-I2V and CogVideoX 1.5 5B I2V: the
  image's VAE latents, padded with zero frames to the video's length, are concatenated
  to the noisy latents on the channels (the transformer takes twice the VAE's channels);
  1.5 adds the ``ofs`` embedding and pads latent frames to a multiple of ``patch_size_t``.
* ``v2v``: a source video and ``strength`` on a text-to-video checkpoint: the source's
  latents noised to the first timestep the strength leaves, then the t2v loop.
* diffusers has no first/last-frame CogVideoX pipeline: ``flf2v`` is refused at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers import CogVideoXVideoToVideoPipeline
from diffusers.pipelines.cogvideo.pipeline_cogvideox import retrieve_timesteps
from PIL import Image

from models.catalog import Workflow
from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.shared.keyframes import SourceVideo, pipeline_over, v2v_inputs

SERVED: tuple[Workflow, ...] = ("t2v", "i2v", "v2v")


@dataclass(frozen=True)
class Start:
    """What ``__call__``'s steps 4-5 leave its loop: the (strength-cut) schedule, the
    initial latents, 1.5's padding latent frames and, for ``i2v``, the image's latents."""

    timesteps: torch.Tensor
    num_inference_steps: int
    latents: torch.Tensor
    additional_frames: int = 0
    image_latents: torch.Tensor | None = None


def check_names(name: str, workflows: list[Workflow]) -> None:
    """Refuse, before any weight loads, workflows no CogVideoX pipeline runs (``flf2v``
    and the workflow-model tasks) and ``i2v`` beside another workflow (an image-to-video
    transformer runs nothing else)."""
    if "flf2v" in workflows:
        raise ValueError(
            f"{name}: diffusers has no first/last-frame CogVideoX pipeline (flf2v); "
            "CogVideoX serves t2v, i2v and v2v"
        )
    unknown = sorted(set(workflows) - set(SERVED))
    if unknown:
        raise ValueError(f"{name}: CogVideoX serves t2v, i2v and v2v, not {', '.join(unknown)}")
    if "i2v" in workflows and len(set(workflows)) > 1:
        others = ", ".join(w for w in workflows if w != "i2v")
        raise ValueError(
            f"{name}: an image-to-video checkpoint serves i2v only, not {others} (its "
            "transformer takes the image's latents as more channels)"
        )


def check_components(name: str, pipe: Any, workflows: list[Workflow]) -> None:
    """Refuse a workflow the loaded transformer cannot run (``ValueError`` naming the
    model): ``i2v`` needs twice the VAE's latent channels (``CogVideoXImageToVideoPipeline``
    passes ``in_channels // 2`` to ``prepare_latents``), ``t2v`` and ``v2v`` exactly
    them, and only an image-to-video transformer may take ``ofs``."""
    config = pipe.transformer.config
    channels, latent = config.in_channels, pipe.vae.config.latent_channels
    if "i2v" in workflows and channels != 2 * latent:
        raise ValueError(
            f"{name}: i2v needs an image-to-video transformer ({channels} input channels "
            f"is a text-to-video one's; it takes {2 * latent})"
        )
    for text in [w for w in ("t2v", "v2v") if w in workflows]:
        if channels != latent or config.ofs_embed_dim is not None:
            raise ValueError(
                f"{name}: {text} needs a text-to-video transformer; this one takes "
                f"{channels} input channels (an image-to-video checkpoint's)"
            )


def check_size(pipe: Any, height: int, width: int) -> None:
    """CogVideoX-5b-I2V's learned positional embeddings are of its sample size only
    (its patch embedding raises at the first step otherwise): any other size is refused
    naming ``size``."""
    config = pipe.transformer.config
    if not config.use_learned_positional_embeddings:
        return
    scale = pipe.vae_scale_factor_spatial
    sample = (config.sample_width * scale, config.sample_height * scale)
    if (width, height) != sample:
        raise InvalidJobInput(
            f"this model's learned positional embeddings take {sample[0]}x{sample[1]} only",
            param="size",
        )


def i2v_start(
    pipe: Any, request: GenerationRequest, image: Image.Image, scheduler: Any,
    generator: torch.Generator, dtype: torch.dtype, device: torch.device,
) -> Start:  # fmt: skip
    """``CogVideoXImageToVideoPipeline.__call__`` steps 4-5 on the job's scheduler: the
    schedule, 1.5's latent-frame padding, the image preprocessed to the canvas and
    ``prepare_latents`` (the image encoded by the VAE, sampled from ``generator``, then
    the noise), which reads ``init_noise_sigma`` off the pipeline's scheduler: the same
    config as the job's copy."""
    height, width, num_frames = request.height, request.width, request.num_frames
    # 4. Prepare timesteps.
    timesteps, steps = retrieve_timesteps(scheduler, request.num_inference_steps, device)
    # 5. Prepare latents (CogVideoX 1.5 pads latent frames to a multiple of patch_size_t).
    latent_frames = (num_frames - 1) // pipe.vae_scale_factor_temporal + 1
    patch_size_t = pipe.transformer.config.patch_size_t
    additional_frames = 0
    if patch_size_t is not None and latent_frames % patch_size_t != 0:
        additional_frames = patch_size_t - latent_frames % patch_size_t
        num_frames += additional_frames * pipe.vae_scale_factor_temporal
    pixels = pipe.video_processor.preprocess(image, height=height, width=width)
    pixels = pixels.to(device, dtype=dtype)
    channels = pipe.transformer.config.in_channels // 2
    latents, image_latents = pipe.prepare_latents(
        pixels, 1, channels, num_frames, height, width, dtype, device, generator, None
    )
    return Start(timesteps, steps, latents, additional_frames, image_latents)


def v2v_view(pipe: Any, scheduler: Any) -> Any:
    """``CogVideoXVideoToVideoPipeline`` over ``pipe``'s modules with the job's
    ``scheduler`` (its ``prepare_latents`` noises with ``self.scheduler``)."""
    return pipeline_over(CogVideoXVideoToVideoPipeline, pipe, scheduler)


def v2v_source(
    view: Any, request: GenerationRequest, source: SourceVideo
) -> tuple[list[Image.Image], float]:
    """(the source's first ``num_frames`` frames, ``strength``) as ``__call__`` takes
    them (keyframes.py's checks: a clip shorter than the job or a strength that runs no
    step is refused), and CogVideoX 1.5's: its latent frames must divide into
    ``patch_size_t`` (``__call__`` pads none), refused naming ``num_frames``."""
    video, strength = v2v_inputs(view, request, source)
    patch_size_t = view.transformer.config.patch_size_t
    latent_frames = (len(video) - 1) // view.vae_scale_factor_temporal + 1
    if patch_size_t is not None and latent_frames % patch_size_t != 0:
        raise InvalidJobInput(
            f"{len(video)} frames make {latent_frames} latent frames; this model's v2v "
            f"takes a multiple of {patch_size_t}",
            param="num_frames",
        )
    return video, strength


def v2v_start(
    view: Any, request: GenerationRequest, video: list[Image.Image], strength: float,
    generator: torch.Generator, dtype: torch.dtype, device: torch.device,
) -> Start:  # fmt: skip
    """``CogVideoXVideoToVideoPipeline.__call__`` steps 4-5 (``view`` holds the job's
    scheduler): the schedule cut by ``strength`` (``get_timesteps``), the source
    preprocessed to the canvas, encoded (sampled from ``generator``) and noised to the
    first timestep left."""
    # 4. Prepare timesteps, cut by strength.
    timesteps, steps = retrieve_timesteps(view.scheduler, request.num_inference_steps, device)
    timesteps, steps = view.get_timesteps(steps, timesteps, strength, device)
    latent_timestep = timesteps[:1].repeat(1)
    # 5. Prepare latents.
    pixels = view.video_processor.preprocess_video(
        video, height=request.height, width=request.width
    )
    pixels = pixels.to(device=device, dtype=dtype)
    channels = view.transformer.config.in_channels
    latents = view.prepare_latents(
        pixels, 1, channels, request.height, request.width, dtype, device, generator, None,
        latent_timestep,
    )  # fmt: skip
    return Start(timesteps, steps, latents)
