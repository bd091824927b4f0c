"""RGB frames to the encoder's pixel format, on the device that decoded them.

x264 takes ``yuv420p``. Given RGB, PyAV converts every frame with swscale on the writer's
thread before x264 sees it: at 448x256 that is 2–6 ms a frame on a CPU, as long as the
whole H.264 encode of a 10 s clip, and it competes for the cores with the thread that
launches the GPU decoder's kernels. On the GPU the same conversion is a few element-wise
kernels over frames already there, and half the bytes cross to the host.

The conversion is BT.601 with limited range (what swscale and x264 assume for an
unflagged stream), chroma the mean of each 2×2 block. Against swscale's default it is
within 1 of every Y, and of every Cb/Cr on smooth pictures; on pixel noise swscale's wider
chroma filter differs more (both are valid 4:2:0 downsamplings).
"""

from __future__ import annotations

import torch

KR, KB = 0.299, 0.114  # BT.601
KG = 1.0 - KR - KB


def yuv420p(frames: torch.Tensor) -> torch.Tensor:
    """uint8 T×H×W×3 RGB (any device) → uint8 T×(H·3/2)×W, on the same device: each
    frame's Y plane, then its Cb and Cr planes (H/2×W/2 each), back to back as PyAV's
    ``VideoFrame.from_ndarray(..., format="yuv420p")`` reads them. H and W must be even."""
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError(f"frames must be uint8 T×H×W×3, got {frames.dtype} {tuple(frames.shape)}")
    count, height, width = frames.shape[:3]
    if height % 2 or width % 2:
        raise ValueError(f"yuv420p needs even width and height, got {width}x{height}")
    rgb = frames.permute(0, 3, 1, 2).float()  # T×3×H×W, 0–255
    luma = _luma(rgb)
    pooled = torch.nn.functional.avg_pool2d(rgb, 2)
    pooled_luma = _luma(pooled)
    cb = 128.0 + (224.0 / 255.0) * (pooled[:, 2] - pooled_luma) / (2.0 * (1.0 - KB))
    cr = 128.0 + (224.0 / 255.0) * (pooled[:, 0] - pooled_luma) / (2.0 * (1.0 - KR))
    y = 16.0 + (219.0 / 255.0) * luma
    area = height * width
    out = torch.empty(count, height * 3 // 2, width, dtype=torch.uint8, device=frames.device)
    flat = out.view(count, -1)  # the planes back to back, as PyAV reads them
    flat[:, :area] = _to_uint8(y).reshape(count, -1)
    flat[:, area : area * 5 // 4] = _to_uint8(cb).reshape(count, -1)
    flat[:, area * 5 // 4 :] = _to_uint8(cr).reshape(count, -1)
    return out


def _luma(rgb: torch.Tensor) -> torch.Tensor:
    return KR * rgb[:, 0] + KG * rgb[:, 1] + KB * rgb[:, 2]


def _to_uint8(plane: torch.Tensor) -> torch.Tensor:
    return plane.round().clamp(0, 255).to(torch.uint8)
