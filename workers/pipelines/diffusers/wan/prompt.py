"""Wan's prompt encoding, the step 3 every Wan ``__call__`` shares (``WanPipeline``,
``WanImageToVideoPipeline``, ``WanVideoToVideoPipeline``), for wan/adapter.py and
wan/v2v.py."""

from __future__ import annotations

from typing import Any

import torch

from workers.pipelines.base import GenerationRequest


def encode_prompt(
    pipe: Any,
    request: GenerationRequest,
    *,
    seq_len: int,
    do_cfg: bool,
    device: Any,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``pipe.encode_prompt`` of the request's prompt and negative prompt (the latter's
    embeddings None without CFG), both cast to the transformer's ``dtype``."""
    embeds, negative = pipe.encode_prompt(
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        do_classifier_free_guidance=do_cfg,
        num_videos_per_prompt=1,
        max_sequence_length=seq_len,
        device=device,
    )
    embeds = embeds.to(dtype)
    if negative is not None:
        negative = negative.to(dtype)
    return embeds, negative
