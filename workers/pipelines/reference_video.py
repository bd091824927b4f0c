"""``reference/video``: a procedural text/image-to-video pipeline with no learned weights.

What it is: a stand-in model that runs anywhere (CPU, no downloads) and behaves like a
real video diffusion pipeline from the queue's point of view, so the whole system —
API, broker, step executor, cancel, previews, encoding, storage — can be run, tested
and benchmarked without a GPU model. It does not understand language: it hashes prompt
words into a scene.

How it works:

* ``prepare`` turns the prompt (and seed) into a scene: sky gradient, sun or moon and
  stars, a terrain (sea, hills, forest, mountains, dunes, city), a main shape with a
  motion path (bounce, orbit, drift, roll) and a few smaller ones. Colour and setting
  words ("red", "blue", "sunset", "ocean", "forest", "night", …) pick the palette; the
  seed varies the layout. It renders the clean scene, stores it at latent resolution
  (width/2 × height/2, standing in for a VAE) and draws Gaussian-noise latents from a
  ``torch.Generator`` seeded with ``request.seed``. With ``reference_image`` the image
  is the background (frame 0 equals it) and camera motion and shapes evolve from it.
* ``step`` is one flow-matching Euler step ``x ← x + (σ_next − σ)·v`` with
  ``v = (x − x̂0)/σ`` on a shifted σ schedule from 1 to 0. The "denoiser" x̂0 is the
  clean scene blurred coarse-to-fine by the target noise level ``σ_next`` (and pulled
  toward its mean colour), so intermediate states go from noise through blur to sharp
  and the last step lands exactly on the scene (also with one step).
* ``decode`` upsamples the latents 2× and adds the high-frequency band of a
  full-resolution render of the same scene (the "decoder"), and synthesises a stereo
  soundtrack: a chord progression chosen from the prompt, a bass line and an arpeggio
  panned with the main shape's on-screen position.

Extras: ``motion`` (speed multiplier, 0–10, default 1.0) and ``camera`` ("static",
"pan", "zoom"; default "pan"). ``guidance_scale`` (None = neutral) mildly grades the
picture: above 5 raises saturation and contrast, below 5 softens them (±30 % at most).
Colour words in ``negative_prompt`` are ignored in the prompt. Same request and seed
give bit-identical frames and audio on the same machine and thread count.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from models.catalog import REFERENCE_VIDEO
from workers.pipelines.base import GenerationRequest, Media, Pipeline, StepState

SAMPLE_RATE = 48_000
_SHIFT = 3.0  # flow-matching timestep shift, as in SD3/Wan-style schedulers
_CAMERAS = ("static", "pan", "zoom")
_MAX_MOTION = 10.0
_RENDER_BUDGET = 4_000_000  # pixels per render chunk (bounds temporaries)
_STEP_BUDGET = 8_000_000  # latent elements per step chunk

Colour = tuple[float, float, float]
_COLOURS: dict[str, Colour] = {
    "red": (0.9, 0.15, 0.12), "orange": (1.0, 0.55, 0.1), "yellow": (1.0, 0.85, 0.15),
    "green": (0.2, 0.75, 0.25), "blue": (0.15, 0.35, 0.9), "purple": (0.55, 0.25, 0.75),
    "violet": (0.55, 0.25, 0.75), "pink": (1.0, 0.45, 0.7), "white": (0.95, 0.95, 0.95),
    "black": (0.06, 0.06, 0.07), "gray": (0.5, 0.5, 0.52), "grey": (0.5, 0.5, 0.52),
    "brown": (0.5, 0.3, 0.15), "gold": (1.0, 0.78, 0.2), "golden": (1.0, 0.78, 0.2),
    "silver": (0.78, 0.8, 0.85), "cyan": (0.1, 0.75, 0.8), "teal": (0.1, 0.6, 0.6),
    "magenta": (0.9, 0.2, 0.75),
}  # fmt: skip
_BRIGHT: list[Colour] = [
    (0.95, 0.3, 0.2), (1.0, 0.75, 0.15), (0.25, 0.8, 0.4), (0.2, 0.5, 1.0),
    (0.8, 0.35, 0.9), (1.0, 0.5, 0.7), (0.1, 0.8, 0.85), (1.0, 0.6, 0.2),
]  # fmt: skip
_SKIES: dict[str, tuple[Colour, Colour]] = {
    "day": ((0.25, 0.5, 0.9), (0.72, 0.86, 1.0)),
    "sunset": ((0.28, 0.18, 0.45), (1.0, 0.55, 0.25)),
    "night": ((0.01, 0.02, 0.08), (0.07, 0.1, 0.25)),
}
_NIGHT = {"night", "midnight", "stars", "starry", "space", "moon", "moonlight", "dark"}
_SUNSET = {"sunset", "sunrise", "dusk", "dawn", "twilight", "evening"}
_DARK = _NIGHT | {"rain", "sad", "storm", "gloomy", "fog", "winter", "cold"}
_SNOW = {"snow", "snowy", "winter", "ice", "icy", "arctic"}
_TERRAIN_WORDS = {
    **dict.fromkeys(("ocean", "sea", "beach", "water", "lake", "waves", "river", "bay"), "sea"),
    **dict.fromkeys(("forest", "tree", "trees", "woods", "jungle", "park"), "forest"),
    **dict.fromkeys(("mountain", "mountains", "peaks", "alps", "snow"), "mountains"),
    **dict.fromkeys(("desert", "sand", "dunes", "dune"), "dunes"),
    **dict.fromkeys(("city", "street", "town", "buildings", "skyline"), "city"),
    **dict.fromkeys(("hill", "hills", "meadow", "field", "grass", "valley"), "hills"),
}
_GROUND: dict[str, Colour] = {
    "sea": (0.08, 0.3, 0.6), "forest": (0.1, 0.35, 0.15), "mountains": (0.42, 0.42, 0.52),
    "dunes": (0.85, 0.68, 0.42), "city": (0.28, 0.28, 0.34), "hills": (0.3, 0.6, 0.25),
}  # fmt: skip
_ROUND = {"ball", "balls", "sphere", "circle", "orb", "planet", "bubble", "bubbles",
          "balloon", "balloons", "wheel", "coin", "dot", "marble", "apple"}  # fmt: skip
_BOXY = {"box", "boxes", "cube", "cubes", "square", "block", "blocks", "car", "cars", "truck",
         "house", "crate", "card", "brick", "robot", "train", "bus", "boat", "kite"}  # fmt: skip
_CREATURES = {"cat", "dog", "bird", "fish", "fox", "person", "man", "woman", "child",
              "dragon", "butterfly", "bee", "rabbit", "horse"}  # fmt: skip
_MOTIONS = (("bounc", "bounce"), ("jump", "bounce"), ("hop", "bounce"), ("orbit", "orbit"),
            ("circl", "orbit"), ("spin", "orbit"), ("swirl", "orbit"), ("danc", "orbit"),
            ("fly", "drift"), ("flies", "drift"), ("float", "drift"), ("drift", "drift"),
            ("hover", "drift"), ("swim", "drift"), ("glid", "drift"), ("roll", "roll"),
            ("driv", "roll"), ("run", "roll"), ("walk", "roll"), ("slid", "roll"),
            ("rac", "roll"))  # fmt: skip
_PATHS = ("bounce", "orbit", "drift", "roll")
_MAJOR = ((0, (0, 4, 7)), (7, (0, 4, 7)), (9, (0, 3, 7)), (5, (0, 4, 7)))  # I V vi IV
_MINOR = ((0, (0, 3, 7)), (8, (0, 4, 7)), (3, (0, 4, 7)), (10, (0, 4, 7)))  # i VI III VII
_ARPS = ((0, 1, 2, 3), (0, 2, 1, 3), (0, 1, 2, 1), (3, 2, 1, 0))


@dataclass
class _Shape:
    kind: str  # "circle" | "rect"
    colour: Colour
    size: float
    path: str  # one of _PATHS
    cx: float
    cy: float
    ax: float
    ay: float
    phase: float
    spin: float = 0.0


@dataclass
class _Scene:
    """Everything needed to render any frame of one request (per-request, never shared)."""

    width: int
    height: int
    num_frames: int
    fps: float
    motion: float
    camera: str
    sky: tuple[Colour, Colour]
    ground: Colour
    horizon: float
    terrain: str
    terrain_phase: float
    night: bool
    orb: tuple[float, float, float, Colour, float]  # x, y, radius, colour, glow
    orb_sink: float
    shapes: list[_Shape]
    saturation: float
    contrast: float
    root_midi: int
    minor: bool
    arp: tuple[int, ...]
    image: torch.Tensor | None = None  # 1×3×H×W in [0, 1] for image-to-video

    @property
    def aspect(self) -> float:
        return self.width / self.height


@dataclass(kw_only=True)
class ReferenceVideoState(StepState):
    """Per-request sampler state: scene, latents, clean target, σ schedule, RNG."""

    scene: _Scene
    latents: torch.Tensor  # T×3×h×w at latent (half) resolution, in [-1, 1] when clean
    clean: torch.Tensor  # the scene at latent resolution (the denoiser's target)
    mean: torch.Tensor  # 1×3×1×1 mean colour of ``clean``
    sigmas: torch.Tensor  # num_steps + 1 values from 1 to 0 (float64)
    timesteps: torch.Tensor  # sigmas[:-1] × 1000
    generator: torch.Generator
    x0_preview: torch.Tensor | None = field(default=None)  # 3×h×w middle frame of x̂0


class ReferenceVideoPipeline(Pipeline):
    """Procedural video + audio reached by a real flow-matching Euler sampler loop."""

    spec = REFERENCE_VIDEO

    def __init__(self) -> None:
        self._device = torch.device("cpu")

    def load(self, device: str) -> None:
        """Select the device; there are no weights to load."""
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"unsupported device {device!r} (use 'cpu' or 'cuda[:n]')")
        self._device = dev

    def prepare(self, request: GenerationRequest) -> ReferenceVideoState:
        """Build the scene, render its clean latents, draw the initial noise."""
        motion, camera = _parse_extra(request.extra)
        _check_request(request)
        scene = _build_scene(request, motion, camera, self._device)
        t, h, w = request.num_frames, request.height, request.width
        lh, lw = (h + 1) // 2, (w + 1) // 2
        clean = torch.empty((t, 3, lh, lw), device=self._device)
        for start, stop in _chunks(t, h * w, _RENDER_BUDGET):
            full = _render(scene, start, stop, h, w, self._device) * 2 - 1
            clean[start:stop] = F.adaptive_avg_pool2d(full, (lh, lw))
        generator = torch.Generator(device="cpu").manual_seed(request.seed & (2**64 - 1))
        noise = torch.randn((t, 3, lh, lw), generator=generator).to(self._device)
        sigmas = torch.linspace(1.0, 0.0, request.num_inference_steps + 1, dtype=torch.float64)
        sigmas = _SHIFT * sigmas / (1 + (_SHIFT - 1) * sigmas)
        return ReferenceVideoState(
            num_steps=request.num_inference_steps,
            scene=scene,
            latents=noise,
            clean=clean,
            mean=clean.mean(dim=(0, 2, 3), keepdim=True),
            sigmas=sigmas,
            timesteps=sigmas[:-1] * 1000,
            generator=generator,
        )

    def step(self, state: StepState) -> None:
        """One Euler step from σ to σ_next, chunked over frames."""
        st = _as_state(state)
        if st.done:
            raise RuntimeError("all denoise steps have already run")
        sigma = float(st.sigmas[st.step_index])
        sigma_next = float(st.sigmas[st.step_index + 1])
        _, _, lh, lw = st.latents.shape
        level = sigma_next * max(0.0, math.log2(min(lh, lw)) - 1)
        mid = st.latents.shape[0] // 2
        for start, stop in _chunks(st.latents.shape[0], 3 * lh * lw, _STEP_BUDGET):
            x = st.latents[start:stop]
            x0 = _blur(st.clean[start:stop], level)
            x0 = st.mean + (x0 - st.mean) * (1 - 0.5 * sigma_next)
            if sigma_next == 0.0:
                x.copy_(x0)  # x + (0 - σ)(x - x̂0)/σ == x̂0, without rounding error
            else:
                x.add_((x - x0).mul_((sigma_next - sigma) / sigma))
            if start <= mid < stop:
                st.x0_preview = x0[mid - start].clone()
        st.step_index += 1

    def decode(self, state: StepState) -> Media:
        """Upsample the latents, add full-resolution detail, synthesise the audio."""
        st = _as_state(state)
        sc = st.scene
        t, h, w = sc.num_frames, sc.height, sc.width
        lh, lw = st.latents.shape[-2:]
        detail = 1.0 - float(st.sigmas[min(st.step_index, st.num_steps)])
        frames = np.empty((t, h, w, 3), dtype=np.uint8)
        for start, stop in _chunks(t, h * w, _RENDER_BUDGET):
            full = _render(sc, start, stop, h, w, st.latents.device) * 2 - 1
            low = F.adaptive_avg_pool2d(full, (lh, lw))
            out = _upsample(st.latents[start:stop], h, w)
            out += detail * (full - _upsample(low, h, w))
            frames[start:stop] = _to_uint8(out).permute(0, 2, 3, 1).cpu().numpy()
        n_samples = round(t / sc.fps * SAMPLE_RATE)
        return Media(frames=frames, fps=sc.fps, audio=_soundtrack(sc, n_samples),
                     sample_rate=SAMPLE_RATE)  # fmt: skip

    def preview(self, state: StepState) -> np.ndarray:
        """Middle frame of the current x̂0 (noise before the first step), side ≤ 256."""
        st = _as_state(state)
        img = st.x0_preview if st.x0_preview is not None else st.latents[st.latents.shape[0] // 2]
        h, w = img.shape[-2:]
        scale = min(1.0, 256 / max(h, w))
        if scale < 1.0:
            size = (max(1, round(h * scale)), max(1, round(w * scale)))
            img = F.interpolate(img[None], size=size, mode="area")[0]
        return _to_uint8(img).permute(1, 2, 0).cpu().numpy()


def _as_state(state: StepState) -> ReferenceVideoState:
    if not isinstance(state, ReferenceVideoState):
        raise TypeError(f"expected ReferenceVideoState, got {type(state).__name__}")
    return state


def _parse_extra(extra: dict[str, object]) -> tuple[float, str]:
    for key in extra:
        if key not in REFERENCE_VIDEO.extra_params:
            raise ValueError(f"extra parameter {key!r} is not supported by reference/video")
    motion = extra.get("motion", 1.0)
    if (isinstance(motion, bool) or not isinstance(motion, int | float)
            or not 0.0 <= motion <= _MAX_MOTION):  # fmt: skip
        raise ValueError(f"extra parameter 'motion' must be a number in [0, 10], got {motion!r}")
    camera = extra.get("camera", "pan")
    if not isinstance(camera, str) or camera not in _CAMERAS:
        raise ValueError(f"extra parameter 'camera' must be one of {_CAMERAS}, got {camera!r}")
    return float(motion), camera


def _check_request(req: GenerationRequest) -> None:
    if req.width < 2 or req.height < 2 or req.num_frames < 1:
        raise ValueError(f"bad size {req.width}x{req.height}x{req.num_frames}")
    if req.num_inference_steps < 1 or not req.fps > 0:
        raise ValueError("num_inference_steps must be >= 1 and fps > 0")
    img = req.reference_image
    if img is not None and (img.dtype != np.uint8 or img.shape != (req.height, req.width, 3)):
        raise ValueError(f"reference_image must be uint8 {(req.height, req.width, 3)}, "
                         f"got {img.dtype} {img.shape}")  # fmt: skip


def _chunks(total: int, per_item: int, budget: int) -> list[tuple[int, int]]:
    step = max(1, budget // max(1, per_item))
    return [(s, min(total, s + step)) for s in range(0, total, step)]


def _upsample(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    return ((x + 1) * 127.5).round_().clamp_(0, 255).to(torch.uint8)


def _blur(x: torch.Tensor, level: float) -> torch.Tensor:
    """Coarse-to-fine blur: down/up-sample by 2**level (fractional levels blend two)."""
    if level <= 0:
        return x
    k = math.floor(level)
    a = _down_up(x, 2**k)
    return torch.lerp(a, _down_up(x, 2 ** (k + 1)), level - k) if level > k else a


def _down_up(x: torch.Tensor, factor: int) -> torch.Tensor:
    if factor <= 1:
        return x
    h, w = x.shape[-2:]
    small = F.adaptive_avg_pool2d(x, (max(1, round(h / factor)), max(1, round(w / factor))))
    return _upsample(small, h, w)


# --- scene --------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _build_scene(req: GenerationRequest, motion: float, camera: str,
                 device: torch.device) -> _Scene:  # fmt: skip
    """Hash the prompt words (and the seed) into a renderable scene."""
    banned = set(_words(req.negative_prompt or ""))
    words = [w for w in _words(req.prompt) if w not in banned]
    key = int.from_bytes(hashlib.blake2b(" ".join(words).encode(), digest_size=8).digest(), "big")
    rng = random.Random(key ^ (req.seed & (2**64 - 1)))
    vocab, aspect = set(words), req.width / req.height
    mood = "night" if vocab & _NIGHT else "sunset" if vocab & _SUNSET else "day"
    top, bottom = (_jitter(c, rng) for c in _SKIES[mood])
    terrain_word = next((w for w in words if w in _TERRAIN_WORDS), None)
    terrain = _TERRAIN_WORDS[terrain_word] if terrain_word else rng.choice(list(_GROUND))

    paired: dict[str, Colour] = {}  # noun -> colour word right before it
    loose: list[Colour] = []
    nouns = _ROUND | _BOXY | _CREATURES | set(_TERRAIN_WORDS) | {"sky"}
    for i, w in enumerate(words):
        if w in _COLOURS:
            target = next((n for n in words[i + 1 : i + 3] if n in nouns), None)
            if target is not None and target not in paired:
                paired[target] = _COLOURS[w]
            else:
                loose.append(_COLOURS[w])
    if "sky" in paired:
        top, bottom = _mix(top, paired["sky"], 0.6), _mix(bottom, paired["sky"], 0.4)
    ground = _GROUND[terrain]
    if vocab & _SNOW and terrain != "sea":
        ground = (0.88, 0.91, 0.96)
    if terrain_word in paired:
        ground = paired[terrain_word]
    if mood == "night":
        ground = _mix(_scale(ground, 0.3), (0.02, 0.03, 0.1), 0.3)
    elif mood == "sunset":
        ground = _scale(_mix(ground, bottom, 0.3), 0.8)

    horizon = rng.uniform(0.55, 0.65)
    floor = horizon + (1 - horizon) * 0.6
    noun = next((w for w in words if w in _ROUND | _BOXY | _CREATURES), None)
    kind = "circle" if noun in _ROUND else "rect" if noun in _BOXY else rng.choice(["circle", "rect"])
    colour = paired.get(noun or "") or (loose.pop(0) if loose else rng.choice(_BRIGHT))
    path = next((p for w in words for stem, p in _MOTIONS if w.startswith(stem)), None)
    path = path or rng.choice(_PATHS)
    size = rng.uniform(0.085, 0.11)
    cx, phase = aspect * rng.uniform(0.4, 0.6), rng.uniform(0, 2 * math.pi)
    spin = rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.2) if path == "orbit" else 0.0
    geometry = {
        "bounce": (floor - size, 0.22 * aspect, min(0.32, floor - size - 0.12)),
        "orbit": (0.42, 0.22 * aspect, 0.14),
        "drift": (rng.uniform(0.3, 0.45), 0.25 * aspect, 0.05),
        "roll": (floor - size, 0.25 * aspect, 0.0),
    }
    cy, ax, ay = geometry[path]
    shapes = []
    for _ in range(rng.randint(1, 3)):
        shapes.append(_Shape(
            kind=rng.choice(["circle", "rect"]),
            colour=loose.pop(0) if loose else rng.choice(_BRIGHT),
            size=rng.uniform(0.025, 0.05), path=rng.choice(["drift", "orbit"]),
            cx=aspect * rng.uniform(0.15, 0.85), cy=rng.uniform(0.15, horizon - 0.08),
            ax=aspect * rng.uniform(0.05, 0.15), ay=rng.uniform(0.02, 0.06),
            phase=rng.uniform(0, 2 * math.pi), spin=rng.uniform(-1.5, 1.5),
        ))  # fmt: skip
    shapes.append(_Shape(kind, colour, size, path, cx, cy, ax, ay, phase, spin))  # main, on top

    if mood == "night":
        orb = (aspect * rng.uniform(0.15, 0.35), 0.18, 0.05, (0.92, 0.92, 0.85), 0.15)
    elif mood == "sunset":
        orb = (aspect * rng.uniform(0.3, 0.7), horizon - 0.07, 0.09, (1.0, 0.6, 0.3), 0.6)
    else:
        orb = (aspect * rng.uniform(0.65, 0.85), rng.uniform(0.12, 0.2), 0.06,
               (1.0, 0.95, 0.75), 0.35)  # fmt: skip
    g = 0.0 if req.guidance_scale is None else max(-0.3, min(0.3, (req.guidance_scale - 5) / 10))
    image = None
    if req.reference_image is not None:
        image = torch.from_numpy(req.reference_image).to(device).permute(2, 0, 1)[None] / 255.0
    return _Scene(
        width=req.width, height=req.height, num_frames=req.num_frames, fps=req.fps,
        motion=motion, camera=camera, sky=(top, bottom), ground=ground, horizon=horizon,
        terrain=terrain, terrain_phase=rng.uniform(0, 100), night=mood == "night", orb=orb,
        orb_sink=0.004 if mood == "sunset" else 0.0, shapes=shapes, saturation=1 + g,
        contrast=1 + g / 2, root_midi=45 + key % 8, minor=bool(vocab & _DARK),
        arp=rng.choice(_ARPS), image=image,
    )  # fmt: skip


def _jitter(c: Colour, rng: random.Random) -> Colour:
    r, g, b = (min(1.0, max(0.0, v + rng.uniform(-0.04, 0.04))) for v in c)
    return (r, g, b)


def _mix(a: Colour, b: Colour, t: float) -> Colour:
    return (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t, a[2] + (b[2] - a[2]) * t)


def _scale(c: Colour, k: float) -> Colour:
    return (c[0] * k, c[1] * k, c[2] * k)


# --- rendering (vectorised over frames × rows × columns) ------------------------------------


def _render(sc: _Scene, start: int, stop: int, h: int, w: int, dev: torch.device) -> torch.Tensor:
    """Frames ``start:stop`` of the scene as T×3×h×w floats in [0, 1]."""
    t = torch.arange(start, stop, device=dev, dtype=torch.float32).view(-1, 1, 1) / sc.fps
    tau = t * sc.motion
    a = sc.aspect
    zoom = 1 + 0.3 * torch.sin(math.pi * tau / 20) ** 2 if sc.camera == "zoom" else 1 + 0 * tau
    pan = 0.05 * tau if sc.camera == "pan" else 0 * tau
    xs = (torch.arange(w, device=dev, dtype=torch.float32).view(1, 1, -1) + 0.5) / h
    ys = (torch.arange(h, device=dev, dtype=torch.float32).view(1, -1, 1) + 0.5) / h
    x = (xs - a / 2) / zoom + a / 2  # camera-local world coordinates, height units
    y = (ys - 0.5) / zoom + 0.5
    px = 1 / (h * zoom)  # world units per pixel, for anti-aliased edges
    if sc.image is not None:
        grid = torch.stack(torch.broadcast_tensors(2 * (x + pan) / a - 1, 2 * y - 1), dim=-1)
        image = sc.image.expand(grid.shape[0], -1, -1, -1)
        img = F.grid_sample(image, grid, mode="bilinear", padding_mode="reflection",
                            align_corners=False)  # fmt: skip
        fade = (t / 0.75).clamp(0, 1) ** 2 * (3 - 2 * (t / 0.75).clamp(0, 1))
    else:
        img = _background(sc, x, y, pan, tau, px)
        fade = torch.ones_like(t)
    for shape in sc.shapes:
        img = _draw_shape(img, shape, x, y, tau, px, fade)
    img = img.clamp(0, 1).expand(-1, 3, h, w)
    if sc.saturation != 1 or sc.contrast != 1:
        lum = img.mean(dim=1, keepdim=True)
        graded = ((lum + (img - lum) * sc.saturation - 0.5) * sc.contrast + 0.5).clamp(0, 1)
        img = img + (graded - img) * fade[:, None]
    return img.contiguous()


def _col(c: Colour, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(c, device=like.device, dtype=torch.float32).view(1, 3, 1, 1)


def _over(img: torch.Tensor, colour: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return torch.lerp(img, colour, alpha.unsqueeze(1))


def _disc(d: torch.Tensor, r: float | torch.Tensor, px: torch.Tensor) -> torch.Tensor:
    return (0.5 - (d - r) / px).clamp(0, 1)


def _frac(v: torch.Tensor) -> torch.Tensor:
    return v - torch.floor(v)


def _background(sc: _Scene, x: torch.Tensor, y: torch.Tensor, pan: torch.Tensor,
                tau: torch.Tensor, px: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Sky gradient, stars, sun/moon with glow, terrain silhouette (with parallax)."""
    top, bottom = _col(sc.sky[0], x), _col(sc.sky[1], x)
    img = torch.lerp(top, bottom, (y / sc.horizon).clamp(0, 1).unsqueeze(1) ** 0.8)
    far, near = x + 0.15 * pan, x + pan  # parallax: sky objects move slower than terrain
    if sc.night:
        k = 90.0
        cell = _frac(torch.sin(torch.floor(far * k) * 12.9898 + torch.floor(y * k) * 78.233)
                     * 43758.5453)  # fmt: skip
        dist = torch.sqrt((_frac(far * k) - 0.5) ** 2 + (_frac(y * k) - 0.5) ** 2)
        star = (cell > 0.975) * (1 - dist * 4).clamp(0, 1) * (0.6 + 0.4 * torch.sin(3 * tau + cell * 40))
        img = img + (star * (y < sc.horizon)).unsqueeze(1) * 0.9
    ox, oy, r, colour, glow = sc.orb
    d = torch.sqrt((far - ox) ** 2 + (y - oy - sc.orb_sink * tau) ** 2)
    orb_col = _col(colour, x)
    img = img + orb_col * (glow * torch.exp(-((d / 0.22) ** 2))).unsqueeze(1)
    img = _over(img, orb_col, _disc(d, r, px))

    u, p = near, sc.terrain_phase
    tri = 1 - 2 * (_frac(u * 10 + p) - 0.5).abs()
    heights = {
        "sea": 0 * u,
        "hills": 0.04 * (1 + torch.sin(2.3 * u + p)) + 0.02 * (1 + torch.sin(5.9 * u + 2 * p)),
        "forest": 0.03 + 0.09 * tri * (0.7 + 0.3 * torch.sin(1.7 * u + p)),
        "mountains": 0.02 + 0.28 * (1 - 2 * (_frac(0.9 * u + p) - 0.5).abs()) ** 1.3
        * (0.6 + 0.4 * torch.sin(2.3 * u + p)),
        "dunes": 0.04 * (1 + torch.sin(3.1 * u + p)) * (0.6 + 0.4 * torch.sin(1.3 * u)),
        "city": 0.05 + 0.2 * _frac(torch.sin(torch.floor(u * 9 + p) * 91.7) * 43758.5453),
    }
    surface = sc.horizon - heights[sc.terrain]
    alpha = (0.5 + (y - surface) / px).clamp(0, 1)
    depth = ((y - sc.horizon) / (1 - sc.horizon)).clamp(0, 1).unsqueeze(1)
    ground = _col(sc.ground, x)
    if sc.terrain == "sea":
        wave = torch.sin(40 * depth.sqrt() - 1.5 * tau.unsqueeze(1)
                         + 2 * torch.sin(4 * u + tau).unsqueeze(1))  # fmt: skip
        colour_map = torch.lerp(bottom * 0.85, ground, depth.sqrt()) * (1 + 0.12 * wave)
        glint = torch.exp(-(((far - ox).unsqueeze(1) / (0.02 + 0.1 * depth)) ** 2))
        colour_map = colour_map + orb_col * glint * wave.clamp(0, 1) * 0.5 * glow
    else:
        colour_map = ground * (0.8 + 0.35 * depth)
        if sc.terrain == "mountains":
            snow = ((sc.horizon - y - 0.16) / 0.02).clamp(0, 1).unsqueeze(1)
            colour_map = torch.lerp(colour_map, _col((0.92, 0.94, 0.98), x), snow)
        elif sc.terrain == "city":
            lit = (_frac(u * 70) < 0.45) & (_frac(y * 45) < 0.5) & (y < sc.horizon)
            window = _col((1.0, 0.85, 0.45) if sc.night else (0.75, 0.85, 0.95), x)
            colour_map = torch.lerp(colour_map, window, lit.unsqueeze(1) * 0.6)
    return _over(img, colour_map, alpha)


