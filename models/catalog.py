"""What a served model can do, as data.

The API validates requests against a :class:`ModelSpec` without importing any pipeline
code; the worker's pipeline adapters declare the same spec. Built-in specs live here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Modality = Literal["video", "audio"]


class ModelSpec(BaseModel):
    """Capabilities of one served model (the API checks requests against these)."""

    name: str
    modality: Modality = "video"
    description: str = ""
    owned_by: str = "omniqueue"
    # Size lattice: width and height must be multiples of ``size_multiple``.
    min_size: int = 16
    max_width: int = 1920
    max_height: int = 1920
    size_multiple: int = 2
    default_size: tuple[int, int] = (832, 480)
    # Frame lattice: num_frames = frame_offset + k * frame_multiple (k >= 0), rounded up.
    frame_multiple: int = 1
    frame_offset: int = 0
    min_frames: int = 1
    max_frames: int = 481
    default_fps: int = 24
    max_fps: int = 60
    default_seconds: float = 4.0
    min_steps: int = 1
    max_steps: int = 200
    default_steps: int = 30
    has_audio: bool = False
    supports_image_input: bool = False
    max_outputs: int = 1
    # Optional request fields the pipeline uses (others are accepted and ignored).
    parameters: list[str] = Field(default_factory=list)
    # Keys allowed inside ``extra_params`` (anything else is rejected).
    extra_params: dict[str, Literal["str", "int", "float", "bool"]] = Field(default_factory=dict)
    # Allowed values of string options and [low, high] of numeric ones.
    extra_choices: dict[str, list[str]] = Field(default_factory=dict)
    extra_ranges: dict[str, tuple[float, float]] = Field(default_factory=dict)

    def snap_frames(self, num_frames: int) -> int:
        """Round a frame count up to this model's lattice."""
        if num_frames <= self.frame_offset:
            return max(self.min_frames, self.frame_offset or 1)
        k = -(-(num_frames - self.frame_offset) // self.frame_multiple)
        return self.frame_offset + k * self.frame_multiple


REFERENCE_VIDEO = ModelSpec(
    name="reference/video",
    description=(
        "Procedural reference model: a flow-matching Euler sampler carries Gaussian noise "
        "toward a scene rendered from the prompt. CPU, no weights, deterministic per seed."
    ),
    min_size=16,
    max_width=1280,
    max_height=1280,
    size_multiple=2,
    default_size=(832, 480),
    default_fps=24,
    default_seconds=4.0,
    default_steps=30,
    max_steps=200,
    has_audio=True,
    supports_image_input=True,
    parameters=["guidance_scale", "negative_prompt"],
    extra_params={"motion": "float", "camera": "str"},
    extra_choices={"camera": ["static", "pan", "zoom"]},
    extra_ranges={"motion": (0.0, 10.0)},
)

BUILTIN_SPECS: dict[str, ModelSpec] = {REFERENCE_VIDEO.name: REFERENCE_VIDEO}
