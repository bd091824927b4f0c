"""One CogVideoX job's state, for every workflow (t2v, i2v, v2v): ``CogVideoXAdapter``
(cogvideox/adapter.py) makes it from what cogvideox/workflows.py starts, and steps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.catalog import Workflow
from workers.pipelines.diffusers.shared.common import DiffusersState


@dataclass(kw_only=True)
class CogVideoXState(DiffusersState):
    """One CogVideoX job; ``prompt_embeds`` is the [negative, positive] batch under CFG."""

    prompt_embeds: torch.Tensor
    image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None
    # prepare_extra_step_kwargs; its "generator" (the DPM step draws noise) is replaced
    # by the state's own at each step, so a trial step on a copy (compiled blocks) draws
    # from the copy's clone, never from the job's RNG.
    extra_step_kwargs: dict[str, Any]
    use_dynamic_cfg: bool
    num_inference_steps: int
    additional_frames: int
    is_dpm: bool  # CogVideoXDPMScheduler: its step carries old_pred_original_sample
    old_pred_original_sample: torch.Tensor | None = None
    workflow: Workflow = "t2v"
    # i2v: the image's latents (zero frames after it), concatenated on the channels.
    image_latents: torch.Tensor | None = None
    # CogVideoX 1.5 I2V (``ofs_embed_dim``): the ofs value __call__ passes (2.0).
    ofs: torch.Tensor | None = None
