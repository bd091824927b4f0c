"""Does diffusers' group offloading carry torchao's FP8 weights (issue 44)? The registry
allows ``quantization = "fp8"`` with ``offload = "group"`` because this said so on an H100
(docs/evidence/fp8_group_probe_h100_2026-12-06.json: bit-equal, pinned host copies).

Two copies of one seeded stack of blocks (a ``ModuleList`` of Linear pairs, the shape
group offloading streams), their Linear layers made FP8 by the worker's own
``fp8.quantize``; one stays resident, the other is offloaded by the worker's own
``shared/offload.group_offload`` (diffusers' ``apply_group_offloading``, ``block_level``,
one block a group, ``use_stream=True``;
``--pageable``: ``low_cpu_mem_usage=True``, the host copies pageable and pinned per group
at onload, the mode a worker takes when the pinned copies would not fit its host).
The JSON says whether the offloaded copy's output equals the resident one's (bit for bit,
and the largest difference), whether its weights left the device between calls, and the
error if it failed.

Run on a GPU of compute capability 8.9 or more, with torchao installed:
    python -m benchmarks.gpu.fp8_group_probe [--pageable]
(``bash benchmarks/device/fp8.sh --probe-group [--pageable]`` on the GPU host.)
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import torch

from workers.pipelines.diffusers.shared import fp8
from workers.pipelines.diffusers.shared.offload import group_offload

WIDTH, BLOCKS, TOKENS = 1024, 6, 256


class Stack(torch.nn.Module):
    """``BLOCKS`` blocks of two Linear layers, each block a group when offloaded."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.Linear(WIDTH, 4 * WIDTH),
                torch.nn.GELU(),
                torch.nn.Linear(4 * WIDTH, WIDTH),
            )
            for _ in range(BLOCKS)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def _quantized(device: torch.device) -> Stack:
    torch.manual_seed(0)
    model = Stack().to(torch.bfloat16)
    fp8.quantize(model, fp8.fp8_kinds(fp8.fp8_layers(model), modulation=False), device)
    return model.to(device)


def probe(device: torch.device, pageable: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(device), "pageable": pageable}
    resident = _quantized(device)
    x = torch.randn(1, TOKENS, WIDTH, device=device, dtype=torch.bfloat16, generator=None)
    with torch.no_grad():
        want = resident(x)
    del resident
    torch.cuda.empty_cache()
    streamed = _quantized(device)
    out["fp8_layers"] = sum(1 for n, why in fp8.fp8_layers(streamed).items() if why is None)
    first: Any = streamed.blocks[0]
    out["weight_type"] = type(first[0].weight).__name__
    before = torch.cuda.memory_allocated(device)
    try:
        group_offload(streamed, device, pageable=pageable)
        torch.cuda.synchronize(device)
        out["allocated_after_offload_mib"] = torch.cuda.memory_allocated(device) / 2**20
        out["allocated_resident_mib"] = before / 2**20
        with torch.no_grad():
            got = [streamed(x) for _ in range(3)]  # the stream's prefetch on later calls
        torch.cuda.synchronize(device)
        out["bit_equal"] = all(torch.equal(g, want) for g in got)
        out["max_abs_diff"] = max(float((g.float() - want.float()).abs().max()) for g in got)
        out["allocated_between_calls_mib"] = torch.cuda.memory_allocated(device) / 2**20
        out["works"] = out["bit_equal"]
    except Exception as exc:  # the probe's finding
        out["works"] = False
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=6)
    return out


def main() -> None:
    device = torch.device("cuda")
    why = fp8.fp8_unsupported(device) or fp8.library_missing()
    result = {"works": False, "error": why} if why else probe(device, "--pageable" in sys.argv)
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
