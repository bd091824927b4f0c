"""A Helios chunk's latents to its frames, piece by piece as the VAE decodes them.

The bottom of ``HeliosPipeline.__call__``'s chunk loop decodes the chunk's 9 latent
frames with Wan's VAE and post-processes the video. Wan's VAE decodes one latent frame
after the other anyway (``shared/wan_decode.py``), so each piece (1 frame, then 4 per
latent frame: 33 in all) is post-processed and rounded to uint8 on the device, copied to
the host and handed on as soon as it is decoded: a world session's delivery lane encodes
it while the next latent frame decodes (``SupportsChunkStream``, docs/architecture.md
rule 15). ``postprocess_video`` and the rounding work element by element, so the pieces,
concatenated, are the whole decode's frames bit for bit. A VAE that ``decode_pieces``
cannot stand in for (tiling, an offload hook) is decoded whole, in one piece.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from workers.pipelines.diffusers.helios.inputs import latent_stats
from workers.pipelines.diffusers.shared.common import frames_uint8, vae_cache_released
from workers.pipelines.diffusers.shared.wan_decode import decode_pieces, streams


def chunk_frames(pipe: Any, latents: torch.Tensor, streamed: bool = True) -> Iterator[np.ndarray]:
    """The frames of the chunk ``latents`` (the denoised chunk, float32), uint8 T×H×W×3
    on the host, one piece per latent frame where ``streamed`` and the VAE streams (else
    one). The VAE is the worker's: read the iterator to its end before anything else
    decodes."""
    vae = pipe.vae
    mean, inv_std = latent_stats(vae, latents.device)
    with torch.no_grad():
        z = latents.to(vae.dtype) / inv_std + mean
    pieces = decode_pieces(vae, z) if streamed and streams(vae) else _whole(vae, z)
    for video in pieces:
        with torch.no_grad():
            # uint8 on the device (bit-equal to output_type="np" then to_uint8): a quarter
            # of the float frames' bytes cross to the host, and no pass over them there
            yield frames_uint8(pipe.video_processor.postprocess_video(video, output_type="pt")[0])


def _whole(vae: Any, z: torch.Tensor) -> Iterator[torch.Tensor]:
    """``vae.decode(z)`` in one piece (its feature cache emptied however it ends)."""
    with torch.no_grad(), vae_cache_released(vae):
        video = vae.decode(z, return_dict=False)[0]
    yield video
