"""Wan's causal VAE (``AutoencoderKLWan``: the Wan family's, and Helios's) decoded one
latent frame at a time, each piece yielded as soon as it is decoded.

``AutoencoderKLWan._decode`` already works that way inside: after ``post_quant_conv`` it
runs its causal decoder on one latent frame after the other (the first gives 1 video
frame, each later one 4), carrying every causal convolution's last inputs in its feature
cache, then concatenates the pieces and clamps them. :func:`decode_pieces` runs that same
loop and clamps each piece, so the pieces, concatenated, are ``vae.decode``'s video bit
for bit (the clamp works element by element), and a caller can encode one piece while
the next decodes: a Wan job's streamed decode (``wan/adapter.py``), a Helios world chunk
(``helios/decode.py``).

The feature cache lives on the VAE, which a worker shares: a decode must be consumed
whole, by one caller at a time (a job's decode, a session's turn at the device), before
the VAE decodes anything else. It is emptied however the decode ends (a stop at a
cancel point inside it, issue 43 §3), as ``_decode`` empties it when it returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from diffusers import AutoencoderKLWan


def streams(vae: Any) -> bool:
    """Whether :func:`decode_pieces` is what ``vae.decode`` would run: diffusers' own
    ``AutoencoderKLWan``, its ``_decode`` unpatched, no tiling asked for, no patched
    latents (Wan 2.2's VAE), no offload hook. (Its feature cache exists only from its
    first decode on, so its presence says nothing.)"""
    return (
        issubclass(type(vae), AutoencoderKLWan)
        and type(vae)._decode is AutoencoderKLWan._decode
        and not getattr(vae, "use_tiling", False)
        and vae.config.get("patch_size") is None
        and not hasattr(vae, "_hf_hook")
    )


def decode_pieces(vae: Any, z: torch.Tensor) -> Iterator[torch.Tensor]:
    """``vae.decode(z)`` (batch 1, de-normalised latents in the VAE's dtype) one latent
    frame at a time: each piece ``(1, C, T, H, W)`` clamped to [-1, 1] as ``_decode``
    clamps the whole video, yielded before the next latent frame is decoded."""
    vae.clear_cache()
    try:
        with torch.no_grad():
            x = vae.post_quant_conv(z)
        for i in range(x.shape[2]):
            with torch.no_grad():  # per piece: grad mode is not held across the yield
                vae._conv_idx = [0]
                first = {"first_chunk": True} if i == 0 else {}
                out = vae.decoder(
                    x[:, :, i : i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx, **first
                )
                piece = torch.clamp(out, min=-1.0, max=1.0)
            yield piece
    finally:
        vae.clear_cache()
