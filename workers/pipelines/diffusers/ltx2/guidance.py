"""LTX-2's guidance, as every workflow's ``__call__`` runs it (diffusers 0.42), for
``LTX2Adapter`` (ltx2/adapter.py): the knobs a request sets (:func:`guidance_scales`,
:func:`stg_blocks`) and one loop iteration (:func:`guided_step`): the batched CFG pass,
then the optional spatio-temporal-guidance and modality-isolation passes, all combined in
x0 space with guidance rescale, one step per scheduler (the keyframe loops' part of it:
ltx2/i2v.py)."""

from __future__ import annotations

from typing import Any

import torch
from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.ltx2.i2v import model_timesteps, next_video_latents
from workers.pipelines.diffusers.ltx2.state import LTX2State
from workers.pipelines.diffusers.shared.common import call_default, cfg_batch, guidance_scale

# The guidance knobs of ``request.extra``, ``__call__``'s arguments of the same names.
KNOBS = (
    "stg_scale",
    "modality_scale",
    "guidance_rescale",
    "audio_guidance_scale",
    "audio_stg_scale",
    "audio_modality_scale",
    "audio_guidance_rescale",
)


def guidance_scales(pipe: Any, request: GenerationRequest) -> dict[str, float]:
    """Guidance knobs: request.extra, else ``__call__``'s defaults; ``audio_* or video``."""
    s = {"guidance_scale": guidance_scale(pipe, request)}
    for name in KNOBS:
        value = request.extra.get(name)
        s[name] = float(call_default(pipe, name) if value is None else value)
    for name in ("guidance_scale", "stg_scale", "modality_scale", "guidance_rescale"):
        s[f"audio_{name}"] = s[f"audio_{name}"] or s[name]
    return s


def stg_blocks(pipe: Any, request: GenerationRequest) -> list[int] | None:
    """``spatio_temporal_guidance_blocks``: the request's comma-separated ``stg_blocks``
    ("" disables STG), else ``__call__``'s default."""
    raw = request.extra.get("stg_blocks")
    if raw is None:
        default = call_default(pipe, "spatio_temporal_guidance_blocks")
        return None if default is None else [int(block) for block in default]
    try:
        blocks = [int(part) for part in str(raw).replace(" ", "").split(",") if part]
    except ValueError:
        raise InvalidJobInput(f"stg_blocks must be comma-separated integers, got {raw!r}") from None
    return blocks or None


