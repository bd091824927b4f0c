"""How long packing a world session's snapshot takes (``workers/pipelines/snapshots.py``):
a Helios-Distilled-shaped snapshot at 640x384, packed as the delivery lane packs it.

Two states: after the first chunk (a text-to-video session's history is zeros but for
the chunk just made) and later (the history all noise). Both carry the prompt's
embeddings, zero-padded to 512 tokens as umt5-xxl's are. The snapshot is made once and
packed ``--repeat`` times; the JSON gives the median and the bytes.

Run: python -m benchmarks.realtime.snapshot_pack [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch

from workers.pipelines.snapshots import pack, unpack

# Helios-Distilled at 640x384: 16 latent channels at 48x80, history of 16 + 2 + 1 latent
# frames (float32), umt5-xxl's 4096-wide embeddings padded to 512 tokens (bfloat16).
HISTORY = (1, 16, 19, 48, 80)
EMBEDS = (1, 512, 4096)
PROMPT_TOKENS = 24
CHUNK_LATENT_FRAMES = 9


def snapshot(first_chunk: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    history = torch.randn(HISTORY, generator=g)
    if first_chunk:
        history[:, :, :-CHUNK_LATENT_FRAMES] = 0
    embeds = torch.zeros(EMBEDS, dtype=torch.bfloat16)
    embeds[:, :PROMPT_TOKENS] = torch.randn(1, PROMPT_TOKENS, EMBEDS[2], generator=g)
    return {
        "history_latents": history,
        "prompt_embeds": embeds,
        "negative_prompt_embeds": None,
        "generator": g.get_state(),
        "chunk_index": 1,
        "prompt": "a quiet harbour at dawn",
        "events": [],
    }


def measure(first_chunk: bool, repeat: int) -> dict[str, Any]:
    state = snapshot(first_chunk)
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        data = pack(state)
        times.append(time.perf_counter() - began)
    back = unpack(data, "cpu")
    same = torch.equal(back["history_latents"], state["history_latents"]) and torch.equal(
        back["prompt_embeds"], state["prompt_embeds"]
    )
    return {
        "pack_ms_median": round(statistics.median(times) * 1000, 2),
        "pack_ms_min": round(min(times) * 1000, 2),
        "bytes": len(data),
        "bit_equal": same,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    out = {
        "benchmark": "benchmarks.realtime.snapshot_pack",
        "machine": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "after_first_chunk": measure(True, args.repeat),
        "later": measure(False, args.repeat),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