def _path(s: _Shape, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Position (x, y) and rotation of a shape at times ``tau`` (motion-scaled seconds)."""
    w = 2 * math.pi
    if s.path == "bounce":
        x = s.cx + s.ax * torch.sin(w * 0.11 * tau + s.phase)
        y = s.cy - s.ay * torch.sin(math.pi * 0.8 * tau + s.phase).abs()
    elif s.path == "orbit":
        x = s.cx + s.ax * torch.cos(w * 0.2 * tau + s.phase)
        y = s.cy + s.ay * torch.sin(w * 0.2 * tau + s.phase)
    elif s.path == "drift":
        x = s.cx + s.ax * torch.sin(w * 0.07 * tau + s.phase)
        y = s.cy + s.ay * torch.sin(w * 0.4 * tau + s.phase)
    else:  # roll: along the ground, turning with the distance travelled
        x = s.cx + s.ax * torch.sin(w * 0.09 * tau + s.phase)
        y = s.cy + 0 * tau
        return x, y, (x - s.cx) / s.size
    return x, y, s.spin * tau


def _draw_shape(img: torch.Tensor, s: _Shape, x: torch.Tensor, y: torch.Tensor,
                tau: torch.Tensor, px: torch.Tensor, fade: torch.Tensor) -> torch.Tensor:  # fmt: skip
    sx, sy, angle = _path(s, tau)
    dx, dy = x - sx, y - sy
    r = s.size
    if s.path in ("bounce", "roll"):  # soft contact shadow, fainter while airborne
        lift = ((s.cy - sy) / max(s.ay, 1e-6)).clamp(0, 1)
        e = (dx / (r * 1.3)) ** 2 + ((y - s.cy - r) / (r * 0.25)) ** 2
        shade = (1 - e).clamp(0, 1) * 0.35 * (1 - 0.6 * lift) * fade
        img = img * (1 - shade.unsqueeze(1))
    colour = _col(s.colour, img)
    if s.kind == "circle":
        alpha = _disc(torch.sqrt(dx**2 + dy**2), r, px)
        hl = (torch.sqrt((dx + 0.35 * r) ** 2 + (dy + 0.35 * r) ** 2) / (1.4 * r)).clamp(0, 1)
        fill = colour * (1.25 - 0.55 * hl).unsqueeze(1) + 0.35 * (1 - hl * 2.5).clamp(0, 1).unsqueeze(1)
    else:
        c, si = torch.cos(angle), torch.sin(angle)
        u, v = dx * c + dy * si, dy * c - dx * si
        qx, qy = u.abs() - r * 1.15, v.abs() - r * 0.8
        d = torch.sqrt(qx.clamp(min=0) ** 2 + qy.clamp(min=0) ** 2) + torch.maximum(qx, qy).clamp(max=0)
        alpha = (0.5 - d / px).clamp(0, 1)
        fill = colour * (1.1 - 0.3 * ((v / (r * 0.8) + 1) / 2).clamp(0, 1)).unsqueeze(1)
    return _over(img, fill, alpha * fade)


# --- audio -------------------------------------------------------------------------------


def _soundtrack(sc: _Scene, n: int) -> np.ndarray:
    """Pad chords + bass + arpeggio (panned with the main shape), float32 (2, n) in [-1, 1]."""
    sr = SAMPLE_RATE
    t = np.arange(n, dtype=np.float64) / sr
    chord_len = 2.0 / min(max(sc.motion, 0.5), 2.0)
    prog = _MINOR if sc.minor else _MAJOR
    idx = (t // chord_len).astype(np.int64) % 4
    tc = t % chord_len
    degree = np.array([d for d, _ in prog])[idx]
    triads = np.array([tri for _, tri in prog])[idx]  # n×3 semitones

    def tone(midi: np.ndarray, detune: float = 0.0) -> np.ndarray:
        freq = 440.0 * 2 ** ((midi - 69) / 12) * (1 + detune)
        return 2 * np.pi * np.cumsum(freq) / sr  # continuous phase across note changes

    left, right = np.zeros(n), np.zeros(n)
    for v in range(3):
        midi = sc.root_midi + 12 + degree + triads[:, v]
        for side, detune in ((left, -0.0015), (right, 0.0015)):
            ph = tone(midi, detune)
            side += 0.1 * (np.sin(ph) + 0.25 * np.sin(2 * ph))
    pad_env = np.clip(tc / 0.4, 0, 1) * np.clip((chord_len - tc) / 0.4, 0, 1)
    ph = tone(sc.root_midi + degree)
    bass = 0.25 * (np.sin(ph) + 0.3 * np.sin(2 * ph)) * np.exp(-1.5 * tc)
    bass *= np.clip(tc / 0.01, 0, 1) * np.clip((chord_len - tc) / 0.05, 0, 1)

    beat = chord_len / 4
    tb = t % beat
    order = np.array(sc.arp)[(t // beat).astype(np.int64) % 4]
    tones = np.concatenate([triads, np.full((n, 1), 12)], axis=1)[np.arange(n), order]
    ph = tone(sc.root_midi + 24 + degree + tones)
    arp = 0.2 * (np.sin(ph) + 0.15 * np.sin(3 * ph))
    arp *= (1 - np.exp(-tb / 0.004)) * np.exp(-6 * tb) * np.clip((beat - tb) / 0.01, 0, 1)

    pan = _main_screen_x(sc, t)
    mix = np.stack([left * pad_env + bass + arp * np.cos(pan * np.pi / 2) * np.sqrt(2),
                    right * pad_env + bass + arp * np.sin(pan * np.pi / 2) * np.sqrt(2)])  # fmt: skip
    peak = float(np.abs(mix).max()) if n else 0.0
    if peak > 0:
        mix *= 0.7 / peak
    edge = np.clip(np.minimum(t, t[::-1]) / 0.01, 0, 1) if n else t
    return (mix * edge).astype(np.float32)


def _main_screen_x(sc: _Scene, t: np.ndarray) -> np.ndarray:
    """The main shape's horizontal screen position in [0, 1] at sample times ``t``."""
    if t.size == 0:
        return t
    control = np.arange(0.0, t[-1] + 0.02, 0.01)  # 100 Hz control rate
    tau = torch.from_numpy(control * sc.motion).float()
    x, _, _ = _path(sc.shapes[-1], tau)
    if sc.camera == "zoom":
        x = (x - sc.aspect / 2) * (1 + 0.3 * torch.sin(math.pi * tau / 20) ** 2) + sc.aspect / 2
    screen = (x / sc.aspect).clamp(0, 1).numpy().astype(np.float64)
    return np.interp(t, control, screen)
