"""The host memory ``offload = "group"`` holds, planned before it is taken (issue 44).

diffusers' group offloading with ``use_stream=True`` keeps a CPU copy of every parameter
and buffer of each component it streams (``ModuleGroup._init_cpu_param_dict``). By
default (``low_cpu_mem_usage=False``) each copy is pinned up front, ``tensor.pin_memory()``
one tensor at a time; pinned tensors come from PyTorch's caching host allocator, which
rounds each block up to a power of two (:func:`pinned_size`). MiniMax-H3's transformer,
61.7 GiB of weights whose feed-forward matrices are 147 MiB each, asks for 90.2 GiB of
page-locked memory, and page-locks it all before the worker is ready.
With ``low_cpu_mem_usage=True`` the copies stay pageable (their own size) and only the
group being moved in is pinned, at onload, which costs its copy on the host each time.

A component offloaded without the stream (one whose groups nest: offload.py's
``unstreamed``, MiniMax-H3's text encoder) gets no such copies: its tensors move to the
host as they are offloaded, pageable, their own size; it is counted so either way.

So before group offloading is applied (:func:`host_plan`): the pinned copies when they fit
the host's available memory with a margin (:data:`RESERVE_FRACTION`,
:data:`RESERVE_MIN_BYTES`: the rest of the worker, the per-group pinned buffers); else
the pageable ones, said in the log; else the model is refused at load, naming the model,
``offload = "group"``, the bytes needed and the bytes available. Weights already on the
host cost no more pageable memory (diffusers' ``.cpu()`` of a CPU tensor is the tensor),
weights on the device (built there: ``weights = "random"``) cost their size.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from models.memory_plan import HostCopies
from models.registry import CatalogError

log = logging.getLogger(__name__)

# What the host keeps besides the copies: this share of its available memory, at least
# RESERVE_MIN_BYTES (the worker's own memory, the groups pinned at onload, the API, the
# object store and the page cache the rest of the stack reads through). A quarter, since
# pinned pages are never reclaimed: H3's copies (71.7 GiB of weights, 101.2 GiB pinned by
# pinned_size, from a meta-device build) stay pageable on a 128 GiB host.
RESERVE_FRACTION = 0.25
RESERVE_MIN_BYTES = 4 << 30


def pinned_size(nbytes: int) -> int:
    """The bytes a pinned block of ``nbytes`` takes: PyTorch's caching host allocator
    (``at::CachingHostAllocator``, ``ATen/core/CachingHostAllocator.h``: ``allocate``)
    rounds a request up to the next power of two, to reuse freed blocks of a size class.
    (Its ``pinned_max_round_threshold`` setting, unbounded unless PYTORCH_ALLOC_CONF sets
    it, would keep larger blocks at their size; this counts the default.)"""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


def _storages(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a (possibly subclassed) tensor holds: torchao's FP8 weight is its
    ``qdata`` and ``scale`` (``__tensor_flatten__``), each pinned on its own."""
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is None:
        return [tensor]
    names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    return [part for name in names for part in _storages(getattr(tensor, name))]


@dataclass(frozen=True)
class HostCopySizes:
    """What group offloading's host copies of some modules take, each way."""

    pinned: int  # every copy pinned up front, in the allocator's rounded blocks
    pageable: int  # the pageable copies made beyond what the host already holds
    weights: int  # the copied tensors' own bytes


def host_copy_sizes(modules: list[torch.nn.Module]) -> HostCopySizes:
    """The host copies of every parameter and buffer of ``modules`` (each tensor once)."""
    seen: set[int] = set()
    pinned = pageable = weights = 0
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            for part in _storages(tensor):
                size = part.numel() * part.element_size()
                weights += size
                pinned += pinned_size(size)
                pageable += 0 if part.device.type == "cpu" else size
    return HostCopySizes(pinned=pinned, pageable=pageable, weights=weights)


def host_available() -> int:
    """The bytes this host can give without swapping: ``MemAvailable`` of /proc/meminfo
    (the kernel's estimate, page cache it can drop included), else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fits(need: int, available: int) -> bool:
    """Whether ``need`` bytes leave the reserve of ``available`` free."""
    return need + max(RESERVE_MIN_BYTES, int(available * RESERVE_FRACTION)) <= available


@dataclass(frozen=True)
class HostPlan:
    """How group offloading holds its host copies, and what they take."""

    copies: HostCopies
    # what the copies take on the host: the pinned blocks, or the pageable copies (the
    # weights' own bytes, some of which the host may have held before)
    host_bytes: int
    available: int  # the host's available memory when it was decided

    @property
    def low_cpu_mem_usage(self) -> bool:
        """diffusers' argument: pageable copies, pinned per group at onload."""
        return self.copies == "pageable"


NO_COPIES = HostCopySizes(pinned=0, pageable=0, weights=0)


def host_plan(
    model: str, sizes: HostCopySizes, available: int, unstreamed: HostCopySizes = NO_COPIES
) -> HostPlan:
    """Pinned copies if they fit ``available`` with the reserve, else pageable ones (why
    logged), else :class:`CatalogError` naming the model, the setting and both sizes.
    ``sizes``: the components offloaded with the prefetch stream; ``unstreamed``: those
    offloaded without it (offload.py's ``unstreamed``), whose copies diffusers never
    pins, so they count at their pageable size either way."""
    need_pinned = sizes.pinned + unstreamed.pageable
    if fits(need_pinned, available):
        return HostPlan("pinned", sizes.pinned + unstreamed.weights, available)
    pageable = sizes.pageable + unstreamed.pageable
    weights = sizes.weights + unstreamed.weights
    if fits(pageable, available):
        log.warning(
            "%s: offload = 'group' would pin %.1f GiB of host copies (%.1f GiB of weights, "
            "each pinned block rounded up to a power of two), over the %.1f GiB available "
            "less the reserve; keeping them pageable (low_cpu_mem_usage: each group is "
            "pinned as it moves in)",
            model,
            need_pinned / 2**30,
            weights / 2**30,
            available / 2**30,
        )
        return HostPlan("pageable", weights, available)
    raise CatalogError(
        f"model {model!r}: offload = 'group' needs {pageable} bytes "
        f"({pageable / 2**30:.1f} GiB) of host memory for its pageable copies of the "
        f"weights ({need_pinned / 2**30:.1f} GiB pinned), and this host has {available} "
        f"bytes ({available / 2**30:.1f} GiB) available, less a reserve of "
        f"{max(RESERVE_MIN_BYTES, int(available * RESERVE_FRACTION)) / 2**30:.1f} GiB"
    )


def plan_host_copies(
    model: str, modules: dict[str, Any], unstreamed: frozenset[str] = frozenset()
) -> HostPlan:
    """The host plan of group-offloading ``modules`` (component name -> module; the names
    in ``unstreamed`` offloaded without the prefetch stream), on this host now, logged
    with what the copies take."""
    plan = host_plan(
        model,
        host_copy_sizes([m for name, m in modules.items() if name not in unstreamed]),
        host_available(),
        host_copy_sizes([m for name, m in modules.items() if name in unstreamed]),
    )
    log.info(
        "%s: offload = 'group' holds %.2f GiB of %s host copies (host available: %.1f GiB)",
        model,
        plan.host_bytes / 2**30,
        plan.copies,
        plan.available / 2**30,
    )
    return plan