def _forward(
    pipe: Any,
    s: LTX2State,
    video: torch.Tensor,
    audio: torch.Tensor,
    times: tuple[torch.Tensor, ...],
    *,
    guide: bool,
    isolate: bool = False,
    stg: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One transformer call with the loop's arguments (``times``: ``model_timesteps``);
    float32 velocity predictions."""
    dtype = s.dtype
    embeds = (
        (s.guide_embeds, s.guide_audio_embeds, s.guide_attention_mask)
        if guide
        else (s.embeds, s.audio_embeds, s.attention_mask)
    )
    coords = (
        (s.guide_video_coords, s.guide_audio_coords) if guide else (s.video_coords, s.audio_coords)
    )
    out_video, out_audio = pipe.transformer(
        hidden_states=video.to(dtype),
        audio_hidden_states=audio.to(dtype),
        encoder_hidden_states=embeds[0],
        audio_encoder_hidden_states=embeds[1],
        timestep=times[0],
        audio_timestep=times[1],
        sigma=times[2],
        audio_sigma=times[3],
        encoder_attention_mask=embeds[2],
        audio_encoder_attention_mask=embeds[2],
        **s.grid.transformer_kwargs(),
        fps=s.conditioning_fps,
        audio_num_frames=s.audio_num_frames,
        video_coords=coords[0],
        audio_coords=coords[1],
        isolate_modalities=isolate,
        spatio_temporal_guidance_blocks=stg,
        perturbation_mask=None,
        use_cross_timestep=s.use_cross_timestep,
        attention_kwargs=None,
        return_dict=False,
    )
    return out_video.float(), out_audio.float()


def guided_step(pipe: Any, s: LTX2State) -> None:
    """One loop iteration: CFG / STG / modality guidance in x0 space, both schedulers."""
    i, sc = s.step_index, s.scales
    latents, audio_latents = s.latents, s.audio_latents
    video_sched, audio_sched = s.scheduler, s.audio_scheduler

    def x0(sample: torch.Tensor, v: torch.Tensor, sched: Any) -> torch.Tensor:
        return pipe.convert_velocity_to_x0(sample, v, i, sched)

    video_in, audio_in = cfg_batch(latents, s.do_cfg), cfg_batch(audio_latents, s.do_cfg)
    times = model_timesteps(s, video_in.shape[0])
    with pipe.transformer.cache_context("cond_uncond"):
        pred_v, pred_a = _forward(pipe, s, video_in, audio_in, times, guide=False)
    # Deltas that are off stay 0, as in __call__ (``x + 0`` is exact).
    cfg_v: torch.Tensor | float = 0.0
    cfg_a: torch.Tensor | float = 0.0
    stg_v: torch.Tensor | float = 0.0
    stg_a: torch.Tensor | float = 0.0
    mod_v: torch.Tensor | float = 0.0
    mod_a: torch.Tensor | float = 0.0
    if s.do_cfg:
        uncond_v, pred_v = pred_v.chunk(2)
        pred_v, uncond_v = x0(latents, pred_v, video_sched), x0(latents, uncond_v, video_sched)
        cfg_v = (sc["guidance_scale"] - 1) * (pred_v - uncond_v)
        uncond_a, pred_a = pred_a.chunk(2)
        pred_a = x0(audio_latents, pred_a, audio_sched)
        uncond_a = x0(audio_latents, uncond_a, audio_sched)
        cfg_a = (sc["audio_guidance_scale"] - 1) * (pred_a - uncond_a)
        times = tuple(x.chunk(2, dim=0)[0] for x in times)
    else:
        pred_v = x0(latents, pred_v, video_sched)
        pred_a = x0(audio_latents, pred_a, audio_sched)

    if s.do_stg:
        with pipe.transformer.cache_context("uncond_stg"):
            stg_pv, stg_pa = _forward(
                pipe, s, latents, audio_latents, times, guide=True, stg=s.stg_blocks
            )
        stg_v = sc["stg_scale"] * (pred_v - x0(latents, stg_pv, video_sched))
        stg_a = sc["audio_stg_scale"] * (pred_a - x0(audio_latents, stg_pa, audio_sched))
    if s.do_modality:
        with pipe.transformer.cache_context("uncond_modality"):
            mod_pv, mod_pa = _forward(
                pipe, s, latents, audio_latents, times, guide=True, isolate=True
            )
        mod_v = (sc["modality_scale"] - 1) * (pred_v - x0(latents, mod_pv, video_sched))
        mod_a = (sc["audio_modality_scale"] - 1) * (pred_a - x0(audio_latents, mod_pa, audio_sched))

    guided_v = pred_v + cfg_v + stg_v + mod_v
    guided_a = pred_a + cfg_a + stg_a + mod_a
    if sc["guidance_rescale"] > 0:
        guided_v = rescale_noise_cfg(guided_v, pred_v, guidance_rescale=sc["guidance_rescale"])
    if sc["audio_guidance_rescale"] > 0:
        guided_a = rescale_noise_cfg(
            guided_a, pred_a, guidance_rescale=sc["audio_guidance_rescale"]
        )
    velocity_a = pipe.convert_x0_to_velocity(audio_latents, guided_a, i, audio_sched)
    s.latents = next_video_latents(pipe, s, guided_v)
    t = s.timesteps[i]
    s.audio_latents = audio_sched.step(velocity_a, t, audio_latents, return_dict=False)[0]
