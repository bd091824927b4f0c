"""Per-request LoRA for the diffusers adapters: one hot-swap slot in the pipe, and an LRU
cache of adapters ready to be copied into it.

The slot. :meth:`LoraCache.install` gives the pipe's ``transformer`` one PEFT adapter
(``omniq_lora``) on every ``nn.Linear`` it has, at rank ``max_rank``, all zeros, through
diffusers itself: ``pipe.enable_lora_hotswap(target_rank=max_rank)`` then
``pipe.load_lora_weights(zeros, adapter_name="omniq_lora")``. diffusers then has PEFT
pad every LoRA weight to ``max_rank`` and turn each layer's ``scaling`` into a 0-dim
tensor (``peft.utils.hotswap.prepare_model_for_compiled_hotswap``), which is what lets
a compiled block keep its graph when the values change: from then on only tensor
*contents* change, never shapes, Python floats or module structure. Installed at load,
before any ``torch.compile`` of the blocks, a swap recompiles nothing.

The cache. On a miss, :meth:`LoraCache.activate` reads the adapter (a local file, or an
``s3://`` object through ``fetch``), has diffusers convert it (``lora_state_dict``: the
Wan formats it knows) and builds its PEFT config as ``load_lora_adapter`` would; then it
checks every tensor against the slot (a layer the slot has, the layer's shape, a rank of
at most ``max_rank``, no DoRA/bias/other keys) and stores the tensors converted to the
slot's dtype and device, each paired with the slot view it goes into, and each layer's
``alpha`` and ``r``. A hit re-reads and re-converts nothing: zero the slot
(``torch._foreach_zero_``), copy the adapter in (``torch._foreach_copy_``), write each
layer's scaling ``scale * alpha / r`` (PEFT's ``set_scale``, computed the same way).

No-LoRA jobs, and after every job (:meth:`LoraCache.release`, from the adapter's
``end()``): the slot is *parked*, its weights and scalings all zero, so every wrapped
layer adds exactly ``0`` to its base output: on the CPU the frames are bit-equal to a
pipe that never had an adapter (tested), the compiled graph is the same one, and the
cost of the zero LoRA matmuls is paid by every job of a LoRA-enabled model (11 % of a
compiled Wan 1.3B step at rank 32 on an H200: docs/PERFORMANCE.md).
Disabling the adapter layers instead (``disable_lora``) flips a Python flag the compiled
blocks guard on: one recompile each way. PEFT's and diffusers' ``set_adapters`` are not
called per job for the same reason: ``set_scale`` writes a Python float over the
hot-swap tensor.

An adapter that does not fit raises :class:`~models.errors.InvalidLora` before the slot is
touched; a failure while copying parks the slot before it propagates. Either way the
next job runs as on a fresh worker.

Exactness. With an adapter's rank equal to ``max_rank`` a job's frames are bit-equal (on
the CPU, float32) to a fresh pipe loaded with that adapter alone through
``load_lora_weights`` + ``set_adapters``; with a lower rank the zero padding changes the
LoRA matmul's inner size, which may change its float rounding (tested to a tolerance).
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from models.errors import InvalidLora
from models.job_specs import LoraSpec

log = logging.getLogger(__name__)

SLOT = "omniq_lora"
_COMPONENT = "transformer"  # the component adapters load into (diffusers' default)
_LORA_METADATA_KEY = "lora_adapter_metadata"  # diffusers.loaders.lora_base


@dataclass
class _Layer:
    """One wrapped linear layer of the slot: its LoRA weights and scaling tensor."""

    name: str  # module name within the transformer, e.g. ``blocks.0.attn1.to_q``
    a: torch.Tensor  # max_rank × in
    b: torch.Tensor  # out × max_rank
    scaling: torch.Tensor  # 0-dim float32


@dataclass
class _Entry:
    """A cached adapter: tensors on the slot's device and dtype, each with the slot view it
    is copied into, and each targeted layer's index in the slot with its alpha, r and
    whether rsLoRA scales it."""

    key: tuple[str, str]
    dst: list[torch.Tensor]
    src: list[torch.Tensor]
    layers: list[tuple[int, float, int, bool]]
    nbytes: int


@dataclass
class LoraStats:
    """What :meth:`LoraCache.stats` reports: cached adapters and their bytes, the slot's
    LoRA parameter bytes in the pipe, hits, misses and evictions so far."""

    entries: int
    cached_bytes: int
    slot_bytes: int
    hits: int
    misses: int
    evictions: int
    keys: list[str] = field(default_factory=list)


class LoraCache:
    """The LoRA slot of one pipe and the LRU of adapters (see the module docstring).

    ``max_adapters`` and ``max_bytes`` bound the cache (the bytes of the cached tensors);
    ``max_rank`` is the slot's rank; ``fetch(uri)`` returns the bytes of an ``s3://``
    adapter (None: s3 adapters fail with ``invalid_lora``). One job at a time: the
    executor calls :meth:`activate` in ``prepare`` and :meth:`release` in ``end``."""

    def __init__(
        self,
        *,
        max_adapters: int = 8,
        max_bytes: int = 2 * 1024**3,
        max_rank: int = 32,
        fetch: Callable[[str], bytes] | None = None,
    ) -> None:
        self.max_adapters = max_adapters
        self.max_bytes = max_bytes
        self.max_rank = max_rank
        self.fetch = fetch
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._layers: list[_Layer] = []
        self._index: dict[str, int] = {}
        self._pipe: Any = None
        self._dirty = False
        self.hits = self.misses = self.evictions = 0

    # ---- the slot -----------------------------------------------------------------

    @property
    def installed(self) -> bool:
        return self._pipe is not None

    def install(self, pipe: Any) -> None:
        """Give ``pipe.transformer`` the zero slot on every linear layer (idempotent for
        the same pipe). Call it before compiling the transformer's blocks."""
        if self._pipe is pipe:
            return
        if self._pipe is not None:
            raise RuntimeError("this LoraCache serves another pipe")
        transformer = getattr(pipe, _COMPONENT, None)
        if transformer is None or not hasattr(pipe, "load_lora_weights"):
            raise InvalidLora(f"{type(pipe).__name__} does not load LoRA adapters")
        rank = self.max_rank
        zeros: dict[str, torch.Tensor] = {}
        for name, module in transformer.named_modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                zeros[f"{_COMPONENT}.{name}.lora_A.weight"] = w.new_zeros(rank, w.shape[1])
                zeros[f"{_COMPONENT}.{name}.lora_B.weight"] = w.new_zeros(w.shape[0], rank)
        pipe.enable_lora_hotswap(target_rank=rank)
        pipe.load_lora_weights(zeros, adapter_name=SLOT)
        del zeros
        from peft.tuners.lora import LoraLayer

        layers = []
        for name, module in transformer.named_modules():
            if isinstance(module, LoraLayer) and SLOT in module.lora_A:
                scaling = module.scaling[SLOT]
                if not isinstance(scaling, torch.Tensor):  # enable_lora_hotswap did not run
                    scaling = torch.tensor(float(scaling), device=module.weight.device)
                    module.scaling[SLOT] = scaling
                a = cast(torch.Tensor, module.lora_A[SLOT].weight).data
                b = cast(torch.Tensor, module.lora_B[SLOT].weight).data
                layers.append(_Layer(name, a, b, scaling))
        self._layers = layers
        self._index = {layer.name: i for i, layer in enumerate(layers)}
        self._pipe = pipe
        self._dirty = True
        self._park()
        size = self._slot_bytes()
        log.info("LoRA slot: %d layers at rank %d (%d bytes)", len(layers), rank, size)

    def _park(self) -> None:
        """All slot weights and scalings to zero: every wrapped layer adds exactly 0."""
        if not self._dirty:
            return
        tensors = [t for layer in self._layers for t in (layer.a, layer.b)]
        torch._foreach_zero_(tensors + [layer.scaling for layer in self._layers])
        self._dirty = False

    def _slot_bytes(self) -> int:
        return sum(layer.a.nbytes + layer.b.nbytes for layer in self._layers)

    # ---- per job ------------------------------------------------------------------

    def activate(self, pipe: Any, lora: LoraSpec | None) -> None:
        """Make ``pipe`` run with ``lora`` (None: the base model) until :meth:`release`.
        Raises :class:`InvalidLora` (nothing changed) when the adapter does not fit."""
        if lora is None:
            if self.installed:
                self._park()
            return
        self.install(pipe)
        entry = self._entry(lora)
        try:
            if self._dirty:
                torch._foreach_zero_([t for layer in self._layers for t in (layer.a, layer.b)])
            self._dirty = True
            torch._foreach_copy_(entry.dst, entry.src)
            scale = float(lora.scale)
            values = [0.0] * len(self._layers)
            for i, alpha, r, rslora in entry.layers:
                # PEFT's set_scale, operation for operation (the reference's float).
                values[i] = scale * alpha / math.sqrt(r) if rslora else scale * alpha / r
            device = self._layers[0].scaling.device
            new = torch.tensor(values, dtype=torch.float32, device=device)
            torch._foreach_copy_([layer.scaling for layer in self._layers], list(new.unbind()))
        except BaseException:
            self._park()
            raise

    def release(self, pipe: Any) -> None:
        """The job ended (any way): park the slot, so the pipe computes the base model."""
        if self._pipe is pipe:
            self._park()

    def layer_shapes(self) -> dict[str, tuple[int, int]]:
        """The slot's layers (module names within the transformer) and their (out, in):
        what an adapter may target (benchmarks build adapters in code from it)."""
        return {layer.name: (layer.b.shape[0], layer.a.shape[1]) for layer in self._layers}

    def stats(self) -> LoraStats:
        return LoraStats(
            entries=len(self._entries),
            cached_bytes=sum(e.nbytes for e in self._entries.values()),
            slot_bytes=self._slot_bytes(),
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            keys=[k[0] for k in self._entries],
        )

    # ---- the cache ----------------------------------------------------------------

    def _entry(self, lora: LoraSpec) -> _Entry:
        key = (lora.path, _identity(lora))
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry
        self.misses += 1
        entry = self._load(lora, key)
        if entry.nbytes > self.max_bytes:
            raise InvalidLora(
                f"LoRA {lora.name!r} ({entry.nbytes} bytes on the device) is larger than "
                "this worker's adapter cache (OMNIQ_LORA__CACHE_BYTES)"
            )
        while self._entries and (
            len(self._entries) >= self.max_adapters
            or sum(e.nbytes for e in self._entries.values()) + entry.nbytes > self.max_bytes
        ):
            self._entries.popitem(last=False)
            self.evictions += 1
        self._entries[key] = entry
        return entry

    def _load(self, lora: LoraSpec, key: tuple[str, str]) -> _Entry:
        """Read, convert and check an adapter against the slot (touching nothing)."""
        state_dict, metadata = self._read(lora)
        if any("dora_scale" in k or "lora_magnitude_vector" in k for k in state_dict):
            raise InvalidLora(f"LoRA {lora.name!r} is a DoRA adapter, which is not supported")
        pipe = self._pipe
        try:
            converted = type(pipe).lora_state_dict(state_dict)
        except Exception as exc:
            raise InvalidLora(f"LoRA {lora.name!r} is not an adapter diffusers can load") from exc
        prefix = f"{_COMPONENT}."
        others = sorted({k.split(".")[0] for k in converted if not k.startswith(prefix)})
        if others:
            raise InvalidLora(
                f"LoRA {lora.name!r} has weights for {', '.join(others)}; only the "
                f"{_COMPONENT} takes LoRA here"
            )
        weights = {k.removeprefix(prefix): v for k, v in converted.items()}
        if not weights:
            raise InvalidLora(f"LoRA {lora.name!r} has no weights")
        if "lora_A" not in next(iter(weights)):
            from diffusers.utils import convert_unet_state_dict_to_peft

            weights = convert_unet_state_dict_to_peft(weights)
        config = self._config(lora, weights, metadata)
        return self._check(lora, key, weights, config)

    def _read(self, lora: LoraSpec) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """The adapter's tensors (on the CPU) and its diffusers LoRA metadata, if any."""
        from safetensors.torch import load as load_safetensors

        try:
            if lora.path.startswith("s3://"):
                if self.fetch is None:
                    raise InvalidLora(f"this worker cannot read s3:// adapters ({lora.name!r})")
                data = self.fetch(lora.path)
            else:
                data = Path(lora.path).read_bytes()
        except OSError as exc:
            raise InvalidLora(f"LoRA {lora.name!r} could not be read") from exc
        try:
            tensors = load_safetensors(data)
            (length,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8 : 8 + length])
        except Exception as exc:
            raise InvalidLora(f"LoRA {lora.name!r} is not a safetensors file") from exc
        raw = (header.get("__metadata__") or {}).get(_LORA_METADATA_KEY)
        metadata = None
        if raw:
            try:
                full = json.loads(raw)
            except ValueError as exc:
                raise InvalidLora(f"LoRA {lora.name!r} has unreadable metadata") from exc
            prefix = f"{_COMPONENT}."
            metadata = {k.removeprefix(prefix): v for k, v in full.items() if k.startswith(prefix)}
        return tensors, metadata or None

    def _config(self, lora: LoraSpec, weights: dict[str, torch.Tensor], metadata: Any) -> Any:
        """The PEFT ``LoraConfig`` diffusers' ``load_lora_adapter`` would build for it."""
        from diffusers.utils.peft_utils import _create_lora_config

        rank = {f"^{k}": v.shape[1] for k, v in weights.items() if "lora_B" in k and v.ndim > 1}
        transformer = getattr(self._pipe, _COMPONENT)
        try:
            return _create_lora_config(
                weights, None, metadata, rank, model_state_dict=transformer.state_dict()
            )
        except Exception as exc:
            raise InvalidLora(f"LoRA {lora.name!r} has a configuration PEFT refuses") from exc

    def _check(
        self, lora: LoraSpec, key: tuple[str, str], weights: dict[str, torch.Tensor], config: Any
    ) -> _Entry:
        from peft.utils.other import get_pattern_key

        name = lora.name
        if getattr(config, "use_dora", False):
            raise InvalidLora(f"LoRA {name!r} is a DoRA adapter, which is not supported")
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for k, v in weights.items():
            for part in ("lora_A", "lora_B"):
                suffix = f".{part}.weight"
                if k.endswith(suffix):
                    pairs.setdefault(k.removesuffix(suffix), {})[part] = v
                    break
            else:
                raise InvalidLora(f"LoRA {name!r} has a weight this server does not load: {k}")
        dst: list[torch.Tensor] = []
        src: list[torch.Tensor] = []
        layers: list[tuple[int, float, int, bool]] = []
        nbytes = 0
        for module, pair in pairs.items():
            i = self._index.get(module)
            if i is None:
                raise InvalidLora(f"LoRA {name!r} targets {module}, which this model lacks")
            a, b = pair.get("lora_A"), pair.get("lora_B")
            if a is None or b is None:
                raise InvalidLora(f"LoRA {name!r} has half a layer: {module}")
            slot = self._layers[i]
            r = a.shape[0]
            if a.ndim != 2 or b.ndim != 2 or b.shape[1] != r:
                raise InvalidLora(f"LoRA {name!r}: {module} is not a linear LoRA pair")
            if a.shape[1] != slot.a.shape[1] or b.shape[0] != slot.b.shape[0]:
                raise InvalidLora(
                    f"LoRA {name!r}: {module} is {b.shape[0]}x{a.shape[1]}, the model's "
                    f"is {slot.b.shape[0]}x{slot.a.shape[1]} (an adapter of another model?)"
                )
            if r > self.max_rank:
                raise InvalidLora(
                    f"LoRA {name!r} has rank {r} at {module}; this server takes at most "
                    f"{self.max_rank} (OMNIQ_LORA__MAX_RANK)"
                )
            for part, tensor, view in (("a", a, slot.a[:r]), ("b", b, slot.b[:, :r])):
                moved = tensor.to(device=view.device, dtype=view.dtype).contiguous()
                if moved is tensor:
                    moved = tensor.clone()
                if not torch.isfinite(moved).all():
                    raise InvalidLora(f"LoRA {name!r} has non-finite weights at {module}.{part}")
                dst.append(view)
                src.append(moved)
                nbytes += moved.nbytes
            alpha_key = get_pattern_key(config.alpha_pattern.keys(), module)
            alpha = float(config.alpha_pattern.get(alpha_key, config.lora_alpha))
            layers.append((i, alpha, r, bool(config.use_rslora)))
        return _Entry(key=key, dst=dst, src=src, layers=layers, nbytes=nbytes)


def _identity(lora: LoraSpec) -> str:
    """What names the adapter's content: the API's version (an S3 ETag), else the local
    file's size and modification time (so a replaced file is read again)."""
    if lora.version:
        return lora.version
    if lora.path.startswith("s3://"):
        return ""
    try:
        st = os.stat(lora.path)
    except OSError as exc:
        raise InvalidLora(f"LoRA {lora.name!r} could not be read") from exc
    return f"{st.st_size}:{st.st_mtime_ns}"


__all__ = ["SLOT", "LoraCache", "LoraStats"]
