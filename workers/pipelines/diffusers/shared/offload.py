"""Offloading for a registry entry's ``offload`` (diffusers' own), and its device memory cap.

* ``model``: each component on the GPU only while it runs: the pipeline's
  ``enable_model_cpu_offload`` (accelerate's hooks move a whole component in when its
  ``forward`` is called and the previous one out). A pipeline without it (MiniMax-H3's
  modular pipeline) cannot.
* ``group``: each component's blocks streamed ahead of use on a CUDA stream:
  ``diffusers.hooks.apply_group_offloading`` per component (as the pipeline's
  ``enable_group_offload`` does, which a modular pipeline has not), ``block_level`` with
  one block per group and ``use_stream=True`` (the next block's weights are copied in
  while the current one runs), from host copies pinned up front, or pageable ones pinned a
  group at a time where the pinned ones would not fit the host (host_memory.py). A
  component's top-level block lists stream block by block and the rest of it moves in as
  one group, at its ``forward``; the children its class names
  (``_group_offload_block_modules``: Wan's VAE's encoder and decoder, which its ``decode``
  calls without ``forward``), or an autoencoder's parts where its class names none (LTX's,
  CogVideoX's, MiniMax-H3's VAEs), those its adapter names (``offload_entry_points``: the
  submodules a pipeline calls directly, such as MiniMax-H3's ``text_encoder.model``, whose
  top-level ``forward`` never runs) and those ``offload_blocks`` leads to (block lists
  further down, ``text_encoder.encoder.block``) get hooks of their own
  (:func:`group_blocks`).
* ``offload_budget_gib``: ``torch.cuda.set_per_process_memory_fraction``, set before any
  weight is placed, so the process fails its allocations (out of memory) past the budget
  instead of taking the rest of the card (weights built on the device, ``weights =
  "random"``, are there first: memory.py sets it once they are placed).

Every component and block path a plan names is resolved by :func:`resolve_paths` when the
model loads: a missing or wrong one is an error naming it, never skipped.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from models.memory_plan import DENOISER_PREFIX, MemoryPlan
from models.registry import CatalogError

GIB = 1 << 30
log = logging.getLogger(__name__)

_BLOCK_LISTS = (torch.nn.ModuleList, torch.nn.Sequential)


def modules_of(pipe: Any) -> dict[str, torch.nn.Module]:
    """The pipeline's components that are modules, by name."""
    return {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}


def resolve_paths(pipe: Any, plan: MemoryPlan, model: str) -> dict[str, list[str]]:
    """Check every component and block path ``plan`` names against ``pipe``; returns
    component -> the block-module names ``apply_group_offloading`` takes for it (from
    ``offload_blocks``). Raises :class:`CatalogError` naming the path that is not there."""
    have = modules_of(pipe)
    where = f"model {model!r}"
    listed = ", ".join(sorted(have)) or "none"
    if isinstance(plan.quantization, dict):
        for component in plan.quantization:
            if component not in have:
                raise CatalogError(
                    f"{where}: quantization names component {component!r}, which "
                    f"{type(pipe).__name__} does not have (its modules: {listed})"
                )
    elif plan.quantization == "fp8" and not any(n.startswith(DENOISER_PREFIX) for n in have):
        raise CatalogError(
            f"{where}: quantization = 'fp8' quantizes the transformer* components, and "
            f"{type(pipe).__name__} has none (its modules: {listed})"
        )
    blocks: dict[str, list[str]] = {}
    for path in plan.offload_blocks:
        component, _, inner = path.partition(".")
        if component not in have:
            raise CatalogError(
                f"{where}: offload_blocks path {path!r}: no component {component!r} "
                f"(its modules: {listed})"
            )
        try:
            found = have[component].get_submodule(inner)
        except AttributeError:
            raise CatalogError(
                f"{where}: offload_blocks path {path!r}: {component} has no module {inner!r}"
            ) from None
        if not isinstance(found, _BLOCK_LISTS):
            raise CatalogError(
                f"{where}: offload_blocks path {path!r} is a {type(found).__name__}, not a "
                "block list (ModuleList or Sequential)"
            )
        # apply_group_offloading recurses into the children it is told are blocks, by
        # name at every level, and streams the lists it finds there.
        blocks.setdefault(component, []).extend(inner.split(".")[:-1])
    return blocks


