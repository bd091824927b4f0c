"""Helios world video over ``WS /v1/realtime/video`` on one GPU (issue 31's evidence):
the distilled Helios shape (14 B, 384x640, 3 steps a chunk as pyramid stages [1, 1, 1],
no CFG, random bf16 weights built on the device) raw and through the whole stack.

    python -m benchmarks.gpu.world [--part all|raw|stack|takeover] [--state FILE]
                                   [--quantization none|fp8] [--attention sdpa|cudnn]
                                   [--vae-channels-last] [--worker-env KEY=VALUE ...]
    python -m benchmarks.gpu.world --tiny      # the same flow on the CPU, every key
    python -m benchmarks.gpu.world --print-registry [...]   # the entries it would serve
    python -m benchmarks.gpu.world --targets-of FILE        # a run's targets, again

(The issue names it ``benchmarks/gpu_world.py``; the GPU benchmarks live in
``benchmarks/gpu/``.) On a GPU host: ``benchmarks/device/world.sh``, one part per run
(each within 10 minutes), the parts' keys kept from run to run in ``--state``.

Weights: ``workers/pipelines/diffusers/helios/random_weights.py`` (a registry entry's
``weights = "random"``), whose docstring lists what is Helios-Distilled's and what is not;
the JSON repeats it under ``weights``.

Parts and keys (the targets are issue 43's, which raised issue 31's; each gets
``targets[key]`` with its value, the target and pass/fail, None where not measured):

* ``raw`` (``world_raw.py``): ``world_raw_fps``, ``block_ms``;
* ``stack`` (``world_stack.py``): ``world_delivered_fps`` (≥ 20.3 in BF16 on an H100,
  and ≥ 1.0 of raw: ``world_delivered_over_raw``), ``world_first_chunk_s`` (≤ 1.5),
  ``world_interaction_to_chunk_s`` (≤ a chunk's playback, 33 / 24 s, + 0.5 s),
  ``world_two_sessions_fps_min`` (≥ 9.0), ``world_stop_p95_ms`` (≤ ``block_ms`` + 50),
  ``world_memory_after_mib`` (back to the baseline after a warm-up session: within
  ``MEMORY_SLACK_MIB``);
* ``takeover`` (``world_stack.py``): ``world_takeover_gap_s`` (≤ 5).

**FP8** (issue 44, ``--quantization fp8``): every part serves the same Helios with its
transformer's block Linear layers FP8, as a registry entry's ``quantization = "fp8"``
makes them: the stack's and the takeover's entries carry it (each of the takeover's two
realtime workers loads its own copy, on one GPU, its random transformer built on the host
so that the two never hold their BF16 copies on the card at once:
``world_stack.registry_text``), and the raw part quantizes diffusers'
own ``HeliosPyramidPipeline`` with the worker's ``MemoryLayout`` (``shared/memory.py``:
``shared/fp8.py``'s rule and torchao quantization, the same call a worker makes) before
compiling its blocks. The keys keep their names whatever the mode; ``quantization`` says
which it is, the JSON is ``gpu_world_fp8.json`` and the state and logs are the mode's
own. In FP8 mode two of them are also written under issue 44's names, and the targets are
that issue's: ``helios_fp8_raw_fps`` (= ``world_raw_fps``, ≥ 26 on an H100) and
``world_fp8_delivered_fps`` (= ``world_delivered_fps``, ≥ 24), besides the others above.
A model the worker would refuse here (FP8 off a CUDA GPU of compute capability 8.9, no
torchao) fails each part at once with the worker's reason (``raw_refused``,
``stack_error``, ``takeover_note``), before anything is built or started. No
``--offload``: a realtime model refuses it (``models/memory_plan.py``). The takeover part
in BF16 is skipped on a GPU under 90 GiB (two 40 GB workers do not fit).

**cuDNN attention** (``--attention cudnn``): every part runs the transformer's attention
through cuDNN's fused attention, as a registry entry's ``attention = "cudnn"`` makes it:
the stack's and the takeover's entries carry it, and the raw part gives the pipeline it
builds the backend through the worker's own ``shared/attention.py`` (checked against the
device first: off a CUDA GPU ``raw_refused`` says why) before compiling its blocks, so raw
and delivered FPS are A/B'd with the same backend. The JSON's ``attention`` says which;
its file, state and logs are the mode's own (``_cudnn`` after any ``_fp8``).

**Channels-last VAE decoder** (``--vae-channels-last``): every part decodes with the VAE
decoder's 3-D convolution weights in ``channels_last_3d`` (527.5 → 436.9 ms a chunk in
isolation on an H100: ``benchmarks/gpu/vae_decode.py``): the stack's and the takeover's
entries carry the adapter option ``vae_channels_last = true``, and the raw part sets the
same layout on its pipeline with the worker's own ``shared/vae_layout.py`` before timing,
so raw and delivered FPS compare like for like. The JSON's ``vae_channels_last`` says
which; its file, state and logs are the mode's own (``_cl`` after any ``_fp8``,
``_cudnn``).

``--tiny``: ``helios_random.TINY_CONFIG`` (the sizes of tests/unit/helios_fixtures.py) at
64x64 on the CPU, float32, no compile: it checks this script end to end; its speeds and
pass/fail mean nothing.

JSON printed and written to ``$OUT/gpu_world.json`` (``gpu_world_fp8.json`` in FP8
mode); copy it to ``docs/evidence/``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu.common import emit, provenance
from benchmarks.gpu.plans import mode_suffix
from benchmarks.gpu.world_stack import entry_args, entry_config

CHUNK_PLAYBACK_S = 33 / 24
MEMORY_SLACK_MIB = 64.0
PARTS = ("raw", "stack", "takeover")
# FP8 mode: issue 44's names of two keys, and their targets (issue 31's for the rest).
FP8_KEYS = {"helios_fp8_raw_fps": "world_raw_fps", "world_fp8_delivered_fps": "world_delivered_fps"}


def header(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "benchmark": "benchmarks.gpu.world",
        "mode": "tiny: CPU, 64x64, tiny Helios; speeds and pass/fail mean nothing"
        if args.tiny
        else "Helios-Distilled shape on the GPU",
        "quantization": args.quantization,
        "attention": args.attention,
        "vae_channels_last": args.vae_channels_last,
        **provenance(),
        "shape": {
            "width": args.width,
            "height": args.height,
            "chunk_frames": 33,
            "fps": 24,
            "steps_per_chunk": 3,
            "pyramid_num_inference_steps_list": [1, 1, 1],
            "guidance_scale": 1.0,
            "dtype": args.dtype,
            "compile": args.compile,
            "max_sequence_length": args.seq_len,
        },
        "weights": (
            "seeded random init of "
            + ("helios_random.TINY_CONFIG" if args.tiny else "Helios-Distilled's configs")
            + f", built on {args.device} in {args.dtype} (registry weights = 'random'); "
            "HeliosPyramidPipeline is_distilled, HeliosDMDScheduler 3 stages; the tokenizer "
            "is character-level (prompts padded to max_sequence_length as the real one "
            "pads); see workers/pipelines/diffusers/helios/random_weights.py"
        ),
    }


def _target(value: Any, op: str, bound: float | None, text: str) -> dict[str, Any]:
    ok = None
    if isinstance(value, int | float) and bound is not None:
        ok = value >= bound if op == ">=" else value <= bound
    return {"value": value, "target": text, "pass": ok}


def targets(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 43's targets over what the parts measured."""
    raw, delivered = out.get("world_raw_fps"), out.get("world_delivered_fps")
    ratio = round(delivered / raw, 3) if raw and delivered else None
    out["world_delivered_over_raw"] = ratio
    block = out.get("block_ms")
    stop_bound = block + 50 if isinstance(block, int | float) else None
    interaction = CHUNK_PLAYBACK_S + 0.5
    memory: dict[str, Any] = {"value": out.get("world_memory_after_mib"), "pass": None}
    baseline, after = out.get("world_memory_baseline_mib"), out.get("world_memory_after_mib")
    if baseline and after:
        memory["pass"] = all(after[k] - baseline.get(k, 0.0) <= MEMORY_SLACK_MIB for k in after)
    memory["target"] = f"baseline {baseline} (+{MEMORY_SLACK_MIB:g} MiB)"
    if out.get("quantization") == "fp8":
        for alias, key in FP8_KEYS.items():
            out[alias] = out.get(key)
        rates = {
            "helios_fp8_raw_fps": _target(raw, ">=", 26.0, ">= 26 (H100)"),
            "world_fp8_delivered_fps": _target(delivered, ">=", 24.0, ">= 24"),
        }
    else:
        rates = {
            "world_raw_fps": {"value": raw, "target": "report", "pass": None},
            "world_delivered_fps": _target(delivered, ">=", 20.3, ">= 20.3 (H100, BF16)"),
        }
    return {
        **rates,
        "world_delivered_over_raw": _target(ratio, ">=", 1.0, ">= 1.0"),
        "world_first_chunk_s": _target(out.get("world_first_chunk_s"), "<=", 1.5, "<= 1.5"),
        "world_interaction_to_chunk_s": _target(
            out.get("world_interaction_to_chunk_s"),
            "<=",
            interaction,
            f"<= one chunk's playback ({CHUNK_PLAYBACK_S:.3f} s) + 0.5 = {interaction:.3f}",
        ),
        "world_two_sessions_fps_min": _target(
            out.get("world_two_sessions_fps_min"), ">=", 9.0, ">= 9.0"
        ),
        "world_takeover_gap_s": _target(out.get("world_takeover_gap_s"), "<=", 5.0, "<= 5"),
        "world_stop_p95_ms": _target(
            out.get("world_stop_p95_ms"), "<=", stop_bound, f"<= block_ms ({block}) + 50"
        ),
        "world_memory_after_mib": memory,
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--part", choices=("all", *PARTS), default="all")
    p.add_argument("--state", help="JSON of earlier parts: read, merged, written back")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=384)
    p.add_argument("--raw-chunks", type=int, default=4)
    p.add_argument("--repeat", type=int, default=2, help="timed raw calls (median)")
    p.add_argument("--chunks", type=int, default=14, help="per streamed session (>= 12)")
    p.add_argument("--interactions", type=int, default=3)
    p.add_argument("--stops", type=int, default=10)
    p.add_argument("--kill-after", type=int, default=2, help="chunk index the kill follows")
    p.add_argument("--ready-timeout", type=float, default=540.0)
    p.add_argument("--keep-logs", default=None, help="copy up's stderr to DIR/up_<part>.log")
    entry_args(p)
    p.add_argument(
        "--print-registry",
        action="store_true",
        help="print the parts' entries as JSON, run nothing",
    )
    p.add_argument("--targets-of", help="a run's JSON: print its targets again, run nothing")
    args = p.parse_args()
    entry_config(args)
    if args.tiny:
        args.stops = min(args.stops, 4)
    return args


