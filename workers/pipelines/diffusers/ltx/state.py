"""One LTX-Video job's state, for every loop (text, image, condition): ``LTXAdapter``
(ltx/adapter.py) makes it, ltx/workflows.py and ltx/condition.py step it. Its own
module, so the workflows import the state and never the adapter or each other's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from models.catalog import Workflow
from workers.pipelines.diffusers.shared.packed import PackedState

# Which ``__call__``'s loop a job runs: ``LTXPipeline``'s, ``LTXImageToVideoPipeline``'s
# (ltx/workflows.py) or ``LTXConditionPipeline``'s (ltx/condition.py).
Loop = Literal["text", "image", "condition"]


@dataclass(kw_only=True)
class LTXState(PackedState):
    """One LTX job. ``latents`` are packed (B×tokens×C; the conditioned loop's extra
    tokens first); ``prompt_embeds`` and ``prompt_attention_mask`` hold the [negative,
    positive] batch when CFG is on."""

    prompt_embeds: torch.Tensor
    prompt_attention_mask: torch.Tensor
    guidance_rescale: float
    # ``LTXPipeline`` / ``LTXImageToVideoPipeline``'s micro-condition (None: the
    # conditioned loop, which passes ``video_coords`` instead).
    rope_interpolation_scale: tuple[float, float, float] | None = None
    workflow: Workflow = "t2v"
    loop: Loop = "text"
    # image: 1 on the first latent frame's tokens (doubled under CFG); condition: each
    # token's conditioning strength (None without conditions).
    conditioning_mask: torch.Tensor | None = None
    # The conditioned loop (ltx/condition.py): coordinates, the conditioned latents the
    # hard-conditioning noise starts from, the count of extra (appended) condition tokens.
    video_coords: torch.Tensor | None = None
    init_latents: torch.Tensor | None = None
    extra_tokens: int = 0
    image_cond_noise_scale: float = 0.0
