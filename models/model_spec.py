"""What a served model can do, as data: :class:`ModelSpec` and the names it uses.

The API validates requests against a model's spec without importing any pipeline code;
the worker's pipeline adapters declare the same spec. The built-in models' and the
adapter families' specs are in ``models/catalog.py``.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, Field, model_validator

from models.memory_plan import MemoryPlan

Modality = Literal["video", "audio"]
# The ``quality`` of a video create (vLLM-Omni's field): "lossless" runs every denoise step
# in full; "high" and "fast" reuse cached block outputs on some steps.
QualityTier = Literal["lossless", "high", "fast"]
QUALITY_TIERS: tuple[QualityTier, ...] = ("lossless", "high", "fast")
# Which adapter interface runs a model (``workers/pipelines/base.py``): a job pipeline
# (``/v1/videos``, ``/v1/audio/generations``), a world model (``WS /v1/realtime/video``)
# or a voice model (``WS /v1/realtime``).
PipelineKind = Literal["job", "world", "voice"]
# What a model makes from its inputs. A joint video + audio model (MiniMax-H3): text only,
# first/last keyframes, or ordered omni-references (images, videos with their sound, audio
# clips). A video model (Wan): text only, a first frame, a first and a last frame, or a
# source video to restyle.
Workflow = Literal["t2va", "fl2va", "ref2va", "t2v", "i2v", "flf2v", "v2v"]
# The video models' workflows: keyframes anchored at frame 0 and/or -1, or one source
# video (api/references.py).
VIDEO_WORKFLOWS: tuple[Workflow, ...] = ("t2v", "i2v", "flf2v", "v2v")
# Attention kernels a role of the denoiser may run: PyTorch's SDPA (diffusers' dispatch),
# video sparse attention (fastvideo-kernel; MiniMax-H3's joint blocks only), or cuDNN's
# fused attention (diffusers' ``_native_cudnn`` backend: SDPA pinned to
# SDPBackend.CUDNN_ATTENTION, faster than FlashAttention-2 on Hopper for long sequences;
# CUDA only, for the families whose attention goes through diffusers' dispatch).
AttentionBackend = Literal["sdpa", "vsa", "cudnn"]
# The adapter families whose denoisers' attention processors all call diffusers'
# ``dispatch_attention_fn`` with their ``_attention_backend``, so that
# ``set_attention_backend`` reaches every role: the ones ``attention = "cudnn"`` serves.
# CogVideoX and Stable Audio call ``F.scaled_dot_product_attention`` themselves.
CUDNN_FAMILIES: tuple[str, ...] = (
    "diffusers.wan",
    "diffusers.ltx",
    "diffusers.ltx2",
    "diffusers.longcat_audio",
    "diffusers.minimax_h3",
    "diffusers.helios",
)
# Where a world model's interaction enters its session (``workers/pipelines/world_rules.py``):
# "step", the chunk under way at its next denoise step while one is left; "chunk", the
# first chunk not yet begun.
InteractionAt = Literal["step", "chunk"]
# The most outputs one video create may ask for (``n``; vLLM-Omni's clients send 1-4).
MAX_OUTPUTS = 4
# VSA's default key blocks per query block: the reference deployment's.
DEFAULT_VSA_TOPK = 64


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
    min_fps: int = 1
    max_fps: int = 60
    default_seconds: float = 4.0
    # Longest clip of an audio model (None: only the server's limits.max_seconds).
    max_seconds: float | None = None
    min_steps: int = 1
    max_steps: int = 200
    default_steps: int = 30
    has_audio: bool = False
    # Serves realtime sessions (WS /v1/realtime/video), not /v1/videos jobs.
    streaming: bool = False
    supports_image_input: bool = False
    # The most outputs (``n``) one video create may ask for: a job makes them one after
    # another, output k from seed ``seed + k`` (audio and realtime models make one).
    max_outputs: int = Field(default=MAX_OUTPUTS, ge=1, le=MAX_OUTPUTS)
    # Optional request fields the pipeline uses (others are accepted and ignored).
    parameters: list[str] = Field(default_factory=list)
    # Keys allowed inside ``extra_params`` (anything else is rejected).
    extra_params: dict[str, Literal["str", "int", "float", "bool", "ints"]] = Field(
        default_factory=dict
    )
    # Allowed values of string options and [low, high] of numeric ones.
    extra_choices: dict[str, list[str]] = Field(default_factory=dict)
    extra_ranges: dict[str, tuple[float, float]] = Field(default_factory=dict)
    # Request-scoped cache tiers of the ``quality`` field besides "lossless" (always
    # offered: no cache). The worker maps each to its family's diffusers cache config
    # (workers/pipelines/diffusers/shared/cache_tiers.py; docs/adapters.md).
    quality_tiers: list[QualityTier] = Field(default_factory=list)
    # The workflows a model serves (empty: a plain text/image-to-video model). A request
    # picks one with ``extra_params.task``, or by its inputs (api/references.py).
    workflows: list[Workflow] = Field(default_factory=list)
    # Named aspect ratios (``extra_params.aspect_ratio``) resolve to a canvas whose short
    # edge is ``canvas_short_edge``, its area capped at ``canvas_max_pixels``.
    canvas_short_edge: int | None = None
    canvas_max_pixels: int | None = None
    # A distilled deployment without classifier-free guidance (FastH3): a
    # ``guidance_scale`` above 1 is refused (at most 1, or none, is what it runs).
    no_cfg: bool = False
    # The attention backend of each role of the denoiser (``/v1/models`` lists it), as
    # the registry entry's ``attention`` sets it (ServedModel); empty: no roles to choose.
    attention: dict[str, AttentionBackend] = Field(default_factory=dict)
    # VSA's key blocks per query block, where a role runs ``vsa``.
    vsa_topk: int | None = None
    # FP8 weights and offloading, as the registry entry's ``quantization`` / ``offload``
    # set them (ServedModel; ``/v1/models`` lists it as ``memory``); None: as loaded.
    memory: MemoryPlan | None = None
    # A world model steered by w/a/s/d camera actions (``session.start``'s
    # ``extra_params.camera_action_script``, ``session.interaction``'s ``event.camera``);
    # a world model without it refuses both, naming the field.
    camera_control: bool = False
    # A text-to-speech model: it speaks its prompt. ``/v1/audio/speech`` without ``model``
    # uses the first served one (other audio jobs: the first served audio model).
    text_to_speech: bool = False
    # The languages (ISO 639-1) a speech model speaks from its text alone, with no
    # ``language`` input: a request's ``language`` among them is taken as what the model
    # does anyway; another is refused (a model that declares ``language`` takes its list).
    spoken_languages: list[str] = Field(default_factory=lambda: ["en"])
    # A world model's blend of a prompt change when neither the interaction nor the
    # session's start sets ``transition_chunks``: over this many chunks (0: a cut).
    default_transition_chunks: int = Field(default=1, ge=0)
    # Where a world model's interaction enters: "step" (its adapter conditions the rest of
    # the chunk under way on it, from the next denoise step, and reports it started in that
    # chunk) or "chunk" (from the first chunk not yet begun: any adapter's rule).
    interaction_at: InteractionAt = "chunk"

    @model_validator(mode="after")
    def _keyframes_are_image_input(self) -> Self:
        """A video model that serves an image or video workflow (``i2v``, ``flf2v``,
        ``v2v``) takes input media (``/v1/models`` lists ``supports_image_input``)."""
        if {"i2v", "flf2v", "v2v"} & set(self.workflows):
            self.supports_image_input = True
        return self

    @property
    def supports_lora(self) -> bool:
        """Takes a per-request ``lora`` (the model lists ``lora`` in ``parameters``)."""
        return "lora" in self.parameters

    @property
    def offered_tiers(self) -> list[QualityTier]:
        """The ``quality`` tiers a request may ask for: ``lossless`` (every step in full,
        always offered, never listed in ``quality_tiers``) and the model's own."""
        return ["lossless", *(t for t in self.quality_tiers if t != "lossless")]

    def offers(self, tier: str) -> bool:
        """Whether a request may ask for ``quality`` ``tier``."""
        return tier in self.offered_tiers

    @property
    def kind(self) -> PipelineKind:
        """The adapter interface of this model: streaming video is a world model,
        streaming audio a voice model, anything else runs as jobs."""
        if not self.streaming:
            return "job"
        return "world" if self.modality == "video" else "voice"

    def snap_frames(self, num_frames: int) -> int:
        """Round a frame count up to this model's lattice."""
        if num_frames <= self.frame_offset:
            return max(self.min_frames, self.frame_offset or 1)
        k = -(-(num_frames - self.frame_offset) // self.frame_multiple)
        return self.frame_offset + k * self.frame_multiple
