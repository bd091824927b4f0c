"""One Wan job's state, for every workflow (t2v, i2v, flf2v, v2v): ``WanAdapter``
(wan/adapter.py) makes it for t2v and the image workflows, wan/v2v.py for v2v, and the
one loop of wan/adapter.py runs them all. Its own module, so the workflows import the
state and never the adapter."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.catalog import Workflow
from workers.pipelines.diffusers.shared.common import DiffusersState


@dataclass(kw_only=True)
class WanState(DiffusersState):
    """One Wan job: embeddings, latents, its scheduler copy and RNG, the stage switch."""

    prompt_embeds: torch.Tensor
    negative_prompt_embeds: torch.Tensor | None
    guidance_scale_2: float  # low-noise stage (only read when boundary_timestep is set)
    boundary_timestep: float | None
    transformer_dtype: torch.dtype
    workflow: Workflow = "t2v"
    # i2v / flf2v: what the loop conditions on (``prepare_latents``' second output: the
    # frame mask and the keyframes' latents, or TI2V-5B's first-frame latents).
    condition: torch.Tensor | None = None
    # TI2V-5B (``expand_timesteps``): 0 on the first latent frame (the keyframe's), else 1.
    first_frame_mask: torch.Tensor | None = None
    # Wan 2.1 I2V / FLF2V: the image encoder's features of the keyframes.
    image_embeds: torch.Tensor | None = None
