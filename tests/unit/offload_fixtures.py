"""diffusers' group offloading as a worker applies it, on the CPU (shared by the offload
tests)."""

from __future__ import annotations

import torch
from diffusers.hooks import apply_group_offloading


def offloaded_on_cpu(component: torch.nn.Module, block_modules: list[str] | None) -> None:
    """``component`` group offloaded block by block as a worker offloads it (less the
    stream: CPU only; onload and offload devices both the host)."""
    apply_group_offloading(
        component,
        onload_device=torch.device("cpu"),
        offload_device=torch.device("cpu"),
        offload_type="block_level",
        num_blocks_per_group=1,
        block_modules=block_modules,
    )
