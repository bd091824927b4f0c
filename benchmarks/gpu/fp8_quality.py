"""FP8 weights against BF16 on the adapters a worker runs, at a fixed seed (issue 44):
MiniMax-H3, Helios and Wan, or any registry entry. For each model, a BF16 side (the
entry with ``quantization`` and ``offload`` off, blocks eager) and an FP8 side (the
entry's ``quantization``, or ``"fp8"`` where it sets none), each loaded as a worker loads
it (benchmarks/gpu/fp8_runs.py), each one job (a world model: one session) of the same
request; the JSON gives, FP8 against BF16, the latents' cosine similarity after every
step, the decoded frames' PSNR, the device memory each holds and the step time, with the
worker's own report (FP8 layers, bytes saved).

Run:
    python -m benchmarks.gpu.fp8_quality --registry models.toml --model NAME [--model ...]
        the entries as written (released weights: their ``path``), unchanged otherwise;
        a FastH3 entry's fused LoRA is fused in BF16 and then quantized, as a worker does
    python -m benchmarks.gpu.fp8_quality --random [--only wan,helios,h3]
        seeded random weights at the real sizes (Wan 2.1 1.3B saved to a temp dir,
        Helios-Distilled 14B and MiniMax-H3 33B built on the GPU; no checkpoint needed)
    python -m benchmarks.gpu.fp8_quality --tiny
        the tiny random models on the CPU: the BF16 side runs, the FP8 side is refused as
        a worker refuses it there (a check of this script, not a measurement)
    --combos adds, each against the BF16 side: BF16 and FP8 with compiled blocks
    (``compile = "blocks"``, each after an untimed warm-up job or session that makes the
    graphs: graphs made while the timed one denoises should be 0; FP8 compiled is held
    against BF16 compiled, its ``step_speedup`` the compiled step's), FP8 with a cancel
    inside a block (the gate stops the step at block 3), FP8 with the ``high`` cache
    tier (models that offer it, against BF16 ``high``), and, for job models, ``offload =
    "model"`` (with compiled blocks, and with FP8) and ``offload = "group"`` (with a
    cancel), each
    expected at cosine 1.0 against its own precision.
    --fp8-modulation makes every FP8 side's entry ``fp8_modulation = true`` (the blocks'
    adaLN / modulation projections FP8 weight-only too: MiniMax-H3's ``adaln_proj``;
    Wan and Helios have none, so their FP8 sides do not change); the JSON's
    ``fp8_modulation`` says so and its file is ``gpu_fp8_quality_modulation.json``. Hold
    its ``against`` figures next to a run without it: the two share seeds and weights.
    --fp8-components transformer,vae makes every FP8 side's entry FP8 on those components
    (the per-component ``quantization``; ``vae``: MiniMax-H3's ViT decoder blocks, whose
    frames' PSNR is then the decode's rounding too); the file is
    ``gpu_fp8_quality_vae.json``.
    --print-sides prints each model's sides (their memory plans, as the registry reads
    them) and runs nothing.
Each side lists ``transformer_gib``, the ``transformer*`` components' weights on the
device once loaded (FP8 ones as held: float8 data and scales), ``resident_mib`` and
``after_mib`` (the device memory allocated once loaded and once the job is done: the
issue's "memory after jobs" for each mode, offloaded ones included), and ``against`` the
``transformer_gib_saved`` of each against its baseline.
On a GPU host: bash benchmarks/device/fp8.sh [args]. JSON on stdout and in
$OUT/gpu_fp8_quality.json.

**Random weights are a weak proxy.** They say how far FP8 moves these networks' outputs
at these seeds, not whether a trained checkpoint still looks right: trained weights have
outlier rows that row-wise scales meet, random ones do not. Run it on the checkpoint you
serve (``--registry``) before you offer FP8 on it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.fp8_runs import Shape, Side, compare, run_side
from benchmarks.gpu.plans import components_arg, modulation_arg
from models.registry import ServedModel, parse_registry

FAMILIES = ("h3", "helios", "wan")
# Each family's job (or session) shape: at full size, and --tiny on the CPU.
SHAPES = {
    "h3": (Shape(448, 256, 121, 5), Shape(64, 64, 124, 3)),
    "helios": (Shape(640, 384, 33, 3, chunks=2), Shape(64, 64, 33, 3, chunks=1)),
    "wan": (Shape(832, 480, 33, 20), Shape(32, 32, 9, 3)),
}


def _random_registry(work: Path, tiny: bool, only: list[str]) -> str:
    """Registry entries of random-weight H3, Helios and Wan (``--random``, ``--tiny``)."""
    text = ""
    dtype = 'dtype = "float32"\n' if tiny else ""
    if "h3" in only:
        text += '[[model]]\nname = "h3"\nadapter = "diffusers.minimax_h3"\nweights = "random"\n'
        if tiny:
            from workers.pipelines.diffusers.minimax_h3.random_weights import TOY_CONFIG

            text += dtype + _options({"random_config": TOY_CONFIG})
    if "helios" in only:
        text += '[[model]]\nname = "helios"\nadapter = "diffusers.helios"\nweights = "random"\n'
        if tiny:
            from workers.pipelines.diffusers.helios.random_weights import TINY_CONFIG

            text += dtype + _options({"random_config": TINY_CONFIG, "max_sequence_length": 16})
        text += "[model.spec]\ndefault_steps = 3\n"  # Helios-Distilled: 3 stages of 1 step
    if "wan" in only:
        path = work / "wan"
        _save_wan(path, tiny)
        text += f'[[model]]\nname = "wan"\nadapter = "diffusers.wan"\npath = "{path}"\n'
        text += dtype or 'dtype = "bfloat16"\n'
        if tiny:
            text += _options({"max_sequence_length": 16})
    return text


def _options(options: dict[str, Any]) -> str:
    """A ``[model.adapter_options]`` table."""
    return "[model.adapter_options]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in options.items())


def _toml(value: Any) -> str:
    """A TOML inline value."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _save_wan(path: Path, tiny: bool) -> None:
    """Wan 2.1 1.3B's architecture with random weights (benchmarks/gpu/random_wan.py),
    or, ``tiny``, two 16-wide blocks (wide enough for FP8's matmuls), saved at ``path``."""
    if not tiny:
        from benchmarks.gpu.random_wan import build_pipeline

        device = "cuda" if torch.cuda.is_available() else "cpu"
        build_pipeline(device).save_pretrained(path)
        return
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    from workers.pipelines.diffusers.shared.random_parts import TINY_UMT5, character_tokenizer

    torch.manual_seed(0)
    pipe: Any = WanPipeline(
        tokenizer=character_tokenizer(),
        text_encoder=UMT5EncoderModel(UMT5Config(**TINY_UMT5)),
        vae=AutoencoderKLWan(
            base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
            temperal_downsample=[False, True, True],
        ),
        scheduler=UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
        ),
        transformer=WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
            in_channels=16, out_channels=16, text_dim=TINY_UMT5["d_model"], freq_dim=256,
            ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        ),
    )  # fmt: skip
    pipe.save_pretrained(path)


