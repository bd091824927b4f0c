"""CogVideoX text-, image- and video-to-video, one denoise step at a time.

Text-to-video (``t2v``) mirrors ``CogVideoXPipeline.__call__`` (diffusers 0.42),
image-to-video (``i2v``) ``CogVideoXImageToVideoPipeline.__call__`` and video-to-video
(``v2v``) ``CogVideoXVideoToVideoPipeline.__call__``: ``prepare`` = steps 1-7 (checks,
prompt encoding with the [negative, positive] CFG batch, timesteps — cut by ``strength``
for v2v —, latents B×F×C×h×w scaled by ``init_noise_sigma`` — with CogVideoX 1.5's
latent-frame padding to a multiple of ``patch_size_t``; i2v: the image's latents beside
them; v2v: the source's, noised —, extra step kwargs, 3D rotary embeddings, 1.5 I2V's
``ofs``), ``step`` = one iteration of step 8 (i2v's image latents concatenated on the
channels, ``use_dynamic_cfg`` guidance, DDIM or DPM-solver step carrying
``old_pred_original_sample``), ``decode`` = drop padding frames, ``decode_latents``,
``postprocess_video``.

The registry entry's ``spec.workflows`` says what a checkpoint serves (cogvideox/workflows.py
checks it against the loaded components): ``["t2v"]`` (the default: ``CogVideoXPipeline``),
``["i2v"]`` (CogVideoX-5b-I2V, CogVideoX 1.5 5B I2V: loads
``CogVideoXImageToVideoPipeline``), ``["t2v", "v2v"]`` or ``["v2v"]`` (a text-to-video
checkpoint; v2v runs a per-job ``CogVideoXVideoToVideoPipeline`` over its modules).

Request options: ``vae_use_tiling`` / ``vae_use_slicing``; extras (``request.extra``):
``use_dynamic_cfg`` (bool, default False) — the ``__call__`` argument of that name;
``strength`` (v2v only; its ``__call__`` default 0.8 when absent).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from diffusers import CogVideoXDPMScheduler, CogVideoXImageToVideoPipeline, CogVideoXPipeline
from diffusers.pipelines.cogvideo.pipeline_cogvideox import retrieve_timesteps
from diffusers.utils.torch_utils import randn_tensor

from models.catalog import Workflow
from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest, Media, StepState
from workers.pipelines.diffusers.cogvideox.state import CogVideoXState
from workers.pipelines.diffusers.cogvideox.workflows import (
    Start,
    check_components,
    check_names,
    check_size,
    i2v_start,
    v2v_source,
    v2v_start,
    v2v_view,
)
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import (
    batched_prediction,
    call_default,
    cfg,
    cfg_batch,
    extra_step_kwargs,
    frames_media,
    grey_preview,
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
    vae_options,
)
from workers.pipelines.diffusers.shared.keyframes import SourceVideo, job_workflow, keyframes_of


def _text_start(
    pipe: Any, request: GenerationRequest, scheduler: Any, generator: torch.Generator,
    dtype: torch.dtype, device: torch.device,
) -> Start:  # fmt: skip
    """``CogVideoXPipeline.__call__`` steps 4-5: the schedule, the latents (CogVideoX 1.5
    pads latent frames to a multiple of ``patch_size_t``) scaled by the job scheduler's
    ``init_noise_sigma``."""
    timesteps, steps = retrieve_timesteps(scheduler, request.num_inference_steps, device)
    num_frames = request.num_frames
    latent_frames = (num_frames - 1) // pipe.vae_scale_factor_temporal + 1
    config = pipe.transformer.config
    additional_frames = 0
    if config.patch_size_t is not None and latent_frames % config.patch_size_t != 0:
        additional_frames = config.patch_size_t - latent_frames % config.patch_size_t
        num_frames += additional_frames * pipe.vae_scale_factor_temporal
    shape = (
        1,
        (num_frames - 1) // pipe.vae_scale_factor_temporal + 1,
        config.in_channels,
        request.height // pipe.vae_scale_factor_spatial,
        request.width // pipe.vae_scale_factor_spatial,
    )
    latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
    latents = latents * scheduler.init_noise_sigma  # prepare_latents, job scheduler
    return Start(timesteps, steps, latents, additional_frames)


class CogVideoXAdapter(DiffusersAdapter[CogVideoXState]):
    """``CogVideoXPipeline`` (CogVideoX 2b/5b, CogVideoX 1.5 5b text-to-video, and
    ``CogVideoXVideoToVideoPipeline``'s v2v over them) and, for an entry serving ``i2v``,
    ``CogVideoXImageToVideoPipeline`` (CogVideoX-5b-I2V, CogVideoX 1.5 5B I2V)."""

    family = "diffusers.cogvideox"
    pipeline_class: Any = CogVideoXPipeline
    default_workflows = ("t2v",)

    @staticmethod
    def _pipeline_for(workflows: list[Workflow]) -> Any:
        """``CogVideoXImageToVideoPipeline`` for an ``i2v`` entry, else
        ``CogVideoXPipeline`` (v2v runs a per-job ``CogVideoXVideoToVideoPipeline``)."""
        return CogVideoXImageToVideoPipeline if "i2v" in workflows else CogVideoXPipeline

    def load(self, device: str) -> None:
        """The served workflows' names checked (before any weight loads), then
        ``DiffusersAdapter.load``, then the workflows checked against the loaded components
        (cogvideox/workflows.py; refusing to start on a mismatch)."""
        check_names(self.spec.name, self.workflows)
        super().load(device)
        check_components(self.spec.name, self._loaded(), self.workflows)

    def _prepare(self, pipe: Any, request: GenerationRequest) -> CogVideoXState:
        """``__call__`` steps 1-7 of the job's workflow's pipeline (``CogVideoXPipeline``,
        ``CogVideoXImageToVideoPipeline`` or ``CogVideoXVideoToVideoPipeline``)."""
        keys = keyframes_of(request, self.spec.name, self.workflows)
        prompt, negative_prompt = request.prompt, request.negative_prompt
        height, width = request.height, request.width
        scheduler = job_scheduler(pipe.scheduler)
        v2v = isinstance(keys, SourceVideo)
        view = v2v_view(pipe, scheduler) if v2v else pipe
        if "strength" in request.extra and not v2v:
            why = "strength is v2v's: send one source video (an MP4 input_reference)"
            raise InvalidJobInput(why, param="extra_params.strength")

        # 1. Check inputs.
        if isinstance(keys, SourceVideo):
            video, strength = v2v_source(view, request, keys)
            view.check_inputs(prompt, height, width, strength, negative_prompt, None, video)
        elif keys is not None:
            pipe.check_inputs(keys.first, prompt, height, width, negative_prompt, None)
        else:
            pipe.check_inputs(prompt, height, width, negative_prompt, None)
        check_size(pipe, height, width)
        scale = guidance_scale(view, request)
        do_cfg = scale > 1.0
        device = pipe._execution_device
        transformer_config = pipe.transformer.config

        # 3. Encode input prompt. The transformer's text positions are sized by
        # max_text_seq_length (226 in every released model = __call__'s default).
        seq_len = self.entry.seq_len(transformer_config.max_text_seq_length)
        embeds, neg_embeds = pipe.encode_prompt(
            prompt,
            negative_prompt,
            do_cfg,
            num_videos_per_prompt=1,
            max_sequence_length=seq_len,
            device=device,
        )
        if do_cfg:
            embeds = torch.cat([neg_embeds, embeds], dim=0)

        # 4./5. Timesteps (on this job's scheduler copy) and latents.
        generator = make_generator(request.seed)
        if isinstance(keys, SourceVideo):
            start = v2v_start(view, request, video, strength, generator, embeds.dtype, device)
        elif keys is not None:
            first = keys.first
            start = i2v_start(pipe, request, first, scheduler, generator, embeds.dtype, device)
        else:
            start = _text_start(pipe, request, scheduler, generator, embeds.dtype, device)
        latents = start.latents

        # 6./7. Extra step kwargs (eta = __call__'s default), rotary embeddings; 8. ofs.
        step_kwargs = extra_step_kwargs(scheduler, generator, call_default(view, "eta"))
        rotary = (
            pipe._prepare_rotary_positional_embeddings(height, width, latents.size(1), device)
            if transformer_config.use_rotary_positional_embeddings
            else None
        )
        ofs = None
        if keys is not None and not v2v and transformer_config.ofs_embed_dim is not None:
            ofs = latents.new_full((1,), fill_value=2.0)
        return CogVideoXState(
            **sampling(request, generator, scheduler, start.timesteps, latents, scale, do_cfg),
            prompt_embeds=embeds,
            image_rotary_emb=rotary,
            extra_step_kwargs=step_kwargs,
            use_dynamic_cfg=bool(request.extra.get("use_dynamic_cfg", False)),
            num_inference_steps=start.num_inference_steps,
            additional_frames=start.additional_frames,
            is_dpm=isinstance(scheduler, CogVideoXDPMScheduler),
            workflow=job_workflow(keys),
            image_latents=start.image_latents,
            ofs=ofs,
        )

    def _step(self, pipe: Any, s: CogVideoXState) -> None:
        """One iteration of ``__call__``'s step 8 (the same in all three pipelines, but
        for i2v's image latents and ``ofs``)."""
        i = s.step_index
        t = s.timesteps[i]
        latents = s.latents
        latent_model_input = s.scheduler.scale_model_input(cfg_batch(latents, s.do_cfg), t)
        if s.image_latents is not None:  # i2v: the image's latents as more channels
            image_input = cfg_batch(s.image_latents, s.do_cfg)
            latent_model_input = torch.cat([latent_model_input, image_input], dim=2)
        noise_pred = batched_prediction(
            pipe,
            latent_model_input,
            t,
            encoder_hidden_states=s.prompt_embeds,
            ofs=s.ofs,
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
        step_kwargs = dict(s.extra_step_kwargs)
        if "generator" in step_kwargs:
            step_kwargs["generator"] = s.generator
        if not s.is_dpm:
            latents = s.scheduler.step(noise_pred, t, latents, **step_kwargs, return_dict=False)[0]
        else:
            latents, s.old_pred_original_sample = s.scheduler.step(
                noise_pred,
                s.old_pred_original_sample,
                t,
                s.timesteps[i - 1] if i > 0 else None,
                latents,
                **step_kwargs,
                return_dict=False,
            )
        s.latents = latents.to(s.prompt_embeds.dtype)

    @torch.no_grad()
    def decode_frames(self, state: StepState) -> np.ndarray:
        """The tail of ``__call__``: drop 1.5's padding frames, ``decode_latents``
        (permute to B×C×F×h×w, divide by the VAE scaling factor, decode), postprocess;
        float32 T×H×W×3 in [0, 1], what ``pipe(..., output_type="np").frames[0]``
        returns."""
        pipe, s = self._loaded(), self._state(state)
        latents = s.latents[:, s.additional_frames :]
        opts = s.request.sampler
        with vae_options(pipe.vae, opts.vae_use_tiling, opts.vae_use_slicing):
            video = pipe.decode_latents(latents)
        frames: np.ndarray = pipe.video_processor.postprocess_video(video=video, output_type="np")
        return frames[0]

    def decode(self, state: StepState) -> Media:
        """``decode_frames`` as uint8 at the request's fps."""
        return frames_media(self.decode_frames(state), self._state(state).request)

    def preview(self, state: StepState) -> np.ndarray | None:
        """Grey middle latent frame (latents are B×F×C×h×w)."""
        s = self._state(state)
        return grey_preview(s.latents[:, s.additional_frames :], channel_dim=2, frame_dim=1)
