"""Request-scoped cache tiers: the ``quality`` of a video job → one diffusers cache config.

``lossless`` (the default) runs every denoise step in full. ``high`` and ``fast`` install
diffusers' TaylorSeer cache (``TaylorSeerCacheConfig``, Liu et al. 2025, "From Reusing to
Forecasting: Accelerating Diffusion Models with TaylorSeers", arXiv 2503.06923) on the
job's denoiser(s) for that job only, in its *lite* form: on a cached step every
transformer block returns at once and the output projection (``proj_out``) is forecast
from its last computed values by a first-order Taylor expansion; on the other steps
everything is computed. Why this hook and not another (docs/adapters.md, "Cache tiers"):

* it works at block level: the hooks wrap a block's ``forward`` from outside, so they
  sit outside the compiled blocks (``compiled.py``) and beside the per-block cancel gates
  (a cached step still passes every gate: cancel, deadline and progress hold);
* its schedule is fixed by the step index alone (compute the first steps, then one step
  in ``cache_interval``), so a tier costs the same on every prompt, seed and weights,
  and its speed measured on random weights is the speed on real ones. The
  threshold-driven caches (FirstBlockCache, MagCache, TeaCache) skip steps by how much a
  residual changed, which random weights cannot tell about real ones.

The schedules, per 100 steps of a job (``tier_schedule``): ``high`` computes the first
20 % and then every 2nd step (about 60 % of the steps computed); ``fast`` the first 20 %
and then every 3rd (about 47 %). The warm-up share follows diffusers' TaylorSeer example
(``disable_cache_before_step=10`` of 50 steps), the intervals the paper's range (N = 2-6,
first order). Their quality on real weights has not been calibrated here.

A config is installed by :func:`install` in ``prepare`` and removed by :func:`remove` in
``end`` (the executor calls it after every job, whatever its outcome), which also resets
the hooks' state: the next job runs on a denoiser exactly as loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from models.catalog import FAMILY_SPECS


@dataclass(frozen=True)
class TierSchedule:
    """A TaylorSeer schedule: ``warmup`` steps in full, then one in ``interval``."""

    warmup_share: float
    interval: int


SCHEDULES: dict[str, TierSchedule] = {
    "high": TierSchedule(warmup_share=0.2, interval=2),
    "fast": TierSchedule(warmup_share=0.2, interval=3),
}


def tier_schedule(tier: str, num_steps: int) -> list[bool]:
    """Which of a job's ``num_steps`` steps the tier computes in full (True) or caches,
    as diffusers' ``TaylorSeerCacheHook`` decides it (for tests and the docs)."""
    if tier == "lossless":
        return [True] * num_steps
    sched = SCHEDULES[tier]
    warmup = max(1, math.ceil(sched.warmup_share * num_steps))
    return [s < warmup or (s - warmup - 1) % sched.interval == 0 for s in range(num_steps)]


def family_tiers(family: str) -> list[str]:
    """The tiers a family offers besides lossless: its ``FAMILY_SPECS`` entry's
    ``quality_tiers`` (a registry entry may offer fewer, never more)."""
    spec = FAMILY_SPECS.get(family)
    return [] if spec is None else list(spec.quality_tiers)


def cache_config(family: str, tier: str, num_steps: int) -> Any | None:
    """The diffusers cache config of ``tier`` for a job of ``num_steps`` steps on a model
    of ``family``; None for lossless. ``ValueError`` for a tier the family lacks."""
    if tier == "lossless":
        return None
    if tier not in family_tiers(family):
        raise ValueError(f"{family} has no quality tier {tier!r}")
    from diffusers import TaylorSeerCacheConfig

    sched = SCHEDULES[tier]
    return TaylorSeerCacheConfig(
        cache_interval=sched.interval,
        disable_cache_before_step=max(1, math.ceil(sched.warmup_share * num_steps)),
        max_order=1,
        # The forecast in float32: the factors are a few tensors of proj_out's output.
        taylor_factors_dtype=torch.float32,
        use_lite_mode=True,
    )


def denoisers(pipe: Any) -> list[Any]:
    """The pipeline's denoisers that take a cache (``transformer``, ``transformer_2``)."""
    out = []
    for name in ("transformer", "transformer_2"):
        model = getattr(pipe, name, None)
        if model is not None and hasattr(model, "enable_cache"):
            out.append(model)
    return out


def install(pipe: Any, config: Any) -> None:
    """Install ``config`` on every denoiser of ``pipe`` (after removing any left over)."""
    remove(pipe)
    if config is None:
        return
    for model in denoisers(pipe):
        model.enable_cache(config)


def remove(pipe: Any) -> None:
    """Remove the cache hooks of every denoiser and their state; a no-op without them."""
    for model in denoisers(pipe):
        if getattr(model, "_cache_config", None) is not None:
            model.disable_cache()


def installed(pipe: Any) -> bool:
    """Whether any denoiser of ``pipe`` carries a cache config."""
    return any(getattr(m, "_cache_config", None) is not None for m in denoisers(pipe))
