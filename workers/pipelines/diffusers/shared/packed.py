"""What LTX and LTX-2 share: latents packed into tokens on a latent grid (unpacked for
decode and previews), Gemma/T5 prompt batches with attention masks, and the decode-timestep
noise of their timestep-conditioned VAEs. Functions over the loaded pipe, which each
family's adapter calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor

from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.shared.common import DiffusersState, call_default, grey_preview


@dataclass(frozen=True)
class LatentGrid:
    """The latent video grid of an LTX-family job: frames, height and width once the VAE
    has compressed them, as ``prepare_latents`` lays the packed tokens out."""

    num_frames: int
    height: int
    width: int

    @property
    def tokens(self) -> int:
        return self.num_frames * self.height * self.width

    def transformer_kwargs(self) -> dict[str, int]:
        """The grid under the names the LTX transformers take it."""
        return {"num_frames": self.num_frames, "height": self.height, "width": self.width}


@dataclass(kw_only=True)
class PackedState(DiffusersState):
    """A job of the LTX family, whose ``latents`` are packed B×tokens×C on ``grid``."""

    grid: LatentGrid


def prompt_batch(
    pipe: Any,
    request: GenerationRequest,
    do_cfg: bool,
    device: Any,
    max_sequence_length: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``encode_prompt``: the prompt embeddings and their attention mask, as the
    [negative, positive] batch under CFG (``max_sequence_length`` None: ``__call__``'s
    default)."""
    default = call_default(pipe, "max_sequence_length")
    embeds, mask, neg_embeds, neg_mask = pipe.encode_prompt(
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        do_classifier_free_guidance=do_cfg,
        num_videos_per_prompt=1,
        max_sequence_length=default if max_sequence_length is None else max_sequence_length,
        device=device,
    )
    if do_cfg:
        embeds = torch.cat([neg_embeds, embeds], dim=0)
        mask = torch.cat([neg_mask, mask], dim=0)
    return embeds, mask


def decode_noise(
    pipe: Any, latents: torch.Tensor, extra: dict[str, Any], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """What LTX and LTX-2 do after their loop for a timestep-conditioned VAE: mix
    ``decode_noise_scale`` of fresh noise (drawn from ``generator``) into the latents and
    decode at ``decode_timestep`` (the ``__call__`` arguments; ``request.extra`` here).
    Returns the noised latents and the decode timestep."""
    decode_timestep = float(extra.get("decode_timestep", call_default(pipe, "decode_timestep")))
    noise_scale = float(extra.get("decode_noise_scale", decode_timestep))
    device, dtype = latents.device, latents.dtype
    noise = randn_tensor(latents.shape, generator=generator, device=device, dtype=dtype)
    timestep = torch.tensor([decode_timestep], device=device, dtype=dtype)
    scale = torch.tensor([noise_scale], device=device, dtype=dtype)[:, None, None, None, None]
    return (1 - scale) * latents + scale * noise, timestep


def latent_grid(pipe: Any, request: GenerationRequest) -> LatentGrid:
    """The request's video on the VAE's latent grid."""
    temporal, spatial = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
    return LatentGrid(
        (request.num_frames - 1) // temporal + 1,
        request.height // spatial,
        request.width // spatial,
    )


def unpacked(pipe: Any, latents: torch.Tensor, grid: LatentGrid) -> torch.Tensor:
    """Packed token latents → B×C×F×H×W, on ``grid``."""
    video: torch.Tensor = pipe._unpack_latents(
        latents,
        grid.num_frames,
        grid.height,
        grid.width,
        pipe.transformer_spatial_patch_size,
        pipe.transformer_temporal_patch_size,
    )
    return video


def packed_preview(pipe: Any, latents: torch.Tensor, grid: LatentGrid) -> np.ndarray:
    """Grey middle latent frame of ``grid``'s packed video latents (``latents``: the
    grid's tokens only)."""
    return grey_preview(unpacked(pipe, latents, grid), channel_dim=1, frame_dim=2)
