"""One denoise step of a Helios chunk, as ``HeliosPipeline`` and ``HeliosPyramidPipeline``
take it (diffusers 0.42), on a session's state (``helios/session.py``).

``HeliosPipeline`` denoises a chunk at full resolution with one schedule.
``HeliosPyramidPipeline`` (Helios-Mid, Helios-Distilled) denoises it in stages from a
quarter of the latent resolution up: at the start of each stage the latents are
upsampled (nearest, 2x) and renoised with block noise, then the stage's own schedule
runs; the distilled models step with DMD, re-noising each prediction towards the stage's
starting point. Each of those steps is one session ``step``: the stage change rides on
the first step of its stage, as the chunk's noise rides on the first step of the chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from diffusers.pipelines.helios import pipeline_helios, pipeline_helios_pyramid

from workers.pipelines.diffusers.helios.session import HeliosState
from workers.pipelines.diffusers.shared.common import cfg

HISTORY_SIZES = (16, 2, 1)  # latent frames of the long, mid and 1x history (``__call__``)
LATENT_FRAMES_PER_CHUNK = 9  # ``num_latent_frames_per_chunk``'s default
ZERO_STEPS = 1  # ``__call__``'s ``zero_steps`` (CFG-Zero*: ``use_zero_init``)


@dataclass
class PyramidStages:
    """Where a pyramid chunk is: its stage, the step within it, that stage's schedule and
    (distilled models) the latents the stage started from."""

    steps: list[int]  # ``pyramid_num_inference_steps_list``
    stage: int = -1  # -1: the chunk has not begun a stage
    stage_step: int = 0
    timesteps: torch.Tensor | None = None
    start_point: torch.Tensor | None = None


def _indices() -> dict[str, torch.Tensor]:
    """``__call__``'s frame indices (``keep_first_frame``): the anchor at 0, then the
    long, mid and 1x history, then the chunk; the short history is the anchor + 1x."""
    sizes = [1, *HISTORY_SIZES, LATENT_FRAMES_PER_CHUNK]
    prefix, long, mid, x1, hidden = torch.arange(0, sum(sizes)).split(sizes, dim=0)
    return {
        "hidden": hidden.unsqueeze(0),
        "short": torch.cat([prefix, x1], dim=0).unsqueeze(0),
        "mid": mid.unsqueeze(0),
        "long": long.unsqueeze(0),
    }


INDICES = _indices()


def shift_mu(pipe: Any, latents_shape: tuple[int, ...]) -> float:
    """``calculate_shift`` of a chunk's latent frames ``(…, t, h, w)`` in tokens."""
    patch = pipe.transformer.config.patch_size
    t, h, w = latents_shape[-3:]
    image_seq_len = t * h * w // (patch[0] * patch[1] * patch[2])
    sched = pipe.scheduler.config
    mu: float = pipeline_helios.calculate_shift(
        image_seq_len,
        sched.get("base_image_seq_len", 256),
        sched.get("max_image_seq_len", 4096),
        sched.get("base_shift", 0.5),
        sched.get("max_shift", 1.15),
    )
    return mu


def predict(
    pipe: Any, s: HeliosState, cache: str, embeds: torch.Tensor | None, timestep: torch.Tensor
) -> torch.Tensor:
    """One transformer pass over the chunk's latents, its history and the embeddings."""
    assert s.latents is not None and s.history is not None
    model = pipe.transformer
    short, mid, long = s.history
    with model.cache_context(cache):
        out: torch.Tensor = model(
            hidden_states=s.latents.to(model.dtype),
            timestep=timestep,
            encoder_hidden_states=embeds,
            indices_hidden_states=INDICES["hidden"],
            indices_latents_history_short=INDICES["short"],
            indices_latents_history_mid=INDICES["mid"],
            indices_latents_history_long=INDICES["long"],
            latents_history_short=short,
            latents_history_mid=mid,
            latents_history_long=long,
            attention_kwargs=None,
            return_dict=False,
        )[0]
    return out


def one_stage_step(pipe: Any, s: HeliosState) -> None:
    """An iteration of ``HeliosPipeline``'s denoising loop."""
    assert s.timesteps is not None and s.latents is not None
    t = s.timesteps[s.step_index]
    timestep = t.expand(s.latents.shape[0])
    noise_pred = predict(pipe, s, "cond", s.chunk_embeds, timestep)
    if s.do_cfg:
        uncond = predict(pipe, s, "uncond", s.negative_prompt_embeds, timestep)
        noise_pred = cfg(uncond, noise_pred, s.guidance_scale)
    s.latents = s.scheduler.step(
        noise_pred, t, s.latents, generator=s.generator, return_dict=False
    )[0]


