"""Where a world chunk's decode time goes, and what the settings around it change: the
Wan 2.1 VAE (``AutoencoderKLWan``, the one Helios decodes its 33-frame chunks with) timed
on one chunk's latents, in each variant:

* ``eager``: as a worker decodes today (cuDNN picks its convolution algorithms by rule);
* ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark = True`` (cuDNN times its
  algorithms on each new shape once, then keeps the fastest; the decode's shapes repeat
  every chunk);
* ``channels_last``: the decoder's weights in ``channels_last_3d`` memory format, with
  cuDNN benchmark (``shared/vae_layout.py``: what the adapters' ``vae_channels_last``
  does);
* ``compiled`` (``--compile``): ``torch.compile`` of the decoder, with cuDNN benchmark.

With ``--paced``, the variants are instead the worker's cancel points on the VAE's
blocks (``install_checkpoints``), which a job's or a session's decode runs with, after
``eager`` without them:

* ``hooks_idle``: the hooks installed, outside a stop's context (each one a context
  variable read, as in a bare call);
* ``unpaced``: inside a stop's context, the host free to queue the whole decode ahead of
  the device (the cancel points before issue 43's bound);
* ``paced_N`` for each N of ``--lookahead``: the host kept N cancel points ahead of the
  device (``workers/pipelines/run_ahead.py``; the worker's default is
  ``CHECKPOINT_LOOKAHEAD``).

Each of the last two also times ``--stops`` stops, each raised at a random moment of a
decode (``stop_to_idle_ms``: from that moment until the device has run what was queued,
the part of a stop's latency the bound is for; p50 and p95).

Each variant's decode is checked against ``eager``'s (peak absolute difference of the
frames in [-1, 1]), since a faster path that changes the picture is no gain.

    python -m benchmarks.gpu.vae_decode [--width 640 --height 384 --frames 33] [--compile]
    python -m benchmarks.gpu.vae_decode --paced [--lookahead 2,3,4] [--stops 40]
    python -m benchmarks.gpu.vae_decode --tiny [--paced]   # a check of this script on the CPU

JSON on stdout and in ``$OUT/gpu_vae_decode.json``: per variant ``decode_ms`` (median of
``--repeat`` after ``--warmup``), ``first_ms`` (its first call: autotuning, compiling),
``peak_abs_diff`` against ``eager``.
"""

from __future__ import annotations

import argparse
import datetime
import random
import statistics
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.embedded_stack import git_state
from benchmarks.gpu.common import emit
from workers.pipelines.diffusers.shared.vae_layout import conv_weights_to


def _sync() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def _vae(tiny: bool, device: str, dtype: torch.dtype) -> Any:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    config: dict[str, Any] = {}
    if tiny:
        config = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1}
    vae: Any = AutoencoderKLWan(**config)
    return vae.to(device, dtype).eval()


def _timed(decode: Callable[[], torch.Tensor], warmup: int, repeat: int) -> dict[str, Any]:
    began = _sync()
    out = decode()
    first = _sync() - began
    for _ in range(max(warmup - 1, 0)):
        decode()
    times = []
    for _ in range(repeat):
        began = _sync()
        out = decode()
        times.append(_sync() - began)
    return {
        "first_ms": round(first * 1000, 1),
        "decode_ms": round(statistics.median(times) * 1000, 1),
        "frames": out,
    }


def _settings(vae: Any, decode: Callable[[], torch.Tensor], args: Any) -> dict[str, Any]:
    """The decode under each setting around it (the module doc's first list)."""
    variants: dict[str, dict[str, Any]] = {}
    torch.backends.cudnn.benchmark = False
    variants["eager"] = _timed(decode, args.warmup, args.repeat)
    torch.backends.cudnn.benchmark = True
    variants["cudnn_benchmark"] = _timed(decode, args.warmup, args.repeat)
    conv_weights_to(vae.decoder, torch.channels_last_3d)  # the adapters' vae_channels_last
    variants["channels_last"] = _timed(decode, args.warmup, args.repeat)
    conv_weights_to(vae.decoder, torch.contiguous_format)
    if args.compile:
        vae.decoder = torch.compile(vae.decoder)
        variants["compiled"] = _timed(decode, args.warmup, args.repeat)
    return variants


