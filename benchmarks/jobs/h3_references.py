"""MiniMax-H3 ``ref2va`` preparation on the tiny CPU model (issue 45 item 4); prints one
JSON object on stdout.

    python -m benchmarks.jobs.h3_references                      # 1024x1024, 1 and 3 images
    python -m benchmarks.jobs.h3_references --reference-short-edge 2048   # as it was

The model is tests/unit/h3_fixtures.py's tiny H3 as tests/integration/test_h3_queue.py
serves it: a 64x64 canvas (``canvas_short_edge`` 64), the video VAE tiled as a worker
loads it, float32, in process. Its image references are encoded at a short edge of
``--reference-short-edge`` (default: the fixture's, the released 2048 : 768 proportion
of its canvas, 160; 2048, the released checkpoint's, is what the tiny model had before).

Measured, median of ``--repeat``, after one run that is not counted:

* ``prepare_s``: per count of image references (``--counts``), random ``--size``-square
  pictures as the API stores them (PNG) decoded as the worker decodes them
  (``workers/jobs/references.py``), then the adapter's ``prepare`` (diffusers' setup, the
  Qwen3-VL text encoder with its vision tower, the VAE encodes, the packed layout);
  ``packed_rows`` the transformer's sequence; ``reference_latent`` an image's latent size;
* ``t2va_job_s``: a whole t2va job (prepare, 2 steps, decode), for scale;
* ``video_normalize_s``: a video reference (``--video`` seconds of 1280x720 at 30 fps)
  from what the worker decodes to what diffusers' setup step makes of it for a 124-frame
  job: ``to_h3_reference``, then the step's own ``_normalize_video_condition``.
"""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep
from PIL import Image

from benchmarks.common import command_line, machine, parser
from benchmarks.gpu.common import emit
from models.catalog import FAMILY_SPECS
from tests.unit.h3_fixtures import h3_request, reference_short_edge, tiny_h3_pipe
from workers.jobs.references import decode_reference
from workers.pipelines.base import MediaReference
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.minimax_h3.inputs import to_h3_reference

CANVAS = 64


def _median(run: Callable[[], Any], repeat: int) -> float:
    run()  # not counted: first calls allocate
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def _png(size: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _adapter(workflow: str, edge: int) -> MiniMaxH3Adapter:
    pipe = tiny_h3_pipe(
        tiled=True,
        canvas_short_edge=CANVAS,
        canvas_max_pixels=CANVAS * CANVAS * 2,
        reference_image_short_edge=edge,
    )
    spec = FAMILY_SPECS["diffusers.minimax_h3"].model_copy(update={"workflows": [workflow]})
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=spec)
    adapter.load("cpu")
    return adapter


def prepare(adapter: MiniMaxH3Adapter, count: int, size: int, repeat: int) -> dict[str, Any]:
    """References decoded and a ref2va prepare, ``count`` images of ``size`` pixels."""
    pngs = [_png(size, seed) for seed in range(count)]
    shapes: dict[str, Any] = {}

    def run() -> None:
        refs = [
            decode_reference("image", png, f"input_references[{i}]") for i, png in enumerate(pngs)
        ]
        state = adapter.prepare(h3_request(references=refs))
        shapes["packed_rows"] = int(state.block_state.denoiser_input_fields["token_tags"].numel())
        latent = state.pipeline_state.get("condition_latents")[0]
        shapes["reference_latent"] = list(latent.shape[-2:])
        adapter.end()

    return {"prepare_s": _median(run, repeat), **shapes}


def whole_job(adapter: MiniMaxH3Adapter, repeat: int) -> float:
    def run() -> None:
        state = adapter.prepare(h3_request())
        while not state.done:
            adapter.step(state)
        adapter.decode(state)
        adapter.end()

    return _median(run, repeat)


def video_normalize(seconds: float, repeat: int) -> float:
    """What the adapter hands diffusers for a 1280x720 30 fps clip, normalised by the setup
    step's own function for a 124-frame job on the released canvas."""
    frames = np.random.default_rng(0).integers(0, 256, (int(seconds * 30), 720, 1280, 3), np.uint8)
    ref = MediaReference(kind="video", frames=frames, fps=30.0)

    def run() -> None:
        video = to_h3_reference(ref)
        MiniMaxH3Ref2VASetupStep._normalize_video_condition(
            video.frames, video.fps, 124, 32, 768, 768 * 1344, 24.0
        )

    return _median(run, repeat)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--size", type=int, default=1024, help="each image's side, in pixels")
    p.add_argument("--counts", type=int, nargs="+", default=[1, 3])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--reference-short-edge", type=int, default=reference_short_edge(CANVAS))
    p.add_argument("--video", type=float, default=10.0, help="seconds of the clip (0: skip)")
    args = p.parse_args()
    torch.manual_seed(0)
    edge = args.reference_short_edge
    out: dict[str, Any] = {
        "command": command_line(),
        "machine": machine(),
        "torch_threads": torch.get_num_threads(),
        "canvas": f"{CANVAS}x{CANVAS}",
        "reference_short_edge": edge,
        "image_size": args.size,
    }
    with torch.no_grad():
        ref2va = _adapter("ref2va", edge)
        out["ref2va"] = {str(n): prepare(ref2va, n, args.size, args.repeat) for n in args.counts}
        out["t2va_job_s"] = whole_job(_adapter("t2va", edge), args.repeat)
    if args.video > 0:
        out["video_normalize_s"] = video_normalize(args.video, args.repeat)
    emit(out, "h3_references")


if __name__ == "__main__":
    main()
