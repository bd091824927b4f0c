"""What the tests of the diffusers video adapters share (test_diffusers_video.py and the
keyframe workflows' test_wan_i2v.py, test_ltx_i2v.py, test_ltx2_i2v.py,
test_cogvideox_i2v.py): the pipeline's own call for a request, keyframes and source clips
as the executor hands them over, bit-equal frames, the warm-up job, jobs stepped in turn,
a cancel inside a step, the cache-tier check, a fresh pipe with one LoRA, and the worker's
and the API's refusals; and a family's entry over the tiny pipelines."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import pytest
import torch

from api.references import keyframe_workflow
from models.catalog import FAMILY_SPECS, ModelSpec
from models.errors import InvalidJobInput, InvalidRequest, JobLost
from models.registry import WarmupShape
from tests.unit.diffusers_fixtures import TINY_SEQ_LEN, TINY_VIDEO
from tests.unit.job_steps import job_frames
from workers.pipelines.base import GenerationRequest, Media, MediaReference, StepState, step_stops
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import to_uint8

A = TypeVar("A", bound="DiffusersAdapter[Any]")


@dataclass(frozen=True)
class TinyEntry(Generic[A]):
    """A family's registry entry over the tiny pipelines, as a test module builds it: the
    adapter class, the catalog family, and its jobs' fps, steps and other defaults."""

    adapter_class: type[A]
    family: str
    fps: float
    steps: int
    defaults: dict[str, Any] = field(default_factory=dict)

    def spec(self, workflows: list[str], **update: Any) -> Any:
        """The family's catalog spec as an entry serving ``workflows``."""
        return FAMILY_SPECS[self.family].model_copy(update={"workflows": workflows, **update})

    def adapter(self, pipe: Any, workflows: list[str], **options: Any) -> A:
        """The adapter over ``pipe`` serving ``workflows`` at ``TINY_SEQ_LEN``, loaded on
        the CPU."""
        spec = self.spec(workflows)
        adapter = self.adapter_class(
            pipe=pipe, spec=spec, max_sequence_length=TINY_SEQ_LEN, **options
        )
        adapter.load("cpu")
        return adapter

    def request(self, **overrides: Any) -> GenerationRequest:
        """A job of the ``TINY_VIDEO`` shape with the entry's defaults."""
        own = {"fps": self.fps, "num_inference_steps": self.steps, **copy.deepcopy(self.defaults)}
        return GenerationRequest.video(**TINY_VIDEO | own | overrides)


def call_frames(pipe: Any, req: GenerationRequest, **more: Any) -> np.ndarray:
    """``pipe(...)``'s float frames for the request's settings, as a user would call it:
    its prompts, size, frames, steps and guidance (``guidance_scale_2`` where set), a
    generator of its seed, the tiny pipelines' ``TINY_SEQ_LEN``; ``more``: the family's
    own arguments (keyframes, ``frame_rate``, ``extra_params``)."""
    kwargs: dict[str, Any] = {
        "prompt": req.prompt,
        "negative_prompt": req.negative_prompt,
        "height": req.height,
        "width": req.width,
        "num_frames": req.num_frames,
        "num_inference_steps": req.num_inference_steps,
        "output_type": "np",
        "generator": torch.Generator().manual_seed(req.seed),
        "max_sequence_length": TINY_SEQ_LEN,
    }
    if req.guidance_scale is not None:
        kwargs["guidance_scale"] = req.guidance_scale
    if req.sampler.guidance_scale_2 is not None:
        kwargs["guidance_scale_2"] = req.sampler.guidance_scale_2
    pipe.set_progress_bar_config(disable=True)
    frames: np.ndarray = pipe(**kwargs, **more).frames[0]
    return frames


