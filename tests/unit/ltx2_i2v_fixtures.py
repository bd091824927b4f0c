"""Tiny random-weight LTX-2 keyframe pipelines: ``LTX2ImageToVideoPipeline`` and
``LTX2ConditionPipeline`` over the modules of ``diffusers_fixtures_av.tiny_ltx2_pipeline``
(same configs and seeds: every class gets the same weights), offline, float32, CPU."""

from __future__ import annotations

from typing import Any

from diffusers import LTX2ConditionPipeline, LTX2ImageToVideoPipeline, LTX2Pipeline

from tests.unit.diffusers_fixtures_av import tiny_ltx2_pipeline

# The pipeline class an entry serving each set of workflows loads.
CLASSES: dict[str, Any] = {
    "t2v": LTX2Pipeline,
    "i2v": LTX2ImageToVideoPipeline,
    "flf2v": LTX2ConditionPipeline,
}


def tiny_ltx2_as(cls: Any, **kwargs: Any) -> Any:
    """A fresh tiny LTX-2 pipeline of class ``cls`` (``kwargs``: ``tiny_ltx2_pipeline``'s)."""
    base = tiny_ltx2_pipeline(**kwargs)
    if cls is LTX2Pipeline:
        return base
    pipe = cls(**base.components)
    pipe.set_progress_bar_config(disable=True)
    return pipe
