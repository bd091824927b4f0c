"""One MiniMax-H3 job's state: what ``MiniMaxH3Adapter`` (minimax_h3/adapter.py) keeps of
diffusers' modular blocks between its calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from models.catalog import Workflow
from workers.pipelines.diffusers.minimax_h3.vsa import VsaLayout
from workers.pipelines.diffusers.shared.common import DiffusersState


@dataclass(kw_only=True)
class H3State(DiffusersState):
    """One H3 job: the blocks' pipeline state, the loop block and its block state (the
    packed video and audio rows, ``latents`` and ``audio_latents``, live in it)."""

    workflow: Workflow
    components: Any  # the job's view of the shared pipeline (its own schedulers)
    pipeline_state: Any
    loop: Any
    core: Any
    block_state: Any
    stage_inputs: dict[str, Any] = field(default_factory=dict)
    # The packed sequence's VSA block layout (attention = "vsa"; minimax_h3/vsa.py), else None.
    vsa_layout: VsaLayout | None = None
