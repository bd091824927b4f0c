"""A diffusers adapter's memory plan at load: where its weights go and in what precision
(``models/memory_plan.py`` is the plan as data; fp8.py and offload.py do the work).

:class:`MemoryLayout` is a part each diffusers adapter holds, as it holds its entry. Its
order at load:

1. :meth:`~MemoryLayout.check`, before any weight is read: an offload mode the pipeline
   class has not (``model`` on a modular pipeline), then the device: FP8 needs a CUDA GPU
   of compute capability 8.9 or more, offloading and the budget a CUDA GPU. Each refusal
   names the model, the setting and the device. (The combinations a plan does not make
   with the rest of its entry are refused before this, by the registry:
   ``models.memory_plan.refused_combination``.)
2. :meth:`~MemoryLayout.place`, once the pipeline is loaded (and, where the plan makes
   FP8 weights, after the adapter changed its weights in their loaded dtype: FastH3's
   fused LoRA): the paths the plan names resolved (with ``group``, the groups each
   component's parts make: offload.py's ``group_blocks``), the budget set, each FP8
   component's layers quantized on the device one at a time (with ``fp8_modulation``, the
   blocks' modulation projections weight-only), then every weight put where ``offload`` says
   (``group``: its host copies planned against the host's memory first,
   host_memory.py: pinned when they fit, else pageable, else refused), and the
   allocator's cached blocks (the loaded dtype's weights that FP8 or offloading replaced)
   handed back to the device, so that another process on the card can have them. It logs
   which layers are FP8 (how many modulation projections weight-only) and what they
   save, and returns the :class:`~models.memory_plan.MemoryReport` the worker publishes.

   Weights built on the device (``weights = "random"``, benchmarks only) are there, at
   their loaded size, before the plan applies: the budget is then set once they are
   placed, and refused when what they hold is over it, so that it caps what the model
   holds while it serves as it does for a checkpoint loaded from the host.

Without a plan, :meth:`~MemoryLayout.place` is the ``pipe.to(device)`` it replaces.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from models.memory_plan import MemoryPlan, MemoryReport
from models.registry import CatalogError
from workers.pipelines.diffusers.shared import fp8
from workers.pipelines.diffusers.shared.host_memory import plan_host_copies
from workers.pipelines.diffusers.shared.offload import (
    group_blocks,
    modules_of,
    offload,
    resolve_paths,
    set_budget,
    unstreamed,
    weights_on_device,
)

log = logging.getLogger(__name__)


class MemoryLayout:
    """The memory plan of one model's adapter (None: weights as loaded, on the device)."""

    def __init__(
        self,
        model: str,
        plan: MemoryPlan | None,
        entry_points: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.model = model
        self.plan = plan
        # The adapter's ``offload_entry_points``: submodules its pipeline calls directly,
        # which ``offload = "group"`` hooks on their own (offload.py: group_blocks).
        self.entry_points = dict(entry_points or {})
        self.report: MemoryReport | None = None

    @property
    def quantizes(self) -> bool:
        """Whether the plan makes any weights FP8."""
        return self.plan is not None and self.plan.quantizes

    def check(self, device: str | torch.device, pipeline_class: Any) -> None:
        """Refuse, before any weight loads, a plan that ``pipeline_class`` or ``device``
        cannot run (:class:`CatalogError`, naming the model, the setting and the device)."""
        plan = self.plan
        if plan is None:
            return
        where = f"model {self.model!r}"
        if plan.offload == "model" and not hasattr(pipeline_class, "enable_model_cpu_offload"):
            raise CatalogError(
                f"{where}: offload = 'model' needs a pipeline with enable_model_cpu_offload, "
                f"and {pipeline_class.__name__} has none; use offload = 'group'"
            )
        target = torch.device(device)
        if plan.quantizes and (why := fp8.fp8_unsupported(target)) is not None:
            raise CatalogError(
                f"{where}: quantization = 'fp8' needs a CUDA GPU of compute capability 8.9 "
                f"or more (FP8 matmuls), and {why}"
            )
        if plan.quantizes and (why := fp8.library_missing()) is not None:
            raise CatalogError(f"{where}: quantization = 'fp8' needs torchao, and {why}")
        cuda = target.type == "cuda" and torch.cuda.is_available()
        if plan.offload != "none" and not cuda:
            raise CatalogError(
                f"{where}: offload = {plan.offload!r} moves weights between the CPU and a "
                f"GPU, and device {target} is not a CUDA GPU"
            )
        if plan.offload_budget_gib is not None and not cuda:
            raise CatalogError(
                f"{where}: offload_budget_gib caps a CUDA GPU's memory, and device {target} "
                "is not one"
            )

    def place(self, pipe: Any, device: str | torch.device) -> MemoryReport | None:
        """Put ``pipe``'s weights on ``device`` as the plan says (the module docstring);
        returns what was done (None without a plan)."""
        target = torch.device(device)
        plan = self.plan
        if plan is None:
            pipe.to(target)
            return None
        blocks = resolve_paths(pipe, plan, self.model)
        if plan.offload == "group":
            blocks = group_blocks(pipe, blocks, self.entry_points, self.model)
        built_there = weights_on_device(pipe, target)
        budget = None if built_there else set_budget(plan, target)
        counts, weight_only, saved = self._quantize(pipe, plan, target)
        host, without_stream = None, frozenset[str]()
        if plan.offload == "group":
            without_stream = unstreamed(pipe, blocks)
            host = plan_host_copies(self.model, modules_of(pipe), without_stream)
        pageable = host is not None and host.low_cpu_mem_usage
        offload(pipe, plan, target, blocks, pageable, without_stream)
        if target.type == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()
        if built_there:
            budget = set_budget(plan, target, held=torch.cuda.memory_allocated(target))
        self.report = MemoryReport(
            fp8_modules=counts,
            fp8_weight_only_modules=weight_only,
            bytes_saved=saved,
            offload=plan.offload,
            budget_bytes=budget,
            offload_host=host.copies if host else None,
            offload_host_bytes=host.host_bytes if host else None,
        )
        log.info(
            "%s: %s; FP8 Linear layers %s, modulation layers FP8 weight-only %s, %.2f GB "
            "saved; offload %s",
            self.model,
            plan.describe(),
            counts or "none",
            weight_only or "none",
            saved / 1e9,
            plan.offload,
        )
        return self.report

    def _quantize(
        self, pipe: Any, plan: MemoryPlan, target: torch.device
    ) -> tuple[dict[str, int], dict[str, int], int]:
        """Each FP8 component's layers quantized on ``target`` (the rule's, and with
        ``fp8_modulation`` its modulation projections weight-only): per component, how many
        of each kind (weight-only counted for every FP8 component when the plan asks for
        them, none found included), and the bytes saved in all."""
        counts: dict[str, int] = {}
        weight_only: dict[str, int] = {}
        saved = 0
        for name, component in modules_of(pipe).items():
            if not plan.fp8_on(name):
                continue
            layers = fp8.fp8_layers(component)
            kinds = fp8.fp8_kinds(layers, plan.fp8_modulation)
            if not kinds:
                raise CatalogError(
                    f"model {self.model!r}: quantization 'fp8' on {name} makes nothing FP8: "
                    f"none of its {len(layers)} Linear layers is in a block, outside norms "
                    "and modulation, with sizes in multiples of 16"
                )
            saved += fp8.bytes_saved(component, list(kinds))
            fp8.quantize(component, kinds, target)
            counts[name] = sum(kind == "dynamic" for kind in kinds.values())
            if plan.fp8_modulation:
                weight_only[name] = len(kinds) - counts[name]
            _log_layers(self.model, name, layers, kinds)
        return counts, weight_only, saved


def _log_layers(
    model: str, component: str, layers: dict[str, str | None], kinds: dict[str, fp8.Fp8Kind]
) -> None:
    """Which of a component's Linear layers are FP8 (of each kind) and why the others are
    not: a line at INFO (the counts, and the kept layers' first names), every name at
    DEBUG."""
    kept: dict[str, list[str]] = {}
    for name, why in layers.items():
        if why is not None and name not in kinds:
            kept.setdefault(why, []).append(name)
    fp8_count = sum(kind == "dynamic" for kind in kinds.values())
    weight_only = len(kinds) - fp8_count
    summary = "; ".join(
        f"{why}: {len(names)} ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
        for why, names in kept.items()
    )
    log.info(
        "%s %s: %d Linear layers FP8, %d modulation layers FP8 weight-only; kept: %s",
        model,
        component,
        fp8_count,
        weight_only,
        summary or "none",
    )
    log.debug("%s %s FP8 layers: %s", model, component, kinds)
