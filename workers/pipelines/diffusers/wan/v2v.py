"""Wan video-to-video (``v2v``): ``WanVideoToVideoPipeline.__call__`` up to its loop, for
``WanAdapter`` (wan/adapter.py), whose text-to-video step runs the loop (the same transformer
call, CFG and scheduler step; no image condition).

The job's source video is the client's clip (its first ``num_frames`` frames), resized to
the canvas by ``preprocess_video``, encoded by the VAE (``argmax``) and noised to the
first timestep that ``strength`` leaves (``get_timesteps``: the last ``int(steps ×
strength)`` of the schedule run). The pipeline's scheduler is never touched: the job's
copy stands in for it in a per-job ``WanVideoToVideoPipeline`` over the loaded modules.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import WanVideoToVideoPipeline

from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.shared.common import (
    call_default,
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
)
from workers.pipelines.diffusers.shared.keyframes import SourceVideo, pipeline_over, v2v_inputs
from workers.pipelines.diffusers.wan.prompt import encode_prompt
from workers.pipelines.diffusers.wan.state import WanState


def v2v_state(
    pipe: Any, request: GenerationRequest, source: SourceVideo, max_sequence_length: int | None
) -> WanState:
    """``__call__`` steps 1-5: checks, prompt encoding, the schedule cut by ``strength``,
    the source encoded and noised to its first timestep."""
    opts = request.sampler
    if opts.guidance_scale_2 is not None or opts.boundary_ratio is not None:
        param = "guidance_scale_2" if opts.guidance_scale_2 is not None else "boundary_ratio"
        raise InvalidJobInput("v2v runs one transformer (no Wan 2.2 stages)", param=param)
    scheduler = job_scheduler(pipe.scheduler, opts.flow_shift)
    view: Any = pipeline_over(WanVideoToVideoPipeline, pipe, scheduler)
    video, strength = v2v_inputs(view, request, source)
    height, width = request.height, request.width
    scale = guidance_scale(view, request)
    do_cfg = scale > 1.0
    device = pipe._execution_device

    # 1. Check inputs.
    view.check_inputs(request.prompt, request.negative_prompt, height, width, video)
    # 3. Encode input prompt.
    seq_len = max_sequence_length or call_default(view, "max_sequence_length")
    transformer_dtype = pipe.transformer.dtype
    prompt_embeds, negative_prompt_embeds = encode_prompt(
        view, request, seq_len=seq_len, do_cfg=do_cfg, device=device, dtype=transformer_dtype
    )

    # 4. Prepare timesteps (the job's scheduler), cut by strength.
    steps = request.num_inference_steps
    scheduler.set_timesteps(steps, device=device)
    timesteps, _ = view.get_timesteps(steps, scheduler.timesteps, strength, device)
    latent_timestep = timesteps[:1].repeat(1)
    pixels = view.video_processor.preprocess_video(video, height=height, width=width)
    pixels = pixels.to(device, dtype=torch.float32)

    # 5. Prepare latent variables: the source's latents noised to the first timestep.
    generator = make_generator(request.seed)
    channels = pipe.transformer.config.in_channels
    latents = view.prepare_latents(
        pixels, 1, channels, height, width, torch.float32, device, generator, None,
        latent_timestep,
    )  # fmt: skip
    return WanState(
        **sampling(request, generator, scheduler, timesteps, latents, scale, do_cfg),
        prompt_embeds=prompt_embeds,
        negative_prompt_embeds=negative_prompt_embeds,
        guidance_scale_2=scale,
        boundary_timestep=None,
        transformer_dtype=transformer_dtype,
        workflow="v2v",
    )