def group_blocks(
    pipe: Any, blocks: dict[str, list[str]], points: dict[str, tuple[str, ...]], model: str
) -> dict[str, list[str]]:
    """Per component of ``pipe``, the block-module names ``apply_group_offloading``
    recurses into, each a group of its own (hooked at its own ``forward``): the class's
    (``_group_offload_block_modules``: Wan's VAE), or an autoencoder's parts where its
    class names none (:func:`_own_blocks`), then the adapter's entry points (``points``:
    the submodules its pipeline calls directly) and the plan's ``offload_blocks``
    (``blocks``, from :func:`resolve_paths`). The recursion follows names from the
    component down, so an entry point must be a child of the component or of another
    named child: one that is not is a :class:`CatalogError` naming it (its hook would
    never be made, and its weights would stay on the host)."""
    out: dict[str, list[str]] = {}
    for component, module in modules_of(pipe).items():
        wanted = points.get(component, ())
        names = list(dict.fromkeys([*_own_blocks(module), *wanted, *blocks.get(component, [])]))
        missing = set(wanted) - _reached(module, set(names))
        if missing:
            raise CatalogError(
                f"model {model!r}: offload = 'group' hooks {component}'s "
                f"{', '.join(sorted(missing))} on their own (its pipeline calls them "
                f"directly), and {type(module).__name__} has no such child under the others"
            )
        out[component] = names
    return out


def _own_blocks(module: torch.nn.Module) -> list[str]:
    """The children ``module``'s class names as blocks; for an autoencoder whose class
    names none (LTX's, CogVideoX's, MiniMax-H3's VAEs), its children that are not block
    lists: its ``encode`` / ``decode`` call them, never its ``forward``."""
    own = getattr(module, "_group_offload_block_modules", None)
    if own is not None:
        return list(own)
    if callable(getattr(module, "decode", None)):
        return [n for n, child in module.named_children() if not isinstance(child, _BLOCK_LISTS)]
    return []


def _reached(module: torch.nn.Module, names: set[str]) -> set[str]:
    """The ``names`` that block-level group offloading's recursion meets in ``module``."""
    found: set[str] = set()
    for name, child in module.named_children():
        if name in names:
            found |= {name} | _reached(child, names)
    return found


def weights_on_device(pipe: Any, device: torch.device) -> bool:
    """Whether ``pipe``'s weights are on ``device``, a CUDA GPU, before the plan placed
    them (built there: ``weights = "random"``); a checkpoint loads on the host."""
    if device.type != "cuda":
        return False
    return any(p.device.type == "cuda" for m in modules_of(pipe).values() for p in m.parameters())


def set_budget(plan: MemoryPlan, device: torch.device, held: int = 0) -> int | None:
    """Cap this process's memory on ``device`` at the plan's budget; returns it in bytes
    (None: no budget). Refuses a budget over the device's memory, and one under ``held``,
    the bytes the placed weights already hold (weights built on the device)."""
    if plan.offload_budget_gib is None:
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    budget = int(plan.offload_budget_gib * GIB)
    if budget > total:
        raise CatalogError(
            f"offload_budget_gib = {plan.offload_budget_gib:g} is more than device {device}'s "
            f"{total / GIB:.1f} GiB"
        )
    if held > budget:
        raise CatalogError(
            f"offload_budget_gib = {plan.offload_budget_gib:g}: the weights placed on "
            f"device {device} hold {held / GIB:.1f} GiB, over the budget"
        )
    # The cap is per device index: a worker's "cuda" (no index) is its current device,
    # which set_per_process_memory_fraction does not take for one (it refuses it).
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(budget / total, index)
    return budget


