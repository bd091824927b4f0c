"""A registry entry's memory plan, as data: FP8 weights and offloading (docs/configuration.md,
"Memory: FP8 weights and offload"; issue 44).

A :class:`~models.registry.ServedModel`'s ``quantization`` (``"fp8"``: every denoiser,
the ``transformer*`` components; or per component, ``{transformer = "fp8", text_encoder =
"none"}``), ``offload`` (``none``, ``model``, ``group``), ``offload_budget_gib`` and
``offload_blocks`` and ``fp8_modulation`` (the blocks' adaLN / modulation projections FP8
weight-only too) become one :class:`MemoryPlan` on its spec. The worker resolves it
against the loaded pipeline (``workers/pipelines/diffusers/shared/memory.py``) and reports
what it did (:class:`MemoryReport`: the FP8 Linear layers of each component, the
weight-only ones apart, and the bytes they saved); ``/v1/models`` lists the plan with the
live workers' figures (:class:`ModelMemory`).

:func:`refused_combination` is the matrix of docs/adapters.md ("FP8 and offload"): what
a plan does not combine with, named with the plan's feature, refused when a worker loads
the model and before it looks at its device (so a CPU test meets each refusal).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# A component's weights: FP8 (torchao's float8, row-wise scales, activations quantized on
# the fly) or as loaded ("none").
Precision = Literal["fp8", "none"]
# Where the weights live between uses: on the device ("none"), each component moved in
# whole while it runs ("model"), or its blocks streamed ahead of use ("group").
OffloadMode = Literal["none", "model", "group"]
# How ``offload = "group"`` holds its host copies of the weights: pinned up front, or
# pageable and pinned a group at a time as it moves in (when the pinned ones would not fit
# the host: workers/pipelines/diffusers/shared/host_memory.py).
HostCopies = Literal["pinned", "pageable"]
# The components ``quantization = "fp8"`` quantizes: the denoisers.
DENOISER_PREFIX = "transformer"


class MemoryPlan(BaseModel):
    """How a model's weights are held on its worker, as its registry entry says."""

    # "fp8" (the denoisers), or component -> precision; "none" keeps everything as loaded.
    quantization: Precision | dict[str, Precision] = "none"
    offload: OffloadMode = "none"
    # The most device memory the worker's process may take (GiB): enforced with
    # torch.cuda.set_per_process_memory_fraction before the weights are placed.
    offload_budget_gib: float | None = Field(default=None, gt=0)
    # ``offload = "group"``: block lists below a component's top level that stream block
    # by block too ("text_encoder.encoder.block"); a component's top-level lists always do.
    offload_blocks: list[str] = Field(default_factory=list)
    # The modulation (adaLN) projections of an FP8 component's blocks FP8 weight-only too
    # (weights float8, the matmul in the loaded dtype); off: kept as loaded, the rule's
    # default (workers/pipelines/diffusers/shared/fp8.py).
    fp8_modulation: bool = False

    @property
    def quantizes(self) -> bool:
        """Whether any component's weights become FP8."""
        q = self.quantization
        return q == "fp8" or (isinstance(q, dict) and "fp8" in q.values())

    def fp8_on(self, component: str) -> bool:
        """Whether ``component``'s weights become FP8 (as declared; the worker checks the
        name against the pipeline's components)."""
        q = self.quantization
        if isinstance(q, dict):
            return q.get(component) == "fp8"
        return q == "fp8" and component.startswith(DENOISER_PREFIX)

    def describe(self) -> str:
        """The plan's settings as the registry writes them (for refusals and logs)."""
        parts = []
        if self.quantization != "none":
            parts.append(f"quantization = {quantization_toml(self.quantization)}")
        if self.fp8_modulation:
            parts.append("fp8_modulation = true")
        if self.offload != "none":
            parts.append(f"offload = {self.offload!r}")
        if self.offload_budget_gib is not None:
            parts.append(f"offload_budget_gib = {self.offload_budget_gib:g}")
        return ", ".join(parts) or "no memory plan"


def quantization_toml(value: Precision | dict[str, Precision]) -> str:
    """An entry's ``quantization`` as TOML writes it: ``'fp8'``, or the per-component
    table ``{transformer = "fp8", vae = "fp8"}``."""
    if isinstance(value, str):
        return repr(value)
    return "{" + ", ".join(f'{k} = "{v}"' for k, v in value.items()) + "}"


def memory_plan(
    quantization: Precision | dict[str, Precision] | None,
    offload: OffloadMode,
    budget_gib: float | None,
    blocks: list[str],
    fp8_modulation: bool = False,
) -> MemoryPlan | None:
    """A registry entry's fields as one plan; None when the entry sets none of them (the
    model loads as before). Refuses (``ValueError``) ``offload_blocks`` without ``offload =
    "group"``, a block path without its component (``component.path``) and
    ``fp8_modulation`` on a plan that makes no component FP8."""
    if blocks and offload != "group":
        raise ValueError(f"offload_blocks needs offload = 'group', not {offload!r}")
    for path in blocks:
        if "." not in path.strip("."):
            raise ValueError(
                f"offload_blocks: {path!r} must name a component and a block list in it "
                "(component.path, e.g. 'text_encoder.encoder.block')"
            )
    if isinstance(quantization, dict) and not quantization:
        raise ValueError("quantization: name at least one component, or write 'fp8'")
    plan = MemoryPlan(
        quantization=quantization or "none",
        offload=offload,
        offload_budget_gib=budget_gib,
        offload_blocks=blocks,
        fp8_modulation=fp8_modulation,
    )
    if fp8_modulation and not plan.quantizes:
        raise ValueError(
            f"fp8_modulation = true needs quantization = 'fp8' (on a component at least), and "
            f"quantization = {quantization_toml(plan.quantization)} makes no component FP8: "
            "the modulation projections it makes FP8 are those of an FP8 component's blocks"
        )
    return None if plan == MemoryPlan() else plan


