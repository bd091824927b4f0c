"""Shared pieces of the diffusers adapters: per-job RNG and scheduler, guidance, VAE
options, postprocessing, previews, and the state every job's extends (the adapter base
class: adapter.py; what a registry entry configures: entry.py; loading helpers:
loading.py).

Every adapter drives a diffusers pipeline with its own step loop: ``prepare`` mirrors what
the pipeline's ``__call__`` does before its denoising loop, ``step`` one loop iteration,
``decode`` what follows it. The pipeline object is shared by all jobs of a worker, so no
per-request value is ever written to it: each job gets its own scheduler copy and RNG.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest, Media, StepState


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """The job's RNG. Kept on the CPU by default: diffusers' ``randn_tensor`` draws on the
    generator's device and moves the noise, so one seed gives the same initial noise on any
    device (and matches ``pipe(..., generator=torch.Generator().manual_seed(seed))``)."""
    return torch.Generator(device=device).manual_seed(int(seed))


def clone_generator(generator: torch.Generator) -> torch.Generator:
    """An independent generator in the same state (to draw without advancing the job's)."""
    clone = torch.Generator(device=generator.device)
    clone.set_state(generator.get_state())
    return clone


def job_scheduler(base: Any, flow_shift: float | None = None) -> Any:
    """A private scheduler for one job (multistep schedulers such as UniPC keep state).

    Without ``flow_shift`` a deep copy of the pipeline's scheduler; with it a fresh one via
    ``from_config`` with that shift (``flow_shift`` for UniPC/DPM-style flow schedulers,
    ``shift`` for ``FlowMatchEulerDiscreteScheduler``), as diffusers' docs do for Wan.
    """
    if flow_shift is None:
        return copy.deepcopy(base)
    config = base.config
    if config.get("use_dynamic_shifting"):
        name = type(base).__name__
        raise InvalidJobInput(f"{name} shifts by resolution here; flow_shift has no effect")
    if "flow_shift" in config:
        return type(base).from_config(config, flow_shift=float(flow_shift))
    if "shift" in config:
        return type(base).from_config(config, shift=float(flow_shift))
    raise InvalidJobInput(f"flow_shift is not supported by {type(base).__name__}")


def call_default(pipe: Any, name: str) -> Any:
    """The default of a ``__call__`` argument of ``pipe`` (e.g. ``guidance_scale``)."""
    return inspect.signature(type(pipe).__call__).parameters[name].default


def guidance_scale(pipe: Any, request: GenerationRequest) -> float:
    """``request.guidance_scale``, or the pipeline's own ``__call__`` default when None."""
    value = request.guidance_scale
    return float(call_default(pipe, "guidance_scale") if value is None else value)


def cfg(uncond: torch.Tensor, cond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance, written as every diffusers video pipeline writes it."""
    return uncond + scale * (cond - uncond)


def extra_step_kwargs(scheduler: Any, generator: torch.Generator, eta: float) -> dict[str, Any]:
    """``prepare_extra_step_kwargs`` of the pipelines, checked against the job scheduler."""
    params = set(inspect.signature(scheduler.step).parameters)
    out: dict[str, Any] = {}
    if "eta" in params:
        out["eta"] = eta
    if "generator" in params:
        out["generator"] = generator
    return out


@contextlib.contextmanager
def vae_options(vae: Any, tiling: bool | None, slicing: bool | None) -> Iterator[None]:
    """Apply ``vae_use_tiling``/``vae_use_slicing`` for one decode, then restore.

    ``enable_tiling()`` etc. mutate the shared VAE, so the request's choice is set around
    its own decode only (decodes of one worker run one at a time). Unsupported: ignored.
    """
    saved: list[tuple[str, bool]] = []
    for attr, want in (("use_tiling", tiling), ("use_slicing", slicing)):
        verb = attr.removeprefix("use_")
        if want is None or not hasattr(vae, attr) or not hasattr(vae, f"enable_{verb}"):
            continue
        saved.append((attr, bool(getattr(vae, attr))))
        getattr(vae, f"enable_{verb}" if want else f"disable_{verb}")()
    try:
        yield
    finally:
        for attr, was in saved:
            setattr(vae, attr, was)


@contextlib.contextmanager
def vae_cache_released(vae: Any) -> Iterator[None]:
    """Empty a causal VAE's feature cache after a decode or encode, however it ended.

    Wan's VAE (``AutoencoderKLWan``, Helios's too) keeps the last frames of every causal
    convolution's input in ``_feat_map`` while it decodes, and clears it only when a decode
    returns. A decode stopped at a cancel point (``checkpoint()``: a job's cancel, a world
    session's stop) left it filled until the next decode of the worker: 0.5 to 1.1 GiB at
    640x384 in bf16, held by the shared VAE. A VAE without ``clear_cache`` is left as it is."""
    try:
        yield
    finally:
        clear = getattr(vae, "clear_cache", None)
        if callable(clear):
            clear()


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] → uint8, rounding as diffusers' ``numpy_to_pil`` does."""
    return (np.clip(frames, 0.0, 1.0) * 255).round().astype(np.uint8)


def pixels_uint8(video: torch.Tensor) -> torch.Tensor:
    """T×3×H×W in [0, 1] → uint8 T×H×W×3, on the device: the arithmetic of ``to_uint8``
    over ``output_type="np"`` (clip, ×255 and round half to even in float32), so the
    frames are bit-equal, with no pass over 83 M floats on the CPU (0.3 s at
    H3's qualification shape)."""
    pixels = (video.float().clamp(0.0, 1.0) * 255).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 1)


def frames_uint8(video: torch.Tensor) -> np.ndarray:
    """:func:`pixels_uint8` on the host (a quarter of the float frames' bytes copied),
    its channels interleaved on the device: the encoder reads each frame row by row, and
    the host would otherwise gather the strided copy on the encoder's thread."""
    return pixels_uint8(video).contiguous().cpu().numpy()


def grey_preview(latents: torch.Tensor, channel_dim: int, frame_dim: int) -> np.ndarray:
    """A cheap preview: the middle latent frame, mean over channels, contrast-stretched
    to grey (uint8 h×w×3 at latent resolution). No model is run."""
    x = latents[0].float()
    c, f = channel_dim - 1, frame_dim - 1
    x = x.mean(dim=c)  # drop channels
    f = f if f < c else f - 1
    x = x.select(f, x.shape[f] // 2)
    lo, hi = torch.quantile(x.flatten(), torch.tensor([0.02, 0.98], device=x.device))
    grey = ((x - lo) / (hi - lo).clamp_min(1e-6)).clamp(0, 1)
    img = (grey * 255).round().to(torch.uint8).cpu().numpy()
    return np.repeat(img[:, :, None], 3, axis=2)


@dataclass(kw_only=True)
class DiffusersState(StepState):
    """Per-request state shared by the diffusers adapters (never stored on the adapter)."""

    request: GenerationRequest
    generator: torch.Generator
    scheduler: Any
    timesteps: torch.Tensor
    latents: torch.Tensor
    guidance_scale: float
    do_cfg: bool
    # Other input shapes at the same latents (LTX's per-token timesteps): blocks of its own.
    compile_variant: str = ""


def sampling(
    request: GenerationRequest,
    generator: torch.Generator,
    scheduler: Any,
    timesteps: torch.Tensor,
    latents: torch.Tensor,
    guidance_scale: float,
    do_cfg: bool,
) -> dict[str, Any]:
    """The :class:`DiffusersState` fields every adapter fills the same way, for a state's
    constructor (``State(**sampling(…), own=…)``); the job has as many steps as its
    schedule has timesteps."""
    return {
        "num_steps": len(timesteps),
        "request": request,
        "generator": generator,
        "scheduler": scheduler,
        "timesteps": timesteps,
        "latents": latents,
        "guidance_scale": guidance_scale,
        "do_cfg": do_cfg,
    }


def cfg_batch(latents: torch.Tensor, do_cfg: bool) -> torch.Tensor:
    """The model input of one step: ``latents`` twice (the [negative, positive] batch)
    under classifier-free guidance, else as they are."""
    return torch.cat([latents] * 2) if do_cfg else latents


def batched_prediction(
    pipe: Any, latent_model_input: torch.Tensor, t: torch.Tensor, **conditioning: Any
) -> torch.Tensor:
    """One transformer pass over a step's whole model input (the CFG batch: the
    ``"cond_uncond"`` cache context) at timestep ``t``; the prediction in float32."""
    timestep = t.expand(latent_model_input.shape[0])
    with pipe.transformer.cache_context("cond_uncond"):
        prediction: torch.Tensor = pipe.transformer(
            hidden_states=latent_model_input,
            timestep=timestep,
            attention_kwargs=None,
            return_dict=False,
            **conditioning,
        )[0]
    return prediction.float()


def frames_media(frames: np.ndarray, request: GenerationRequest) -> Media:
    """A video job's media: float frames in [0, 1] (a ``decode_frames``) as uint8 at the
    request's fps."""
    return Media(frames=to_uint8(frames), fps=request.fps)


def decode_video(pipe: Any, request: GenerationRequest, *latents: Any) -> np.ndarray:
    """``vae.decode(*latents)`` under the request's VAE options, post-processed to float32
    T×H×W×3 in [0, 1] (``postprocess_video(output_type="np")`` of the one video)."""
    opts = request.sampler
    vae = pipe.vae
    with vae_options(vae, opts.vae_use_tiling, opts.vae_use_slicing), vae_cache_released(vae):
        video = vae.decode(*latents, return_dict=False)[0]
    frames: np.ndarray = pipe.video_processor.postprocess_video(video, output_type="np")
    return frames[0]