def offload(
    pipe: Any,
    plan: MemoryPlan,
    device: torch.device,
    blocks: dict[str, list[str]],
    pageable: bool = False,
    without_stream: frozenset[str] = frozenset(),
) -> None:
    """Put ``pipe``'s weights where ``plan.offload`` says (``none``: all on ``device``).
    ``pageable``: group offloading's host copies stay pageable (``low_cpu_mem_usage``),
    as host_memory.py decides when the pinned ones would not fit the host;
    ``without_stream``: the components group-offloaded without the prefetch stream
    (:func:`unstreamed`)."""
    if plan.offload == "none":
        pipe.to(device)
    elif plan.offload == "model":
        pipe.enable_model_cpu_offload(device=device)
    else:
        for name, component in modules_of(pipe).items():  # blocks: group_blocks'
            stream = name not in without_stream
            group_offload(component, device, blocks.get(name) or None, pageable, stream)


def group_offload(
    component: torch.nn.Module,
    device: torch.device,
    block_modules: list[str] | None = None,
    pageable: bool = False,
    stream: bool = True,
) -> None:
    """diffusers' group offloading of ``component`` as a worker applies it: a block a
    group, streamed to ``device`` ahead of use on a CUDA stream (unless ``stream`` is
    False: each group moved in when used), the host copies pinned unless ``pageable``;
    ``block_modules``: more block lists than its top level's. Layers under weight norm
    are folded first (:func:`fold_weight_norm`)."""
    from diffusers.hooks import apply_group_offloading

    if folded := fold_weight_norm(component):
        log.info("%s: %d weight-norm layers folded", type(component).__name__, folded)
    if not stream:
        log.info("%s: group offload without a stream (nested groups)", type(component).__name__)
    apply_group_offloading(
        component,
        onload_device=device,
        offload_device=torch.device("cpu"),
        offload_type="block_level",
        num_blocks_per_group=1,
        use_stream=stream,
        low_cpu_mem_usage=pageable,
        block_modules=block_modules,
    )


def fold_weight_norm(component: torch.nn.Module) -> int:
    """Fold ``torch.nn.utils.weight_norm`` into plain weights (``remove_weight_norm``, the
    same weight it computes at each call); returns how many layers. Its forward pre-hook
    computes a layer's weight from ``weight_g`` and ``weight_v`` before the layer's
    ``forward``, and group offloading onloads them inside ``forward``: under it the hook
    reads the host copies where the layer is a group of its own, and the convolution meets
    a weight on the CPU (MiniMax-H3's audio upsamplers; the H100 found it). The
    parametrization form (``torch.nn.utils.parametrizations.weight_norm``) computes the
    weight when read, inside ``forward``, and needs no folding."""
    from torch.nn.utils import remove_weight_norm
    from torch.nn.utils.weight_norm import WeightNorm

    folded = 0
    for module in component.modules():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, WeightNorm):
                remove_weight_norm(module, hook.name)
                folded += 1
    return folded


def unstreamed(pipe: Any, blocks: dict[str, list[str]]) -> frozenset[str]:
    """The components of ``pipe`` to group-offload without the prefetch stream, with
    ``blocks`` (:func:`group_blocks`' answer): those whose groups nest
    (:func:`nested_groups`). diffusers (0.42) cannot prefetch a level with a group of its
    own above another (each level's prefetch hook marks the layers below it, and the
    second mark is refused: "Hook with name layer_execution_tracker already exists"), so
    such a component's groups move in when used (MiniMax-H3's text encoder: it runs once
    a job, in ``prepare``). Decided once at load, for the host plan and the offload."""
    return frozenset(
        name
        for name, component in modules_of(pipe).items()
        if nested_groups(component, set(blocks.get(name) or ()))
    )


def nested_groups(module: torch.nn.Module, names: set[str]) -> bool:
    """Whether block-level group offloading of ``module``, recursing into the children
    ``names``, makes a level's own group (what it holds outside its block lists and named
    children) above another level's."""
    return _levels(module, names)[1]


def _levels(module: torch.nn.Module, names: set[str]) -> tuple[bool, bool]:
    """(a level at or below ``module`` has its own group, one such level is above another)."""
    below = nested = False
    own = (*module.parameters(recurse=False), *module.buffers(recurse=False))
    here = bool(own)
    for name, child in module.named_children():
        if name in names:
            has, deeper = _levels(child, names)
            below, nested = below or has, nested or deeper
        elif not isinstance(child, _BLOCK_LISTS):
            here = True
    return here or below, nested or (here and below)
