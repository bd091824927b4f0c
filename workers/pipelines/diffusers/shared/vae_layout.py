"""The memory layout of a VAE decoder's 3-D convolution weights: the adapter option
``vae_channels_last`` of ``diffusers.wan`` and ``diffusers.helios``.

Why: a Helios world chunk's time is its denoise plus the VAE decode of its 9 latent
frames, and in isolation (``benchmarks/gpu/vae_decode.py`` on an H100, one 33-frame
640x384 chunk, bf16) the Wan VAE's decode took 527.5 ms with cuDNN's benchmark mode and
436.9 ms with the decoder's weights in ``torch.channels_last_3d`` (the frames within 0.046
of the default's: other convolution algorithms round bf16 otherwise). cuDNN's
channels-last kernels read the activations without a transpose per layer; the
activations follow the weights' layout from the first convolution on.

Only the decoder: that is what was measured, and a job's or a session's encode (Wan's
image-to-video condition, Helios' reference image) keeps the layout it was loaded with.
The layout is set once, after the weights are placed on their device (``.to`` keeps a
tensor's strides, but an offload hook moves weights in and out as it likes, so an entry
that offloads is refused: :func:`refuse_with_offload`).
"""

from __future__ import annotations

from typing import Any

import torch

from models.memory_plan import MemoryPlan


def conv_weights_to(
    module: torch.nn.Module, memory_format: torch.memory_format = torch.channels_last_3d
) -> int:
    """Every 5-D parameter of ``module`` (its 3-D convolutions' weights) in
    ``memory_format``, in place (the parameter objects are kept, so hooks and optimisers
    holding them see the change); how many there were."""
    changed = 0
    for param in module.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=memory_format)
            changed += 1
    return changed


def decoder_channels_last(pipe: Any) -> int:
    """``pipe.vae.decoder``'s 3-D convolution weights in ``channels_last_3d``; how many."""
    return conv_weights_to(pipe.vae.decoder, torch.channels_last_3d)


def refuse_with_offload(model: str, memory: MemoryPlan | None) -> None:
    """``ValueError`` where ``vae_channels_last`` meets an offload: the offload hooks move
    the weights between host and device, and what layout they come back in is theirs."""
    if memory is not None and memory.offload != "none":
        raise ValueError(
            f"{model}: vae_channels_last = true does not combine with "
            f"offload = {memory.offload!r} (offload hooks move the VAE's weights): "
            "drop one of them"
        )
