"""What LTX and LTX-2 share: latents packed into tokens on a latent grid (unpacked for
decode and previews), and Gemma/T5 prompt batches with attention masks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor

from workers.pipelines.base import GenerationRequest, StepState
from workers.pipelines.diffusers.shared.common import DiffusersState, call_default, grey_preview
from workers.pipelines.diffusers.shared.workflow_adapter import WorkflowAdapter


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


P = TypeVar("P", bound=PackedState)


class PackedLatentsAdapter(WorkflowAdapter[P]):
    """What LTX and LTX-2 share: Gemma/T5 prompt batches with attention masks, and latents
    packed into tokens (unpacked for decode and previews)."""

    def _prompt_batch(
        self, pipe: Any, request: GenerationRequest, do_cfg: bool, device: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``encode_prompt``: the prompt embeddings and their attention mask, as the
        [negative, positive] batch under CFG."""
        embeds, mask, neg_embeds, neg_mask = pipe.encode_prompt(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            do_classifier_free_guidance=do_cfg,
            num_videos_per_prompt=1,
            max_sequence_length=self._seq_len(call_default(pipe, "max_sequence_length")),
            device=device,
        )
        if do_cfg:
            embeds = torch.cat([neg_embeds, embeds], dim=0)
            mask = torch.cat([neg_mask, mask], dim=0)
        return embeds, mask

    def _decode_noise(
        self, latents: torch.Tensor, extra: dict[str, Any], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What LTX and LTX-2 do after their loop for a timestep-conditioned VAE: mix
        ``decode_noise_scale`` of fresh noise (drawn from ``generator``) into the latents and
        decode at ``decode_timestep`` (the ``__call__`` arguments; ``request.extra`` here).
        Returns the noised latents and the decode timestep."""
        default = call_default(self._loaded(), "decode_timestep")
        decode_timestep = float(extra.get("decode_timestep", default))
        noise_scale = float(extra.get("decode_noise_scale", decode_timestep))
        device, dtype = latents.device, latents.dtype
        noise = randn_tensor(latents.shape, generator=generator, device=device, dtype=dtype)
        timestep = torch.tensor([decode_timestep], device=device, dtype=dtype)
        scale = torch.tensor([noise_scale], device=device, dtype=dtype)[:, None, None, None, None]
        return (1 - scale) * latents + scale * noise, timestep

    def _latent_grid(self, pipe: Any, request: GenerationRequest) -> LatentGrid:
        """The request's video on the VAE's latent grid."""
        temporal, spatial = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
        return LatentGrid(
            (request.num_frames - 1) // temporal + 1,
            request.height // spatial,
            request.width // spatial,
        )

    def _unpacked(self, latents: torch.Tensor, s: P) -> torch.Tensor:
        """Packed token latents → B×C×F×H×W, on the state's latent grid."""
        pipe = self._loaded()
        unpacked: torch.Tensor = pipe._unpack_latents(
            latents,
            s.grid.num_frames,
            s.grid.height,
            s.grid.width,
            pipe.transformer_spatial_patch_size,
            pipe.transformer_temporal_patch_size,
        )
        return unpacked

    def preview(self, state: StepState) -> np.ndarray | None:
        """Grey middle latent frame of the unpacked video latents (B×C×F×h×w)."""
        s = self._state(state)
        return grey_preview(self._unpacked(s.latents, s), channel_dim=1, frame_dim=2)
