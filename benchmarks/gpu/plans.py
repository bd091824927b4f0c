"""The memory plan of a stack benchmark's registry entry (issue 44: FP8 weights, offload,
a memory budget; ``models/memory_plan.py``) and its attention backend (``attention =
"cudnn"``: cuDNN's fused attention), and what the stack's workers say of them.

* :func:`memory_args` adds ``--quantization`` (and, where the model may offload,
  ``--offload`` and ``--offload-budget-gib``; where its blocks have modulation
  projections, ``--fp8-modulation``) to a script's arguments, :func:`attention_args`
  ``--attention``, :func:`vae_layout_arg` ``--vae-channels-last`` (an adapter option, which
  the script writes into its entry); :func:`plan_toml` writes the others as an entry's
  top-level keys, :func:`plan_fields` as the run's JSON lists them, :func:`mode_suffix`
  names a run's files.
* :func:`refusal` is what a worker would refuse of an entry before it reads a weight
  (the registry's combinations, then the pipeline class and the device: FP8 off a CUDA GPU
  of compute capability 8.9, torchao missing, cuDNN attention off a CUDA GPU), asked in the
  benchmark's own process (the workers' Python) before any ``omniqueue up``: a run that
  cannot load fails in seconds.
* :func:`worker_metrics` scrapes every worker's ``/metrics`` (the addresses up logs) and
  :func:`model_memory` reads ``/v1/models``' ``memory`` of a model (the plan with the
  live worker's report: FP8 layers, bytes saved).
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.request
from typing import Any

from benchmarks.embedded_stack import Stack
from models.memory_plan import Precision, quantization_toml

QUANTIZATIONS = ("none", "fp8")
OFFLOADS = ("none", "model", "group")
# The entry's ``attention``: diffusers' default dispatch (SDPA), or cuDNN's fused attention.
ATTENTIONS = ("sdpa", "cudnn")
# "metrics: API http://…/metrics, worker 0 http://…/metrics, realtime worker 0 http://…"
_METRICS = re.compile(r"((?:realtime )?worker \d+) (http://\S+/metrics)")


def memory_args(
    p: argparse.ArgumentParser, *, offload: bool, modulation: bool = False, components: bool = False
) -> None:
    """``--quantization`` ({none, fp8}: fp8 makes the ``transformer*`` components' block
    Linear layers FP8, the worker's rule); with ``offload``, ``--offload`` and
    ``--offload-budget-gib`` as the registry spells them; with ``modulation`` (a model
    whose blocks have modulation projections: MiniMax-H3's), ``--fp8-modulation``; with
    ``components``, ``--fp8-components``. :func:`check_memory_args` refuses the FP8
    options without ``--quantization fp8``."""
    p.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="none",
        help='the entry\'s quantization ("fp8": its transformer)',
    )
    if components:
        components_arg(p)
    if offload:
        p.add_argument("--offload", choices=OFFLOADS, default="none")
        p.add_argument("--offload-budget-gib", type=float, default=None)
    if modulation:
        modulation_arg(p)


def components_arg(p: argparse.ArgumentParser) -> None:
    """``--fp8-components``: with ``--quantization fp8``, the components made FP8, the
    entry's per-component form (``quantization = {transformer = "fp8", vae = "fp8"}``);
    without it, ``"fp8"``: the ``transformer*`` components."""
    p.add_argument(
        "--fp8-components",
        type=lambda text: [name for name in text.split(",") if name],
        default=None,
        help="with --quantization fp8: the components FP8, comma-separated (e.g. "
        "transformer,vae; default: the transformer's)",
    )


def check_memory_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``p.error`` for an FP8 option without ``--quantization fp8`` (which the registry
    would refuse, or which would change nothing)."""
    if args.quantization == "fp8":
        return
    if getattr(args, "fp8_modulation", False):
        p.error("--fp8-modulation needs --quantization fp8 (the registry refuses it without)")
    if getattr(args, "fp8_components", None):
        p.error("--fp8-components needs --quantization fp8")


def quantization_value(args: argparse.Namespace) -> Precision | dict[str, Precision] | None:
    """The entry's ``quantization`` for ``args``: ``"fp8"``, the per-component table of
    ``--fp8-components``, or None."""
    if args.quantization == "none":
        return None
    components = getattr(args, "fp8_components", None)
    return {name: args.quantization for name in components} if components else args.quantization


def modulation_arg(p: argparse.ArgumentParser) -> None:
    """``--fp8-modulation``: the entry's ``fp8_modulation = true`` (with ``--quantization
    fp8``: the blocks' adaLN / modulation projections FP8 weight-only too)."""
    p.add_argument(
        "--fp8-modulation",
        action="store_true",
        help="the entry's fp8_modulation = true: the blocks' modulation projections FP8 "
        "weight-only too (needs --quantization fp8)",
    )


def attention_args(p: argparse.ArgumentParser) -> None:
    """``--attention`` ({sdpa, cudnn}: cudnn runs every denoiser's attention through
    cuDNN's fused attention, the entry's ``attention = "cudnn"``), for an A/B of the
    backend on one host."""
    p.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default="sdpa",
        help="the entry's attention (\"cudnn\": cuDNN's fused attention, CUDA only)",
    )


def vae_layout_arg(p: argparse.ArgumentParser) -> None:
    """``--vae-channels-last``: the entry's adapter option ``vae_channels_last = true``
    (the VAE decoder's 3-D convolution weights channels-last once loaded:
    ``workers/pipelines/diffusers/shared/vae_layout.py``), for an A/B of the decode's
    layout on one host."""
    p.add_argument(
        "--vae-channels-last",
        action="store_true",
        help="the entry's adapter option vae_channels_last = true: the VAE decoder's "
        "weights in channels_last_3d",
    )


def plan_toml(args: argparse.Namespace) -> str:
    """The entry's top-level memory and attention keys for ``args`` (empty: none)."""
    lines = []
    if getattr(args, "attention", "sdpa") != "sdpa":
        lines.append(f'attention = "{args.attention}"')
    if (quantization := quantization_value(args)) is not None:
        lines.append(f"quantization = {quantization_toml(quantization)}")
    if getattr(args, "fp8_modulation", False):
        lines.append("fp8_modulation = true")
    offload = getattr(args, "offload", "none")
    if offload != "none":
        lines.append(f'offload = "{offload}"')
    budget = getattr(args, "offload_budget_gib", None)
    if budget is not None:
        lines.append(f"offload_budget_gib = {budget:g}")
    return "".join(line + "\n" for line in lines)


def plan_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The run's memory plan and attention backend as the JSON lists them."""
    return {
        "attention": getattr(args, "attention", "sdpa"),
        "quantization": args.quantization,
        "fp8_components": getattr(args, "fp8_components", None),
        "fp8_modulation": getattr(args, "fp8_modulation", False),
        "offload": getattr(args, "offload", "none"),
        "offload_budget_gib": getattr(args, "offload_budget_gib", None),
    }


def mode_suffix(args: argparse.Namespace) -> str:
    """``_fp8`` (then each FP8 component beside the transformer, ``_vae``; then
    ``_modulation`` with ``--fp8-modulation``, and ``_group``,
    ``_24gib``) for a run with a plan, then ``_cudnn`` for one with cuDNN attention, then
    ``_cl`` for one with ``--vae-channels-last``: its files' names (``world.sh`` names
    them the same way)."""
    fields = plan_fields(args)
    out = "" if fields["quantization"] == "none" else f"_{fields['quantization']}"
    out += "".join(f"_{name}" for name in fields["fp8_components"] or () if name != "transformer")
    if fields["fp8_modulation"]:
        out += "_modulation"
    if fields["offload"] != "none":
        out += f"_{fields['offload']}"
    if fields["offload_budget_gib"] is not None:
        out += f"_{fields['offload_budget_gib']:g}gib"
    if fields["attention"] != "sdpa":
        out += f"_{fields['attention']}"
    if getattr(args, "vae_channels_last", False):
        out += "_cl"
    return out


def refusal(registry: str, model: str, device: str) -> str | None:
    """Why a worker on ``device`` would refuse ``model`` of the registry text ``registry``
    before reading a weight (the registry's combinations, then the pipeline class and the
    device, with the worker's own words), or None. Run in this process: the workers'
    Python, so a missing torchao is found here too."""
    from models.registry import CatalogError, parse_registry
    from workers.pipelines.diffusers.shared import attention

    entry = parse_registry(registry)[model]
    try:
        _check_plan(entry, model, device)
        attention.refuse_off_cuda(entry.spec, device)  # after the plan, as a worker loads
    except CatalogError as exc:
        return str(exc)
    return None


def _check_plan(entry: Any, model: str, device: str) -> None:
    """The memory plan's refusals of :func:`refusal` (``CatalogError``)."""
    from workers.pipelines.diffusers.shared.memory import MemoryLayout
    from workers.pipelines.registry import adapter_class, check_plan

    plan = entry.spec.memory
    if plan is None:
        return
    cls = adapter_class(entry)
    pipeline_class = getattr(cls, "pipeline_class", None)
    if pipeline_class is None:  # Helios's world adapter checks against HeliosPipeline
        from diffusers import HeliosPipeline

        pipeline_class = HeliosPipeline
    check_plan(entry)
    MemoryLayout(model, plan).check(device, pipeline_class)


def worker_metrics(stack: Stack) -> dict[str, dict[str, float]]:
    """Each worker's ``/metrics`` (``"worker 0"``, ``"realtime worker 1"`` …): every
    sample's value by metric name, summed over its labels; a worker that does not answer
    is left out."""
    out: dict[str, dict[str, float]] = {}
    for worker, url in dict(_METRICS.findall(stack.log_path.read_text(errors="replace"))).items():
        try:
            text = urllib.request.urlopen(url, timeout=10).read().decode()
        except OSError:
            continue
        values: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            metric = name.split("{", 1)[0]
            try:
                values[metric] = values.get(metric, 0.0) + float(value)
            except ValueError:
                continue
        out[worker] = values
    return out


def gauge_mib(stack: Stack, metric: str, kind: str) -> dict[str, float]:
    """``metric`` (bytes) of each worker whose name starts with ``kind`` (``"worker"``,
    ``"realtime worker"``), in MiB; empty where no worker serves it (a CPU worker has no
    GPU gauges)."""
    return {
        worker: round(values[metric] / 2**20, 1)
        for worker, values in worker_metrics(stack).items()
        if worker.startswith(kind) and metric in values
    }


def model_memory(stack: Stack, model: str) -> dict[str, Any] | None:
    """``/v1/models``' entry of ``model``: its ``available`` (and why not) and its
    ``memory`` (the plan and the live worker's FP8 report), or None when not listed."""
    with urllib.request.urlopen(f"{stack.url}/v1/models", timeout=30) as resp:
        listed = json.loads(resp.read())
    for item in listed.get("data", []):
        if item.get("id") == model:
            keep = ("available", "unavailable_reason", "memory")
            return {k: item.get(k) for k in keep if k in item}
    return None
