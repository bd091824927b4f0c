"""The device of the weightless procedural pipelines (there are no weights to move)."""

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


class OnDevice:
    """The device of a weightless procedural pipeline: the CPU until ``load`` picks one."""

    def __init__(self) -> None:
        self._device = torch.device("cpu")

    def load(self, device: str) -> None:
        """Select the device; there are no weights."""
        self._device = select_device(device)
