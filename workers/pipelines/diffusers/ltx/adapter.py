"""LTX-Video text-, image-, first/last-frame- and video-to-video, one denoise step at a time.

Text-to-video (``t2v``) mirrors ``LTXPipeline.__call__`` (diffusers 0.42): ``prepare`` =
steps 1-6 (checks, prompt encoding with the [negative, positive] CFG batch, packed latents,
the resolution-dependent ``mu`` shift of the sigma schedule, RoPE interpolation scale from
the frame rate = ``request.fps``), ``step`` = one iteration of step 7, ``decode`` = unpack,
de-normalise, the timestep-conditioned VAE's ``decode_timestep``/``decode_noise_scale``
noise (drawn from the job's generator, as ``__call__`` does after its loop), VAE decode.

The registry entry's ``spec.workflows`` says what a checkpoint serves and so which
pipeline loads (ltx/workflows.py): ``["t2v"]`` (the default) ``LTXPipeline``; ``i2v`` (with or
without ``t2v``) ``LTXImageToVideoPipeline``, whose loop is ltx/workflows.py's and whose ``t2v``
jobs run ``LTXPipeline``'s loop over the same modules; ``flf2v`` or ``v2v`` in the list
``LTXConditionPipeline`` (LTX-Video 0.9.5+), which runs every workflow of the entry with
its own loop (ltx/condition.py). The decode noise of ``LTXImageToVideoPipeline`` is
``torch.randn`` on the execution device in ``__call__``; here it is drawn on the job's CPU
generator and moved (the same numbers on CPU, where they are compared).

Request options: ``vae_use_tiling`` / ``vae_use_slicing``; extras (``request.extra``):
``decode_timestep`` (default 0.0), ``decode_noise_scale`` (default: = decode_timestep),
``guidance_rescale`` (default 0.0) — the ``__call__`` arguments of the same names — and,
for ``v2v``, ``strength`` (ltx/condition.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from diffusers import LTXConditionPipeline, LTXImageToVideoPipeline, LTXPipeline
from diffusers.pipelines.ltx.pipeline_ltx import (
    calculate_shift,
    retrieve_timesteps,
)

from workers.pipelines.base import GenerationRequest, Media, StepState
from workers.pipelines.diffusers.ltx.condition import condition_fields, condition_step
from workers.pipelines.diffusers.ltx.state import LTXState
from workers.pipelines.diffusers.ltx.workflows import (
    check_workflows,
    guided,
    image_latents,
    image_step,
    pipeline_for,
    text_pipeline,
)
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import (
    batched_prediction,
    call_default,
    cfg_batch,
    clone_generator,
    decode_video,
    frames_media,
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
)
from workers.pipelines.diffusers.shared.keyframes import (
    Keyframes,
    job_workflow,
    keyframes_of,
    text_over_image,
)
from workers.pipelines.diffusers.shared.packed import (
    decode_noise,
    latent_grid,
    packed_preview,
    prompt_batch,
    unpacked,
)


class LTXAdapter(DiffusersAdapter[LTXState]):
    """``LTXPipeline`` (LTX-Video 0.9.x text-to-video) and, for an entry serving other
    workflows, ``LTXImageToVideoPipeline`` or ``LTXConditionPipeline`` (ltx/workflows.py)."""

    family = "diffusers.ltx"
    pipeline_class: Any = LTXPipeline
    default_workflows = ("t2v",)
    _pipeline_for = staticmethod(pipeline_for)
    # t2v jobs of LTXImageToVideoPipeline: LTXPipeline over its modules (``load``).
    _text_pipe: Any = None

    def load(self, device: str) -> None:
        """``DiffusersAdapter.load``, then the served workflows checked against the loaded
        components (ltx/workflows.py; refusing to start on a mismatch) and, for ``t2v``
        beside ``i2v``, ``LTXPipeline`` over the loaded modules."""
        super().load(device)
        pipe = self._loaded()
        check_workflows(self.spec.name, pipe, self.workflows)
        image_class = LTXImageToVideoPipeline
        self._text_pipe = text_over_image(pipe, self.workflows, image_class, text_pipeline)

    def _prepare(self, pipe: Any, request: GenerationRequest) -> LTXState:
        """``__call__``'s steps before its loop: ``LTXConditionPipeline``'s for every
        workflow of a conditioned entry (ltx/condition.py), else ``LTXPipeline``'s steps
        1-6 (t2v) or ``LTXImageToVideoPipeline``'s (i2v: a first frame)."""
        keys = keyframes_of(request, self.spec.name, self.workflows)
        height, width, num_frames = request.height, request.width, request.num_frames
        conditioned = isinstance(pipe, LTXConditionPipeline)
        image = keys if isinstance(keys, Keyframes) and not conditioned else None
        text_pipe = self._text_pipe if self._text_pipe is not None and image is None else pipe
        # 1. Check inputs (the conditioned pipeline's in condition_fields).
        if not conditioned:
            text_pipe.check_inputs(prompt=request.prompt, height=height, width=width)
        scale = guidance_scale(pipe, request)
        do_cfg = scale > 1.0
        extra = request.extra
        rescale = float(extra.get("guidance_rescale", call_default(pipe, "guidance_rescale")))
        device = pipe._execution_device

        # 3. Prepare text embeddings ([negative, positive] batch under CFG).
        seq_len = self.entry.max_sequence_length
        embeds, mask = prompt_batch(pipe, request, do_cfg, device, seq_len)
        generator = make_generator(request.seed)
        grid = latent_grid(pipe, request)
        common: dict[str, Any] = {
            "prompt_embeds": embeds,
            "prompt_attention_mask": mask,
            "guidance_rescale": rescale,
            "grid": grid,
            "workflow": job_workflow(keys),
        }
        if conditioned:
            fields = condition_fields(pipe, request, keys, device, generator, do_cfg)
            scheduler, timesteps = fields.pop("scheduler"), fields.pop("timesteps")
            latents = fields.pop("latents")
            per_token = fields["conditioning_mask"] is not None
            return LTXState(
                **sampling(request, generator, scheduler, timesteps, latents, scale, do_cfg),
                **common,
                **fields,
                loop="condition",
                # timesteps per token, or one per sample: blocks compiled for each
                compile_variant="/per-token" if per_token else "",
            )

        # 4. Prepare latent variables (packed into tokens; i2v: the image's first frame).
        conditioning_mask = None
        if image is None:
            latents = text_pipe.prepare_latents(
                1, pipe.transformer.config.in_channels, height, width, num_frames,
                torch.float32, device, generator,
            )  # fmt: skip
        else:
            latents, conditioning_mask = image_latents(
                pipe, image.first, height, width, num_frames, embeds.dtype, device, generator,
                do_cfg,
            )  # fmt: skip

        # 5. Prepare timesteps: sigmas 1 → 1/N shifted by mu(video sequence length).
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
            **common,
            rope_interpolation_scale=rope_scale,
            loop="text" if image is None else "image",
            conditioning_mask=conditioning_mask,
            compile_variant="" if image is None else "/per-token",
        )

    def _step(self, pipe: Any, s: LTXState) -> None:
        """One iteration of the job's loop: ``LTXPipeline``'s step 7 (batched CFG,
        optional rescale), or ltx/workflows.py's / ltx/condition.py's."""
        if s.loop == "image":
            image_step(pipe, s)
            return
        if s.loop == "condition":
            condition_step(pipe, s)
            return
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
        noise_pred = guided(noise_pred, s)
        s.latents = s.scheduler.step(noise_pred, t, latents, return_dict=False)[0]

    @torch.no_grad()
    def decode_frames(self, state: StepState) -> np.ndarray:
        """The tail of ``__call__``: the condition tokens dropped, unpack, de-normalise,
        decode-timestep noise, decode; float32 T×H×W×3 in [0, 1], what ``pipe(...,
        output_type="np").frames[0]`` returns."""
        pipe, s = self._loaded(), self._state(state)
        vae = pipe.vae
        latents = unpacked(pipe, s.latents[:, s.extra_tokens :], s.grid)
        latents = pipe._denormalize_latents(
            latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
        )
        latents = latents.to(s.prompt_embeds.dtype)
        timestep: torch.Tensor | None = None
        if vae.config.timestep_conditioning:
            # Drawn from a clone: decoding twice gives the same video.
            generator = clone_generator(s.generator)
            latents, timestep = decode_noise(pipe, latents, s.request.extra, generator)
        return decode_video(pipe, s.request, latents.to(vae.dtype), timestep)

    def decode(self, state: StepState) -> Media:
        """``decode_frames`` as uint8 at the request's fps."""
        return frames_media(self.decode_frames(state), self._state(state).request)

    def preview(self, state: StepState) -> np.ndarray | None:
        """Grey middle latent frame of the video's latents (the condition tokens left out)."""
        s = self._state(state)
        return packed_preview(self._loaded(), s.latents[:, s.extra_tokens :], s.grid)
