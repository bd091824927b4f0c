"""A job pipeline whose denoise step needs the memory attention over the clip would, for
tests of a real out-of-memory on CPU (served as ``tests.integration.attention_pipeline:
AttentionPipeline`` from a registry file, or built in process).

Every step runs ``blocks`` "blocks", each behind the executor's block gate as a diffusers
denoiser's are (``workers/pipelines/blocks.py``): the block makes a tensor of its own,
then allocates the attention scores, ``heads × tokens × tokens`` float32 with one token
per 4×4 pixels of every frame. That is a real allocation, and its failure a real
``MemoryError``: numpy's, as torch's CPU allocator raises a bare ``RuntimeError`` (only its
CUDA allocator raises ``torch.OutOfMemoryError``). At 64x48 and 8 frames a step asks for
~38 MB, never touched; at 1280x720 and 81 frames for ~300 TiB, past any machine's
address space, so it fails whatever the kernel's overcommit policy.

:attr:`AttentionPipeline.step_tensors` holds weak references to the tensors of the last
step run in this process (its block's tensor and the job's latents), for tests that check
nothing keeps them alive after the job.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from workers.pipelines.base import GenerationRequest, Media, Pipeline, StepState, step_stop


@dataclass
class AttentionState(StepState):
    request: GenerationRequest | None = None
    latents: torch.Tensor | None = None
    tokens: int = 0


class AttentionPipeline(Pipeline):
    step_tensors: ClassVar[list[weakref.ref[torch.Tensor]]] = []

    def __init__(self, heads: int = 4, blocks: int = 3, **_: Any) -> None:
        self.heads = heads
        self.blocks = blocks

    def load(self, device: str) -> None:
        if device != "cpu":
            raise ValueError(f"AttentionPipeline runs on cpu, not {device}")

    def prepare(self, request: GenerationRequest) -> AttentionState:
        pixels = request.width * request.height * request.num_frames
        generator = torch.Generator().manual_seed(request.seed)
        latents = torch.randn(max(1, pixels // 64), 4, generator=generator)
        return AttentionState(
            num_steps=request.num_inference_steps,
            request=request,
            latents=latents,
            tokens=max(1, pixels // 16),
        )

    def step(self, state: StepState) -> None:
        assert isinstance(state, AttentionState) and state.latents is not None
        stop = step_stop()
        latents = state.latents
        for block in range(1, self.blocks + 1):
            if stop is not None and (exc := stop(block)) is not None:
                raise exc
            hidden = latents * 0.99
            type(self).step_tensors = [weakref.ref(hidden), weakref.ref(latents)]
            scores = np.empty((self.heads, state.tokens, state.tokens), dtype=np.float32)
            del scores
            latents = hidden
        state.latents = latents
        state.step_index += 1

    def decode(self, state: StepState) -> Media:
        assert isinstance(state, AttentionState) and state.request is not None
        r = state.request
        frames = np.full((r.num_frames, r.height, r.width, 3), 96, dtype=np.uint8)
        return Media(frames=frames, fps=r.fps)
