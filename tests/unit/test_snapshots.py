"""How a world session's snapshot is packed (``workers/pipelines/snapshots.py``): a
tensor mostly of zero blocks is stored as its non-zero blocks, the others as they are,
and every one comes back bit for bit, in its dtype and shape; earlier releases'
snapshots still read."""

from __future__ import annotations

import io
import zlib

import torch

from workers.pipelines.snapshots import BLOCK, LEVEL, pack, to_host, unpack


def _state() -> dict[str, object]:
    embeds = torch.zeros(1, 64, 256, dtype=torch.bfloat16)  # a short prompt, zero padded
    embeds[:, :5] = torch.randn(1, 5, 256, generator=torch.Generator().manual_seed(0))
    return {
        "prompt_embeds": embeds,
        "history": torch.randn(1, 4, 3, 8, 8, generator=torch.Generator().manual_seed(1)),
        "zeros": torch.zeros(2, 16, 64),
        "rng": torch.Generator().manual_seed(2).get_state(),
        "small": torch.zeros(3),
        "events": [{"id": "e1", "embeds": embeds.clone()}, ("a", 1, None, 2.5)],
    }


def _same(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def test_every_tensor_comes_back_bit_for_bit() -> None:
    state = _state()
    _same(unpack(pack(state), "cpu"), state)


def test_mostly_zero_tensors_are_compressed_and_noise_is_stored_as_it_is() -> None:
    """The zero padding of the embeddings and a zero history pack to little; the random
    history is stored whole (compressing noise buys a few percent)."""
    noise = {"history": torch.randn(1, 16, 8, 32, 32)}
    padded = {"embeds": torch.zeros(1, 512, 512, dtype=torch.bfloat16)}
    padded["embeds"][:, :8] = 1.5
    raw = noise["history"].numel() * 4
    assert len(pack(noise)) >= raw  # as it is, in torch.save's zip
    assert len(pack(padded)) < padded["embeds"].numel() * 2 / 50


def test_a_snapshot_packed_whole_with_zlib_still_reads() -> None:
    """Snapshots stored before per-tensor compression (torch.save, then zlib)."""
    state = to_host(_state())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    old = zlib.compress(buffer.getvalue(), LEVEL)
    _same(unpack(old, "cpu"), unpack(pack(state), "cpu"))


def test_a_history_half_zeros_packs_to_its_non_zero_half() -> None:
    """After a text-to-video session's first chunk its history is the chunk's latents
    after zeros: stored as the non-zero blocks (noise, never compressed), bit for bit.
    Values that are zero but not all-zero bytes (-0.0) come back as they were."""
    history = torch.randn(1, 16, 20, 24, 40, generator=torch.Generator().manual_seed(3))
    history[:, :, :11] = 0
    history[0, 0, 0, 0, :4] = -0.0
    packed = pack({"history": history})
    nonzero_bytes = history[:, :, 11:].numel() * 4
    # each of the 16 channels' zero run starts and ends inside a block at most
    assert len(packed) < nonzero_bytes + 2 * 16 * BLOCK + 4096 < history.numel() * 4 * 0.6
    back = unpack(packed, "cpu")["history"]
    assert torch.equal(back.view(torch.int32), history.view(torch.int32))


def test_an_earlier_release_s_zlib_compressed_tensor_still_reads() -> None:
    """A snapshot whose mostly-zero tensors an earlier release stored zlib-compressed."""
    embeds = torch.zeros(1, 64, 256, dtype=torch.bfloat16)
    embeds[:, :3] = 2.0
    raw = embeds.view(-1).view(torch.uint8).numpy().tobytes()
    packed = torch.frombuffer(bytearray(zlib.compress(raw, LEVEL)), dtype=torch.uint8)
    old = {"embeds": {"__zlib__": packed, "dtype": "bfloat16", "shape": [1, 64, 256]}}
    buffer = io.BytesIO()
    torch.save(old, buffer)
    _same(unpack(buffer.getvalue(), "cpu"), {"embeds": embeds})
