"""Loading a diffusers pipeline for an adapter: the dtype names a registry entry may use,
``from_pretrained``'s dtype argument, weights copied out of memory-mapped files on the CPU,
modules built straight on the device (the random-weight builds, which the families that
have one offer as :class:`RandomWeights`), and cancel points between the blocks of the text
encoders, VAEs and vocoders."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from workers.pipelines.base import checkpoint_check
from workers.pipelines.run_ahead import pace_checkpoint


@runtime_checkable
class RandomWeights(Protocol):
    """A family that builds its pipeline from default configs with seeded random weights,
    on the device (a registry entry's ``weights = "random"``; benchmarks only)."""

    def random_pipeline(self, device: str) -> Any: ...


_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def _dtype_kwarg() -> str:
    """``from_pretrained``'s dtype argument: ``dtype`` since diffusers deprecated
    ``torch_dtype`` (0.42 warns on it), ``torch_dtype`` on older releases."""
    from diffusers.utils import deprecation_utils

    return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"


@contextlib.contextmanager
def allocated_on(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Modules built in this block are allocated on ``device`` in ``dtype``: no host copy
    of billions of parameters first (``minimax_h3/random_weights.py``,
    ``helios/random_weights.py``)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(before)


_HOOKED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def _checkpoint_hook(module: torch.nn.Module, args: Any) -> None:
    check = checkpoint_check()
    if check is None:
        return
    pace_checkpoint(args, check)
    check()


def install_checkpoints(pipe: Any) -> None:
    """Cancel points inside prepare and decode: a forward pre-hook on every block (each
    element of a ``ModuleList``) of the text encoders, VAEs and vocoders that runs the
    check of ``checkpoint()``, after bounding on CUDA how far the host has queued work
    ahead of the device (:func:`~workers.pipelines.run_ahead.pace_checkpoint`), so a stop
    seen there waits for a few blocks of the device, not for the decode's rest. The
    denoiser's blocks get a :class:`BlockGate` instead (``load``). Outside a job's or a
    session's prepare/decode the hook is one context-variable read."""
    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module) or name.startswith(("transformer", "unet")):
            continue
        if component in _HOOKED:
            continue
        for module in component.modules():
            if isinstance(module, torch.nn.ModuleList):
                for block in module:
                    block.register_forward_pre_hook(_checkpoint_hook)
        _HOOKED.add(component)


def hoist_checkpoints(module: torch.nn.Module) -> None:
    """Move the cancel points inside ``module`` (:func:`install_checkpoints`'s hooks) to
    ``module``'s own call, for a module about to be compiled: dynamo cannot trace the
    hook's context-variable read, so each hook broke the graph at its block, and H3's VAE
    decode compiled that way took 1.23 s instead of 0.61 s on an H200. The hook on the
    module itself runs eager, before the compiled forward, so a cancel is still seen at
    every call (one temporal clip of a VAE decode), and the host's run-ahead is bounded
    in clips."""
    for inner in module.modules():
        for key, hook in list(inner._forward_pre_hooks.items()):
            if hook is _checkpoint_hook:
                del inner._forward_pre_hooks[key]
    module.register_forward_pre_hook(_checkpoint_hook)


def own_weights(pipe: Any) -> None:
    """Copy every weight of a loaded pipeline into memory of its own. On the CPU the
    loaders leave tensors in the memory-mapped safetensors file at offsets that need not
    be 64-byte aligned, and a misaligned weight makes the SIMD kernels round differently
    (and run slower): the same weights then give different latents than in memory.
    (``.to("cuda")`` copies anyway.)"""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            for tensor in [*component.parameters(), *component.buffers()]:
                tensor.data = tensor.data.clone()


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"``, ``"float32"``/``"fp32"`` → dtype."""
    if isinstance(name, torch.dtype):
        return name
    key = name.strip().lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r} (use bfloat16, float16 or float32)")
    return _DTYPES[key]


DTYPE_KWARG = _dtype_kwarg()
