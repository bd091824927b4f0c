"""FP8 weights for a registry entry's ``quantization``: which Linear layers, what they save,
and the quantization itself, through torchao (imported only when an entry asks for FP8, so
a worker without torchao serves every other model).

**The rule** (:func:`fp8_layers`) is a pure function of a module tree: a Linear layer
becomes FP8 when

* it sits inside a repeated block (an ancestor of it is an element of a ``ModuleList``:
  the denoiser's transformer blocks, a text encoder's layers), so embedders (time, text,
  patch: ``condition_embedder.*``, ``time_embed.*``, ``proj_in``), the final projection
  (``proj_out``, ``norm_out.linear``) and anything else outside the blocks stay as loaded;
* no part of its qualified name marks a precision-sensitive module: norms, adaLN and
  modulation projections, embeddings, time projections, the text-token refiner
  (:data:`KEPT_PARTS`);
* both its sizes are multiples of 16 (``torch._scaled_mm``'s).

A Linear inside a block kept only because a name part is a modulation part (``adaln``,
``ada_ln``, ``modulation``: :data:`MODULATION_PARTS`), with sizes in multiples of 16, is
told apart (:data:`MODULATION`): by default it stays as loaded, as the other
precision-sensitive layers do; a registry entry's ``fp8_modulation = true`` makes it FP8
**weight-only** (:func:`fp8_kinds`). MiniMax-H3's 50 joint blocks' ``adaln_proj.linear``
are 24.2 GiB of its transformer in bfloat16: weight-only FP8 halves them, and keeps the
modulation's matmul, and so the scale and shift every block applies, in the loaded dtype,
at the cost of their weights' rounding (measured by benchmarks/gpu/fp8_quality.py's
``--fp8-modulation``).

Everything that is not an ``nn.Linear`` (convolutions, norms, embeddings, parameters
such as ``scale_shift_table``) is never touched.

**The quantization** of the rule's layers is torchao's
``Float8DynamicActivationFloat8WeightConfig`` with row-wise scales (``PerRow``): float8
e4m3 weights with a float32 scale per output row, activations quantized per row on the
fly, the matmul ``torch._scaled_mm``. The modulation layers of ``fp8_modulation`` get
``Float8WeightOnlyConfig``, row-wise too: the same weights and scales, dequantized to the
loaded dtype at each call (a transient copy of the one layer) for a matmul in it. Each
layer is handed to ``torchao.quantization.quantize_`` on its own, with its kind's config
and ``device=``, so it moves to the device and is quantized there, one at a time: the
device never holds more than one of those layers in its loaded dtype; the rest of the
component follows once they are done. torchao's ``set_inductor_config`` is off: it would
set process-wide inductor and float32-matmul settings under every other model of the
worker.

**Bytes saved** (:func:`bytes_saved`): each FP8 layer's weight (either config's) at one
byte an element instead of its dtype's (two for bfloat16), less its float32 row scales.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

import torch

# torch._scaled_mm needs both sizes of the weight to be multiples of 16.
FP8_MULTIPLE = 16
# A qualified-name part that marks a precision-sensitive module (lowercase substrings):
# norms, adaLN / modulation projections, embeddings and embedders, time projections, the
# text-token refiner (MiniMax-H3's text embedding stage), scale/shift tables.
KEPT_PARTS = ("norm", "adaln", "ada_ln", "modulation", "emb", "time", "refiner", "scale_shift")
# The kept parts that name an adaLN / modulation projection: a Linear kept for these alone
# is one ``fp8_modulation`` makes FP8 weight-only.
MODULATION_PARTS = frozenset({"adaln", "ada_ln", "modulation"})
# Why a Linear stays as loaded (fp8_layers' values; None: FP8).
OUTSIDE = "outside the blocks"
SENSITIVE = "precision-sensitive"
MODULATION = "modulation projection"
NARROW = "sizes not multiples of 16"
# Which torchao config an FP8 layer gets: FP8 weights and matmul (activations quantized on
# the fly), or FP8 weights dequantized for a matmul in the loaded dtype.
Fp8Kind = Literal["dynamic", "weight_only"]
# FP8 matmuls: Ada (8.9), Hopper (9.0), Blackwell (10.0, 12.0).
MIN_CAPABILITY = (8, 9)


def _block_elements(model: torch.nn.Module) -> set[str]:
    """The qualified names of the elements of every ModuleList in ``model``."""
    out: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList):
            out.update(f"{name}.{i}" if name else str(i) for i in range(len(module)))
    return out


def fp8_layers(model: torch.nn.Module) -> dict[str, str | None]:
    """Every Linear layer of ``model`` by qualified name -> None when the rule makes it FP8,
    else why it stays as loaded (the module docstring gives the rule)."""
    elements = _block_elements(model)
    out: dict[str, str | None] = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        parts = name.split(".")
        ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}
        kept = {part for part in KEPT_PARTS if part in name.lower()}
        narrow = bool(module.in_features % FP8_MULTIPLE or module.out_features % FP8_MULTIPLE)
        if not ancestors & elements:
            out[name] = OUTSIDE
        elif kept and kept <= MODULATION_PARTS and not narrow:
            out[name] = MODULATION
        elif kept:
            out[name] = SENSITIVE
        elif narrow:
            out[name] = NARROW
        else:
            out[name] = None
    return out


def fp8_kinds(layers: dict[str, str | None], modulation: bool) -> dict[str, Fp8Kind]:
    """The layers of :func:`fp8_layers`' answer that become FP8, each with its config:
    the rule's layers ``dynamic``, and with ``modulation`` (the entry's ``fp8_modulation``)
    the modulation projections ``weight_only``; every other layer stays as loaded."""
    out: dict[str, Fp8Kind] = {}
    for name, why in layers.items():
        if why is None:
            out[name] = "dynamic"
        elif modulation and why == MODULATION:
            out[name] = "weight_only"
    return out


def fp8_modules(model: torch.nn.Module) -> list[str]:
    """The qualified names of the Linear layers of ``model`` the rule makes FP8 (the
    ``dynamic`` ones: without ``fp8_modulation``, every one)."""
    return [name for name, why in fp8_layers(model).items() if why is None]


def bytes_saved(model: torch.nn.Module, names: list[str]) -> int:
    """What FP8 weights save on the layers ``names`` of ``model`` (as loaded, before any
    quantization): one byte an element instead of the weight's dtype's, less a float32
    scale per output row."""
    saved = 0
    for name in names:
        weight: torch.Tensor = model.get_submodule(name).weight  # type: ignore[assignment]
        saved += weight.numel() * (weight.element_size() - 1) - weight.shape[0] * 4
    return saved


def fp8_unsupported(device: torch.device) -> str | None:
    """Why ``device`` cannot run FP8 matmuls (None: it can): a CUDA GPU of compute
    capability 8.9 or more is needed."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"device {device} is not a CUDA GPU"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        major, minor = capability
        return f"device {device} ({name}) has compute capability {major}.{minor}"
    return None


