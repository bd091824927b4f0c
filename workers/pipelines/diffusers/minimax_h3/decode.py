"""MiniMax-H3's video decode, temporal clip by clip, so that x264 encodes each clip's
frames while the VAE decodes the next (``SupportsDecodeStream.decode_stream``; the
executor's ``decode_streamed``).

``AutoencoderKLMiniMaxH3._decode`` decodes the latent video in overlapping temporal clips,
cross-fades each clip's head into the previous clip's tail, concatenates them and cuts
the frames its end padding made. :func:`stream_frames` runs that same loop and yields
each finished piece, converted as the decode step converts the whole video (latent
denormalisation first; pixel mean/std, clamp and uint8 after: all elementwise), holding
back only the frames the end padding will cut. So the concatenated chunks are bit-equal
to ``vae.decode`` + the decode step's conversion (tests/unit/test_minimax_h3.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl_minimax_h3 import AutoencoderKLMiniMaxH3
from diffusers.models.modeling_utils import get_parameter_dtype


def streamable(vae: Any) -> bool:
    """Whether :func:`stream_frames` is what ``vae.decode`` would run: diffusers' own
    H3 VAE, its ``_decode`` unpatched, no offload hook."""
    return (
        type(vae) is AutoencoderKLMiniMaxH3
        and type(vae)._decode is AutoencoderKLMiniMaxH3._decode
        and not hasattr(vae, "_hf_hook")
    )


def _pad_frames(vae: Any, num_latents: int, pad_tokens: int) -> int:
    """The trailing pixel frames that ``_decode`` cuts (its own arithmetic)."""
    if pad_tokens <= 0:
        return 0
    ratio = vae.temporal_compression_ratio
    intra_tail = vae.config.clip_length % ratio
    return sum(
        intra_tail if intra_tail and (num_latents + k) % vae.tokens_chunk_size == 0 else ratio
        for k in range(pad_tokens)
    )


Frames = np.ndarray | torch.Tensor  # uint8 T×H×W×3, on the host or on the device


def _concat(parts: list[Frames]) -> Frames:
    if all(isinstance(part, np.ndarray) for part in parts):
        return np.concatenate(parts)
    return torch.cat([torch.as_tensor(part) for part in parts])


def stream_frames(
    vae: Any, latents: torch.Tensor, convert: Callable[[torch.Tensor], Frames]
) -> Iterator[Frames]:
    """``vae.decode(latents)`` (denormalised latents, batch 1) piece by piece, each piece
    ``(1, C, T, H, W)`` passed through ``convert`` (to uint8 T×H×W×3, a numpy array or a
    tensor left on the device) and yielded."""
    with torch.no_grad():
        z = latents.to(get_parameter_dtype(vae.post_quant_conv))
    chunk_tokens = vae.tokens_chunk_size
    token_drop = vae.config.token_drop
    chunk_frames = chunk_tokens * vae.temporal_compression_ratio
    num_latents = z.shape[2]
    num_tokens = num_latents + token_drop
    pad_tokens = (-num_tokens) % chunk_tokens
    num_chunks = (num_tokens + pad_tokens) // chunk_tokens - int(token_drop > 0)
    if pad_tokens > 0:
        z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad_tokens, 1, 1)], dim=2)
    cut = _pad_frames(vae, num_latents, pad_tokens)
    pending: list[Frames] = []  # the last ``cut`` frames so far: the cut may hit them

    def take(piece: torch.Tensor) -> Frames:
        """``piece`` converted, after the frames held back; all but the last ``cut``."""
        frames = _concat([*pending, convert(piece)])
        keep = max(len(frames) - cut, 0)
        pending[:] = [frames[keep:]]
        return frames[:keep]

    overlap = None
    for i in range(num_chunks):
        start = i * chunk_tokens
        with torch.no_grad():  # per clip: grad mode is not held across the yield
            clip = vae._decode_clip(z[:, :, start : start + chunk_tokens + vae.token_overlap])
            piece = None
            for j in range(int(token_drop > 0) + 1):
                chunk = clip[:, :, j * chunk_frames : (j + 1) * chunk_frames]
                chunk = chunk[:, :, vae.frame_pre_padding :]
                if j == 0:
                    if overlap is not None:
                        chunk = vae._blend(overlap, chunk, vae.frame_overlap, dim=-3)
                    piece = chunk
                else:
                    overlap = chunk
        assert piece is not None
        if len(frames := take(piece)):
            yield frames
    if overlap is not None and len(frames := take(overlap)):
        yield frames
