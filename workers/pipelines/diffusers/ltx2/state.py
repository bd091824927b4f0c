"""One LTX-2 job's state, per workflow: text-to-video (``LTX2Pipeline``), image-to-video
(``LTX2ImageToVideoPipeline``: the first latent frame held clean) and keyframe
conditions (``LTX2ConditionPipeline``: a first frame in place, a last frame as appended
tokens). A class per workflow, so compiled blocks are made per loop (the image loops feed
the transformer a per-token timestep)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workers.pipelines.diffusers.shared.packed import PackedState


@dataclass(kw_only=True)
class LTX2State(PackedState):
    """One LTX-2 text-to-video job. ``latents`` (video) and ``audio_latents`` are packed
    B×tokens×C; ``embeds``/``audio_embeds``/``attention_mask``/coords hold the [negative,
    positive] batch under CFG, the ``guide_*`` fields what the STG / modality passes use."""

    audio_scheduler: Any
    audio_latents: torch.Tensor
    # dtype of the text encoder's prompt embeddings: __call__ casts model inputs to it.
    dtype: torch.dtype
    scales: dict[str, float]
    stg_blocks: list[int] | None
    use_cross_timestep: bool
    embeds: torch.Tensor
    audio_embeds: torch.Tensor
    attention_mask: torch.Tensor
    video_coords: torch.Tensor
    audio_coords: torch.Tensor
    guide_embeds: torch.Tensor
    guide_audio_embeds: torch.Tensor
    guide_attention_mask: torch.Tensor
    guide_video_coords: torch.Tensor
    guide_audio_coords: torch.Tensor
    conditioning_fps: float
    audio_num_frames: int
    latent_mel_bins: int

    @property
    def do_stg(self) -> bool:
        return self.scales["stg_scale"] > 0.0 or self.scales["audio_stg_scale"] > 0.0

    @property
    def do_modality(self) -> bool:
        return self.scales["modality_scale"] > 1.0 or self.scales["audio_modality_scale"] > 1.0


@dataclass(kw_only=True)
class LTX2ImageState(LTX2State):
    """An ``i2v`` job (``LTX2ImageToVideoPipeline``): ``conditioning_mask`` (B×tokens, the
    CFG batch's) is 1 on the first latent frame's tokens, which hold the keyframe's
    latents; the video timestep is ``t * (1 - mask)`` and the scheduler steps the other
    latent frames only."""

    conditioning_mask: torch.Tensor


@dataclass(kw_only=True)
class LTX2ConditionState(LTX2State):
    """An ``flf2v`` job (``LTX2ConditionPipeline``, conditions at latent indices 0 and -1):
    ``latents`` are the grid's tokens followed by the last keyframe's tokens;
    ``conditioning_mask`` (B×tokens×1, the CFG batch's) is the strength on conditioned
    tokens, ``clean_latents`` their clean values (blended in x0 space each step);
    ``audio_timesteps`` the audio scheduler's own schedule."""

    conditioning_mask: torch.Tensor
    clean_latents: torch.Tensor
    audio_timesteps: torch.Tensor