def main() -> None:
    args = parse_args()
    if args.print_registry or args.targets_of:
        print(json.dumps(_without_running(args), indent=2))
        return
    state_path = Path(args.state) if args.state else None
    out: dict[str, Any] = {}
    if state_path is not None and state_path.exists():
        out = json.loads(state_path.read_text())
        defaults = {"quantization": "none", "attention": "sdpa", "vae_channels_last": False}
        for field, default in defaults.items():
            earlier = out.get(field, default)
            if earlier != getattr(args, field):
                raise SystemExit(
                    f"{state_path} holds parts run with {field} {earlier!r}, not "
                    f"{getattr(args, field)!r}: pass the same --{field.replace('_', '-')}, "
                    "or begin with the raw part (world.sh --raw), which starts a new state"
                )
    out |= header(args)
    args.random_config = out.get("random_config", args.random_config)  # the raw part's
    parts = PARTS if args.part == "all" else (args.part,)
    seconds = out.setdefault("part_seconds", {})
    for part in parts:
        began = time.perf_counter()
        if part == "raw":
            from benchmarks.gpu import world_raw

            out |= world_raw.run(args)
        else:
            from benchmarks.gpu import world_stack

            run = world_stack.part_stack if part == "stack" else world_stack.part_takeover
            with tempfile.TemporaryDirectory() as tmp:
                out |= run(args, Path(tmp))
        seconds[part] = round(time.perf_counter() - began, 1)
        if state_path is not None:  # a later part's failure keeps this one's keys
            state_path.write_text(json.dumps(out, indent=2))
    for key in ("world_delivered_over_raw", "targets"):  # last, over every part's keys
        out.pop(key, None)
    out["targets"] = targets(out)
    if state_path is not None:
        state_path.write_text(json.dumps(out, indent=2))
    emit(out, "gpu_world" + mode_suffix(args))


def _without_running(args: argparse.Namespace) -> dict[str, Any]:
    """``--print-registry``: the stack's and the takeover's registry entries;
    ``--targets-of FILE``: that run's targets made again (and its FP8 keys)."""
    if args.targets_of:
        out = json.loads(Path(args.targets_of).read_text())
        out["targets"] = targets(out)
        keys = ("quantization", "attention", "vae_channels_last", *FP8_KEYS, "targets")
        return {k: out.get(k) for k in keys}
    from benchmarks.gpu.world_stack import registry_text

    return {"stack": registry_text(args, 2), "takeover": registry_text(args, 1, workers=2)}


if __name__ == "__main__":
    main()
