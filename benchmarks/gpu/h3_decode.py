"""MiniMax-H3's video decode at the qualification shape, alone and beside the MP4 encode:
what chose the executor's decode path (docs/PERFORMANCE.md, "MiniMax-H3").

Run:  python -m benchmarks.gpu.h3_decode [--tiny]     (JSON on stdout, $OUT/gpu_h3_decode.json)
On a GPU host (after ``bash benchmarks/device/h3.sh --stage --only``, with
.wheelhouse/h3): ``PYTHONPATH=/tmp/h3-site:$PWD python3 -m benchmarks.gpu.h3_decode``.

The video VAE is built from its default config with seeded random weights (bf16 on the
GPU, as ``h3_random.random_pipeline`` builds it; the rest of that pipeline is shrunk),
and decodes latents of the qualification job's size (72 latent frames of 16x28 for
448x256, 243 frames). Keys, each the median of ``--repeat`` after one warm-up:
``whole_s`` (``vae.decode`` + uint8 frames), ``stream_s`` (h3_decode.stream_frames, frames
discarded), ``stream_encode_s`` (streamed into ``Mp4Writer`` with a 10 s soundtrack, RGB
frames converted by swscale) for each x264 thread count in ``--threads`` (0: x264's own
count), ``encode_s`` (encode_mp4 of noise frames, no decode), then the same with the
decoder compiled (``compiled_*``, and ``compile_s`` for the first call), and
``compiled_stream_encode_yuv_s``: the executor's path, yuv420p made on the GPU
(workers.media.pixels) and handed to x264 as it is. ``sws_rgb_to_yuv_ms`` is swscale's
conversion of one frame on this host's CPU (one thread, and x264's thread count).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch


def _sync() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tiny", action="store_true", help="toy VAE and sizes, for a CPU check")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", default="0,4,8", help="x264 thread counts to try")
    p.add_argument(
        "--hooks",
        action="store_true",
        help="the worker's cancel points on the VAE's blocks (loading.install_checkpoints)",
    )
    p.add_argument("--compiled-only", action="store_true", help="skip the eager figures")
    args = p.parse_args()
    from diffusers.models.autoencoders.autoencoder_kl_minimax_h3 import AutoencoderKLMiniMaxH3

    from benchmarks.gpu.common import emit
    from workers.media.mp4 import Media, Mp4Writer, encode_mp4
    from workers.media.pixels import yuv420p
    from workers.pipelines.diffusers.minimax_h3.decode import stream_frames
    from workers.pipelines.diffusers.minimax_h3.random_weights import TOY_CONFIG
    from workers.pipelines.diffusers.shared.common import frames_uint8, pixels_uint8

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if args.tiny:
        torch.manual_seed(0)
        vae = AutoencoderKLMiniMaxH3(**TOY_CONFIG["vae"]).eval()
    else:  # as the worker's random-weights entry builds it (float32 parts kept)
        from workers.pipelines.diffusers.minimax_h3.random_weights import random_pipeline

        small = {"transformer": {"num_layers": 1}}
        built: Any = random_pipeline(device, dtype, text_layers=1, config=small)
        vae = built.vae
    latents, height, width = (37, 4, 4) if args.tiny else (72, 16, 28)
    z = torch.randn(1, vae.config.latent_channels, latents, height, width, device=device)
    z = z.to(next(vae.post_quant_conv.parameters()).dtype)
    seconds = 10.0
    audio = np.zeros((2, int(32000 * seconds)), np.float32)

    def convert(video: torch.Tensor) -> np.ndarray:
        return frames_uint8(video[0].transpose(0, 1).float().clamp(0, 1))

    def on_device(video: torch.Tensor) -> torch.Tensor:
        return pixels_uint8(video[0].transpose(0, 1).float().clamp(0, 1))

    def whole() -> float:
        t = _sync()
        with torch.no_grad():
            convert(vae.decode(z).sample)
        return _sync() - t

    def stream() -> float:
        t = _sync()
        sum(len(c) for c in stream_frames(vae, z, convert))
        return _sync() - t

    def stream_encode(threads: int, planes: bool = False) -> Callable[[], float]:
        """Streamed into the MP4: RGB frames (swscale converts them), or with ``planes``
        the executor's path, yuv420p made on the device."""

        def run() -> float:
            with tempfile.TemporaryDirectory() as tmp:
                t = _sync()
                mp4 = Mp4Writer(
                    Path(tmp, "v.mp4"), 24.0, audio=audio, sample_rate=32000, threads=threads
                )
                with mp4:
                    for chunk in stream_frames(vae, z, on_device if planes else convert):
                        if planes:
                            mp4.write_planes(yuv420p(torch.as_tensor(chunk)).cpu().numpy())
                        else:
                            mp4.write(np.asarray(chunk))
                return _sync() - t

        return run

    def sws_ms(threads: int) -> float:
        frame = av.VideoFrame.from_ndarray(noise[0].astype(np.uint8), format="rgb24")
        t = time.perf_counter()
        for _ in range(48):
            frame.reformat(format="yuv420p", threads=threads)
        return round((time.perf_counter() - t) / 48 * 1000, 2)

    frames_n = sum(len(c) for c in stream_frames(vae, z, convert))
    noise = np.random.default_rng(0).integers(0, 255, (frames_n, height * 16, width * 16, 3))

    def encode() -> float:
        media = Media(frames=noise.astype(np.uint8), fps=24.0, audio=audio, sample_rate=32000)
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            encode_mp4(media, Path(tmp, "e.mp4"))
            return time.perf_counter() - t

    def median(fn: Callable[[], float]) -> float:
        fn()
        return round(statistics.median(fn() for _ in range(args.repeat)), 3)

    threads = [int(n) for n in args.threads.split(",")]
    out: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "frames": frames_n,
        "hooks": args.hooks,
    }
    if args.hooks:
        from workers.pipelines.diffusers.shared.loading import install_checkpoints

        install_checkpoints(type("Pipe", (), {"components": {"vae": vae}})())
    if not args.compiled_only:
        out["whole_s"] = median(whole)
        out["stream_s"] = median(stream)
        out["stream_encode_s"] = {str(n): median(stream_encode(n)) for n in threads}
        out["encode_s"] = median(encode)
        out["sws_rgb_to_yuv_ms"] = {str(n): sws_ms(n) for n in (1, *threads)}
    vae.decoder.compile(dynamic=False)
    t = time.perf_counter()
    whole()
    out["compile_s"] = round(time.perf_counter() - t, 1)
    out["compiled_whole_s"] = median(whole)
    out["compiled_stream_s"] = median(stream)
    out["compiled_stream_encode_s"] = {str(n): median(stream_encode(n)) for n in threads}
    out["compiled_stream_encode_yuv_s"] = {
        str(n): median(stream_encode(n, planes=True)) for n in threads
    }
    emit(out, "gpu_h3_decode")


if __name__ == "__main__":
    main()
