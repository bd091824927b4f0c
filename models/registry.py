"""The served-model registry: each entry (a :class:`ServedModel`) names the adapter that
runs a model, where its weights are and how it runs; ``parse_registry`` reads the TOML
file (docs/configuration.md, "Model registry")."""

from __future__ import annotations

import difflib
import json
import tomllib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.catalog import (
    CUDNN_FAMILIES,
    DEFAULT_VSA_TOPK,
    FAMILY_SPECS,
    REFERENCE_AUDIO,
    REFERENCE_SPEECH,
    REFERENCE_VIDEO,
    REFERENCE_VOICE,
    REFERENCE_WORLD,
    AttentionBackend,
    ModelSpec,
)
from models.memory_plan import OffloadMode, Precision, memory_plan

ParallelStrategy = Literal["cfg", "ulysses", "ring"]
# How a diffusers model's denoiser runs: each transformer block's forward compiled by
# torch.compile (the per-block cancel gates and cache hooks stay outside), or eager.
CompileMode = Literal["blocks", "off"]


class WarmupShape(BaseModel):
    """A shape bucket compiled at worker start, before the worker takes jobs."""

    model_config = ConfigDict(extra="forbid")

    width: int = Field(ge=1)
    height: int = Field(ge=1)
    num_frames: int = Field(ge=1)


