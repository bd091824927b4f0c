"""The device of the weightless procedural pipelines (there are no weights to move): each
reference model's ``load`` selects it with :func:`select_device`."""

from __future__ import annotations

import re

import torch


def select_device(device: str) -> torch.device:
    """``cpu`` or ``cuda[:n]`` (CUDA must be there) for the weightless reference models."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"unsupported device {device!r}; use 'cpu' or 'cuda[:n]'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)