class _Stop(Exception):
    """A stop raised at a cancel point of the decode."""


def _stop_to_idle(decode: Callable[[], torch.Tensor], decode_s: float, stops: int) -> Any:
    """p50 and p95 ms from a stop, raised at a random moment of a decode, to the device
    idle (``synchronize``): the time until a cancel point sees it and the queued work.
    A decode that ends before its stop's moment counts for nothing."""
    from workers.pipelines.base import checkpoints

    rng = random.Random(0)
    drained = []
    for _ in range(stops):
        began = _sync()
        stop_at = began + rng.uniform(0.0, decode_s)

        def check(stop_at: float = stop_at) -> None:
            if time.perf_counter() >= stop_at:
                raise _Stop

        try:
            with checkpoints(check):
                decode()
        except _Stop:
            drained.append((_sync() - stop_at) * 1000)
        # else the decode ended first (it ran faster than the median): no stop to time
    if not drained:
        return None
    cuts = statistics.quantiles(drained, n=20, method="inclusive")
    p50, p95 = statistics.median(drained), cuts[18]
    return {"p50": round(p50, 1), "p95": round(p95, 1), "stops": len(drained)}


def _cancel_points(vae: Any, decode: Callable[[], torch.Tensor], args: Any) -> dict[str, Any]:
    """The decode with the worker's cancel points on the VAE's blocks, unpaced and paced
    (the module doc's second list)."""
    from workers.pipelines.base import checkpoints
    from workers.pipelines.diffusers.shared.loading import install_checkpoints
    from workers.pipelines.run_ahead import checkpoint_pacer

    torch.backends.cudnn.benchmark = False
    variants = {"eager": _timed(decode, args.warmup, args.repeat)}
    install_checkpoints(SimpleNamespace(components={"vae": vae}))
    variants["hooks_idle"] = _timed(decode, args.warmup, args.repeat)
    pacer = checkpoint_pacer()  # this thread's, which the hooks use

    def fresh() -> torch.Tensor:
        pacer.clear()  # an unpaced decode keeps every mark: none carried over
        return decode()

    def in_context() -> torch.Tensor:
        with checkpoints(lambda: None):
            return fresh()

    lookaheads = [int(n) for n in args.lookahead.split(",")]
    for name, lookahead in [("unpaced", sys.maxsize), *((f"paced_{n}", n) for n in lookaheads)]:
        pacer.lookahead = lookahead
        variants[name] = result = _timed(in_context, args.warmup, args.repeat)
        result["stop_to_idle_ms"] = _stop_to_idle(fresh, result["decode_ms"] / 1000, args.stops)
    return variants


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=384)
    p.add_argument("--frames", type=int, default=33)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--paced", action="store_true", help="the worker's cancel points instead")
    p.add_argument("--lookahead", default="2,3,4", help="--paced: the lookaheads to time")
    p.add_argument("--stops", type=int, default=40, help="--paced: stops timed per variant")
    p.add_argument("--tiny", action="store_true", help="a small VAE on the CPU, 64x64")
    args = p.parse_args()
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    if args.tiny:
        args.width = args.height = 64
        args.frames, args.repeat, args.warmup, args.stops = 9, 1, 1, 4
    vae = _vae(args.tiny, device, dtype)
    spatial = 2 ** len(vae.temperal_downsample)
    latent_frames = (args.frames - 1) // 4 + 1
    shape = (1, vae.config.z_dim, latent_frames, args.height // spatial, args.width // spatial)
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)

    @torch.no_grad()
    def decode() -> torch.Tensor:
        return vae.decode(latents, return_dict=False)[0]

    variants = (_cancel_points if args.paced else _settings)(vae, decode, args)
    reference = variants["eager"]["frames"].float()
    for result in variants.values():
        frames = result.pop("frames").float()
        result["peak_abs_diff"] = round(float((frames - reference).abs().max()), 6)
    out = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        **git_state(),
        "latents": list(shape),
        "dtype": str(dtype).removeprefix("torch."),
        "variants": variants,
    }
    emit(out, "gpu_vae_decode")


if __name__ == "__main__":
    main()
