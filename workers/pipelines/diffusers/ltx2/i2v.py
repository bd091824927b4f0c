"""LTX-2's keyframe workflows: which ones a loaded checkpoint serves and, for a job's
keyframes (keyframes.py), what ``__call__`` of ``LTX2ImageToVideoPipeline`` /
``LTX2ConditionPipeline`` does with them before its loop and after each step's guidance,
for ``LTX2Adapter`` (ltx2/adapter.py), which runs all three workflows in its own step loop.

* ``t2v``: ``LTX2Pipeline`` (no keyframe).
* ``i2v``: a first frame, as ``LTX2ImageToVideoPipeline(image=…)``: the keyframe
  (re-compressed with H.264 at ``image_crf``, resized to the canvas) is VAE-encoded
  (``argmax``) into the first latent frame, whose tokens are held clean: timestep
  ``t * (1 - mask)`` per token, and the scheduler steps the later latent frames only.
* ``flf2v``: a first and a last frame, as ``LTX2ConditionPipeline(conditions=[…])`` with
  ``LTX2VideoCondition(first, index=0)`` and ``LTX2VideoCondition(last, index=-1)`` (the
  pipeline's own first/last-frame example): the first replaces the first latent frame's
  tokens, the last is appended as extra tokens whose positions put it at the start of the
  last latent frame (pixel frame ``(F_latent - 2) * r_t + 1``, not the clip's very last
  frame: diffusers reads the index as a latent one); both held clean by blending the
  guided x0 with their clean latents each step; the extra tokens are dropped before
  decode.

Every workflow shares ``LTX2Pipeline``'s guidance (CFG, STG, modality isolation, rescale)
and audio branch; an entry's workflows decide the class it loads (``loaded_class``),
and the other workflows run sibling pipelines over the same modules
(``workflow_pipelines``: the same weights, cancel gates, compiled blocks, LoRA slot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from diffusers import LTX2ConditionPipeline, LTX2ImageToVideoPipeline, LTX2Pipeline
from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
from diffusers.pipelines.ltx2.utils import (
    apply_image_conditioning_crf,
    resolve_default_image_crf,
)
from PIL import Image

from models.catalog import Workflow
from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.ltx2.state import LTX2ConditionState, LTX2ImageState, LTX2State
from workers.pipelines.diffusers.shared.common import cfg_batch
from workers.pipelines.diffusers.shared.keyframes import Keyframes

SERVED: tuple[Workflow, ...] = ("t2v", "i2v", "flf2v")
IMAGE_WORKFLOWS: tuple[Workflow, ...] = ("i2v", "flf2v")
# The diffusers pipeline whose ``__call__`` each workflow mirrors.
PIPELINES: dict[Workflow, Any] = {
    "t2v": LTX2Pipeline,
    "i2v": LTX2ImageToVideoPipeline,
    "flf2v": LTX2ConditionPipeline,
}


def loaded_class(workflows: list[Workflow]) -> Any:
    """The class an entry loads: ``LTX2ConditionPipeline`` if it serves ``flf2v``, else
    ``LTX2ImageToVideoPipeline`` if ``i2v``, else ``LTX2Pipeline``."""
    for workflow in ("flf2v", "i2v"):
        if workflow in workflows:
            return PIPELINES[workflow]
    return LTX2Pipeline


def workflow_pipelines(pipe: Any, workflows: list[Workflow]) -> dict[Workflow, Any]:
    """Each served workflow's pipeline: ``pipe`` itself for its own class, else that
    workflow's class over ``pipe``'s modules (its own checks, ``prepare_latents`` and
    ``video_processor``; ``LTX2ConditionPipeline``'s ``audio_scheduler`` only where loaded)."""
    out: dict[Workflow, Any] = {}
    for workflow in workflows:
        cls = PIPELINES[workflow]
        if type(pipe) is cls:
            out[workflow] = pipe
            continue
        out[workflow] = cls(
            scheduler=pipe.scheduler, vae=pipe.vae, audio_vae=pipe.audio_vae,
            text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer,
            connectors=pipe.connectors, transformer=pipe.transformer, vocoder=pipe.vocoder,
            processor=pipe.processor, prompt_enhancer=pipe.prompt_enhancer,
            duration_head=pipe.duration_head,
        )  # fmt: skip
        out[workflow].set_progress_bar_config(disable=True)
    return out


def check_workflows(name: str, pipe: Any, workflows: list[Workflow]) -> None:
    """Refuse to serve what the loaded components cannot run (``ValueError`` at load,
    naming the model): a workflow LTX-2 has no pipeline for, and an image workflow on a
    transformer that patches latents (both pipelines pack a one-channel conditioning
    mask with the transformer's patch sizes and squeeze it to one value per token)."""
    unknown = sorted(set(workflows) - set(SERVED))
    if unknown:
        raise ValueError(f"{name}: LTX-2 serves t2v, i2v and flf2v, not {', '.join(unknown)}")
    config = pipe.transformer.config
    images = [w for w in IMAGE_WORKFLOWS if w in workflows]
    if images and (config.patch_size, config.patch_size_t) != (1, 1):
        raise ValueError(
            f"{name}: {' and '.join(images)} need a transformer with patch_size 1 and "
            f"patch_size_t 1 (this one: {config.patch_size}, {config.patch_size_t})"
        )


def check_keyframes(pipe: Any, keys: Keyframes | None, request: GenerationRequest) -> None:
    """What the loops need of a job beyond ``check_inputs``: ``image_crf`` only with
    keyframes (it would act on nothing); ``flf2v`` a second latent frame for the last
    keyframe (with one, ``index=-1`` is latent frame 0 and ``LTX2ConditionPipeline`` would
    overwrite the first keyframe with the last)."""
    if keys is None and "image_crf" in request.extra:
        raise InvalidJobInput(
            "image_crf re-compresses keyframes, and none was sent", param="extra_params.image_crf"
        )
    if keys is None or keys.workflow != "flf2v":
        return
    temporal = pipe.vae_temporal_compression_ratio
    if (request.num_frames - 1) // temporal + 1 < 2:
        raise InvalidJobInput(
            f"a first and a last frame need more than {temporal} frames "
            f"({request.num_frames} asked for)",
            param="num_frames",
        )


def image_crf(request: GenerationRequest) -> int | None:
    """``extra_params.image_crf``: the H.264 CRF the keyframes are re-compressed at before
    the VAE (``__call__``'s ``image_crf`` / ``LTX2VideoCondition.crf``); None: the model's
    default (33 for Gemma 3 checkpoints), 0: none."""
    raw = request.extra.get("image_crf")
    return None if raw is None else int(raw)


def image_latents(
    pipe: Any,
    keys: Keyframes,
    request: GenerationRequest,
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``LTX2ImageToVideoPipeline.__call__``'s step 4: the keyframe re-compressed,
    preprocessed to the canvas, then ``prepare_latents`` (its VAE latents in the first
    latent frame, the noise from ``generator``); (packed latents, packed mask)."""
    crf = image_crf(request)
    crf = resolve_default_image_crf(pipe.text_encoder) if crf is None else crf
    image = keys.first
    if crf != 0:
        image = Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))
    height, width = request.height, request.width
    pixels = pipe.video_processor.preprocess(image, height=height, width=width)
    pixels = pixels.to(device=device, dtype=dtype)
    channels = pipe.transformer.config.in_channels
    latents, mask = pipe.prepare_latents(
        pixels, 1, channels, height, width, request.num_frames, 0.0, torch.float32, device,
        generator, None,
    )  # fmt: skip
    return latents, mask


def condition_latents(
    pipe: Any,
    keys: Keyframes,
    request: GenerationRequest,
    conditioning_fps: float,
    device: torch.device,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``LTX2ConditionPipeline.__call__``'s step 4 for ``conditions=[first at 0, last at
    -1]`` (strength 1): ``prepare_latents``' (latents, mask, clean latents, the appended
    keyframe tokens' coordinates)."""
    crf = image_crf(request)
    conditions = [LTX2VideoCondition(frames=keys.first, index=0, strength=1.0, crf=crf)]
    if keys.last is not None:
        conditions.append(LTX2VideoCondition(frames=keys.last, index=-1, strength=1.0, crf=crf))
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]
    out = pipe.prepare_latents(
        conditions=conditions,
        batch_size=1,
        num_channels_latents=pipe.transformer.config.in_channels,
        height=request.height,
        width=request.width,
        num_frames=request.num_frames,
        frame_rate=conditioning_fps,
        noise_scale=1.0,  # __call__'s default without custom sigmas
        dtype=torch.float32,
        device=device,
        generator=generator,
        latents=None,
    )
    return out


@dataclass(frozen=True)
class VideoStart:
    """What a workflow's step 4 leaves its loop: the packed video latents, the fields of
    its state class (``LTX2ImageState`` / ``LTX2ConditionState``) and the appended
    keyframe tokens' coordinates (flf2v)."""

    latents: torch.Tensor
    keyed: dict[str, torch.Tensor]
    keyframe_coords: torch.Tensor | None = None


def video_start(
    pipe: Any,
    keys: Keyframes | None,
    request: GenerationRequest,
    do_cfg: bool,
    dtype: torch.dtype,
    conditioning_fps: float,
    device: torch.device,
    generator: torch.Generator,
) -> VideoStart:
    """Step 4's video latents of the job's workflow's ``__call__``, from ``generator``
    (t2v's ``prepare_latents``; the keyframes': ``image_latents`` / ``condition_latents``),
    the conditioning mask doubled for the CFG batch as ``__call__`` does."""
    if keys is None:
        latents = pipe.prepare_latents(
            1, pipe.transformer.config.in_channels, request.height, request.width,
            request.num_frames, 0.0, torch.float32, device, generator,
        )  # fmt: skip
        return VideoStart(latents, {})
    if keys.workflow == "i2v":
        latents, mask = image_latents(pipe, keys, request, dtype, device, generator)
        return VideoStart(latents, {"conditioning_mask": cfg_batch(mask, do_cfg)})
    latents, mask, clean, coords = condition_latents(
        pipe, keys, request, conditioning_fps, device, generator
    )
    keyed = {"conditioning_mask": cfg_batch(mask, do_cfg), "clean_latents": clean}
    return VideoStart(latents, keyed, coords)


def model_timesteps(s: LTX2State, batch: int) -> tuple[torch.Tensor, ...]:
    """The transformer's ``timestep``, ``audio_timestep``, ``sigma`` and ``audio_sigma``
    for this step's batch, as each ``__call__`` passes them (t2v leaves the audio ones to
    default to the video ones: the same values)."""
    i = s.step_index
    timestep = s.timesteps[i].expand(batch)
    if isinstance(s, LTX2ConditionState):
        audio = s.audio_timesteps[i].expand(batch)
        video = timestep.unsqueeze(-1) * (1 - s.conditioning_mask.squeeze(-1))
        return video, audio, timestep, audio
    if isinstance(s, LTX2ImageState):
        video = timestep.unsqueeze(-1) * (1 - s.conditioning_mask)
        return video, timestep, timestep, timestep
    return timestep, timestep, timestep, timestep


def next_video_latents(pipe: Any, s: LTX2State, guided: torch.Tensor) -> torch.Tensor:
    """The end of a loop iteration for the video latents, from the guided x0 prediction:
    t2v converts it to a velocity and steps; i2v does so unpacked and steps all but the
    first latent frame; flf2v first blends in the clean keyframe latents by the mask."""
    i = s.step_index
    t, latents, sched = s.timesteps[i], s.latents, s.scheduler
    if isinstance(s, LTX2ConditionState):
        mask = s.conditioning_mask[: guided.size(0)]
        guided = (guided * (1 - mask) + s.clean_latents * mask).to(guided.dtype)
    if not isinstance(s, LTX2ImageState):
        velocity = pipe.convert_x0_to_velocity(latents, guided, i, sched)
        stepped: torch.Tensor = sched.step(velocity, t, latents, return_dict=False)[0]
        return stepped
    p, p_t = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
    grid = (s.grid.num_frames, s.grid.height, s.grid.width)
    guided = pipe._unpack_latents(guided, *grid, p, p_t)
    latents = pipe._unpack_latents(latents, *grid, p, p_t)
    velocity = pipe.convert_x0_to_velocity(latents, guided, i, sched)[:, :, 1:]
    later = sched.step(velocity, t, latents[:, :, 1:], return_dict=False)[0]
    packed: torch.Tensor = pipe._pack_latents(torch.cat([latents[:, :, :1], later], dim=2), p, p_t)
    return packed
