"""Stable Audio text-to-audio (``diffusers.StableAudioPipeline``) one denoise step at a time.

Mirrors ``StableAudioPipeline.__call__`` (diffusers 0.42) for one prompt and one waveform:
``prepare`` = its steps 0-7 (seconds → waveform window, ``check_inputs``, prompt encoding,
duration encoding, the [negative, positive] CFG batch, timesteps on the job's own
scheduler, latents scaled by that scheduler's ``init_noise_sigma``, ``extra_step_kwargs``
and the rotary embedding), ``step`` = one iteration of its step 8, ``decode`` = step 9
(VAE decode, crop to ``[audio_start_in_s, audio_end_in_s)``).

Duration: ``audio_end_in_s`` is ``request.extra["audio_end_in_s"]`` when given, otherwise
``request.duration_s`` (the audio job's length); ``audio_start_in_s`` is ``request.extra
["audio_start_in_s"]`` or 0.0. The model's maximum is ``transformer.sample_size *
vae.hop_length / vae.sampling_rate`` (47.55 s for stable-audio-open-1.0).

Differences from ``__call__`` (none change the numbers): no ``initial_audio_waveforms``
(audio-to-audio), no precomputed embeddings, ``num_waveforms_per_prompt`` = 1, ``eta`` =
0.0 (only DDIM-like schedulers read it). An empty ``negative_prompt`` counts as none,
i.e. the zero unconditional embedding ``__call__`` uses when no negative prompt is given.
The job's ``torch.Generator`` (CPU, seeded with ``request.seed``) is handed to the
scheduler's ``step`` like ``__call__`` does; stochastic schedulers (``sde-dpmsolver++``,
the released checkpoint's ``CosineDPMSolverMultistepScheduler``, which needs ``torchsde``)
keep their noise sampler on the job's scheduler copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from diffusers import StableAudioPipeline
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from diffusers.utils.torch_utils import randn_tensor

from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest, Media, StepState
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import (
    cfg,
    cfg_batch,
    extra_step_kwargs,
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
)
from workers.pipelines.diffusers.stable_audio.state import StableAudioState

# Every ``request.extra`` key this adapter reads (FAMILY_SPECS declares the same).
EXTRA_PARAMS = ("audio_start_in_s", "audio_end_in_s")


class StableAudioAdapter(DiffusersAdapter[StableAudioState]):
    """``StableAudioPipeline`` (e.g. stabilityai/stable-audio-open-1.0); audio only."""

    family = "diffusers.stable_audio"
    pipeline_class = StableAudioPipeline

    def audio_window(self, request: GenerationRequest) -> tuple[float, float]:
        """``(audio_start_in_s, audio_end_in_s)`` of a request (see the module docstring)."""
        start = float(request.extra.get("audio_start_in_s", 0.0))
        end = request.extra.get("audio_end_in_s")
        if end is not None:
            return start, float(end)
        if request.duration_s is None:
            raise InvalidJobInput("an audio request needs duration_s (or extra audio_end_in_s)")
        return start, request.duration_s

    def _prepare(self, pipe: Any, request: GenerationRequest) -> StableAudioState:
        """``__call__`` steps 0-7."""
        prompt = request.prompt
        negative_prompt = request.negative_prompt or None
        start, end = self.audio_window(request)

        # 0. Convert audio input length from seconds to latent length.
        sampling_rate = pipe.vae.config.sampling_rate
        max_seconds = pipe.transformer.config.sample_size * pipe.vae.hop_length / sampling_rate
        if end - start > max_seconds:
            raise InvalidJobInput(
                f"The total audio length requested ({end - start}s) is longer than the model "
                f"maximum possible length ({max_seconds})."
            )
        window = slice(int(start * sampling_rate), int(end * sampling_rate))
        waveform_length = int(pipe.transformer.config.sample_size)

        # 1. Check inputs (callback_steps=1 as __call__'s default).
        pipe.check_inputs(prompt, start, end, 1, negative_prompt)

        # 2. Call parameters.
        device = pipe._execution_device
        scale = guidance_scale(pipe, request)
        do_cfg = scale > 1.0

        # 3. Encode the prompt (projected, masked; [negative, positive] with a negative).
        prompt_embeds = pipe.encode_prompt(prompt, device, do_cfg, negative_prompt)
        seconds_start, seconds_end = pipe.encode_duration(
            start, end, device, do_cfg and negative_prompt is not None, 1
        )
        text_audio_duration_embeds = torch.cat([prompt_embeds, seconds_start, seconds_end], dim=1)
        audio_duration_embeds = torch.cat([seconds_start, seconds_end], dim=2)
        # CFG without a negative prompt: zero unconditional embeddings.
        if do_cfg and negative_prompt is None:
            negative = torch.zeros_like(text_audio_duration_embeds)
            text_audio_duration_embeds = torch.cat([negative, text_audio_duration_embeds], dim=0)
            audio_duration_embeds = torch.cat([audio_duration_embeds, audio_duration_embeds], dim=0)

        # 4. Timesteps, on the job's own scheduler.
        scheduler = job_scheduler(pipe.scheduler)
        scheduler.set_timesteps(request.num_inference_steps, device=device)
        timesteps = scheduler.timesteps

        # 5. Latents (prepare_latents: noise × the job scheduler's init_noise_sigma).
        generator = make_generator(request.seed)
        shape = (1, pipe.transformer.config.in_channels, waveform_length)
        latents = randn_tensor(
            shape, generator=generator, device=device, dtype=text_audio_duration_embeds.dtype
        )
        latents = latents * scheduler.init_noise_sigma

        # 7. Rotary positional embedding (6., the extra step kwargs, go into the state).
        rotary_embedding = get_1d_rotary_pos_embed(
            pipe.rotary_embed_dim,
            latents.shape[2] + audio_duration_embeds.shape[1],
            use_real=True,
            repeat_interleave_real=False,
        )
        return StableAudioState(
            **sampling(request, generator, scheduler, timesteps, latents, scale, do_cfg),
            text_audio_duration_embeds=text_audio_duration_embeds,
            audio_duration_embeds=audio_duration_embeds,
            rotary_embedding=rotary_embedding,
            step_kwargs=extra_step_kwargs(scheduler, generator, 0.0),
            window=window,
        )

    def _step(self, pipe: Any, s: StableAudioState) -> None:
        """One iteration of ``__call__``'s step 8 (batched CFG, job scheduler step)."""
        t = s.timesteps[s.step_index]
        latents = s.latents
        latent_model_input = s.scheduler.scale_model_input(cfg_batch(latents, s.do_cfg), t)
        noise_pred = pipe.transformer(
            latent_model_input,
            t.unsqueeze(0),
            encoder_hidden_states=s.text_audio_duration_embeds,
            global_hidden_states=s.audio_duration_embeds,
            rotary_embedding=s.rotary_embedding,
            return_dict=False,
        )[0]
        if s.do_cfg:
            noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
            noise_pred = cfg(noise_pred_uncond, noise_pred_text, s.guidance_scale)
        s.latents = s.scheduler.step(noise_pred, t, latents, **s.step_kwargs).prev_sample

    @torch.no_grad()
    def decode_audio(self, state: StepState) -> torch.Tensor:
        """``__call__``'s step 9: VAE decode, cropped to the requested window; B×C×S, what
        ``pipe(..., output_type="pt").audios`` returns."""
        pipe, s = self._loaded(), self._state(state)
        audio: torch.Tensor = pipe.vae.decode(s.latents).sample
        return audio[:, :, s.window]

    def decode(self, state: StepState) -> Media:
        """Audio-only media: no frames (shape 0×0×0×3), float32 (channels, samples)."""
        s = self._state(state)
        audio = self.decode_audio(s)[0].float().cpu().numpy()
        rate = int(self._loaded().vae.config.sampling_rate)
        return Media.audio_only(np.ascontiguousarray(audio, dtype=np.float32), rate, s.request.fps)
