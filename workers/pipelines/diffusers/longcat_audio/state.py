"""One LongCat-AudioDiT job's state (``LongCatAudioAdapter``, longcat_audio/adapter.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.pipelines.diffusers.longcat_audio.batch import TextSide
from workers.pipelines.diffusers.shared.common import DiffusersState


@dataclass(kw_only=True)
class LongCatAudioState(DiffusersState):
    """One LongCat job. ``latents`` are 1×frames×latent_dim (more, padded with zeros, where
    the lengths are bucketed: buckets.py); the negative embedding is the
    zero tensor (no ``negative_prompt``) or the encoded one, with its own mask. A job whose
    rows run in one pass (batch.py: a batched step, or its own under ``guidance_batch``)
    keeps its text side too."""

    prompt_embeds: torch.Tensor
    text_mask: torch.Tensor
    negative_prompt_embeds: torch.Tensor
    negative_text_mask: torch.Tensor
    mask: torch.Tensor  # the latent frames' attention mask (false on a bucket's padding)
    latent_cond: torch.Tensor  # zeros: no audio prompt
    frames: int  # the clip's latent frames: ``latents``' first ones (the rest pad a bucket)
    # Each step's transformer timestep (``timesteps / num_train_timesteps``, the text's
    # dtype), made once in ``prepare``.
    step_times: torch.Tensor
    # The prompt's and the negative's text side (batch.py), made at the job's first
    # one-pass step and kept: it does not change from step to step.
    text: TextSide | None = None
    null_text: TextSide | None = None
