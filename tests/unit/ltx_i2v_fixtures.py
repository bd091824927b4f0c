"""Tiny random-weight LTX-Video pipelines of each class an entry's workflows load
(ltx/workflows.py), over the components of ``tiny_ltx_pipeline`` (diffusers_fixtures.py):

* ``"t2v"``: ``LTXPipeline`` (LTX-Video 0.9.0/0.9.1's resolution-shifting scheduler);
* ``"i2v"``: ``LTXImageToVideoPipeline`` over the same components;
* ``"condition"``: ``LTXConditionPipeline`` with an LTX-Video 0.9.5-style scheduler (no
  resolution shift: its schedule is the pipeline's own linear-quadratic one).

Sizes: multiples of 32; frames 4k+1 (VAE 4x spatial / 4x temporal)."""

from __future__ import annotations

from typing import Any, Literal

from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    LTXConditionPipeline,
    LTXImageToVideoPipeline,
)

from tests.unit.diffusers_fixtures import tiny_ltx_pipeline

Kind = Literal["t2v", "i2v", "condition"]
# The workflows each kind's entry serves (its spec.workflows).
WORKFLOWS: dict[Kind, list[str]] = {
    "t2v": ["t2v"],
    "i2v": ["t2v", "i2v"],
    "condition": ["t2v", "i2v", "flf2v", "v2v"],
}


def tiny_ltx(kind: Kind) -> Any:
    """A fresh tiny pipeline of ``kind`` (bit-identical weights on every call)."""
    base = tiny_ltx_pipeline()
    if kind == "t2v":
        return base
    modules = {
        "vae": base.vae,
        "text_encoder": base.text_encoder,
        "tokenizer": base.tokenizer,
        "transformer": base.transformer,
    }
    if kind == "i2v":
        return LTXImageToVideoPipeline(scheduler=base.scheduler, **modules)
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=False, base_shift=0.95, max_shift=2.05,
        base_image_seq_len=1024, max_image_seq_len=4096,
    )  # fmt: skip
    return LTXConditionPipeline(scheduler=scheduler, **modules)