def pyramid_begin_chunk(s: HeliosState, stages: PyramidStages) -> None:
    """``HeliosPyramidPipeline``: the chunk's full-resolution noise taken down to the
    first stage's resolution (bilinear, x2 per halving)."""
    assert s.latents is not None
    b, c, f, h, w = s.latents.shape
    latents = s.latents.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
    for _ in range(len(stages.steps) - 1):
        h, w = h // 2, w // 2
        latents = F.interpolate(latents, size=(h, w), mode="bilinear") * 2
    s.latents = latents.reshape(b, f, c, h, w).permute(0, 2, 1, 3, 4)
    stages.stage, stages.stage_step, stages.timesteps = -1, 0, None
    stages.start_point = None


def _begin_stage(pipe: Any, s: HeliosState, stages: PyramidStages) -> None:
    """The top of a pyramid stage: its schedule; after the first, the latents upsampled
    and renoised with block noise (``__call__``'s "fix the stage")."""
    assert s.latents is not None
    stages.stage += 1
    stages.stage_step = 0
    k = stages.stage
    device = pipe._execution_device
    s.scheduler.set_timesteps(
        stages.steps[k], k, device=device, mu=shift_mu(pipe, tuple(s.latents.shape))
    )
    stages.timesteps = s.scheduler.timesteps
    if k > 0:
        b, c, f, h, w = s.latents.shape
        latents = s.latents.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
        latents = F.interpolate(latents, size=(h * 2, w * 2), mode="nearest")
        latents = latents.reshape(b, f, c, h * 2, w * 2).permute(0, 2, 1, 3, 4)
        ori_sigma = 1 - s.scheduler.ori_start_sigmas[k]
        gamma = s.scheduler.config.gamma
        alpha = 1 / (math.sqrt(1 + (1 / gamma)) * (1 - ori_sigma) + ori_sigma)
        beta = alpha * (1 - ori_sigma) / math.sqrt(gamma)
        patch = pipe.transformer.config.patch_size
        noise = pipe.sample_block_noise(b, c, f, h * 2, w * 2, patch, device, s.generator)
        noise = noise.to(device=device, dtype=pipe.transformer.dtype)
        s.latents = alpha * latents + beta * noise
    if pipe.config.is_distilled:
        stages.start_point = s.latents


def pyramid_step(pipe: Any, s: HeliosState, stages: PyramidStages) -> None:
    """An iteration of ``HeliosPyramidPipeline``'s innermost loop (beginning the next
    stage first when the last one is through): CFG-Zero* where the pipeline's config asks
    for it, DMD's arguments for a distilled model."""
    if stages.timesteps is None or stages.stage_step >= len(stages.timesteps):
        _begin_stage(pipe, s, stages)
    assert stages.timesteps is not None and s.latents is not None
    i, t = stages.stage_step, stages.timesteps[stages.stage_step]
    timestep = t.expand(s.latents.shape[0]).to(torch.int64)
    noise_pred = predict(pipe, s, "cond", s.chunk_embeds, timestep)
    if s.do_cfg:
        uncond = predict(pipe, s, "uncond", s.negative_prompt_embeds, timestep)
        if pipe.config.is_cfg_zero_star:
            batch = noise_pred.shape[0]
            alpha = pipeline_helios_pyramid.optimized_scale(
                noise_pred.reshape(batch, -1), uncond.reshape(batch, -1)
            )
            alpha = alpha.view(batch, *([1] * (noise_pred.dim() - 1))).to(noise_pred.dtype)
            if stages.stage == 0 and i <= ZERO_STEPS:  # use_zero_init
                noise_pred = noise_pred * 0.0
            else:
                noise_pred = uncond * alpha + s.guidance_scale * (noise_pred - uncond * alpha)
        else:
            noise_pred = cfg(uncond, noise_pred, s.guidance_scale)
    extra: dict[str, Any] = {}
    if pipe.config.is_distilled:
        extra = {
            "cur_sampling_step": i,
            "dmd_noisy_tensor": stages.start_point,
            "dmd_sigmas": s.scheduler.sigmas,
            "dmd_timesteps": s.scheduler.timesteps,
            "all_timesteps": stages.timesteps,
        }
    s.latents = s.scheduler.step(
        noise_pred, t, s.latents, generator=s.generator, return_dict=False, **extra
    )[0]
    stages.stage_step += 1