def variant(entry: ServedModel, **fields: Any) -> ServedModel:
    """``entry`` with ``fields`` changed (the memory plan made again from them)."""
    data = entry.model_dump(exclude={"spec"})
    return ServedModel.model_validate({**data, **fields, "spec": entry.spec})


def _sides(
    entry: ServedModel, combos: bool, modulation: bool, components: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """The variants of ``entry`` to run: label -> (fields, options of the run); with
    ``modulation`` (or the entry's own ``fp8_modulation``), every FP8 side's entry sets
    ``fp8_modulation = true``; with ``components``, every FP8 side's entry makes those
    components FP8 (the per-component ``quantization``)."""
    off: dict[str, Any] = {"quantization": None, "offload": "none", "offload_budget_gib": None}
    off |= {"offload_blocks": [], "fp8_modulation": False}
    chosen = {name: "fp8" for name in components} if components else None
    fp8: dict[str, Any] = {**off, "quantization": chosen or entry.quantization or "fp8"}
    fp8["fp8_modulation"] = modulation or entry.fp8_modulation
    fp8["offload_budget_gib"] = entry.offload_budget_gib
    out: dict[str, dict[str, Any]] = {
        "bf16": {"fields": {**off, "compile": "off"}},
        "fp8": {"fields": {**fp8, "compile": "off"}},
    }
    if not combos:
        return out
    out["bf16_compiled"] = {"fields": {**off, "compile": "blocks"}, "warm": True}
    out["fp8_compiled"] = {"fields": {**fp8, "compile": "blocks"}, "warm": True}
    job = entry.spec.kind == "job"
    if job:
        out["fp8_cancel"] = {"fields": {**fp8, "compile": "off"}, "cancel": True}
    if job and entry.spec.offers("high"):
        out["bf16_high"] = {"fields": {**off, "compile": "off"}, "quality": "high"}
        out["fp8_high"] = {"fields": {**fp8, "compile": "off"}, "quality": "high"}
    if job:
        model = {**off, "offload": "model"}
        out["offload_model"] = {"fields": {**model, "compile": "off"}}
        out["offload_model_compiled"] = {"fields": {**model, "compile": "blocks"}}
        out["fp8_offload_model"] = {"fields": {**fp8, "offload": "model", "compile": "off"}}
        group = {**off, "offload": "group", "offload_blocks": entry.offload_blocks}
        out["offload_group_cancel"] = {"fields": {**group, "compile": None}, "cancel": True}
    return out


# Which side each variant is held against (the rest: "bf16").
BASELINE = {
    "fp8_high": "bf16_high",
    "fp8_offload_model": "fp8",
    "fp8_compiled": "bf16_compiled",
    "fp8_cancel": "fp8",
}


def run_model(
    entry: ServedModel,
    device: str,
    shape: Shape,
    combos: bool,
    modulation: bool,
    components: list[str] | None = None,
) -> dict[str, Any]:
    """Every side of ``entry``, each compared with its baseline."""
    sides: dict[str, Side] = {}
    for label, how in _sides(entry, combos, modulation, components).items():
        run_shape = Shape(**{**vars(shape), "quality": how.get("quality", "lossless")})
        model = variant(entry, **how["fields"])
        sides[label] = run_side(
            label,
            model,
            device,
            run_shape,
            cancel=how.get("cancel", False),
            warm=how.get("warm", False),
        )
        print(f"{entry.name} {label}: {sides[label].summary()}", file=sys.stderr, flush=True)
    out: dict[str, Any] = {
        "adapter": entry.adapter,
        # the checkpoint's folder name (never a path of the machine that ran it)
        "weights": "random" if entry.weights == "random" else Path(entry.path or "").name,
        "fused_lora": "fused_lora" in entry.adapter_options,
        "fp8_modulation": modulation or entry.fp8_modulation,
        "shape": vars(shape),
        "sides": {label: side.summary() for label, side in sides.items()},
    }
    out["against"] = {
        label: {"baseline": BASELINE.get(label, "bf16")}
        | compare(sides[BASELINE.get(label, "bf16")], side)
        for label, side in sides.items()
        if label != "bf16"
    }
    return out


def _planned(entry: ServedModel, args: argparse.Namespace) -> dict[str, Any]:
    """Each side of ``entry`` as the registry reads it: its memory plan and compile."""
    out: dict[str, Any] = {}
    for label, how in _sides(entry, args.combos, args.fp8_modulation, args.fp8_components).items():
        model = variant(entry, **how["fields"])
        plan = model.spec.memory
        out[label] = {"memory": plan.model_dump() if plan else None, "compile": model.compile}
    return out


def _entries(args: argparse.Namespace, work: Path) -> list[tuple[ServedModel, str]]:
    """(entry, family) of each model to run."""
    if args.registry:
        served = parse_registry(Path(args.registry).read_text(), args.registry)
        names = args.model or list(served)
        return [(served[n], _family(served[n].adapter)) for n in names]
    only = args.only.split(",")
    served = parse_registry(_random_registry(work, args.tiny, only))
    return [(entry, _family(entry.adapter)) for entry in served.values()]


def _family(adapter: str) -> str:
    for family, name in (("h3", "minimax_h3"), ("helios", "helios"), ("wan", "wan")):
        if adapter.endswith(name):
            return family
    return "wan"  # another video job model: Wan's shape unless told otherwise


def _header() -> dict[str, Any]:
    """The machine, the versions, the date and the commit of a run."""
    import diffusers

    from benchmarks.embedded_stack import git_state

    try:
        import torchao

        torchao_version: str | None = torchao.__version__
    except ImportError:
        torchao_version = None
    cuda = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if cuda else None,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "torchao": torchao_version,
        "date": datetime.date.today().isoformat(),
        **git_state(),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--registry", help="a registry file (TOML) whose entries to run")
    source.add_argument("--random", action="store_true", help="random weights, real sizes")
    source.add_argument("--tiny", action="store_true", help="tiny random models on the CPU")
    p.add_argument("--model", action="append", help="with --registry: an entry's name")
    p.add_argument("--only", default=",".join(FAMILIES), help="with --random/--tiny")
    p.add_argument("--combos", action="store_true", help="the combinations too (GPU)")
    p.add_argument("--width", type=int)
    p.add_argument("--height", type=int)
    p.add_argument("--frames", type=int, help="a job's frames (snapped to its lattice)")
    p.add_argument("--steps", type=int, help="a job's steps, a session's per chunk")
    p.add_argument("--chunks", type=int, help="a world session's chunks")
    modulation_arg(p)
    components_arg(p)
    p.add_argument("--print-sides", action="store_true", help="the sides' plans, run nothing")
    args = p.parse_args()
    from benchmarks.gpu.common import emit

    if args.print_sides:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps({e.name: _planned(e, args) for e, _ in _entries(args, Path(tmp))}))
        return

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    out: dict[str, Any] = {
        **_header(),
        "device": device,
        "mode": "tiny: CPU, FP8 refused; a check of the script"
        if args.tiny
        else "random weights: a weak proxy for released ones"
        if args.random
        else "registry entries",
        "fp8_modulation": args.fp8_modulation,
        "fp8_components": args.fp8_components,
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for entry, family in _entries(args, Path(tmp)):
            full, tiny = SHAPES[family]
            shape = tiny if args.tiny else full
            shape = Shape(
                width=args.width or shape.width,
                height=args.height or shape.height,
                frames=args.frames or shape.frames,
                steps=args.steps or shape.steps,
                chunks=args.chunks or shape.chunks,
            )
            out["models"][entry.name] = run_model(
                entry, device, shape, args.combos, args.fp8_modulation, args.fp8_components
            )
    name = "gpu_fp8_quality" + ("_modulation" if args.fp8_modulation else "")
    name += "".join(f"_{c}" for c in args.fp8_components or () if c != "transformer")
    emit(out, name)


if __name__ == "__main__":
    main()
