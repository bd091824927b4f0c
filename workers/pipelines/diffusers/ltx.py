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
from diffusers.utils.torch_utils import randn_tensor

from workers.pipelines.base import GenerationRequest, StepState
from workers.pipelines.diffusers.common import (
    DiffusersAdapter,
    DiffusersState,
    call_default,
    cfg,
    clone_generator,
    grey_preview,
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
    unpack_video_latents,
    vae_options,
)


@dataclass(kw_only=True)
class LTXState(DiffusersState):
    """One LTX job. ``latents`` are packed (B×tokens×C); ``prompt_embeds`` and
    ``prompt_attention_mask`` hold the [negative, positive] batch when CFG is on."""

    prompt_embeds: torch.Tensor
    prompt_attention_mask: torch.Tensor
    guidance_rescale: float
    latent_num_frames: int
    latent_height: int
    latent_width: int
    rope_interpolation_scale: tuple[float, float, float]
    device: torch.device


class LTXAdapter(DiffusersAdapter):
    """``LTXPipeline`` (LTX-Video 0.9.x text-to-video)."""

    family = "diffusers.ltx"
    pipeline_class = LTXPipeline

    @torch.no_grad()
    def prepare(self, request: GenerationRequest) -> LTXState:
        """``__call__`` steps 1-6; nothing is written to the shared pipe."""
        pipe = self._loaded()
        self._no_reference(request)
        height, width, num_frames = request.height, request.width, request.num_frames
        # 1. Check inputs.
        pipe.check_inputs(prompt=request.prompt, height=height, width=width)
        scale = guidance_scale(pipe, request)
        do_cfg = scale > 1.0
        extra = request.extra
        rescale = float(extra.get("guidance_rescale", call_default(pipe, "guidance_rescale")))
        device = pipe._execution_device

        # 3. Prepare text embeddings ([negative, positive] batch under CFG).
        embeds, mask, neg_embeds, neg_mask = pipe.encode_prompt(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            do_classifier_free_guidance=do_cfg,
            num_videos_per_prompt=1,
            max_sequence_length=self._seq_len(call_default(pipe, "max_sequence_length")),
            device=device,
        )
        if do_cfg:
            embeds = torch.cat([neg_embeds, embeds], dim=0)
            mask = torch.cat([neg_mask, mask], dim=0)

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
        latent_num_frames = (num_frames - 1) // pipe.vae_temporal_compression_ratio + 1
        latent_height = height // pipe.vae_spatial_compression_ratio
        latent_width = width // pipe.vae_spatial_compression_ratio
        steps = request.num_inference_steps
        scheduler = job_scheduler(pipe.scheduler)
        config = scheduler.config
        mu = calculate_shift(
            latent_num_frames * latent_height * latent_width,
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
            latent_num_frames=latent_num_frames,
            latent_height=latent_height,
            latent_width=latent_width,
            rope_interpolation_scale=rope_scale,
            device=device,
        )

    @torch.no_grad()
    def step(self, state: StepState) -> None:
        """One iteration of ``__call__``'s step 7 (batched CFG, optional rescale)."""
        pipe, s = self._loaded(), _state(state)
        t = s.timesteps[s.step_index]
        latents = s.latents
        latent_model_input = torch.cat([latents] * 2) if s.do_cfg else latents
        latent_model_input = latent_model_input.to(s.prompt_embeds.dtype)
        timestep = t.expand(latent_model_input.shape[0])
        with pipe.transformer.cache_context("cond_uncond"):
            noise_pred = pipe.transformer(
                hidden_states=latent_model_input,
                encoder_hidden_states=s.prompt_embeds,
                timestep=timestep,
                encoder_attention_mask=s.prompt_attention_mask,
                num_frames=s.latent_num_frames,
                height=s.latent_height,
                width=s.latent_width,
                rope_interpolation_scale=s.rope_interpolation_scale,
                attention_kwargs=None,
                return_dict=False,
            )[0]
        noise_pred = noise_pred.float()
        if s.do_cfg:
            noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
            noise_pred = cfg(noise_pred_uncond, noise_pred_text, s.guidance_scale)
            if s.guidance_rescale > 0:
                noise_pred = rescale_noise_cfg(
                    noise_pred, noise_pred_text, guidance_rescale=s.guidance_rescale
                )
        s.latents = s.scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        s.step_index += 1

    def _unpacked(self, latents: torch.Tensor, s: LTXState) -> torch.Tensor:
        return unpack_video_latents(self._loaded(), latents, s)

    @torch.no_grad()
    def decode_frames(self, state: StepState) -> np.ndarray:
        """The tail of ``__call__``: unpack, de-normalise, decode-timestep noise, decode."""
        pipe, s = self._loaded(), _state(state)
        vae = pipe.vae
        latents = self._unpacked(s.latents, s)
        latents = pipe._denormalize_latents(
            latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
        )
        latents = latents.to(s.prompt_embeds.dtype)
        timestep: torch.Tensor | None = None
        if vae.config.timestep_conditioning:
            extra = s.request.extra
            # Drawn from a clone: decoding twice gives the same video.
            noise = randn_tensor(
                latents.shape,
                generator=clone_generator(s.generator),
                device=s.device,
                dtype=latents.dtype,
            )
            default = call_default(pipe, "decode_timestep")
            decode_timestep = float(extra.get("decode_timestep", default))
            noise_scale = float(extra.get("decode_noise_scale", decode_timestep))
            timestep = torch.tensor([decode_timestep], device=s.device, dtype=latents.dtype)
            scale = torch.tensor([noise_scale], device=s.device, dtype=latents.dtype)
            scale = scale[:, None, None, None, None]
            latents = (1 - scale) * latents + scale * noise
        latents = latents.to(vae.dtype)
        opts = s.request.options
        with vae_options(vae, opts.get("vae_use_tiling"), opts.get("vae_use_slicing")):
            video = vae.decode(latents, timestep, return_dict=False)[0]
        frames: np.ndarray = pipe.video_processor.postprocess_video(video, output_type="np")
        return frames[0]

    def preview(self, state: StepState) -> np.ndarray | None:
        """Grey middle latent frame of the unpacked latents (B×C×F×h×w)."""
        s = _state(state)
        return grey_preview(self._unpacked(s.latents, s), channel_dim=1, frame_dim=2)


def _state(state: StepState) -> LTXState:
    if not isinstance(state, LTXState):
        raise TypeError(f"expected an LTXState, got {type(state).__name__}")
    return state
