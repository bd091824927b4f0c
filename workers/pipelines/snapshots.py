"""How a world pipeline packs a session's state at a chunk boundary into bytes and back
(``SupportsSnapshot.snapshot`` / ``restore``), so another worker can take the session over
(``workers/sessions/world_checkpoint.py``).

A snapshot is plain data only: tensors, numbers, strings, None, and lists, tuples and
dicts of them, written with ``torch.save`` and compressed with zlib (level 1: latents are
float noise that compresses little, but a T2V session's zero history and the zero
padding of text embeddings compress to almost nothing). It is read back with
``torch.load(weights_only=True)``, which builds no other object, so bytes from Redis
never run code. Tensors keep their device type: one on a GPU comes back on the
restoring adapter's device, one on the CPU (a generator's state, a scheduler's CPU
tables) stays there.

A snapshot is taken in two halves (``SupportsSnapshotLater``): :func:`to_host` copies the
state off the device at the chunk boundary (a millisecond for a few MB), marking what was
on an accelerator; :func:`pack` then serialises that copy on another thread, while the
device already runs the next chunk and moves on from the state the copy was taken of.
"""

from __future__ import annotations

import io
import zlib
from typing import Any

import torch

LEVEL = 1  # zlib: fast; the rest of a level buys little on float latents
_SCALARS = (bool, int, float, str, type(None))


_ON_DEVICE = "__on_device__"  # marks a tensor to_host took off an accelerator


def to_host(value: Any) -> Any:
    """``value`` (plain data) copied to the CPU: every tensor copied (one that was on an
    accelerator marked, for :func:`unpack`), every list, tuple and dict rebuilt, so that
    nothing the session changes later reaches the copy."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return value.detach().clone()
        return {_ON_DEVICE: value.detach().to("cpu")}
    if type(value) in (list, tuple):
        return type(value)(to_host(v) for v in value)
    if type(value) is dict:
        return {k: to_host(v) for k, v in value.items()}
    return value


def _to_device(value: Any, target: torch.device) -> Any:
    if type(value) is dict:
        if set(value) == {_ON_DEVICE}:
            return value[_ON_DEVICE].to(target)
        return {k: _to_device(v, target) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_to_device(v, target) for v in value)
    return value


def pack(data: dict[str, Any]) -> bytes:
    """``data`` (plain data, see the module doc) as compressed bytes."""
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return zlib.compress(buffer.getvalue(), LEVEL)


def unpack(data: bytes, device: torch.device | str) -> dict[str, Any]:
    """What :func:`pack` packed; tensors that were on an accelerator go to ``device``."""
    target = torch.device(device)

    def onto(storage: Any, location: str) -> Any:
        return storage if location == "cpu" else storage.to(target)

    loaded = torch.load(io.BytesIO(zlib.decompress(data)), map_location=onto, weights_only=True)
    if not isinstance(loaded, dict):
        raise ValueError("not a world session snapshot")
    restored: dict[str, Any] = _to_device(loaded, target)
    return restored


def is_plain(value: Any) -> bool:
    """Whether ``value`` is data :func:`unpack` reads back as it was (exact types only: a
    diffusers ``FrozenDict`` is a dict subclass, ``numpy.float64`` a float one; neither
    is)."""
    if type(value) in (list, tuple):
        return all(is_plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) in (int, str) and is_plain(v) for k, v in value.items())
    return type(value) in _SCALARS or isinstance(value, torch.Tensor)


def object_state(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The plain-data attributes of ``obj`` (a scheduler: its step counters, its
    multistep history and timesteps), those in ``skip`` left out. Set them on a copy of
    the object it was made from with :func:`set_object_state`."""
    return {k: v for k, v in vars(obj).items() if k not in skip and is_plain(v)}


def set_object_state(obj: Any, state: dict[str, Any]) -> None:
    for name, value in state.items():
        setattr(obj, name, value)