class ServedModel(BaseModel):
    """One entry of the served-model registry: which adapter runs it, from where, how."""

    name: str
    # ``reference.video``, a family of FAMILY_SPECS (``diffusers.wan``…), or ``module:Class``.
    adapter: str
    path: str | None = None
    # "random": the weights are built from the family's default configs with a seeded
    # random init on the device, instead of loaded from ``path``: benchmarks of models too
    # big to save on the machine at hand, only; a worker refuses such an entry unless
    # OMNIQ_WORKER__RANDOM_WEIGHTS is on.
    weights: Literal["checkpoint", "random"] = "checkpoint"
    dtype: str = "bfloat16"
    # None: the worker's device (OMNIQ_WORKER__DEVICE).
    device: str | None = None
    # Extra keyword arguments of the adapter's constructor (e.g. max_sequence_length).
    adapter_options: dict[str, Any] = Field(default_factory=dict)
    # Devices one job runs on: a worker group of exactly that many serves the model
    # (``omniqueue worker --devices cuda:0,cuda:1``), and single-device workers do not.
    devices: int = Field(default=1, ge=1, le=64)
    # How a group splits the work (docs/deployment.md): ``cfg``, the conditional and
    # unconditional passes of classifier-free guidance on two ranks; ``ulysses`` / ``ring``,
    # diffusers' context parallelism over the token sequence.
    parallel: ParallelStrategy | None = None
    # None: "blocks" on a CUDA device, "off" elsewhere (docs/adapters.md, "Compiled blocks").
    compile: CompileMode | None = None
    # torch.compile's backend and mode for the blocks ("inductor", None: its default).
    compile_backend: str = "inductor"
    compile_mode: str | None = None
    # The denoiser's attention (None: the family's, SDPA): "vsa" with ``vsa_topk`` key
    # blocks per query block (default 64), for diffusers.minimax_h3's joint blocks; "cudnn"
    # (cuDNN's fused attention, on a CUDA device) for every role of a CUDNN_FAMILIES model.
    attention: AttentionBackend | None = None
    vsa_topk: int | None = None
    # Shapes compiled at worker start; a job of another shape compiles in its prepare.
    warmup: list[WarmupShape] = Field(default_factory=list)
    # FP8 weights ("fp8": the denoisers; or per component) and offloading, with a cap on
    # the process's device memory (models/memory_plan.py; docs/configuration.md, "Memory").
    quantization: Precision | dict[str, Precision] | None = None
    offload: OffloadMode = "none"
    offload_budget_gib: float | None = Field(default=None, gt=0)
    offload_blocks: list[str] = Field(default_factory=list)
    # With FP8: the denoiser blocks' adaLN / modulation projections FP8 weight-only too
    # (weights float8, the matmul in the loaded dtype); off, they stay as loaded.
    fp8_modulation: bool = False
    # This model's own queue bound and default ``ttl`` (seconds); None: the server's
    # (``OMNIQ_QUEUE__MAX_DEPTH``, ``OMNIQ_QUEUE__DEFAULT_TTL_S``); 0: none.
    max_queue_depth: int | None = Field(default=None, ge=0)
    # A world model's sessions on one realtime worker; None: as many as keep real time,
    # measured (``workers/sessions/turns.py``), within ``OMNIQ_REALTIME__SLOTS``.
    max_sessions: int | None = Field(default=None, ge=1)
    ttl_s: int | None = Field(default=None, ge=0)
    spec: ModelSpec

    @model_validator(mode="after")
    def _check_parallel(self) -> ServedModel:
        if self.devices > 1 and self.parallel is None:
            raise ValueError("devices > 1 needs a parallel strategy (cfg, ulysses or ring)")
        if self.devices == 1 and self.parallel is not None:
            raise ValueError(f"parallel = {self.parallel!r} needs devices > 1")
        if self.parallel == "cfg" and self.devices != 2:
            raise ValueError("parallel = 'cfg' runs on exactly 2 devices")
        if self.devices > 1 and self.device is not None:
            raise ValueError("a model on several devices runs on the worker group's (--devices)")
        if self.devices > 1 and self.spec.streaming:
            raise ValueError("streaming models run on one device (devices = 1)")
        return self

    @model_validator(mode="after")
    def _check_attention(self) -> ServedModel:
        """``attention`` / ``vsa_topk`` into the spec's roles (what ``/v1/models`` lists)."""
        if self.vsa_topk is not None and self.attention != "vsa":
            raise ValueError("vsa_topk needs attention = 'vsa'")
        if self.vsa_topk is not None and self.vsa_topk <= 0:
            raise ValueError(f"vsa_topk must be at least 1, not {self.vsa_topk}")
        if self.attention == "vsa":
            if "blocks" not in self.spec.attention:
                raise ValueError(
                    f"attention = 'vsa' is implemented for diffusers.minimax_h3, not {self.adapter}"
                )
            roles = {**self.spec.attention, "blocks": "vsa"}
            topk = self.vsa_topk or DEFAULT_VSA_TOPK
            self.spec = self.spec.model_copy(update={"attention": roles, "vsa_topk": topk})
        if self.attention == "cudnn":
            if self.adapter not in CUDNN_FAMILIES:
                raise ValueError(
                    f"attention = 'cudnn' is implemented for {', '.join(CUDNN_FAMILIES)}, "
                    f"whose attention goes through diffusers' dispatch, not {self.adapter}"
                )
            # one backend for the whole denoiser (set_attention_backend reaches every
            # attention module): each role the family names, else the one "blocks"
            roles = {role: "cudnn" for role in self.spec.attention or ("blocks",)}
            self.spec = self.spec.model_copy(update={"attention": roles})
        return self

    @model_validator(mode="after")
    def _memory_plan(self) -> ServedModel:
        """``quantization`` / ``offload`` into the spec's plan (what ``/v1/models`` lists)."""
        plan = memory_plan(
            self.quantization,
            self.offload,
            self.offload_budget_gib,
            self.offload_blocks,
            self.fp8_modulation,
        )
        self.spec = self.spec.model_copy(update={"memory": plan})
        return self


BUILTIN_MODELS: dict[str, ServedModel] = {
    spec.name: ServedModel(
        name=spec.name, adapter=spec.name.replace("/", "."), dtype="float32", spec=spec
    )
    for spec in (
        REFERENCE_VIDEO,
        REFERENCE_WORLD,
        REFERENCE_AUDIO,
        REFERENCE_SPEECH,
        REFERENCE_VOICE,
    )
}


class CatalogError(ValueError):
    """The model registry file is malformed; the message names the entry and field."""


