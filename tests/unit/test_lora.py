"""Per-request LoRA on one worker's adapter (``workers/pipelines/diffusers/shared/lora.py``), in
process on the tiny Wan: the same adapter object runs job after job as the executor
drives it (``prepare`` / ``step`` / ``decode_frames`` / ``end``), and every job's frames
are exactly those of a fresh pipe loaded with that job's adapter alone through diffusers'
own ``load_lora_weights`` + ``set_adapters``."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from models.errors import ErrorCode, InvalidLora
from models.job_specs import LoraSpec
from tests.unit.diffusers_fixtures import TINY_SEQ_LEN, tiny_wan_pipeline
from tests.unit.lora_fixtures import CROSS_ATTN, FFN, SELF_ATTN, lora_weights, write_lora
from workers.common.failures import classify
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.shared.lora import LoraCache
from workers.pipelines.diffusers.wan.adapter import WanAdapter

RANK = 4  # the slot's rank (OMNIQ_LORA__MAX_RANK)


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {
        "A": write_lora(root / "a", SELF_ATTN + FFN, rank=RANK, seed=1),
        "B": write_lora(root / "b", CROSS_ATTN, rank=RANK, seed=2, alpha=8.0),
        "C": write_lora(root / "c", SELF_ATTN, rank=2, seed=3),  # padded to RANK
    }


def _request(lora: LoraSpec | None) -> GenerationRequest:
    return GenerationRequest.video(
        prompt="a red ball", width=32, height=32, num_frames=9, fps=16.0,
        num_inference_steps=3, seed=7, lora=lora,
    )


def _run(adapter: WanAdapter, lora: LoraSpec | None) -> np.ndarray:
    """One job as the executor runs it (``end`` in a ``finally``)."""
    try:
        state = adapter.prepare(_request(lora))
        while not state.done:
            adapter.step(state)
        return adapter.decode_frames(state)
    finally:
        adapter.end()


def _adapter(pipe: object, cache: LoraCache | None = None) -> WanAdapter:
    adapter = WanAdapter(pipe=pipe, max_sequence_length=TINY_SEQ_LEN)
    if cache is not None:
        adapter.use_lora(cache)
    adapter.load("cpu")
    return adapter


def _fresh(path: Path | None, scale: float = 1.0) -> np.ndarray:
    """A fresh pipe with only this adapter, loaded by diffusers itself (None: no LoRA)."""
    pipe = tiny_wan_pipeline()
    if path is not None:
        pipe.load_lora_weights(str(path), adapter_name="only")
        pipe.set_adapters(["only"], [scale])
    return _run(_adapter(pipe), None)


def _spec(path: Path, scale: float = 1.0) -> LoraSpec:
    return LoraSpec(name=path.parent.name, path=str(path), scale=scale)


def test_jobs_with_adapters_match_a_fresh_pipe_with_that_adapter_alone(
    loras: dict[str, Path],
) -> None:
    adapter = _adapter(tiny_wan_pipeline(), LoraCache(max_rank=RANK))
    base = _fresh(None)
    jobs: list[tuple[str | None, float]] = [("A", 1.0), ("B", 1.0), (None, 1.0), ("A", 0.5)]
    for name, scale in jobs:
        got = _run(adapter, None if name is None else _spec(loras[name], scale))
        want = base if name is None else _fresh(loras[name], scale)
        assert np.array_equal(got, want), (name, scale, np.abs(got - want).max())
        if name is not None:  # the adapter really changes the video
            assert np.abs(got - base).max() > 0.01, name
    stats = adapter.lora.stats() if adapter.lora else None
    assert stats is not None and (stats.misses, stats.hits) == (2, 1)

    # A lower rank is zero-padded to the slot's: the same LoRA, up to float rounding of
    # the padded matmul.
    got = _run(adapter, _spec(loras["C"]))
    want = _fresh(loras["C"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert np.abs(got - base).max() > 0.01


def _bad(tmp_path: Path) -> dict[str, Path]:
    """Adapters that do not fit the tiny Wan, each for its own reason."""
    wrong = lora_weights(SELF_ATTN[:1], rank=RANK, seed=4)
    wrong["blocks.0.attn1.to_q.lora_A.weight"] = torch.randn(RANK, 7)  # in_features 24
    missing = lora_weights(SELF_ATTN[:1], rank=RANK, seed=5)
    missing = {k.replace("to_q", "to_nothing"): v for k, v in missing.items()}
    text = {f"text_encoder.{k}": v for k, v in lora_weights(FFN[:1], rank=RANK, seed=6).items()}
    save_file(text, str(tmp_path / "text.safetensors"))
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    return {
        "shape": write_lora(tmp_path / "shape", [], rank=RANK, seed=0, weights=wrong),
        "layer": write_lora(tmp_path / "layer", [], rank=RANK, seed=0, weights=missing),
        "rank": write_lora(tmp_path / "rank", SELF_ATTN, rank=RANK * 2, seed=7),
        "component": tmp_path / "text.safetensors",
        "junk": tmp_path / "junk.safetensors",
        "gone": tmp_path / "gone.safetensors",
    }


def test_an_adapter_that_does_not_fit_fails_before_denoise_and_leaves_nothing(
    loras: dict[str, Path], tmp_path: Path
) -> None:
    adapter = _adapter(tiny_wan_pipeline(), LoraCache(max_rank=RANK))
    _run(adapter, _spec(loras["A"]))  # the slot holds an adapter before the bad ones
    for reason, path in _bad(tmp_path).items():
        with pytest.raises(InvalidLora) as info:
            _run(adapter, LoraSpec(name=reason, path=str(path)))
        assert classify(info.value)[0] == ErrorCode.INVALID_LORA, reason
        assert reason in info.value.message or "LoRA" in info.value.message
    stats = adapter.lora.stats() if adapter.lora else None
    assert stats is not None and stats.entries == 1  # none of them was cached
    # The next jobs run as on a fresh worker.
    assert np.array_equal(_run(adapter, None), _fresh(None))
    assert np.array_equal(_run(adapter, _spec(loras["B"])), _fresh(loras["B"]))


def _lora_param_bytes(pipe: object) -> int:
    transformer = pipe.transformer  # type: ignore[attr-defined]
    return sum(p.nbytes for n, p in transformer.named_parameters() if "lora_" in n)


def test_twenty_adapters_through_a_cache_of_four_stay_within_its_budget(tmp_path: Path) -> None:
    pipe = tiny_wan_pipeline()
    paths = [write_lora(tmp_path / f"l{i}", SELF_ATTN, rank=RANK, seed=10 + i) for i in range(20)]
    one = sum(v.nbytes for v in lora_weights(SELF_ATTN, rank=RANK, seed=0).values())
    cache = LoraCache(max_adapters=4, max_bytes=4 * one, max_rank=RANK)
    cache.install(pipe)
    slot = _lora_param_bytes(pipe)
    assert slot == cache.stats().slot_bytes > 0
    evicted: list[weakref.ref[torch.Tensor]] = []
    for i, path in enumerate(paths):
        cache.activate(pipe, _spec(path))
        entry = next(iter(cache._entries.values()))  # the least recently used
        cache.release(pipe)
        stats = cache.stats()
        assert stats.entries == min(i + 1, 4)
        assert stats.cached_bytes == stats.entries * one <= cache.max_bytes
        assert _lora_param_bytes(pipe) == slot  # the pipe's LoRA memory never grows
        if i == 3:
            evicted = [weakref.ref(t) for t in entry.src]
    gc.collect()
    assert evicted and all(ref() is None for ref in evicted)  # evicted tensors are freed
    assert cache.stats().evictions == 16
    # The four most recent are hits; the bytes budget alone also bounds the count.
    for path in paths[-4:]:
        cache.activate(pipe, _spec(path))
        cache.release(pipe)
    assert (cache.stats().hits, cache.stats().misses) == (4, 20)
    small = LoraCache(max_adapters=10, max_bytes=int(2.5 * one), max_rank=RANK)
    small.install(tiny_wan_pipeline())
    for path in paths[:5]:
        small.activate(small._pipe, _spec(path))
    assert small.stats().entries == 2 and small.stats().cached_bytes <= 2.5 * one
    # Parked, the slot is all zeros: no trace of the last adapter.
    small.release(small._pipe)
    assert all(not layer.b.any() and not layer.a.any() for layer in small._layers)
