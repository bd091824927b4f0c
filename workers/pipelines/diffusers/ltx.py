"""LTX-Video text-to-video (``diffusers.LTXPipeline``) run one denoise step at a time.

Mirrors ``LTXPipeline.__call__`` (diffusers 0.42): ``prepare`` = steps 1-6 (checks,
prompt encoding with the [negative, positive] CFG batch, packed latents, the
resolution-dependent ``mu`` shift of the sigma schedule, RoPE interpolation scale from the
frame rate = ``request.fps``), ``step`` = one iteration of step 7, ``decode`` = unpack,
de-normalise, the timestep-conditioned VAE's ``decode_timestep``/``decode_noise_scale``
noise (drawn from the job's generator, as ``__call__`` does after its loop), VAE decode.

Request options: ``vae_use_tiling`` / ``vae_use_slicing``; extras (``request.extra``):
``decode_timestep`` (default 0.0), ``decode_noise_scale`` (default: = decode_timestep),
``guidance_rescale`` (default 0.0) — the ``__call__`` arguments of the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from diffusers import LTXPipeline
from diffusers.pipelines.ltx.pipeline_ltx import (
    calculate_shift,
    rescale_noise_cfg,
    retrieve_timesteps,
)

from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.common import (
    batched_prediction,
    call_default,
    cfg,
    cfg_batch,
    clone_generator,
    decode_video,
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
)
from workers.pipelines.diffusers.packed import PackedLatentsAdapter, PackedState


@dataclass(kw_only=True)
class LTXState(PackedState):
    """One LTX job. ``latents`` are packed (B×tokens×C); ``prompt_embeds`` and
    ``prompt_attention_mask`` hold the [negative, positive] batch when CFG is on."""

    prompt_embeds: torch.Tensor
    prompt_attention_mask: torch.Tensor
    guidance_rescale: float
    rope_interpolation_scale: tuple[float, float, float]


class LTXAdapter(PackedLatentsAdapter[LTXState]):
    """``LTXPipeline`` (LTX-Video 0.9.x text-to-video)."""

    family = "diffusers.ltx"
    pipeline_class = LTXPipeline

    def _prepare(self, pipe: Any, request: GenerationRequest) -> LTXState:
        """``__call__`` steps 1-6."""
        height, width, num_frames = request.height, request.width, request.num_frames
        # 1. Check inputs.
        pipe.check_inputs(prompt=request.prompt, height=height, width=width)
        scale = guidance_scale(pipe, request)
        do_cfg = scale > 1.0
        extra = request.extra
        rescale = float(extra.get("guidance_rescale", call_default(pipe, "guidance_rescale")))
        device = pipe._execution_device

        # 3. Prepare text embeddings ([negative, positive] batch under CFG).
        embeds, mask = self._prompt_batch(pipe, request, do_cfg, device)

        # 4. Prepare latent variables (packed into tokens).
        generator = make_generator(request.seed)
        latents = pipe.prepare_latents(
            1,
            pipe.transformer.config.in_channels,
            height,
            width,
            num_frames,
            torch.float32,
            device,
            generator,
        )

        # 5. Prepare timesteps: sigmas 1 → 1/N shifted by mu(video sequence length).
        grid = self._latent_grid(pipe, request)
        steps = request.num_inference_steps
        scheduler = job_scheduler(pipe.scheduler)
        config = scheduler.config
        mu = calculate_shift(
            grid.tokens,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        sigmas: Any = np.linspace(1.0, 1 / steps, steps)  # an ndarray, as in __call__
        timesteps, _ = retrieve_timesteps(scheduler, steps, device, None, sigmas=sigmas, mu=mu)

        # 6. Micro-conditions.
        rope_scale = (
            pipe.vae_temporal_compression_ratio / request.fps,
            pipe.vae_spatial_compression_ratio,
            pipe.vae_spatial_compression_ratio,
        )
        return LTXState(
            **sampling(request, generator, scheduler, timesteps, latents, scale, do_cfg),
            prompt_embeds=embeds,
            prompt_attention_mask=mask,
            guidance_rescale=rescale,
            grid=grid,
            rope_interpolation_scale=rope_scale,
        )

    def _step(self, pipe: Any, s: LTXState) -> None:
        """One iteration of ``__call__``'s step 7 (batched CFG, optional rescale)."""
        t = s.timesteps[s.step_index]
        latents = s.latents
        latent_model_input = cfg_batch(latents, s.do_cfg).to(s.prompt_embeds.dtype)
        noise_pred = batched_prediction(
            pipe,
            latent_model_input,
            t,
            encoder_hidden_states=s.prompt_embeds,
            encoder_attention_mask=s.prompt_attention_mask,
            **s.grid.transformer_kwargs(),
            rope_interpolation_scale=s.rope_interpolation_scale,
        )
        if s.do_cfg:
            noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
            noise_pred = cfg(noise_pred_uncond, noise_pred_text, s.guidance_scale)
            if s.guidance_rescale > 0:
                noise_pred = rescale_noise_cfg(
                    noise_pred, noise_pred_text, guidance_rescale=s.guidance_rescale
                )
        s.latents = s.scheduler.step(noise_pred, t, latents, return_dict=False)[0]

    def _decode_frames(self, pipe: Any, s: LTXState) -> np.ndarray:
        """The tail of ``__call__``: unpack, de-normalise, decode-timestep noise, decode."""
        vae = pipe.vae
        latents = self._unpacked(s.latents, s)
        latents = pipe._denormalize_latents(
            latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
        )
        latents = latents.to(s.prompt_embeds.dtype)
        timestep: torch.Tensor | None = None
        if vae.config.timestep_conditioning:
            # Drawn from a clone: decoding twice gives the same video.
            generator = clone_generator(s.generator)
            latents, timestep = self._decode_noise(latents, s.request.extra, generator)
        return decode_video(pipe, s.request, latents.to(vae.dtype), timestep)
