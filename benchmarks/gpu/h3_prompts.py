"""MiniMax-H3's compiled blocks across prompt lengths: what a deployment meets when every
request brings its own prompt (docs/PERFORMANCE.md, "MiniMax-H3").

H3 pads no prompt, so each prompt length is a new packed-sequence length. The adapter
compiles its blocks with dynamo's automatic dynamic shapes: the warm-up's length static,
the second length one graph with the length symbolic, which later lengths reuse.

Run:  python -m benchmarks.gpu.h3_prompts [--tiny]   (JSON on stdout, $OUT/gpu_h3_prompts.json)
On a GPU host: ``bash benchmarks/device/h3.sh --stage --prompts`` (with .wheelhouse/h3).

For each prompt (``--lengths`` characters; the benchmark tokenizer is character level, so
as many text rows): ``prepare_s`` (text encoding, plus the blocks' compile for a length
not yet covered), ``forward_s`` (one transformer forward over the packed sequence, median
of ``--repeat``), ``graphs`` (dynamo graphs made by that prepare) and ``rows``; then
``compile_fell_back`` (the reason, if compiling was given up) and ``static_forward_s``,
the warm-up length's forward (its own static graph).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch

from benchmarks.gpu.common import emit
from benchmarks.gpu.h3 import _forward, _rows, _sync, build_pipeline


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tiny", action="store_true", help="toy sizes, for a CPU check of the script")
    p.add_argument("--lengths", default="70,71,96,130,180,250,333,420")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--text-layers", type=int, default=4)
    args = p.parse_args()
    from models.catalog import FAMILY_SPECS
    from workers.pipelines.base import GenerationRequest
    from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
    from workers.pipelines.diffusers.shared.compiled import graphs_made

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size, frames = (64, 124) if args.tiny else ((448, 256), 243)
    width, height = (size, size) if isinstance(size, int) else size
    pipe = build_pipeline(device, args.tiny, args.text_layers)
    spec = FAMILY_SPECS["diffusers.minimax_h3"]
    backend = "inductor" if device == "cuda" else "eager"
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=spec, compile="blocks", compile_backend=backend)
    adapter.load(device)

    def request(length: int) -> GenerationRequest:
        prompt = ("a red ball rolls down a long green hill at dusk, " * 20)[:length]
        return GenerationRequest.video(
            prompt=prompt,
            width=width,
            height=height,
            num_frames=frames,
            fps=24.0,
            num_inference_steps=5,
            seed=42,
        )

    rows: list[dict[str, Any]] = []
    for length in [int(n) for n in args.lengths.split(",")]:
        before = graphs_made()
        t = _sync()
        state = adapter.prepare(request(length))
        prepare_s = _sync() - t
        made = graphs_made() - before
        forward = statistics.median(_forward(adapter, state) for _ in range(args.repeat))
        rows.append(
            {
                "prompt_chars": length,
                "rows": _rows(state),
                "prepare_s": round(prepare_s, 2),
                "graphs": made,
                "forward_s": round(forward, 4),
            }
        )
        adapter.end()
        print(json.dumps(rows[-1]), flush=True)
    out: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "torch": torch.__version__,
        "shape": {"width": width, "height": height, "num_frames": frames},
        "dynamic": adapter.compiler.dynamic,
        "prompts": rows,
        "static_forward_s": rows[0]["forward_s"],
        "dynamic_forward_s": (
            statistics.median(r["forward_s"] for r in rows[1:]) if rows[1:] else None
        ),
        "compile_fell_back": adapter.compiler.failed,
    }
    emit(out, "gpu_h3_prompts")


if __name__ == "__main__":
    main()
