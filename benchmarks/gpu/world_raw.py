"""The raw half of the world benchmark (``benchmarks/gpu/world.py``): diffusers'
``HeliosPyramidPipeline`` called directly, in this process, on the random-weight
Helios-Distilled (``workers/pipelines/diffusers/helios/random_weights.py``) with its denoiser
blocks compiled as the Helios adapter compiles them on CUDA (``BlockCompiler``; no cancel
gates, no checkpoints: the pipeline alone).

Keys: ``world_raw_fps`` (frames ``pipe(...)`` returns ÷ its wall time, median of
``--repeat`` calls of ``--raw-chunks`` chunks, warm), ``raw_compile_s`` (the first,
one-chunk call: every pyramid stage's shape compiled), ``block_ms`` (the full-resolution
stage's transformer forward ÷ its blocks: how long a stop may wait for the next block
gate), ``raw_memory_mib``, ``random_config`` (what the build used: the stack's workers
build the same; ``block_noise_note`` where the device made ``gamma`` change),
``raw_compile_fallback`` (why the blocks went back to eager, None while compiled).

``--quantization fp8``: the transformer's block Linear layers made FP8 by the worker's own
``MemoryLayout`` (``shared/memory.py``: the plan checked against the device, then
``fp8.fp8_layers`` and ``fp8.quantize``, as ``HeliosWorldAdapter.load`` places a
``quantization = "fp8"`` entry), before the blocks compile; ``fp8_report`` is the
worker's report of it (layers, bytes saved). Where the worker would refuse it (the CPU, a
GPU before compute capability 8.9, no torchao) nothing is built: ``raw_refused`` says why.

``--attention cudnn``: every attention of the transformer through cuDNN's fused attention,
set by the worker's own ``shared/attention.py`` on the spec an ``attention = "cudnn"``
entry gets (refused off a CUDA GPU before anything is built, as a worker refuses it),
after the weights are placed and before the blocks compile, as a worker loads it.

``--vae-channels-last``: the VAE decoder's 3-D convolution weights in
``channels_last_3d`` by the worker's own ``shared/vae_layout.py``, once the weights are
placed, as ``HeliosWorldAdapter.load`` sets an entry's ``vae_channels_last = true``: the
raw FPS and the delivered FPS decode alike (the JSON's ``vae_channels_last``;
``raw_vae_decoder_channels_last``: the layout the timed pipeline's decoder had).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import warnings
from typing import Any

import torch

from benchmarks.gpu.common import sync_time

PROMPT = "a lighthouse on a cliff at dusk, waves breaking below, gulls circling"
CHUNK_FRAMES = 33


def memory_layout(args: argparse.Namespace) -> Any:
    """The worker's ``MemoryLayout`` of the run's plan (None without one), checked
    against the device as a worker checks it before loading (``CatalogError``)."""
    from diffusers import HeliosPipeline

    from models.memory_plan import MemoryPlan
    from workers.pipelines.diffusers.shared.memory import MemoryLayout

    if args.quantization == "none":
        return None
    layout = MemoryLayout("helios-raw", MemoryPlan(quantization=args.quantization))
    layout.check(args.device, HeliosPipeline)
    return layout


def attention_spec(args: argparse.Namespace) -> Any:
    """The spec a Helios registry entry with the run's ``attention`` gets (its roles), as
    the registry writes it; refused off a CUDA GPU as a worker refuses it (``CatalogError``)."""
    from models.catalog import FAMILY_SPECS
    from models.registry import ServedModel
    from workers.pipelines.diffusers.shared import attention

    base = FAMILY_SPECS["diffusers.helios"].model_copy(update={"name": "helios-raw"})
    entry = ServedModel(
        name="helios-raw", adapter="diffusers.helios", attention=args.attention, spec=base
    )
    attention.refuse_off_cuda(entry.spec, args.device)
    return entry.spec


def build(args: argparse.Namespace, layout: Any = None, spec: Any = None) -> tuple[Any, Any]:
    """The random-weight pipeline on ``args.device``, its weights placed by ``layout``
    (FP8: the worker's quantization), its VAE decoder's weights channels-last with
    ``--vae-channels-last`` (the worker's ``vae_layout``), its attention backend the one
    ``spec`` says (the worker's ``attention.install``), blocks compiled per
    ``args.compile``; and the block compiler (None: eager)."""
    from workers.pipelines.diffusers.helios.random_weights import random_pipeline
    from workers.pipelines.diffusers.shared import attention
    from workers.pipelines.diffusers.shared.compiled import BlockCompiler
    from workers.pipelines.diffusers.shared.loading import parse_dtype
    from workers.pipelines.diffusers.shared.vae_layout import decoder_channels_last

    pipe = random_pipeline(
        args.device,
        parse_dtype(args.dtype),
        config=args.random_config,
        max_sequence_length=args.seq_len,
    )
    if layout is not None:
        layout.place(pipe, args.device)
    if args.vae_channels_last:  # where HeliosWorldAdapter.load sets it: once placed
        decoder_channels_last(pipe)
    if spec is not None:
        attention.install(pipe, spec)
    compiler = None
    if args.compile == "blocks":
        compiler = BlockCompiler()
        compiler.install(pipe)
    return pipe, compiler


def decoder_layout_is_channels_last(pipe: Any) -> bool:
    """Whether every 3-D convolution weight of the pipeline's VAE decoder is in
    ``channels_last_3d`` (what ``--vae-channels-last`` set, checked on the pipeline
    timed)."""
    weights = [p for p in pipe.vae.decoder.parameters() if p.dim() == 5]
    return all(w.is_contiguous(memory_format=torch.channels_last_3d) for w in weights)


def call(pipe: Any, args: argparse.Namespace, chunks: int, seed: int = 0) -> tuple[float, int]:
    """One ``pipe(...)``: Distilled's 3 steps a chunk ([1, 1, 1]), no CFG. Its wall time
    and the frames it returned."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "__array_wrap__", DeprecationWarning)
        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        start = sync_time()
        out = pipe(
            PROMPT,
            height=args.height,
            width=args.width,
            num_frames=CHUNK_FRAMES * chunks,
            guidance_scale=1.0,
            pyramid_num_inference_steps_list=[1, 1, 1],
            max_sequence_length=args.seq_len,
            generator=torch.Generator().manual_seed(seed),
            output_type="np",
        )
        wall = sync_time() - start
    return wall, int(out.frames.shape[1])


def block_ms(pipe: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One more one-chunk call with each transformer forward timed (synchronised): the
    longest (the full-resolution stage) ÷ the number of blocks."""
    forwards: list[float] = []
    began: list[float] = []
    model = pipe.transformer
    pre = model.register_forward_pre_hook(lambda *_: began.append(sync_time()))
    post = model.register_forward_hook(lambda *_: forwards.append(sync_time() - began[-1]))
    try:
        call(pipe, args, 1)
    finally:
        pre.remove()
        post.remove()
    blocks = len(model.blocks)
    return {
        "block_ms": round(max(forwards) * 1000 / blocks, 2),
        "forward_ms_per_stage": [round(f * 1000, 1) for f in forwards],
        "blocks": blocks,
    }


def block_noise(args: argparse.Namespace) -> dict[str, Any]:
    """Published Helios's ``gamma`` (1/3) where this device factorises the block noise's
    covariance at it (``helios_random.check_block_noise``); else 0.2, said so: the noise's
    shape, and so every cost, is the same. The parts after this one build with it too."""
    from workers.pipelines.diffusers.helios.random_weights import check_block_noise

    scheduler = args.random_config.get("scheduler", {})
    try:
        check_block_noise(torch.device(args.device), scheduler.get("gamma", 1 / 3), (1, 2, 2))
    except ValueError as exc:
        args.random_config = {**args.random_config, "scheduler": {**scheduler, "gamma": 0.2}}
        return {"random_config": args.random_config, "block_noise_note": f"{exc}: ran at 0.2"}
    return {"random_config": args.random_config}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from models.registry import CatalogError

    out = block_noise(args)
    try:
        layout = memory_layout(args)
        spec = attention_spec(args)
    except CatalogError as exc:  # what a worker would refuse: nothing built
        return out | {"world_raw_fps": None, "raw_refused": str(exc)}
    began = time.perf_counter()
    pipe, compiler = build(args, layout, spec)
    out["raw_build_s"] = round(time.perf_counter() - began, 1)
    out["raw_vae_decoder_channels_last"] = decoder_layout_is_channels_last(pipe)
    if layout is not None and layout.report is not None:
        out["fp8_report"] = layout.report.model_dump()
    compile_s, _ = call(pipe, args, args.raw_chunks)
    out["raw_compile_s"] = round(compile_s, 2)
    runs = [call(pipe, args, args.raw_chunks, seed=i + 1) for i in range(args.repeat)]
    out["raw_calls"] = [{"wall_s": round(w, 3), "frames": n} for w, n in runs]
    out["world_raw_fps"] = round(statistics.median(n / w for w, n in runs), 2)
    out |= block_ms(pipe, args)
    out["raw_compile_fallback"] = compiler.failed if compiler is not None else None
    if torch.cuda.is_available():
        out["raw_memory_mib"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        out["raw_peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    del pipe
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out
