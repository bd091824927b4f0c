"""The stand-in latent space of the reference models and the sampler step taken in it.

A latent is the frame at half resolution (2x average pooling in place of a VAE encoder,
bilinear upsampling in place of its decoder), with values in [-1, 1]. Noise levels follow
a shifted flow-matching schedule; each step moves the latents toward the clean target
blurred by the next noise level, so early steps fix the layout and late ones the detail.
Large tensors are processed in bounded chunks (``RENDER_BUDGET``, ``STEP_BUDGET``), which
also bounds the time between two cancel checks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

RENDER_BUDGET = 1_000_000  # pixels per render chunk (bounds temporaries; cancel points)
STEP_BUDGET = 8_000_000  # latent values per step chunk


def shifted_sigmas(steps: int, shift: float) -> torch.Tensor:
    """``steps + 1`` flow-matching noise levels from 1 down to 0 (float64), moved toward
    the noisy end by ``shift`` (``shift·σ / (1 + (shift - 1)·σ)``)."""
    sigmas = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def chunks(total: int, per_item: int, budget: int) -> list[tuple[int, int]]:
    """``(start, stop)`` ranges covering ``range(total)``, each of at most ``budget //
    per_item`` items (at least one): pieces whose temporaries stay within ``budget``
    values, and between which a caller can check for a cancel."""
    size = max(1, budget // max(1, per_item))
    return [(s, min(total, s + size)) for s in range(0, total, size)]


def encode(target: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> latent space: 2x average pooling, values in [-1, 1]."""
    h, w = target.shape[-2:]
    return F.adaptive_avg_pool2d(target.float() / 127.5 - 1, ((h + 1) // 2, (w + 1) // 2))


def upsample(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Latents (or any N×C×h×w) -> N×C×``h``×``w``, bilinear: the stand-in VAE decode."""
    return F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Values in [-1, 1] -> uint8 pixels, rounded and clamped."""
    return ((x + 1) * 127.5).round_().clamp_(0, 255).to(torch.uint8)


def blur(x: torch.Tensor, level: float) -> torch.Tensor:
    """Down/up-sample by 2**level (a fractional level blends the two nearest octaves)."""
    h, w = x.shape[-2:]

    def down_up(factor: int) -> torch.Tensor:
        size = (max(1, round(h / factor)), max(1, round(w / factor)))
        return upsample(F.adaptive_avg_pool2d(x, size), h, w) if factor > 1 else x

    k = math.floor(level)
    coarse = down_up(2**k)
    return torch.lerp(coarse, down_up(2 ** (k + 1)), level - k) if level > k else coarse


def euler_step(
    latents: torch.Tensor,
    clean: torch.Tensor,
    mean: torch.Tensor,
    sigmas: torch.Tensor,
    index: int,
    keep: int | None = None,
) -> torch.Tensor | None:
    """One flow-matching Euler step of ``latents`` (T×3×h×w, in place, chunked over
    frames) from ``sigmas[index]`` to ``sigmas[index + 1]``, toward x0_hat: ``clean``
    blurred and flattened toward ``mean`` by the noise level. Returns a copy of frame
    ``keep``'s x0_hat (a preview), None without ``keep``."""
    sigma, sigma_next = float(sigmas[index]), float(sigmas[index + 1])
    t, _, lh, lw = latents.shape
    level = sigma_next**2 * max(0.0, math.log2(min(lh, lw)) - 1)  # blur octaves
    kept = None
    for start, stop in chunks(t, 3 * lh * lw, STEP_BUDGET):
        x, x0 = latents[start:stop], clean[start:stop]
        if sigma_next > 0:
            x0 = mean + (blur(x0, level) - mean) * (1 - 0.5 * sigma_next)
            x.add_((x - x0).mul_((sigma_next - sigma) / sigma))
        else:
            x.copy_(x0)  # x + (0 - s) * (x - x0) / s == x0, without rounding error
        if keep is not None and start <= keep < stop:
            kept = x0[keep - start].clone()
    return kept
