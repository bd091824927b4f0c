"""Rollout arithmetic of ``WS /v1/realtime/video`` (streaming world-model video), pure.

The one copy of the world models' chunk arithmetic (:class:`ChunkLattice`: each model's
from its spec) and of the camera-block check, which the API
(:mod:`models.realtime_video`, :mod:`models.realtime_video_start`) and the reference world
pipeline (``workers/pipelines/reference_world.py``) import. The reference lattice: 3
latent frames per generation chunk, temporal compression 4, the first latent frame
decoded to a single pixel frame — so chunk 0 holds 9 pixel frames and every later
chunk 12, and ``frames_for_chunks(16) == 189``. A chunk's camera actions are one list of
pressed keys (``w a s d``) per latent frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LATENT_FRAMES_PER_CHUNK = 3
TEMPORAL_COMPRESSION = 4
CAMERA_KEYS = ("w", "a", "s", "d")
# one chunk's camera actions: one list of pressed keys per latent frame (three of them)
CameraActions = list[list[str]]


@dataclass(frozen=True)
class ChunkLattice:
    """A world model's chunks in pixel frames: the first holds ``first``, every later one
    ``every`` (its ``ModelSpec``'s ``frame_offset`` and ``frame_multiple``). The default is
    the reference lattice above (9, then 12)."""

    first: int = (LATENT_FRAMES_PER_CHUNK - 1) * TEMPORAL_COMPRESSION + 1
    every: int = LATENT_FRAMES_PER_CHUNK * TEMPORAL_COMPRESSION

    def chunks_for_frames(self, num_frames: int) -> int:
        """Whole chunks in ``num_frames`` pixel frames (0 when too few)."""
        if num_frames < self.first:
            return 0
        return 1 + (num_frames - self.first) // self.every

    def frames_for_chunks(self, chunks: int) -> int:
        """Pixel frames of exactly ``chunks`` chunks (at least one)."""
        if chunks < 1:
            raise ValueError("chunks must be at least 1")
        return self.first + (chunks - 1) * self.every

    def frames_in_chunk(self, index: int) -> int:
        """Pixel frames carried by chunk ``index``."""
        if index < 0:
            raise ValueError("index must be non-negative")
        return self.first if index == 0 else self.every


# The reference lattice (9, then 12): what ``reference/world`` and the tests use.
REFERENCE_LATTICE = ChunkLattice()


def chunks_for_frames(num_frames: int) -> int:
    """Generation chunks of the reference lattice in ``num_frames`` pixel frames (0 when
    too few)."""
    if num_frames < 1:
        raise ValueError("num_frames must be at least 1")
    return REFERENCE_LATTICE.chunks_for_frames(num_frames)


def frames_for_chunks(chunks: int) -> int:
    """Pixel frames of a reference rollout of exactly ``chunks`` chunks."""
    return REFERENCE_LATTICE.frames_for_chunks(chunks)


def frames_in_chunk(index: int) -> int:
    """Pixel frames carried by reference chunk ``index``: 9 for the first, then 12."""
    return REFERENCE_LATTICE.frames_in_chunk(index)


def camera_block_problem(block: Any, name: str) -> str | None:
    """What is wrong with one chunk's camera actions ``block``, named ``name`` in the
    message; None when nothing is. A block is a list of exactly three lists (one per
    latent frame) of keys from ``w a s d``; ``[[], [], []]`` holds the camera. The one
    check of the API (``session.start``, ``session.interaction``) and of the reference
    world pipeline (``workers/pipelines/reference_world.py``)."""
    if not isinstance(block, list | tuple) or len(block) != LATENT_FRAMES_PER_CHUNK:
        got = f"{len(block)} items" if isinstance(block, list | tuple) else repr(block)
        return (
            f"{name} must be a list of {LATENT_FRAMES_PER_CHUNK} per-latent-frame "
            f"action lists, got {got}"
        )
    for j, actions in enumerate(block):
        if not isinstance(actions, list | tuple):
            return f"{name}[{j}] must be a list of actions, got {actions!r}"
        for action in actions:
            if action not in CAMERA_KEYS:
                return f"{name}[{j}] has unknown action {action!r}; use 'w', 'a', 's', 'd'"
    return None


def is_camera_block(actions: Any) -> bool:
    """One chunk's camera actions: three key lists drawn from w/a/s/d."""
    return camera_block_problem(actions, "camera") is None
