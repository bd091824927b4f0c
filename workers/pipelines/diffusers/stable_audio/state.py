"""One Stable Audio job's state (``StableAudioAdapter``, stable_audio/adapter.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workers.pipelines.diffusers.shared.common import DiffusersState


@dataclass(kw_only=True)
class StableAudioState(DiffusersState):
    """One Stable Audio job. ``latents`` are B×C×L audio latents; the embeddings hold the
    [negative, positive] batch when CFG is on."""

    text_audio_duration_embeds: torch.Tensor
    audio_duration_embeds: torch.Tensor
    rotary_embedding: tuple[torch.Tensor, torch.Tensor]
    step_kwargs: dict[str, Any]
    window: slice  # the requested samples of the decoded waveform
