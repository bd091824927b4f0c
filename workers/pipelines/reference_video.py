"""``reference/video``: procedural text/image-to-video with no learned weights.

It exists so the whole system (API, broker, step executor, cancel, previews, encoding,
storage) can run, be tested and be benchmarked anywhere: CPU only, nothing to download.
It does not understand language; prompt words are hashed into a scene.

* ``prepare`` builds a scene from prompt and seed: sky, sun or moon (stars at night),
  terrain (sea, hills, forest, mountains, dunes), a main shape on a motion path and a few
  small shapes; colour and setting words ("red", "sunset", "ocean", "night", ...) pick
  the palette, the seed varies the layout. A ``reference_image`` becomes the background
  (frame 0 equals it). The clean video is rendered once (vectorised torch ops), kept as
  uint8 and, 2x average-pooled, as the latent target (the pooling stands in for a VAE).
  Latents start as Gaussian noise from a ``torch.Generator`` seeded with the seed.
* ``step`` is one flow-matching Euler step ``x <- x + (s_next - s) * (x - x0_hat) / s``
  on a shifted sigma schedule from 1 to 0; the "denoiser" ``x0_hat`` is the target
  blurred by the next noise level, so states go noise -> blur -> sharp and the last step
  lands exactly on the target (also with a single step).
* ``decode`` upsamples the latents 2x, adds the full-resolution detail band, and makes
  stereo audio: chords picked from the prompt (minor for dark words), bass, and an
  arpeggio panned with the main shape's position on screen.

Extras: ``motion`` (speed multiplier in [0, 10], default 1) and ``camera`` ("static",
"pan", "zoom"; default "pan"). ``guidance_scale`` (None: neutral) grades mildly: above 5
more saturation and contrast, below 5 less (at most 30 %). ``negative_prompt`` words are
dropped from the prompt. Same request and seed give bit-identical frames and audio
(on one machine and torch thread count: SIMD paths may round differently elsewhere).

Scene, renderer, soundtrack and the stand-in latent space are the public
``workers/pipelines/procedural/``, shared with ``reference/world``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from models.catalog import REFERENCE_VIDEO
from models.errors import InvalidJobInput
from workers.pipelines import procedural as proc
from workers.pipelines.base import (
    GenerationRequest,
    Media,
    NoWeights,
    Pipeline,
    StepState,
    checkpoint,
)
from workers.pipelines.procedural import SAMPLE_RATE

_SHIFT = 3.0  # timestep shift of the sigma schedule, as in SD3/Wan flow-matching schedulers
_CAMERAS = ("static", "pan", "zoom")
_U64 = 2**64 - 1


@dataclass(kw_only=True)
class ReferenceVideoState(StepState):
    """Per-request sampler state: scene, target, latents, sigma schedule, RNG."""

    scene: proc.Scene
    target: torch.Tensor  # uint8 Tx3xHxW: the clean full-resolution render
    clean: torch.Tensor  # the target in latent space (Tx3x(H/2)x(W/2), [-1, 1])
    mean: torch.Tensor  # 1x3x1x1 mean colour of ``clean``
    latents: torch.Tensor  # like ``clean``; Gaussian noise at step 0
    sigmas: torch.Tensor  # num_steps + 1 values from 1 down to 0 (float64)
    timesteps: torch.Tensor  # sigmas[:-1] * 1000
    generator: torch.Generator
    x0_preview: torch.Tensor | None = None  # 3xhxw middle frame of the last x0_hat


class ReferenceVideoPipeline(NoWeights, Pipeline):
    """Procedural video and audio reached by a flow-matching Euler sampler loop."""

    spec = REFERENCE_VIDEO

    # The CPU until ``load`` selects a device (there are no weights to move).
    _device = torch.device("cpu")

    def load(self, device: str) -> None:
        """Select the device (``cpu`` or ``cuda[:n]``); there are no weights."""
        self._device = proc.select_device(device)

    def prepare(self, request: GenerationRequest) -> ReferenceVideoState:
        """Build and render the scene, encode it to latent space, draw the noise."""
        motion, camera = _validate(request)
        scene = proc.build_scene(request, motion, camera, self._device)
        t, h, w = request.num_frames, request.height, request.width
        target = torch.empty((t, 3, h, w), dtype=torch.uint8, device=self._device)
        clean = torch.empty((t, 3, (h + 1) // 2, (w + 1) // 2), device=self._device)
        for start, stop in proc.chunks(t, h * w, proc.RENDER_BUDGET):
            checkpoint()
            target[start:stop] = proc.render(scene, start, stop, self._device).mul_(255).round_()
            clean[start:stop] = proc.encode(target[start:stop])
        generator = torch.Generator(device="cpu").manual_seed(request.seed & _U64)
        noise = torch.randn(clean.shape, generator=generator).to(self._device)
        sigmas = proc.shifted_sigmas(request.num_inference_steps, _SHIFT)
        return ReferenceVideoState(
            num_steps=request.num_inference_steps,
            scene=scene,
            target=target,
            clean=clean,
            mean=clean.mean(dim=(0, 2, 3), keepdim=True),
            latents=noise,
            sigmas=sigmas,
            timesteps=sigmas[:-1] * 1000,
            generator=generator,
        )

    def step(self, state: StepState) -> None:
        """One Euler step from sigma to sigma_next (chunked over frames)."""
        st = _as_state(state)
        if st.done:
            raise RuntimeError("all denoise steps have already run")
        middle = st.latents.shape[0] // 2
        st.x0_preview = proc.euler_step(
            st.latents, st.clean, st.mean, st.sigmas, st.step_index, keep=middle
        )
        st.step_index += 1

    def decode(self, state: StepState) -> Media:
        """Upsample the latents, add full-resolution detail, synthesise the audio."""
        st = _as_state(state)
        t, _, h, w = st.target.shape
        detail = 1.0 - float(st.sigmas[st.step_index])  # 1 once all steps have run
        frames = np.empty((t, h, w, 3), dtype=np.uint8)
        for start, stop in proc.chunks(t, h * w, proc.RENDER_BUDGET):
            checkpoint()
            full = st.target[start:stop].float() / 127.5 - 1
            out = proc.upsample(st.latents[start:stop], h, w)
            # clean == proc.encode(full)
            out += detail * (full - proc.upsample(st.clean[start:stop], h, w))
            frames[start:stop] = proc.to_uint8(out).permute(0, 2, 3, 1).cpu().numpy()
        checkpoint()
        audio = proc.soundtrack(st.scene, round(t / st.scene.fps * SAMPLE_RATE))
        return Media(frames=frames, fps=st.scene.fps, audio=audio, sample_rate=SAMPLE_RATE)

    def preview(self, state: StepState) -> np.ndarray:
        """Middle frame of the current x0 estimate (noise before step 1), side <= 256."""
        st = _as_state(state)
        img = st.x0_preview if st.x0_preview is not None else st.latents[len(st.latents) // 2]
        h, w = img.shape[-2:]
        if max(h, w) > 256:
            size = (max(1, h * 256 // max(h, w)), max(1, w * 256 // max(h, w)))
            img = F.interpolate(img[None], size=size, mode="area")[0]
        return proc.to_uint8(img).permute(1, 2, 0).cpu().numpy()


def _as_state(state: StepState) -> ReferenceVideoState:
    if not isinstance(state, ReferenceVideoState):
        raise TypeError(f"expected ReferenceVideoState, got {type(state).__name__}")
    return state


def _validate(req: GenerationRequest) -> tuple[float, str]:
    """Check the request; return the ``motion`` and ``camera`` extras."""
    for key in req.extra:
        if key not in REFERENCE_VIDEO.extra_params:
            raise InvalidJobInput(f"extra parameter {key!r} is not supported by reference/video")
    motion, camera = req.extra.get("motion", 1.0), req.extra.get("camera", "pan")
    if isinstance(motion, bool) or not isinstance(motion, int | float) or not 0 <= motion <= 10:
        raise InvalidJobInput(
            f"extra parameter 'motion' must be a number in [0, 10], got {motion!r}"
        )
    if not isinstance(camera, str) or camera not in _CAMERAS:
        raise InvalidJobInput(f"extra parameter 'camera' must be one of {_CAMERAS}, got {camera!r}")
    if min(req.width, req.height) < 2 or min(req.num_frames, req.num_inference_steps) < 1:
        raise InvalidJobInput("need width, height >= 2 and num_frames, num_inference_steps >= 1")
    if not req.fps > 0:
        raise InvalidJobInput(f"fps must be positive, got {req.fps}")
    img, shape = req.reference_image, (req.height, req.width, 3)
    if img is not None and (img.dtype != np.uint8 or img.shape != shape):
        raise InvalidJobInput(f"reference_image must be uint8 {shape}, got {img.dtype} {img.shape}")
    return float(motion), camera
