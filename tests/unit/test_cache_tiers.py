"""Request-scoped cache tiers (``quality``) on the tiny diffusers pipelines, in process:
each tier's frames on a worker that served other tiers before are exactly the frames of
that tier alone on a fresh adapter; the schedule is the one documented; the hooks are gone
after every job, however it ended. The same through the real queue is in
``tests/integration/test_diffusers_queue.py``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from models.errors import InvalidJobInput, JobLost
from tests.unit.job_steps import job_frames
from tests.unit.test_diffusers_video import CASES, FAMILIES, _adapter, _reference, _request
from workers.pipelines.base import step_stops
from workers.pipelines.diffusers.shared import cache_tiers
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter

STEPS = 6


def _frames(adapter: DiffusersAdapter, quality: str, **overrides: Any) -> np.ndarray:
    case = CASES[adapter.family.removeprefix("diffusers.")]
    req = _request(case, num_inference_steps=STEPS, quality=quality, **overrides)
    return job_frames(adapter, req)


def _fresh(name: str) -> DiffusersAdapter:
    return _adapter(CASES[name], CASES[name].build())


@pytest.mark.parametrize("name", FAMILIES)
def test_alternating_tiers_equal_each_tier_alone(name: str) -> None:
    alone = {q: _frames(_fresh(name), q) for q in ("lossless", "high", "fast")}
    # lossless is the pipeline's own call; the cached tiers change the output
    ref = _reference(CASES[name].build(), _request(CASES[name], num_inference_steps=STEPS))
    np.testing.assert_allclose(alone["lossless"], ref, rtol=0, atol=1e-6)
    assert not np.array_equal(alone["fast"], alone["lossless"])
    assert not np.array_equal(alone["high"], alone["fast"])

    shared = _fresh(name)
    for quality in ("fast", "lossless", "high", "fast", "high", "lossless"):
        np.testing.assert_array_equal(_frames(shared, quality), alone[quality])
        assert not cache_tiers.installed(shared.pipe)


def test_the_schedule_is_what_the_hook_computes() -> None:
    adapter = _fresh("wan")
    calls: list[int] = []
    attn = adapter.pipe.transformer.blocks[0].attn1
    attn.register_forward_hook(lambda m, a, o: calls.append(1))
    for quality in ("lossless", "high", "fast"):
        calls.clear()
        _frames(adapter, quality)
        computed = sum(cache_tiers.tier_schedule(quality, STEPS))
        assert len(calls) == 2 * computed  # a cond and an uncond pass per computed step
    assert sum(cache_tiers.tier_schedule("high", 100)) == 60
    assert sum(cache_tiers.tier_schedule("fast", 100)) == 47
    assert sum(cache_tiers.tier_schedule("fast", 20)) == 9


def test_a_job_stopped_inside_a_cached_tier_leaves_nothing_behind() -> None:
    name = "wan"
    fresh = _frames(_fresh(name), "lossless")
    adapter = _fresh(name)
    req = _request(CASES[name], num_inference_steps=STEPS, quality="fast")
    state = adapter.prepare(req)
    assert cache_tiers.installed(adapter.pipe)

    def stop(block: int) -> BaseException | None:
        return JobLost() if state.step_index == 4 and block == 2 else None

    with pytest.raises(JobLost):  # steps until the stop inside step 4
        while not state.done:
            with step_stops(stop):
                adapter.step(state)
    adapter.end()  # what the executor's finally does
    assert not cache_tiers.installed(adapter.pipe)
    np.testing.assert_array_equal(_frames(adapter, "lossless"), fresh)


def test_a_failed_prepare_leaves_no_tier_and_a_model_without_tiers_refuses() -> None:
    adapter = _fresh("wan")
    with pytest.raises(ValueError, match="divisible by 16"):  # the pipeline's own check
        _frames(adapter, "fast", width=33)
    assert not cache_tiers.installed(adapter.pipe)
    adapter.spec = adapter.spec.model_copy(update={"quality_tiers": []})
    with pytest.raises(InvalidJobInput, match="quality"):
        _frames(adapter, "high")
    with pytest.raises(ValueError, match="no quality tier"):
        cache_tiers.cache_config("diffusers.ltx2", "fast", 10)
    assert cache_tiers.cache_config("diffusers.wan", "lossless", 10) is None


def test_both_transformers_of_a_two_stage_wan_get_the_tier() -> None:
    adapter = _adapter(CASES["wan2.2"], CASES["wan2.2"].build())
    req = _request(CASES["wan2.2"], num_inference_steps=STEPS, quality="high")
    adapter.prepare(req)
    assert [m._cache_config is not None for m in cache_tiers.denoisers(adapter.pipe)] == [
        True,
        True,
    ]
    adapter.end()
    assert not cache_tiers.installed(adapter.pipe)
    with torch.no_grad():
        assert len(cache_tiers.denoisers(adapter.pipe)) == 2