def keyframe(seed: int, size: tuple[int, int] = (32, 32)) -> np.ndarray:
    """A random uint8 H×W×3 keyframe of ``size`` (width, height)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)


def source_clip(fps: float, frames: int = 9, size: tuple[int, int] = (48, 40)) -> MediaReference:
    """A decoded source clip as the executor hands it over (another size than the job's)."""
    video = np.stack([keyframe(30 + i, size) for i in range(frames)])
    return MediaReference(kind="video", frames=video, fps=fps)


def assert_same_frames(frames: np.ndarray, media: Media, ref: np.ndarray) -> None:
    """Bit-equal float frames, and the uint8 media those frames make."""
    np.testing.assert_array_equal(frames, ref)
    np.testing.assert_array_equal(media.frames, to_uint8(ref))


def warm_up_state(adapter: Any, num_frames: int = 9) -> Any:
    """What ``prepare`` makes of the adapter's own warm-up job at 32x32 (the entry's first
    workflow's), without stepping it."""
    request = adapter._warm_up_request(WarmupShape(width=32, height=32, num_frames=num_frames))
    return adapter._prepare(adapter._loaded(), request)


def step_in_turn(adapter: Any, requests: list[GenerationRequest]) -> list[Any]:
    """The jobs prepared together and stepped one step each in turn until all are done:
    their states, for the caller to decode."""
    states = [adapter.prepare(r) for r in requests]
    while not all(s.done for s in states):
        for s in states:
            if not s.done:
                adapter.step(s)
    return states


def blocks_asked_before_cancel(adapter: Any, state: StepState, cancel_at: int) -> list[int]:
    """One step of ``state`` whose stop gate cancels (``JobLost``) before block
    ``cancel_at``: the blocks the gate was asked about, the step raising as a cancel does;
    the adapter's ``end`` after it."""
    asked: list[int] = []

    def stop(block: int) -> BaseException | None:
        asked.append(block)
        return JobLost() if block == cancel_at else None

    with pytest.raises(JobLost), step_stops(stop):
        adapter.step(state)
    adapter.end()
    return asked


def assert_tier_leaves_no_trace(
    adapter: DiffusersAdapter,
    fresh: Callable[[], DiffusersAdapter],
    request: GenerationRequest,
    fast: GenerationRequest,
) -> None:
    """A ``fast`` (cache tier) job, then ``request`` (lossless) on the same adapter: the
    latter's frames are a fresh adapter's, and the tier did skip work."""
    fast_frames = job_frames(adapter, fast)
    lossless = job_frames(adapter, request)
    np.testing.assert_array_equal(lossless, job_frames(fresh(), request))
    assert np.abs(fast_frames - lossless).max() > 1e-4


def with_lora_alone(pipe: Any, path: Any) -> Any:
    """``pipe`` with the LoRA at ``path`` loaded and set as its only adapter (scale 1), as
    diffusers' own ``load_lora_weights`` + ``set_adapters`` do it."""
    pipe.load_lora_weights(str(path), adapter_name="only")
    pipe.set_adapters(["only"], [1.0])
    return pipe


def assert_refused(adapter: Any, request: GenerationRequest, param: str) -> None:
    """``prepare`` refuses the job with an ``InvalidJobInput`` naming ``param``."""
    with pytest.raises(InvalidJobInput) as err:
        adapter.prepare(request)
    assert err.value.param == param


def assert_takes_no_reference(adapter: Any, *requests: GenerationRequest) -> None:
    """A text-to-video entry: the adapter takes no reference, and ``prepare`` refuses each
    of ``requests`` (each bringing a keyframe or a source video), saying so."""
    assert not adapter.takes_references
    for request in requests:
        with pytest.raises(InvalidJobInput, match="does not take an input_reference"):
            adapter.prepare(request)


def assert_keyframe_refusals(refusals: list[tuple[ModelSpec, dict[str, Any], int, str]]) -> None:
    """Each ``(spec, extra_params, files, param)``: ``keyframe_workflow`` refuses the
    request with an ``InvalidRequest`` naming ``param``."""
    for spec, extra, files, param in refusals:
        with pytest.raises(InvalidRequest) as err:
            keyframe_workflow(spec, extra, files)
        assert err.value.param == param


@contextmanager
def fresh_dynamo() -> Iterator[None]:
    """Dynamo's caches reset before and after: compiled-block tests count their graphs."""
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()
