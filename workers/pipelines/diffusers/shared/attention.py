"""cuDNN's fused attention for a denoiser: a registry entry's ``attention = "cudnn"``
(``models/registry.py``; docs/adapters.md, "cuDNN attention").

On an H100 PyTorch's SDPA dispatch picks FlashAttention-2; cuDNN's fused attention
(``SDPBackend.CUDNN_ATTENTION``) is faster on Hopper for long sequences, where the big
models spend a fifth or more of a forward. diffusers names it ``_native_cudnn``: every
attention processor of the families in ``CUDNN_FAMILIES`` calls ``dispatch_attention_fn``
with its ``_attention_backend``, which ``ModelMixin.set_attention_backend`` sets on every
attention module of a model, so one call per denoiser reaches all of its roles (H3's
token refiner included).

* :func:`refuse_off_cuda`: before any weight loads, a model that asks for it on a device
  that is not a CUDA GPU is refused (:class:`CatalogError`, naming ``attention``), so the
  worker lists it unavailable with that reason, as it does an FP8 plan off a GPU;
* :func:`install`: after the weights are placed, each ``transformer*`` component gets the
  backend (:func:`use_backend`), and each role's backend is logged (:func:`log_roles`);
* :func:`use_backend`: ``set_attention_backend`` without its process-wide side effect
  (it also makes the backend diffusers' active one, which every processor left at None
  dispatches to: another model of the same worker would run it too). A worker group's
  ring attention (``workers/pipelines/parallel.py``) sets cuDNN through it as well.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from models.catalog import ModelSpec
from models.registry import CatalogError

log = logging.getLogger(__name__)

# diffusers' name of cuDNN's fused attention (``AttentionBackendName._NATIVE_CUDNN``).
CUDNN_BACKEND = "_native_cudnn"


def takes_cudnn(spec: ModelSpec) -> bool:
    """Whether the entry asked for cuDNN attention (the registry sets every role to it)."""
    return "cudnn" in spec.attention.values()


def refuse_off_cuda(spec: ModelSpec, device: str | torch.device) -> None:
    """Refuse ``attention = "cudnn"`` on a device that is not a CUDA GPU (the model, the
    field and the device named), before anything loads."""
    target = torch.device(device)
    if takes_cudnn(spec) and (target.type != "cuda" or not torch.cuda.is_available()):
        raise CatalogError(
            f"model {spec.name!r}: attention = 'cudnn' runs cuDNN's fused attention on a "
            f"CUDA GPU, and device {target} is not one"
        )


def denoisers(pipe: Any) -> dict[str, torch.nn.Module]:
    """The pipeline's ``transformer*`` components (the denoisers), by name."""
    return {
        name: component
        for name, component in pipe.components.items()
        if name.startswith("transformer") and isinstance(component, torch.nn.Module)
    }


def use_backend(model: torch.nn.Module, backend: str) -> None:
    """``model.set_attention_backend(backend)``: every attention processor of ``model``
    dispatches to ``backend``; diffusers' process-wide active backend is left as it was."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    active = _AttentionBackendRegistry._active_backend
    try:
        model.set_attention_backend(backend)  # type: ignore[operator]
    finally:
        _AttentionBackendRegistry.set_active_backend(active)


def install(pipe: Any, spec: ModelSpec) -> list[str]:
    """Give every denoiser of ``pipe`` cuDNN's fused attention where ``spec`` asks for it;
    the components it went to (none where it does not ask)."""
    if not takes_cudnn(spec):
        return []
    found = denoisers(pipe)
    if not found:
        raise CatalogError(f"model {spec.name!r}: attention = 'cudnn' found no transformer")
    for model in found.values():
        use_backend(model, CUDNN_BACKEND)
    log_roles(spec, f"; {CUDNN_BACKEND} on {', '.join(found)}")
    return list(found)


def log_roles(spec: ModelSpec, detail: str = "") -> None:
    """One line of each role's backend at load (nothing for a model without roles)."""
    if spec.attention:
        roles = ", ".join(f"{role} {backend}" for role, backend in spec.attention.items())
        log.info("%s attention: %s%s", spec.name, roles, detail)
