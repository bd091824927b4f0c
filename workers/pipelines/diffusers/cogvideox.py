"""CogVideoX text-to-video (``diffusers.CogVideoXPipeline``) run one denoise step at a time.

Mirrors ``CogVideoXPipeline.__call__`` (diffusers 0.42): ``prepare`` = steps 1-7 (checks,
prompt encoding with the [negative, positive] CFG batch, timesteps, latents B×F×C×h×w
scaled by ``init_noise_sigma`` — with CogVideoX 1.5's latent-frame padding to a multiple
of ``patch_size_t`` —, extra step kwargs, 3D rotary embeddings), ``step`` = one iteration
of step 8 (``use_dynamic_cfg`` guidance, DDIM or DPM-solver step carrying
``old_pred_original_sample``), ``decode`` = drop padding frames, ``decode_latents``,
``postprocess_video``.

Request options: ``vae_use_tiling`` / ``vae_use_slicing``; extras (``request.extra``):
``use_dynamic_cfg`` (bool, default False) — the ``__call__`` argument of that name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from diffusers import CogVideoXDPMScheduler, CogVideoXPipeline
from diffusers.pipelines.cogvideo.pipeline_cogvideox import retrieve_timesteps
from diffusers.utils.torch_utils import randn_tensor

from workers.pipelines.base import GenerationRequest, StepState
from workers.pipelines.diffusers.common import (
    DiffusersAdapter,
    DiffusersState,
    batched_prediction,
    call_default,
    cfg,
    cfg_batch,
    extra_step_kwargs,
    grey_preview,
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
    vae_options,
)


@dataclass(kw_only=True)
class CogVideoXState(DiffusersState):
    """One CogVideoX job; ``prompt_embeds`` is the [negative, positive] batch under CFG."""

    prompt_embeds: torch.Tensor
    image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None
    extra_step_kwargs: dict[str, Any]
    use_dynamic_cfg: bool
    num_inference_steps: int
    additional_frames: int
    is_dpm: bool  # CogVideoXDPMScheduler: its step carries old_pred_original_sample
    old_pred_original_sample: torch.Tensor | None = None


class CogVideoXAdapter(DiffusersAdapter[CogVideoXState]):
    """``CogVideoXPipeline`` (CogVideoX 2b/5b, CogVideoX 1.5 5b text-to-video)."""

    family = "diffusers.cogvideox"
    pipeline_class = CogVideoXPipeline

    def _prepare(self, pipe: Any, request: GenerationRequest) -> CogVideoXState:
        """``__call__`` steps 1-7."""
        height, width, num_frames = request.height, request.width, request.num_frames
        # 1. Check inputs.
        pipe.check_inputs(request.prompt, height, width, request.negative_prompt, None)
        scale = guidance_scale(pipe, request)
        do_cfg = scale > 1.0
        device = pipe._execution_device
        transformer_config = pipe.transformer.config

        # 3. Encode input prompt. The transformer's text positions are sized by
        # max_text_seq_length (226 in every released model = __call__'s default).
        seq_len = self._seq_len(transformer_config.max_text_seq_length)
        embeds, neg_embeds = pipe.encode_prompt(
            request.prompt,
            request.negative_prompt,
            do_cfg,
            num_videos_per_prompt=1,
            max_sequence_length=seq_len,
            device=device,
        )
        if do_cfg:
            embeds = torch.cat([neg_embeds, embeds], dim=0)

        # 4. Prepare timesteps (on this job's scheduler copy).
        scheduler = job_scheduler(pipe.scheduler)
        timesteps, steps = retrieve_timesteps(scheduler, request.num_inference_steps, device)

        # 5. Prepare latents (CogVideoX 1.5 pads latent frames to a multiple of patch_size_t).
        latent_frames = (num_frames - 1) // pipe.vae_scale_factor_temporal + 1
        patch_size_t = transformer_config.patch_size_t
        additional_frames = 0
        if patch_size_t is not None and latent_frames % patch_size_t != 0:
            additional_frames = patch_size_t - latent_frames % patch_size_t
            num_frames += additional_frames * pipe.vae_scale_factor_temporal
        generator = make_generator(request.seed)
        shape = (
            1,
            (num_frames - 1) // pipe.vae_scale_factor_temporal + 1,
            transformer_config.in_channels,
            height // pipe.vae_scale_factor_spatial,
            width // pipe.vae_scale_factor_spatial,
        )
        latents = randn_tensor(shape, generator=generator, device=device, dtype=embeds.dtype)
        latents = latents * scheduler.init_noise_sigma  # prepare_latents, job scheduler

        # 6./7. Extra step kwargs (eta = __call__'s default), rotary embeddings.
        step_kwargs = extra_step_kwargs(scheduler, generator, call_default(pipe, "eta"))
        rotary = (
            pipe._prepare_rotary_positional_embeddings(height, width, latents.size(1), device)
            if transformer_config.use_rotary_positional_embeddings
            else None
        )
        return CogVideoXState(
            **sampling(request, generator, scheduler, timesteps, latents, scale, do_cfg),
            prompt_embeds=embeds,
            image_rotary_emb=rotary,
            extra_step_kwargs=step_kwargs,
            use_dynamic_cfg=bool(request.extra.get("use_dynamic_cfg", False)),
            num_inference_steps=steps,
            additional_frames=additional_frames,
            is_dpm=isinstance(scheduler, CogVideoXDPMScheduler),
        )

    def _step(self, pipe: Any, s: CogVideoXState) -> None:
        """One iteration of ``__call__``'s step 8."""
        i = s.step_index
        t = s.timesteps[i]
        latents = s.latents
        latent_model_input = s.scheduler.scale_model_input(cfg_batch(latents, s.do_cfg), t)
        noise_pred = batched_prediction(
            pipe,
            latent_model_input,
            t,
            encoder_hidden_states=s.prompt_embeds,
            image_rotary_emb=s.image_rotary_emb,
        )
        scale = s.guidance_scale
        if s.use_dynamic_cfg:
            # As written in __call__ (t is a train timestep, compared with the step count).
            n = s.num_inference_steps
            scale = 1 + s.guidance_scale * (
                (1 - math.cos(math.pi * ((n - t.item()) / n) ** 5.0)) / 2
            )
        if s.do_cfg:
            noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
            noise_pred = cfg(noise_pred_uncond, noise_pred_text, scale)
        if not s.is_dpm:
            latents = s.scheduler.step(
                noise_pred, t, latents, **s.extra_step_kwargs, return_dict=False
            )[0]
        else:
            latents, s.old_pred_original_sample = s.scheduler.step(
                noise_pred,
                s.old_pred_original_sample,
                t,
                s.timesteps[i - 1] if i > 0 else None,
                latents,
                **s.extra_step_kwargs,
                return_dict=False,
            )
        s.latents = latents.to(s.prompt_embeds.dtype)

    def _decode_frames(self, pipe: Any, s: CogVideoXState) -> np.ndarray:
        """The tail of ``__call__``: drop 1.5's padding frames, ``decode_latents``
        (permute to B×C×F×h×w, divide by the VAE scaling factor, decode), postprocess."""
        latents = s.latents[:, s.additional_frames :]
        opts = s.request.sampler
        with vae_options(pipe.vae, opts.vae_use_tiling, opts.vae_use_slicing):
            video = pipe.decode_latents(latents)
        frames: np.ndarray = pipe.video_processor.postprocess_video(video=video, output_type="np")
        return frames[0]

    def preview(self, state: StepState) -> np.ndarray | None:
        """Grey middle latent frame (latents are B×F×C×h×w)."""
        s = self._state(state)
        return grey_preview(s.latents[:, s.additional_frames :], channel_dim=2, frame_dim=1)
