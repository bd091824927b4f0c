"""LTX-Video 0.9.5+'s conditioned generation (``LTXConditionPipeline``, diffusers 0.42),
for ``LTXAdapter`` (ltx/adapter.py) on an entry that serves ``flf2v`` or ``v2v``
(ltx/workflows.py says why those load this pipeline).

A job's conditions are what ``__call__`` takes as ``image`` / ``video`` with
``frame_index`` and ``strength``:

* ``t2v``: none;
* ``i2v``: the first frame, ``image`` at ``frame_index`` 0, strength 1;
* ``flf2v``: the first and the last frame, ``image=[first, last]`` at ``frame_index``
  ``[0, num_frames - 1]``, strength 1: the first is blended into the first latent frame,
  the last is encoded apart and appended as extra tokens at its own video coordinates;
* ``v2v``: the source clip, ``video`` at ``frame_index`` 0 (its first ``num_frames``
  frames, cut to 8k+1 by ``trim_conditioning_sequence``), ``strength`` =
  ``extra_params.strength`` (default 1): how strongly the clip's latents are held. At 1
  its tokens are never denoised (the video keeps the clip); below 1 they start from
  ``lerp(noise, clip, strength)`` and are denoised once the schedule reaches ``1 -
  strength``. This is the reverse of Wan's v2v ``strength`` (the share of steps run).

``prepare`` mirrors steps 1-5 (checks, prompt batch, the conditions preprocessed, the
linear-quadratic schedule as custom timesteps, ``prepare_latents``, ``video_coords``
scaled by 1/frame rate), ``step`` one iteration of step 6 (timestep-dependent noise on the
hard-conditioning tokens drawn from the job's generator, per-token timesteps
``min(t, (1 - mask) × 1000)``, the scheduler step on ``-noise_pred`` with
``per_token_timesteps``, only tokens past their conditioning updated), and the decode
drops the extra tokens before ``LTXPipeline``'s tail. ``denoise_strength`` (which needs
pre-encoded ``latents``) is not offered.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.pipelines.ltx.pipeline_ltx_condition import (
    linear_quadratic_schedule,
    retrieve_timesteps,
)

from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.ltx.state import LTXState
from workers.pipelines.diffusers.ltx.workflows import guided, transformer_pass
from workers.pipelines.diffusers.shared.common import call_default, cfg_batch, job_scheduler
from workers.pipelines.diffusers.shared.keyframes import Keyframes, SourceVideo


def condition_tensors(
    pipe: Any, request: GenerationRequest, keys: Keyframes | SourceVideo | None, device: Any
) -> tuple[list[torch.Tensor], list[float], list[int]]:
    """``__call__``'s step 1 (``check_inputs``) and the conditioning part of step 3: each
    condition preprocessed to the canvas in the VAE's dtype; (tensors, strengths,
    frame indices)."""
    height, width, num_frames = request.height, request.width, request.num_frames
    strength = 1.0  # __call__'s default; only v2v takes the request's
    image: Any = None
    video: Any = None
    if isinstance(keys, SourceVideo):
        strength = float(request.extra.get("strength", call_default(pipe, "strength")))
        if not 0.0 < strength <= 1.0:
            raise InvalidJobInput(
                f"strength {strength:g} is not in (0, 1]", param="extra_params.strength"
            )
        video = [keys.images(num_frames)]
        indices = [0]
    elif keys is not None:
        image = [keys.first] if keys.last is None else [keys.first, keys.last]
        indices = [0] if keys.last is None else [0, num_frames - 1]
    else:
        indices = []
    pipe.check_inputs(
        prompt=request.prompt, conditions=None, image=image, video=video,
        frame_index=indices or 0, strength=strength, denoise_strength=1.0, height=height,
        width=width,
    )  # fmt: skip
    tensors: list[torch.Tensor] = []
    processor, vae_dtype = pipe.video_processor, pipe.vae.dtype
    for i, index in enumerate(indices):
        if image is not None:
            tensor = processor.preprocess(image[i], height, width).unsqueeze(2)
        else:
            tensor = processor.preprocess_video(video[i], height, width)
            kept = pipe.trim_conditioning_sequence(index, tensor.size(2), num_frames)
            tensor = tensor[:, :, :kept]
        tensors.append(tensor.to(device, dtype=vae_dtype))
    return tensors, [strength] * len(indices), indices


def condition_fields(
    pipe: Any,
    request: GenerationRequest,
    keys: Keyframes | SourceVideo | None,
    device: Any,
    generator: torch.Generator,
    do_cfg: bool,
) -> dict[str, Any]:
    """``__call__`` steps 4-5 after the conditions (:func:`condition_tensors`): the job's
    scheduler with the linear-quadratic schedule, ``prepare_latents`` (noise, the
    conditions' VAE samples and extra noise, all from ``generator``), the scaled video
    coordinates; the ``LTXState`` fields of the conditioned loop."""
    tensors, strengths, indices = condition_tensors(pipe, request, keys, device)
    # 4. Prepare timesteps: the linear-quadratic schedule, as custom timesteps.
    steps = request.num_inference_steps
    scheduler = job_scheduler(pipe.scheduler)
    # As an ndarray: the scheduler takes np.array() of it either way (float32 both), and
    # numpy 2 warns when that is done to a tensor.
    custom = (linear_quadratic_schedule(steps) * 1000).numpy()
    timesteps, _ = retrieve_timesteps(scheduler, steps, device, custom)
    # 5. Prepare latent variables (extra tokens of the conditions first).
    latents, mask, coords, extra_tokens = pipe.prepare_latents(
        tensors, strengths, indices, batch_size=1,
        num_channels_latents=pipe.transformer.config.in_channels, height=request.height,
        width=request.width, num_frames=request.num_frames, sigma=None, latents=None,
        generator=generator, device=device, dtype=torch.float32,
    )  # fmt: skip
    coords = coords.float()
    coords[:, 0] = coords[:, 0] * (1.0 / request.fps)
    if do_cfg:
        coords = torch.cat([coords, coords], dim=0)
    noise_scale = float(call_default(pipe, "image_cond_noise_scale"))
    return {
        "scheduler": scheduler,
        "timesteps": timesteps,
        "latents": latents,
        "conditioning_mask": mask if tensors else None,
        "video_coords": coords,
        "init_latents": latents.clone() if tensors else None,
        "extra_tokens": extra_tokens,
        "image_cond_noise_scale": noise_scale,
    }


def condition_step(pipe: Any, s: LTXState) -> None:
    """One iteration of ``LTXConditionPipeline.__call__``'s step 6."""
    t = s.timesteps[s.step_index]
    latents, mask = s.latents, s.conditioning_mask
    if s.image_cond_noise_scale > 0 and s.init_latents is not None:
        latents = pipe.add_noise_to_image_conditioning_latents(
            t / 1000.0, s.init_latents, latents, s.image_cond_noise_scale, mask, s.generator
        )
    latent_model_input = cfg_batch(latents, s.do_cfg).to(s.prompt_embeds.dtype)
    timestep = t.expand(latent_model_input.shape[0]).unsqueeze(-1).float()
    if mask is not None:
        timestep = torch.min(timestep, (1 - cfg_batch(mask, s.do_cfg)) * 1000.0)
    noise_pred = transformer_pass(
        pipe, s, latent_model_input, timestep, video_coords=s.video_coords
    )
    noise_pred = guided(noise_pred, s)
    if s.do_cfg:
        timestep, _ = timestep.chunk(2)
    denoised = s.scheduler.step(
        -noise_pred, t, latents, per_token_timesteps=timestep, return_dict=False
    )[0]
    if mask is not None:
        to_denoise = (t / 1000 - 1e-6 < (1.0 - mask)).unsqueeze(-1)
        s.latents = torch.where(to_denoise, denoised, latents)
    else:
        s.latents = denoised
