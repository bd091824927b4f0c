"""LTX-Video's workflows: which pipeline an entry's ``spec.workflows`` loads, what the
loaded components can serve, ``LTXImageToVideoPipeline``'s image-to-video loop, its
transformer call (:func:`transformer_pass`, also the conditioned loop's) and the guidance
every LTX loop shares (:func:`guided`), for ``LTXAdapter`` (ltx/adapter.py), which runs
every workflow in its own step loop.

Which pipeline serves which workflow (the entry's ``workflows`` decide):

* ``["t2v"]`` (the default): ``LTXPipeline``.
* ``i2v`` without ``flf2v`` / ``v2v`` (``["i2v"]``, ``["t2v", "i2v"]``):
  ``LTXImageToVideoPipeline``, the image-to-video pipeline of LTX-Video 0.9.0 / 0.9.1: the
  first latent frame is the image's latents, held at timestep 0 (a per-token timestep
  ``t × (1 - conditioning_mask)``) and left out of the scheduler step. Its ``t2v`` jobs run
  ``LTXPipeline``'s loop over the same modules (:func:`text_pipeline`).
* ``flf2v`` or ``v2v`` in the list: ``LTXConditionPipeline`` (LTX-Video 0.9.5+; its
  linear-quadratic schedule, ``video_coords``, per-token timesteps), ltx/condition.py.
  It serves every workflow the entry names, each as its ``__call__`` runs it: ``t2v``
  without conditions, ``i2v`` an image at ``frame_index`` 0, ``flf2v`` images at 0 and
  ``num_frames - 1``, ``v2v`` the source clip at 0 with ``strength``. diffusers has no
  last frame in ``LTXImageToVideoPipeline``, and no source video outside
  ``LTXConditionPipeline``: that is why these two workflows load it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    LTXConditionPipeline,
    LTXImageToVideoPipeline,
    LTXPipeline,
)
from diffusers.pipelines.ltx.pipeline_ltx import rescale_noise_cfg
from PIL import Image

from models.catalog import VIDEO_WORKFLOWS, Workflow
from workers.pipelines.diffusers.ltx.state import LTXState
from workers.pipelines.diffusers.shared.common import cfg, cfg_batch
from workers.pipelines.diffusers.shared.keyframes import pipeline_over

# The workflows that load LTXConditionPipeline (diffusers runs them nowhere else).
CONDITION_WORKFLOWS: tuple[Workflow, ...] = ("flf2v", "v2v")


def pipeline_for(workflows: list[Workflow]) -> Any:
    """The diffusers pipeline class an entry serving ``workflows`` loads."""
    if set(CONDITION_WORKFLOWS) & set(workflows):
        return LTXConditionPipeline
    if "i2v" in workflows:
        return LTXImageToVideoPipeline
    return LTXPipeline


def check_workflows(name: str, pipe: Any, workflows: list[Workflow]) -> None:
    """Refuse to serve a workflow the loaded components cannot run (``ValueError`` at load,
    naming the model): a workflow LTX has no pipeline for, a transformer whose input is
    not the VAE's latents (the keyframes' latents go into its tokens), and, for
    ``LTXConditionPipeline``, a scheduler that cannot take its fixed schedule and
    per-token timesteps (a resolution-shifting one: an LTX-Video 0.9.0 / 0.9.1 config)."""
    unknown = sorted(set(workflows) - set(VIDEO_WORKFLOWS))
    if unknown:
        raise ValueError(f"{name}: LTX serves t2v, i2v, flf2v and v2v, not {', '.join(unknown)}")
    channels, latent = pipe.transformer.config.in_channels, pipe.vae.config.latent_channels
    if channels != latent:
        raise ValueError(
            f"{name}: the transformer takes {channels} channels, the VAE makes {latent}"
        )
    if not isinstance(pipe, LTXConditionPipeline):
        return
    scheduler: Any = cast(Any, pipe).scheduler
    shifting = scheduler.config.get("use_dynamic_shifting")
    served = ", ".join(workflows)
    if not isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
        raise ValueError(
            f"{name}: {served} run LTXConditionPipeline, whose per-token timesteps need "
            f"FlowMatchEulerDiscreteScheduler, not {type(scheduler).__name__}"
        )
    if shifting:
        raise ValueError(
            f"{name}: {served} run LTXConditionPipeline, whose linear-quadratic schedule "
            "takes no resolution shift: this scheduler has use_dynamic_shifting (an "
            "LTX-Video 0.9.0/0.9.1 config; such a checkpoint serves t2v and i2v)"
        )


def text_pipeline(pipe: Any) -> LTXPipeline:
    """``LTXPipeline`` over the modules of an image-to-video pipeline (its ``t2v`` jobs):
    the same weights, hooks and compiled blocks, ``LTXPipeline``'s own checks and noise."""
    return pipeline_over(LTXPipeline, pipe, pipe.scheduler)