def library_missing() -> str | None:
    """Why torchao cannot be imported here (None: it can); it is the ``fp8`` extra."""
    if importlib.util.find_spec("torchao") is None:
        return "it is not installed: pip install 'omniqueue[fp8]'"
    return None


def quantize(model: torch.nn.Module, kinds: dict[str, Fp8Kind], device: torch.device) -> None:
    """Make the weights of the Linear layers of ``model`` that ``kinds`` names FP8
    (torchao's float8, row-wise scales; each layer with its kind's config), each moved to
    ``device`` and quantized there, one at a time; then the rest of ``model`` moved there,
    as one ``quantize_`` over it with ``device=`` leaves it."""
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Float8WeightOnlyConfig,
        PerRow,
        quantize_,
    )

    configs = {
        "dynamic": Float8DynamicActivationFloat8WeightConfig(
            granularity=PerRow(), set_inductor_config=False
        ),
        "weight_only": Float8WeightOnlyConfig(granularity=PerRow(), set_inductor_config=False),
    }
    for name, kind in kinds.items():
        layer = model.get_submodule(name)
        if not isinstance(layer, torch.nn.Linear):
            raise TypeError(f"{name} is a {type(layer).__name__}, not a Linear layer")
        # torchao's transforms set the layer's weight in place: the layer itself is handed
        quantize_(layer, configs[kind], filter_fn=lambda module, fqn: True, device=device)
    model.to(device)
