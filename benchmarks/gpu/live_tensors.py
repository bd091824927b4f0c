"""The tensors a process still holds, against a baseline (``world_memory.py``'s census).

:class:`Census` takes the live tensors of one device type from ``gc.get_objects()``
(every ``torch.Tensor``, parameters included, is a tracked object), remembers them as the
baseline (by identity, weakly), and later lists the ones that are new: their storages
(views of a storage counted once, a view of a baseline storage not at all), each with its
shape, dtype, MiB and who refers to it, read as a path (``AutoencoderKLWan._feat_map[3]``,
``HeliosState.latents``, ``list[0]``) from ``gc.get_referrers``. A tensor that only C++
holds (autograd, dynamo's guards, a CUDA graph's pool, a cuBLAS workspace) is no Python
object: it is in the allocator's count and not here, hence :meth:`Census.diff`'s
``unaccounted_mib`` beside the allocator's delta.
"""

from __future__ import annotations

import gc
import inspect
import warnings
import weakref
from typing import Any

import torch

MIB = 2**20


def live_tensors(device_type: str) -> list[torch.Tensor]:
    """Every tensor the collector tracks whose device is of ``device_type``."""
    found = []
    with warnings.catch_warnings():  # isinstance reads __class__: deprecated objects warn
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and obj.device.type == device_type:
                    found.append(obj)
            except Exception:  # an object whose isinstance or device raises: not ours
                continue
    return found


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(data pointer, bytes) of ``t``'s storage; (0, 0) where it has none (meta, sparse,
    a fake tensor of dynamo's, a wrapper subclass such as torchao's FP8 weights, whose
    inner tensors are tensors of their own)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except Exception:
        return 0, 0


class Census:
    """The live tensors of ``device_type`` now, against those of :meth:`set_baseline`."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self._baseline: dict[int, weakref.ref[torch.Tensor]] = {}
        self._baseline_storages: set[int] = set()

    @property
    def has_baseline(self) -> bool:
        return bool(self._baseline)

    def set_baseline(self) -> int:
        """Remember the live tensors; returns how many."""
        gc.collect()
        tensors = live_tensors(self.device_type)
        self._baseline = {id(t): weakref.ref(t) for t in tensors}
        self._baseline_storages = {_storage(t)[0] for t in tensors}
        return len(tensors)

    def _is_baseline(self, t: torch.Tensor) -> bool:
        ref = self._baseline.get(id(t))
        return ref is not None and ref() is t

    def diff(
        self, top: int = 20, allocated_delta_mib: float | None = None, holders_of: int = 8
    ) -> dict[str, Any]:
        """The tensors alive now and not at the baseline: their count, the MiB of the new
        storages, the ``top`` largest (the first ``holders_of`` with who holds them: each
        path is a few walks of the whole heap), and (given the allocator's delta) the MiB
        it counts that no live tensor explains."""
        gc.collect()
        new = [t for t in live_tensors(self.device_type) if not self._is_baseline(t)]
        storages: dict[int, list[torch.Tensor]] = {}
        views_of_baseline = 0
        for t in new:
            ptr, _ = _storage(t)
            if ptr and ptr in self._baseline_storages:
                views_of_baseline += 1
                continue
            storages.setdefault(ptr or id(t), []).append(t)
        sized = sorted(storages.values(), key=lambda ts: -_storage(ts[0])[1])
        total = sum(_storage(ts[0])[1] for ts in sized) / MIB
        skip = {id(new), id(storages), id(sized), *(id(ts) for ts in sized)}
        listed = [_describe(ts, skip, i < holders_of) for i, ts in enumerate(sized[:top])]
        out: dict[str, Any] = {
            "new_tensors": len(new),
            "new_storages": len(sized),
            "new_views_of_baseline_storages": views_of_baseline,
            "new_mib": round(total, 1),
            "top": listed,
        }
        if allocated_delta_mib is not None:
            out["unaccounted_mib"] = round(allocated_delta_mib - total, 1)
        del new, storages, sized
        return out


def _describe(tensors: list[torch.Tensor], skip: set[int], held: bool) -> dict[str, Any]:
    """A storage's largest tensor: shape, dtype, MiB, and (``held``) the paths its tensors
    are held by."""
    t = max(tensors, key=lambda x: x.numel())
    out: dict[str, Any] = {
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "mib": round(_storage(t)[1] / MIB, 2),
        "tensors": len(tensors),
    }
    if held:
        paths: list[str] = []
        views = tensors[:4]
        for view in views:
            paths += holders(view, skip | {id(tensors), id(views)})
        out["held_by"] = sorted(set(paths))[:6]
    return out


def holders(obj: Any, skip: set[int], depth: int = 3) -> list[str]:
    """How each referrer of ``obj`` (not a frame, not in ``skip``) reaches it, as a path."""
    refs = gc.get_referrers(obj)
    mine = skip | {id(obj), id(refs)}  # the list of referrers refers to them too
    out = []
    for ref in refs:
        if id(ref) in mine or inspect.isframe(ref):
            continue
        out.append(_path(ref, obj, mine | {id(ref)}, depth))
    return out or ["(no Python referrer)"]


def _path(container: Any, item: Any, skip: set[int], depth: int) -> str:
    """``container``'s hold on ``item`` as a path: an object's attribute, a list's index, a
    dict's key, with the container's own holder in front (``depth`` levels)."""
    refs = gc.get_referrers(container)
    skip = skip | {id(refs)}
    if isinstance(container, dict):
        key = next((k for k, v in container.items() if v is item), "?")
        for owner in refs:
            if getattr(owner, "__dict__", None) is container:
                return f"{type(owner).__name__}.{key}"
        step = f"[{key!r}]"
    elif isinstance(container, list | tuple):
        index = next((i for i, v in enumerate(container) if v is item), "?")
        step = f"[{index}]"
    else:  # an object holding it in an attribute (its __dict__ may not be a referrer)
        attrs = getattr(container, "__dict__", None)
        name = None
        if isinstance(attrs, dict):
            name = next((k for k, v in attrs.items() if v is item), None)
        return f"{type(container).__name__}.{name}" if name else type(container).__name__
    if depth > 0:
        for ref in refs:
            if id(ref) in skip or inspect.isframe(ref):
                continue
            return _path(ref, container, skip | {id(ref)}, depth - 1) + step
    return type(container).__name__ + step