def refused_combination(
    plan: MemoryPlan,
    *,
    lora: bool,
    streaming: bool,
    compile: str | None,
    devices: int,
) -> str | None:
    """Why ``plan`` does not combine with the rest of its entry (one line naming both
    features), or None. ``lora``: the spec lists per-request ``lora``; ``streaming``: a
    realtime model; ``compile``: the entry's ``compile`` as written (None: the default,
    which ``offload = "group"`` makes "off"); ``devices``: its worker group's size."""
    fp8 = f"quantization = {quantization_toml(plan.quantization)}"
    offload = f"offload = {plan.offload!r}"
    if lora and plan.fp8_on("transformer"):
        return (
            f"{fp8} and per-request LoRA (parameters lists 'lora') do not combine: the LoRA "
            "slot's layers wrap the transformer's Linear layers, whose weights FP8 replaces"
        )
    if lora and plan.offload != "none":
        return (
            f"{offload} and per-request LoRA (parameters lists 'lora') do not combine: the "
            "LoRA cache keeps adapters on the device and copies them into the slot, which "
            "offloading moves off it"
        )
    if plan.offload != "none" and streaming:
        return (
            f"{offload} and realtime sessions do not combine: a realtime worker steps one "
            "pipeline from several session threads, and offloading moves its weights per call"
        )
    if plan.offload == "group" and compile == "blocks":
        return (
            f"{offload} and compile = 'blocks' do not combine: group offloading's hooks and "
            "the compiled blocks both replace the blocks' forward; leave compile unset (off "
            "with group offloading) or set it to 'off'"
        )
    if devices > 1 and (plan.quantizes or plan.offload != "none"):
        return f"{plan.describe()} and a worker group (devices = {devices}) do not combine"
    return None


class MemoryReport(BaseModel):
    """What a worker did with a model's plan when it loaded it (worker -> API, through
    its presence in Redis: ``storage/worker_presence.py``)."""

    # Quantized component -> how many of its Linear layers hold FP8 weights with FP8
    # matmuls (the rule's layers).
    fp8_modules: dict[str, int] = Field(default_factory=dict)
    # fp8_modulation: quantized component -> how many of its modulation projections hold
    # FP8 weights with a matmul in the loaded dtype (weight-only).
    fp8_weight_only_modules: dict[str, int] = Field(default_factory=dict)
    # Device memory the FP8 weights save (both kinds): each quantized Linear's weight at one
    # byte an element instead of its dtype's, less its row-wise float32 scales.
    bytes_saved: int = 0
    offload: OffloadMode = "none"
    # The per-process device memory cap in bytes (offload_budget_gib), when set.
    budget_bytes: int | None = None
    # offload = "group": its host copies (pinned or pageable) and the host bytes they hold.
    offload_host: HostCopies | None = None
    offload_host_bytes: int | None = None


class ModelMemory(BaseModel):
    """``/v1/models``' ``memory`` of a model with a plan: the plan, and what the live
    workers that loaded it report (None before one has)."""

    quantization: Precision | dict[str, Precision]
    offload: OffloadMode
    offload_budget_gib: float | None = None
    offload_blocks: list[str] = Field(default_factory=list)
    fp8_modulation: bool = False
    # FP8 Linear layers in all (per component: ``fp8_components``), the modulation
    # projections made FP8 weight-only apart (``fp8_modulation``: per component
    # ``fp8_weight_only_components``), and the bytes both save.
    fp8_modules: int | None = None
    fp8_components: dict[str, int] | None = None
    fp8_weight_only_modules: int | None = None
    fp8_weight_only_components: dict[str, int] | None = None
    bytes_saved: int | None = None
    # offload = "group": how the worker holds the host copies, and their bytes.
    offload_host: HostCopies | None = None
    offload_host_bytes: int | None = None


def model_memory(plan: MemoryPlan | None, report: MemoryReport | None) -> ModelMemory | None:
    """The listing of ``plan`` with a live worker's ``report`` (None: no plan)."""
    if plan is None:
        return None
    listed = ModelMemory(
        quantization=plan.quantization,
        offload=plan.offload,
        offload_budget_gib=plan.offload_budget_gib,
        offload_blocks=list(plan.offload_blocks),
        fp8_modulation=plan.fp8_modulation,
    )
    if report is not None:
        listed.fp8_modules = sum(report.fp8_modules.values())
        listed.fp8_components = dict(report.fp8_modules)
        listed.fp8_weight_only_modules = sum(report.fp8_weight_only_modules.values())
        listed.fp8_weight_only_components = dict(report.fp8_weight_only_modules)
        listed.bytes_saved = report.bytes_saved
        listed.offload_host = report.offload_host
        listed.offload_host_bytes = report.offload_host_bytes
    return listed