def parse_registry(text: str, source: str = "model registry") -> dict[str, ServedModel]:
    """Parse a registry file (TOML)::

    [[model]]
    name = "Wan-AI/Wan2.1-T2V-1.3B"
    adapter = "diffusers.wan"
    path = "/weights/Wan2.1-T2V-1.3B-Diffusers"
    dtype = "bfloat16"
    [model.spec]          # optional overrides of the family's ModelSpec
    max_width = 1280
    """
    doc = _load_toml(text, source)
    _check_keys(doc, {"model"}, source)
    entries = doc.get("model", [])
    if not isinstance(entries, list):
        raise CatalogError(
            f"{source}: 'model' must be an array of tables: write [[model]] (two brackets) "
            "above each entry, not [model]"
        )
    out: dict[str, ServedModel] = {}
    for i, entry in enumerate(entries):
        model = _parse_entry(entry, f"{source}: model[{i}]")
        if model.name in out:
            raise CatalogError(f"{source}: model[{i}]: duplicate model name {model.name!r}")
        out[model.name] = model
    return out


def _load_toml(text: str, source: str) -> dict[str, Any]:
    """The file as TOML; a file that is not is named as such (JSON, the usual mistake,
    said so)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        try:
            json.loads(text)
            what = "is JSON"
        except ValueError:
            what = "is not valid TOML"
        raise CatalogError(
            f"{source}: the model registry must be a TOML file, and this one {what} ({exc}): "
            "write a [[model]] table per model (docs/configuration.md, "
            '"The model registry file")'
        ) from exc


def _parse_entry(entry: Any, where: str) -> ServedModel:
    """One ``[[model]]`` table: every key known (the closest named where one is not),
    ``name`` and ``adapter`` given, the adapter known, the spec valid."""
    if not isinstance(entry, dict):
        raise CatalogError(f"{where} must be a table: a [[model]] header with its keys below it")
    label = f"{where} ({entry['name']})" if "name" in entry else where
    _check_keys(entry, set(ServedModel.model_fields), label)
    overrides: dict[str, Any] = dict(entry.get("spec", {}))
    _check_keys(overrides, set(ModelSpec.model_fields) - {"name"}, f"{label} spec")
    for j, shape in enumerate(entry.get("warmup", [])):
        if isinstance(shape, dict):
            _check_keys(shape, set(WarmupShape.model_fields), f"{label} warmup[{j}]")
    missing = [key for key in ("name", "adapter") if key not in entry]
    if missing:
        raise CatalogError(f"{where} needs {' and '.join(repr(k) for k in missing)}")
    name, adapter = str(entry["name"]), str(entry["adapter"])
    builtin = {m.adapter: m.spec for m in BUILTIN_MODELS.values()}
    base = builtin.get(adapter) or FAMILY_SPECS.get(adapter)
    if base is None and ":" not in adapter:
        known = ", ".join(sorted(FAMILY_SPECS))
        raise CatalogError(
            f"{where}: unknown adapter {adapter!r} (known: {known}, or 'module:Class')"
        )
    try:
        spec_fields = {**(base.model_dump() if base else {}), **overrides, "name": name}
        spec = ModelSpec.model_validate(spec_fields)
        extra = {k: v for k, v in entry.items() if k != "spec"}
        return ServedModel.model_validate({**extra, "spec": spec})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        why = f"{field}: {error['msg']}" if field else error["msg"]
        raise CatalogError(f"{label}: {why}") from exc


def _check_keys(table: dict[str, Any], known: set[str], where: str) -> None:
    """Refuse a key the registry does not know, naming the closest one: a misspelt key
    (``comple = "off"``, ``max_widht = 832``) was silently ignored, so the setting it
    meant was never applied."""
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CatalogError(f"{where}: unknown key {key!r}{hint}")


def served_models(
    names: list[str] | None, registry: dict[str, ServedModel]
) -> dict[str, ServedModel]:
    """The models to serve, in order; ``None`` means every registry entry (or the built-in
    reference model when there is no registry)."""
    known = {**BUILTIN_MODELS, **registry}
    if names is None:
        names = list(registry) or list(BUILTIN_MODELS)
    missing = [n for n in names if n not in known]
    if missing:
        raise CatalogError(
            f"served model(s) {', '.join(missing)} are neither built in nor in the registry file"
        )
    if not names:
        raise CatalogError("no model to serve")
    return {n: known[n] for n in names}
