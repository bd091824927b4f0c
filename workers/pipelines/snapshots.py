"""How a world pipeline packs a session's state at a chunk boundary into bytes and back
(``SupportsSnapshot.snapshot`` / ``restore``), so another worker can take the session over
(``workers/sessions/world_checkpoint.py``).

A snapshot is plain data only: tensors, numbers, strings, None, and lists, tuples and
dicts of them, written with ``torch.save``. A tensor mostly of zeros (a T2V session's
zero history, the zero padding of text embeddings) is stored as its non-zero blocks of
4 KiB and a mask of which they are: a pass of tensor arithmetic, ~6 ms for a Helios
snapshot after its first chunk on a quiet 2-core VM, where zlib took 87-104 ms (300-450
under load: that history is the chunk's latents after zeros, half of it float noise,
which zlib crawls through);
the others (latents: float noise) are stored as they are, since compressing them buys a
few percent (``python -m benchmarks.realtime.snapshot_pack``). It is read back with
``torch.load(weights_only=True)``, which builds no other object, so bytes from Redis
never run code; snapshots of earlier releases (packed whole with zlib, or with zlib per
tensor) still read. Tensors keep their device type: one on a GPU comes back on the
restoring adapter's device, one on the CPU (a generator's state, a scheduler's CPU
tables) stays there.

A snapshot is taken in two halves (``SupportsSnapshotLater``): :func:`to_host` copies the
state off the device at the chunk boundary (a millisecond for a few MB), marking what was
on an accelerator; :func:`pack` then serialises that copy on another thread, while the
device already runs the next chunk and moves on from the state the copy was taken of.
"""

from __future__ import annotations

import io
import math
import zlib
from typing import Any

import torch

LEVEL = 1  # zlib, for snapshots of earlier releases: packed whole or per tensor
# A tensor whose blocks are at most this share non-zero is stored as its non-zero blocks.
KEPT_TO_SPARSE = 0.5
BLOCK = 4096  # bytes
_ZLIB = "__zlib__"  # an earlier release's compressed tensor: its bytes, dtype and shape
_BLOCKS = "__blocks__"  # a tensor stored as its non-zero blocks: them, mask, dtype, shape
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
    """``data`` (plain data, see the module doc) as bytes, its mostly-zero tensors
    compressed."""
    buffer = io.BytesIO()
    torch.save(_compressed(data), buffer)
    return buffer.getvalue()


def unpack(data: bytes, device: torch.device | str) -> dict[str, Any]:
    """What :func:`pack` packed; tensors that were on an accelerator go to ``device``."""
    target = torch.device(device)

    def onto(storage: Any, location: str) -> Any:
        return storage if location == "cpu" else storage.to(target)

    if data[:2] != b"PK":  # torch.save writes a zip; an older snapshot was zlib whole
        data = zlib.decompress(data)
    loaded = torch.load(io.BytesIO(data), map_location=onto, weights_only=True)
    if not isinstance(loaded, dict):
        raise ValueError("not a world session snapshot")
    restored: dict[str, Any] = _to_device(_decompressed(loaded), target)
    return restored


def _compressed(value: Any) -> Any:
    """``value`` with each CPU tensor of mostly zero blocks replaced by its non-zero
    blocks of ``BLOCK`` bytes, the mask of which they are (uint8 and bool tensors:
    ``torch.load(weights_only=True)`` reads them), dtype and shape."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or value.numel() * value.element_size() < 2 * BLOCK:
            return value
        raw = value.contiguous().view(-1).view(torch.uint8)
        blocks = torch.nn.functional.pad(raw, (0, -raw.numel() % BLOCK)).view(-1, BLOCK)
        # looked at as 64-bit words: an eighth of the elements to count
        mask = torch.count_nonzero(blocks.view(torch.int64), dim=1) > 0
        if float(mask.sum()) > KEPT_TO_SPARSE * len(mask):
            return value
        return {_BLOCKS: blocks[mask], "mask": mask,
                "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape)}  # fmt: skip
    if type(value) in (list, tuple):
        return type(value)(_compressed(v) for v in value)
    if type(value) is dict:
        return {k: _compressed(v) for k, v in value.items()}
    return value


def _decompressed(value: Any) -> Any:
    """What :func:`_compressed` (or an earlier release's zlib) replaced, back as the
    tensor it was."""
    if type(value) is dict:
        if _BLOCKS in value:
            mask = value["mask"]
            blocks = torch.zeros(len(mask), BLOCK, dtype=torch.uint8)
            blocks[mask] = value[_BLOCKS]
            dtype = getattr(torch, value["dtype"])
            size = math.prod(value["shape"]) * torch.empty((), dtype=dtype).element_size()
            return blocks.view(-1)[:size].view(dtype).reshape(value["shape"])
        if _ZLIB in value:
            raw = bytearray(zlib.decompress(value[_ZLIB].numpy().tobytes()))
            flat = torch.frombuffer(raw, dtype=torch.uint8)
            return flat.view(getattr(torch, value["dtype"])).reshape(value["shape"])
        return {k: _decompressed(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_decompressed(v) for v in value)
    return value


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