def guided(noise_pred: torch.Tensor, s: LTXState) -> torch.Tensor:
    """The guidance of every LTX ``__call__``'s loop (the same in all three pipelines):
    under CFG the [negative, positive] batch's predictions combined at
    ``guidance_scale``, then rescaled (``rescale_noise_cfg``) where ``guidance_rescale``
    is above 0; without CFG the prediction as it is."""
    if not s.do_cfg:
        return noise_pred
    noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
    noise_pred = cfg(noise_pred_uncond, noise_pred_text, s.guidance_scale)
    if s.guidance_rescale > 0:
        noise_pred = rescale_noise_cfg(
            noise_pred, noise_pred_text, guidance_rescale=s.guidance_rescale
        )
    return noise_pred


def transformer_pass(
    pipe: Any, s: LTXState, latent_model_input: torch.Tensor, timestep: torch.Tensor,
    **positions: Any,
) -> torch.Tensor:  # fmt: skip
    """The transformer call of the per-token-timestep loops (image, condition) as their
    ``__call__`` makes it: the step's model input (the CFG batch: the ``"cond_uncond"``
    cache context) with the prompt batch, ``timestep`` and ``positions`` (the latent
    grid's RoPE or ``video_coords``); the prediction in the transformer's dtype (only the
    image loop casts it to float32)."""
    with pipe.transformer.cache_context("cond_uncond"):
        prediction: torch.Tensor = pipe.transformer(
            hidden_states=latent_model_input,
            encoder_hidden_states=s.prompt_embeds,
            timestep=timestep,
            encoder_attention_mask=s.prompt_attention_mask,
            **positions,
            attention_kwargs=None,
            return_dict=False,
        )[0]
    return prediction


def image_latents(
    pipe: Any,
    image: Image.Image,
    height: int,
    width: int,
    num_frames: int,
    embeds_dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
    do_cfg: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``LTXImageToVideoPipeline.__call__``'s step 4: the image preprocessed to the canvas
    (in the prompt embeddings' dtype), ``prepare_latents`` (its VAE sample, then the noise,
    both from ``generator``); (packed latents, the packed first-frame mask, doubled under
    CFG)."""
    pixels = pipe.video_processor.preprocess(image, height=height, width=width)
    pixels = pixels.to(device=device, dtype=embeds_dtype)
    latents, mask = pipe.prepare_latents(
        pixels, 1, pipe.transformer.config.in_channels, height, width, num_frames,
        torch.float32, device, generator, None,
    )  # fmt: skip
    if do_cfg:
        mask = torch.cat([mask, mask])
    return latents, mask


def image_step(pipe: Any, s: LTXState) -> None:
    """One iteration of ``LTXImageToVideoPipeline.__call__``'s step 7: the per-token
    timestep (0 on the first frame's tokens), batched CFG with optional rescale, and the
    scheduler step on every latent frame but the first (the image's, kept)."""
    assert s.conditioning_mask is not None
    t = s.timesteps[s.step_index]
    grid = s.grid
    latent_model_input = cfg_batch(s.latents, s.do_cfg).to(s.prompt_embeds.dtype)
    timestep = t.expand(latent_model_input.shape[0])
    timestep = timestep.unsqueeze(-1) * (1 - s.conditioning_mask)
    noise_pred = transformer_pass(
        pipe, s, latent_model_input, timestep, **grid.transformer_kwargs(),
        rope_interpolation_scale=s.rope_interpolation_scale,
    )  # fmt: skip
    noise_pred = guided(noise_pred.float(), s)
    sizes = (grid.num_frames, grid.height, grid.width)
    patch, patch_t = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
    noise_pred = pipe._unpack_latents(noise_pred, *sizes, patch, patch_t)
    latents = pipe._unpack_latents(s.latents, *sizes, patch, patch_t)
    pred_latents = s.scheduler.step(noise_pred[:, :, 1:], t, latents[:, :, 1:], return_dict=False)[
        0
    ]
    latents = torch.cat([latents[:, :, :1], pred_latents], dim=2)
    s.latents = pipe._pack_latents(latents, patch, patch_t)
