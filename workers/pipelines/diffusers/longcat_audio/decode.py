"""LongCat's audio VAE decoded window by window, so that a streamed clip's first PCM goes
out before its last window is decoded (``SupportsAudioDecodeStream``, pcm_stream.py).

The decoder (``AudioDiTVaeDecoder``) is a non-causal stack of convolutions: an input conv
of kernel 7, then per upsampling stage a transposed convolution and three residual units
of kernel 7 with dilations 1, 3 and 9, then an output conv. One output sample sees a
bounded number of latent frames either side, its *reach* (:func:`reach_frames`: about 11
frames for LongCat-AudioDiT-1B's strides ``[2, 4, 4, 8, 8]``, most of it from the first
stage's dilated units at 8 samples a frame). A window decoded with at least that many
frames of context either side therefore computes the same function of the latents as the
whole decode over the samples it keeps; only the summation order differs (convolution
algorithms change with the input length), so the two agree to rounding: at most
``1e-6`` peak in float32 with the tiny test model and the default context (measured,
``tests/unit/test_longcat_streaming.py``). At the clip's two ends a window starts or
ends where the clip does, so the zero padding is the same as the whole decode's.

Windows grow: ``first`` frames, then twice as many each time (capped at ``largest``), so
the first audio waits for a short decode while the context re-decoded in total stays a
fraction of the clip.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def _conv(module: nn.Module) -> tuple[int, int, int, int]:
    """``(kernel, stride, dilation, padding)`` of a 1-d convolution, transposed or not."""
    conv: Any = module
    if isinstance(conv.padding, str):
        raise ValueError(f"cannot bound the reach of {module!r}")
    return conv.kernel_size[0], conv.stride[0], conv.dilation[0], conv.padding[0]


def reach_frames(decoder: nn.Module) -> float:
    """How many latent frames either side of its own one output sample of ``decoder``
    depends on, at most: each convolution's reach, in the samples at its input, divided
    by the samples a latent frame has there (the product of the transposed convolutions'
    strides before it), summed in the modules' order (``nn.Sequential`` runs them so)."""
    rate = 1  # samples a latent frame has at the current layer's input
    reach = 0.0
    for module in decoder.modules():
        if isinstance(module, nn.ConvTranspose1d):
            kernel, stride, dilation, pad = _conv(module)
            # output j reads inputs (j + pad - span) / stride .. (j + pad) / stride
            span = dilation * (kernel - 1)
            reach += (max(pad, span - pad) / stride + 1) / rate
            rate *= stride
        elif isinstance(module, nn.Conv1d):
            kernel, stride, dilation, pad = _conv(module)
            if stride != 1:
                raise ValueError(f"cannot bound the reach of {module!r}")
            reach += max(pad, dilation * (kernel - 1) - pad) / rate
    return reach


def context_frames(decoder: nn.Module) -> int:
    """The context each window is decoded with, either side: the reach rounded up, plus
    one frame."""
    return math.ceil(reach_frames(decoder)) + 1


def windows(frames: int, first: int, largest: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` latent frames of each window, in order, covering ``frames``:
    ``first`` frames, then twice the last, never more than ``largest``."""
    start, size = 0, max(1, first)
    while start < frames:
        stop = min(frames, start + size)
        yield start, stop
        start, size = stop, min(max(largest, 1), size * 2)


def decode_windows(
    vae: Any, latents: torch.Tensor, *, first: int, largest: int, context: int
) -> Iterator[torch.Tensor]:
    """``vae.decode`` of 1×frames×latent_dim ``latents`` (the DiT's layout) window by
    window: each 1×1×samples in order, joined the whole decode (to rounding, module
    docstring). The caller must have checked that a frame decodes to
    ``downsampling_ratio`` samples (:func:`decodes_whole_frames`)."""
    ratio = int(vae.config.downsampling_ratio)
    frames = latents.shape[1]
    for start, stop in windows(frames, first, largest):
        lo, hi = max(0, start - context), min(frames, stop + context)
        audio: torch.Tensor = vae.decode(latents[:, lo:hi].permute(0, 2, 1)).sample
        yield audio[..., (start - lo) * ratio : (stop - lo) * ratio]


def decodes_whole_frames(vae: Any) -> bool:
    """Whether each latent frame decodes to exactly ``downsampling_ratio`` samples (every
    convolution keeps its input's length, every transposed one makes ``stride`` × it: an
    even stride with kernel ``2 × stride`` and padding ``stride / 2``, as the released VAE
    has), which windows need to be cut on frame boundaries."""
    ratio, product = int(vae.config.downsampling_ratio), 1
    for module in vae.decoder.modules():
        if not isinstance(module, nn.Conv1d | nn.ConvTranspose1d):
            continue
        if isinstance(module.padding, str):
            return False
        kernel, stride, dilation, pad = _conv(module)
        span = dilation * (kernel - 1)
        if isinstance(module, nn.ConvTranspose1d):
            span += module.output_padding[0]
            product *= stride
        elif stride != 1:
            return False
        if span + 1 - 2 * pad != (stride if isinstance(module, nn.ConvTranspose1d) else 1):
            return False
    return product == ratio
