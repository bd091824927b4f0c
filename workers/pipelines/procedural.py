"""Procedural scenes and soundtracks: the shared toolkit of the weightless reference models.

``reference/video`` (``reference_video.py``) and ``reference/world`` (``reference_world.py``)
both draw from here; neither imports the other. Nothing here understands language:

* :func:`build_scene` hashes the prompt's words (and the seed) into a :class:`Scene`: sky,
  sun or moon (stars at night), terrain (sea, hills, forest, mountains, dunes), a main
  shape on a motion path and a few small shapes; colour and setting words ("red",
  "sunset", "ocean", "night", ...) pick the palette, the seed varies the layout. A
  ``reference_image`` becomes the background.
* :func:`render` draws frames of a scene with a static, panning or zooming camera;
  :func:`background` and :func:`draw_shape` are its pieces, for renderers with another
  camera (reference/world's).
* :func:`soundtrack` makes stereo music for a scene: chords picked from the prompt (minor
  for dark words), bass, and an arpeggio panned with the main shape's position.
* :func:`encode`, :func:`upsample`, :func:`blur` and :func:`to_uint8` are the stand-in
  latent space (2x average pooling for a VAE), :func:`euler_step` the sampler's step in
  it; :func:`chunks` splits work into bounded pieces (``RENDER_BUDGET``, ``STEP_BUDGET``).

Everything is deterministic: the same inputs give bit-identical outputs (on one machine
and torch thread count).
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from workers.pipelines.base import GenerationRequest

SAMPLE_RATE = 48_000  # of soundtrack()
RENDER_BUDGET = 1_000_000  # pixels per render chunk (bounds temporaries; cancel points)
STEP_BUDGET = 8_000_000  # latent values per step chunk
_U64 = 2**64 - 1

Colour = tuple[float, float, float]
_COLOURS: dict[str, Colour] = {
    "red": (0.9, 0.15, 0.12),
    "orange": (1.0, 0.55, 0.1),
    "yellow": (1.0, 0.85, 0.15),
    "green": (0.2, 0.75, 0.25),
    "blue": (0.15, 0.35, 0.9),
    "purple": (0.55, 0.25, 0.75),
    "pink": (1.0, 0.45, 0.7),
    "white": (0.95, 0.95, 0.95),
    "black": (0.06, 0.06, 0.07),
    "gray": (0.5, 0.5, 0.52),
    "brown": (0.5, 0.3, 0.15),
    "gold": (1.0, 0.78, 0.2),
    "silver": (0.78, 0.8, 0.85),
    "cyan": (0.1, 0.75, 0.8),
    "magenta": (0.9, 0.2, 0.75),
}
_COLOURS |= {"grey": _COLOURS["gray"], "golden": _COLOURS["gold"], "violet": _COLOURS["purple"]}
_BRIGHT: list[Colour] = [
    (0.95, 0.3, 0.2),
    (1.0, 0.75, 0.15),
    (0.25, 0.8, 0.4),
    (0.2, 0.5, 1.0),
    (0.8, 0.35, 0.9),
    (1.0, 0.5, 0.7),
    (0.1, 0.8, 0.85),
    (1.0, 0.6, 0.2),
]
_SKIES: dict[str, tuple[Colour, Colour]] = {  # top and horizon colours
    "day": ((0.25, 0.5, 0.9), (0.72, 0.86, 1.0)),
    "night": ((0.01, 0.02, 0.08), (0.07, 0.1, 0.25)),
    "sunset": ((0.28, 0.18, 0.45), (1.0, 0.55, 0.25)),
}
_GROUND: dict[str, Colour] = {
    "sea": (0.08, 0.3, 0.6),
    "forest": (0.1, 0.35, 0.15),
    "mountains": (0.42, 0.42, 0.52),
    "dunes": (0.85, 0.68, 0.42),
    "hills": (0.3, 0.6, 0.25),
}
_TERRAIN_WORDS = {
    word: terrain
    for terrain, words in {
        "sea": ("ocean", "sea", "beach", "water", "lake", "waves", "river", "bay"),
        "forest": ("forest", "tree", "trees", "woods", "jungle", "park"),
        "mountains": ("mountain", "mountains", "peaks", "alps", "snow"),
        "dunes": ("desert", "sand", "dunes", "dune"),
        "hills": ("hill", "hills", "meadow", "field", "grass", "valley"),
    }.items()
    for word in words
}
_NIGHT = {"night", "midnight", "stars", "starry", "space", "moon", "moonlight", "dark"}
_SUNSET = {"sunset", "sunrise", "dusk", "dawn", "twilight", "evening"}
_DARK = _NIGHT | {"rain", "sad", "storm", "gloomy", "fog", "winter", "cold"}
_ROUND = {
    "ball",
    "balls",
    "sphere",
    "circle",
    "orb",
    "planet",
    "bubble",
    "bubbles",
    "balloon",
    "balloons",
    "wheel",
    "coin",
    "dot",
    "marble",
    "apple",
}
_BOXY = {
    "box",
    "boxes",
    "cube",
    "cubes",
    "square",
    "block",
    "blocks",
    "car",
    "cars",
    "truck",
    "house",
    "crate",
    "card",
    "brick",
    "robot",
    "train",
    "bus",
    "boat",
    "kite",
}
_MOTIONS = {  # verb stem -> path
    **dict.fromkeys(("bounc", "jump", "hop"), "bounce"),
    **dict.fromkeys(("orbit", "circl", "spin", "swirl", "danc"), "orbit"),
    **dict.fromkeys(("fly", "flies", "float", "drift", "hover", "swim", "glid"), "drift"),
    **dict.fromkeys(("roll", "driv", "run", "walk", "slid", "rac"), "roll"),
}
_PATHS = ("bounce", "orbit", "drift", "roll")
_MAJOR = ((0, (0, 4, 7)), (7, (0, 4, 7)), (9, (0, 3, 7)), (5, (0, 4, 7)))  # I V vi IV
_MINOR = ((0, (0, 3, 7)), (8, (0, 4, 7)), (3, (0, 4, 7)), (10, (0, 4, 7)))  # i VI III VII


@dataclass
class Shape:
    kind: str  # "circle" | "rect"
    colour: Colour
    size: float
    path: str  # one of _PATHS
    cx: float
    cy: float
    ax: float
    ay: float
    phase: float
    spin: float


@dataclass
class Scene:
    """Everything needed to render any frame of one request."""

    width: int
    height: int
    aspect: float
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
    shapes: list[Shape]  # the last one is the main shape
    grade: float  # saturation/contrast change from guidance_scale, in [-0.3, 0.3]
    root_midi: int
    minor: bool
    image: torch.Tensor | None  # 1x3xHxW in [0, 1] for image-to-video


def select_device(device: str) -> torch.device:
    """``cpu`` or ``cuda[:n]`` (CUDA must be there) for the weightless reference models."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"unsupported device {device!r}; use 'cpu' or 'cuda[:n]'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)


class OnDevice:
    """The device of a weightless procedural pipeline: the CPU until ``load`` picks one."""

    def __init__(self) -> None:
        self._device = torch.device("cpu")

    def load(self, device: str) -> None:
        """Select the device; there are no weights."""
        self._device = select_device(device)


def shifted_sigmas(steps: int, shift: float) -> torch.Tensor:
    """``steps + 1`` flow-matching noise levels from 1 down to 0 (float64), moved toward
    the noisy end by ``shift`` (``shift·σ / (1 + (shift - 1)·σ)``)."""
    sigmas = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def chunks(total: int, per_item: int, budget: int) -> list[tuple[int, int]]:
    size = max(1, budget // max(1, per_item))
    return [(s, min(total, s + size)) for s in range(0, total, size)]


def encode(target: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> latent space: 2x average pooling, values in [-1, 1]."""
    h, w = target.shape[-2:]
    return F.adaptive_avg_pool2d(target.float() / 127.5 - 1, ((h + 1) // 2, (w + 1) // 2))


def upsample(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    return ((x + 1) * 127.5).round_().clamp_(0, 255).to(torch.uint8)


def blur(x: torch.Tensor, level: float) -> torch.Tensor:
    """Down/up-sample by 2**level (a fractional level blends the two nearest octaves)."""
    h, w = x.shape[-2:]

    def down_up(factor: int) -> torch.Tensor:
        size = (max(1, round(h / factor)), max(1, round(w / factor)))
        return upsample(F.adaptive_avg_pool2d(x, size), h, w) if factor > 1 else x

    k = math.floor(level)
    coarse = down_up(2**k)
    return torch.lerp(coarse, down_up(2 ** (k + 1)), level - k) if level > k else coarse


def euler_step(
    latents: torch.Tensor,
    clean: torch.Tensor,
    mean: torch.Tensor,
    sigmas: torch.Tensor,
    index: int,
    keep: int | None = None,
) -> torch.Tensor | None:
    """One Euler step of ``latents`` (T×3×h×w, in place, chunked over frames) toward
    ``clean`` blurred by ``sigmas[index + 1]``; a copy of frame ``keep``'s x0 estimate."""
    sigma, sigma_next = float(sigmas[index]), float(sigmas[index + 1])
    t, _, lh, lw = latents.shape
    level = sigma_next**2 * max(0.0, math.log2(min(lh, lw)) - 1)  # blur octaves
    kept = None
    for start, stop in chunks(t, 3 * lh * lw, STEP_BUDGET):
        x, x0 = latents[start:stop], clean[start:stop]
        if sigma_next > 0:
            x0 = mean + (blur(x0, level) - mean) * (1 - 0.5 * sigma_next)
            x.add_((x - x0).mul_((sigma_next - sigma) / sigma))
        else:
            x.copy_(x0)  # x + (0 - s) * (x - x0) / s == x0, without rounding error
        if keep is not None and start <= keep < stop:
            kept = x0[keep - start].clone()
    return kept


# --- the scene, from prompt words and seed --------------------------------------------------


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def build_scene(req: GenerationRequest, motion: float, camera: str, device: torch.device) -> Scene:
    banned = set(_words(req.negative_prompt or ""))
    words = [w for w in _words(req.prompt) if w not in banned]
    key = int.from_bytes(hashlib.blake2b(" ".join(words).encode(), digest_size=8).digest(), "big")
    rng = random.Random(key ^ (req.seed & _U64))
    vocab, aspect = set(words), req.width / req.height
    mood = "night" if vocab & _NIGHT else "sunset" if vocab & _SUNSET else "day"
    top, bottom = (_mix(c, (rng.random(), rng.random(), rng.random()), 0.08) for c in _SKIES[mood])
    terrain_word = next((w for w in words if w in _TERRAIN_WORDS), None)
    terrain = _TERRAIN_WORDS[terrain_word] if terrain_word else rng.choice(sorted(_GROUND))

    # A colour word colours the noun right after it ("red ball", "blue ocean", "pink sky").
    paired: dict[str, Colour] = {}
    loose: list[Colour] = []
    nouns = _ROUND | _BOXY | set(_TERRAIN_WORDS) | {"sky"}
    for i, w in enumerate(words):
        if w in _COLOURS:
            noun = next((n for n in words[i + 1 : i + 3] if n in nouns), None)
            if noun is not None and noun not in paired:
                paired[noun] = _COLOURS[w]
            else:
                loose.append(_COLOURS[w])
    if "sky" in paired:
        top, bottom = _mix(top, paired["sky"], 0.6), _mix(bottom, paired["sky"], 0.4)
    ground = paired.get(terrain_word or "", _GROUND[terrain])
    if mood == "night":
        ground = _mix(ground, (0.02, 0.03, 0.12), 0.6)
    elif mood == "sunset":
        ground = _mix(_mix(ground, bottom, 0.3), (0.0, 0.0, 0.0), 0.2)

    horizon = rng.uniform(0.55, 0.65)
    shapes = [
        Shape(
            rng.choice(["circle", "rect"]),
            loose.pop(0) if loose else rng.choice(_BRIGHT),
            rng.uniform(0.025, 0.05),
            rng.choice(["drift", "orbit"]),
            aspect * rng.uniform(0.15, 0.85),
            rng.uniform(0.15, horizon - 0.08),
            aspect * rng.uniform(0.05, 0.15),
            rng.uniform(0.02, 0.06),
            rng.uniform(0, 2 * math.pi),
            rng.uniform(-1.5, 1.5),
        )
        for _ in range(rng.randint(1, 3))
    ]
    shapes.append(_main_shape(words, paired, loose, rng, aspect, horizon))
    orb = {  # x, y, radius, colour, glow of the moon / low sun / high sun
        "night": (aspect * rng.uniform(0.15, 0.35), 0.18, 0.05, (0.92, 0.92, 0.85), 0.15),
        "sunset": (aspect * rng.uniform(0.3, 0.7), horizon - 0.07, 0.09, (1.0, 0.78, 0.45), 0.6),
        "day": (aspect * rng.uniform(0.65, 0.85), 0.16, 0.06, (1.0, 0.95, 0.75), 0.35),
    }[mood]
    grade = 0.0 if req.guidance_scale is None else (req.guidance_scale - 5) / 10
    image = None
    if req.reference_image is not None:  # copied: the caller's array may be read-only
        image = torch.from_numpy(req.reference_image.copy()).to(device).permute(2, 0, 1)[None]
        image = image / 255.0
    return Scene(
        width=req.width,
        height=req.height,
        aspect=aspect,
        fps=req.fps,
        motion=motion,
        camera=camera,
        sky=(top, bottom),
        ground=ground,
        horizon=horizon,
        terrain=terrain,
        terrain_phase=rng.uniform(0, 100),
        night=mood == "night",
        orb=orb,
        shapes=shapes,
        grade=max(-0.3, min(0.3, grade)),
        root_midi=45 + key % 8,
        minor=bool(vocab & _DARK),
        image=image,
    )


def _main_shape(
    words: list[str],
    paired: dict[str, Colour],
    loose: list[Colour],
    rng: random.Random,
    aspect: float,
    horizon: float,
) -> Shape:
    """The subject: first shape-like noun, its colour word, the first motion verb."""
    noun = next((w for w in words if w in _ROUND | _BOXY), "")
    kind = "rect" if noun in _BOXY else "circle" if noun else rng.choice(["circle", "rect"])
    colour = paired.get(noun) or (loose.pop(0) if loose else rng.choice(_BRIGHT))
    path = next((p for w in words for stem, p in _MOTIONS.items() if w.startswith(stem)), None)
    path = path or rng.choice(_PATHS)
    size = rng.uniform(0.085, 0.11)
    rest = horizon + (1 - horizon) * 0.6 - size  # resting on the ground
    cy, ax, ay = {
        "bounce": (rest, 0.22 * aspect, min(0.32, rest - 0.12)),
        "orbit": (0.42, 0.22 * aspect, 0.14),
        "drift": (rng.uniform(0.3, 0.45), 0.25 * aspect, 0.05),
        "roll": (rest, 0.25 * aspect, 0.0),
    }[path]
    spin = rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.2) if path == "orbit" else 0.0
    cx, phase = aspect * rng.uniform(0.4, 0.6), rng.uniform(0, 2 * math.pi)
    return Shape(kind, colour, size, path, cx, cy, ax, ay, phase, spin)


def _mix(a: Colour, b: Colour, t: float) -> Colour:
    return (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t, a[2] + (b[2] - a[2]) * t)


# --- rendering, vectorised over frames x rows x columns -------------------------------------


def render(sc: Scene, start: int, stop: int, dev: torch.device) -> torch.Tensor:
    """Frames ``start:stop`` as Tx3xHxW floats in [0, 1]."""
    h, w = sc.height, sc.width
    t = torch.arange(start, stop, device=dev, dtype=torch.float32).view(-1, 1, 1) / sc.fps
    tau = t * sc.motion  # scene time
    zoom = 1 + 0.3 * torch.sin(math.pi * tau / 20) ** 2 if sc.camera == "zoom" else 1 + 0 * tau
    pan = 0.05 * tau if sc.camera == "pan" else 0 * tau
    x, y, px = camera_view(sc, zoom, 0.5, dev)
    if sc.image is not None:
        img, fade = image_frames(sc, x, y, pan, t)  # shapes and grading fade in
    else:
        img, fade = background(sc, x, y, pan, tau, px), torch.ones_like(t)
    for shape in sc.shapes:
        img = draw_shape(img, shape, x, y, tau, px, fade)
    img = img.clamp(0, 1).expand(-1, 3, h, w)
    if sc.grade:
        lum = img.mean(dim=1, keepdim=True)
        graded = (lum + (img - lum) * (1 + sc.grade) - 0.5) * (1 + sc.grade / 2) + 0.5
        img = torch.lerp(img, graded.clamp(0, 1), fade[:, None])
    return img.contiguous()


def camera_view(
    sc: Scene, zoom: torch.Tensor, centre_y: float, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a camera zoomed by ``zoom`` (T×1×1) around ``(aspect / 2, centre_y)`` sees:
    the world coordinates ``x`` (1×1×W per frame) and ``y`` (1×H×1) of every pixel centre,
    in units of the frame height, and the world units per pixel (for anti-aliased edges)."""
    h, w, a = sc.height, sc.width, sc.aspect
    xs = (torch.arange(w, device=dev, dtype=torch.float32).view(1, 1, -1) + 0.5) / h
    ys = (torch.arange(h, device=dev, dtype=torch.float32).view(1, -1, 1) + 0.5) / h
    x = (xs - a / 2) / zoom + a / 2
    y = (ys - centre_y) / zoom + centre_y
    return x, y, 1 / (h * zoom)


def image_frames(
    sc: Scene, x: torch.Tensor, y: torch.Tensor, pan: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference image (``sc.image``) seen through the camera, panned by ``pan``, and
    the fade-in of everything drawn over it (0 at frame 0, so frame 0 is the image)."""
    a = sc.aspect
    assert sc.image is not None
    grid = torch.stack(torch.broadcast_tensors(2 * (x + pan) / a - 1, 2 * y - 1), dim=-1)
    img = F.grid_sample(
        sc.image.expand(len(grid), -1, -1, -1),
        grid,
        mode="bilinear",
        padding_mode="reflection",
        align_corners=False,
    )
    ramp = (t / 0.75).clamp(0, 1)
    return img, ramp * ramp * (3 - 2 * ramp)


def _col(c: Colour, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(c, device=like.device, dtype=torch.float32).view(1, 3, 1, 1)


def _over(img: torch.Tensor, colour: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return torch.lerp(img, colour, alpha.unsqueeze(1))


def _frac(v: torch.Tensor) -> torch.Tensor:
    return v - torch.floor(v)


def background(
    sc: Scene,
    x: torch.Tensor,
    y: torch.Tensor,
    pan: torch.Tensor,
    tau: torch.Tensor,
    px: torch.Tensor,
) -> torch.Tensor:
    """Sky gradient, stars, sun or moon with glow, terrain (terrain pans faster: parallax)."""
    top, bottom, ground = _col(sc.sky[0], x), _col(sc.sky[1], x), _col(sc.ground, x)
    img = torch.lerp(top, bottom, (y / sc.horizon).clamp(0, 1).unsqueeze(1) ** 0.8)
    far, u = x + 0.15 * pan, x + pan
    if sc.night:
        k = 90.0
        cell = _frac(torch.sin(torch.floor(far * k) * 12.9898 + torch.floor(y * k) * 78.233) * 4e4)
        dist = torch.sqrt((_frac(far * k) - 0.5) ** 2 + (_frac(y * k) - 0.5) ** 2)
        twinkle = 0.6 + 0.4 * torch.sin(3 * tau + cell * 40)
        star = (cell > 0.975) * (y < sc.horizon) * (1 - dist * 4).clamp(0, 1) * twinkle
        img = img + 0.9 * star.unsqueeze(1)
    ox, oy, r, colour, glow = sc.orb
    d = torch.sqrt((far - ox) ** 2 + (y - oy) ** 2)
    orb = _col(colour, x)
    img = img + orb * (glow * torch.exp(-((d / 0.22) ** 2))).unsqueeze(1)
    img = _over(img, 0.5 + 0.5 * orb, (0.5 - (d - r) / px).clamp(0, 1))  # bright disc

    p = sc.terrain_phase
    wave = torch.sin(2.3 * u + p)
    if sc.terrain == "sea":
        height = 0 * u
    elif sc.terrain == "hills":
        height = 0.04 * (1 + wave) + 0.02 * (1 + torch.sin(5.9 * u + 2 * p))
    elif sc.terrain == "forest":
        height = 0.03 + 0.09 * (1 - 2 * (_frac(u * 10 + p) - 0.5).abs()) * (0.8 + 0.2 * wave)
    elif sc.terrain == "mountains":
        height = 0.02 + 0.28 * (1 - 2 * (_frac(0.9 * u + p) - 0.5).abs()) * (0.6 + 0.4 * wave)
    else:  # dunes
        height = 0.04 * (1 + torch.sin(3.1 * u + p)) * (0.6 + 0.4 * wave)
    alpha = (0.5 + (y - sc.horizon + height) / px).clamp(0, 1)
    depth = ((y - sc.horizon) / (1 - sc.horizon)).clamp(0, 1).unsqueeze(1)
    if sc.terrain == "sea":
        ripple = 2 * torch.sin(4 * u + tau)[:, None]
        swell = torch.sin(40 * depth.sqrt() - 1.5 * tau[:, None] + ripple)
        shade = torch.lerp(bottom * 0.85, ground, depth.sqrt()) * (1 + 0.12 * swell)
        glint = torch.exp(-(((far - ox)[:, None] / (0.02 + 0.1 * depth)) ** 2))
        shade = shade + orb * glint * swell.clamp(0, 1) * 0.5 * glow
    else:
        shade = ground * (0.8 + 0.35 * depth)
        if sc.terrain == "mountains":  # snow caps
            snow = ((sc.horizon - y - 0.16) / 0.02).clamp(0, 1).unsqueeze(1)
            shade = torch.lerp(shade, _col((0.92, 0.94, 0.98), x), snow)
    return _over(img, shade, alpha)


def shape_path(s: Shape, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Position (x, y) and rotation of a shape at scene times ``tau``."""
    turn = 2 * math.pi * tau
    if s.path == "bounce":
        x = s.cx + s.ax * torch.sin(0.11 * turn + s.phase)
        y = s.cy - s.ay * torch.sin(0.4 * turn + s.phase).abs()
    elif s.path == "orbit":
        x = s.cx + s.ax * torch.cos(0.2 * turn + s.phase)
        y = s.cy + s.ay * torch.sin(0.2 * turn + s.phase)
    elif s.path == "drift":
        x = s.cx + s.ax * torch.sin(0.07 * turn + s.phase)
        y = s.cy + s.ay * torch.sin(0.4 * turn + s.phase)
    else:  # roll along the ground, turning with the distance travelled
        x = s.cx + s.ax * torch.sin(0.09 * turn + s.phase)
        return x, s.cy + 0 * tau, (x - s.cx) / s.size
    return x, y, s.spin * tau


def draw_shape(
    img: torch.Tensor,
    s: Shape,
    x: torch.Tensor,
    y: torch.Tensor,
    tau: torch.Tensor,
    px: torch.Tensor,
    fade: torch.Tensor,
) -> torch.Tensor:
    sx, sy, angle = shape_path(s, tau)
    dx, dy, r = x - sx, y - sy, s.size
    if s.path in ("bounce", "roll"):  # soft contact shadow, fainter while airborne
        lift = ((s.cy - sy) / max(s.ay, 1e-6)).clamp(0, 1)
        e = (dx / (r * 1.3)) ** 2 + ((y - s.cy - r) / (r * 0.25)) ** 2
        img = img * (1 - ((1 - e).clamp(0, 1) * 0.35 * (1 - 0.6 * lift) * fade).unsqueeze(1))
    colour = _col(s.colour, img)
    if s.kind == "circle":  # shaded ball with a highlight
        alpha = (0.5 - (torch.sqrt(dx**2 + dy**2) - r) / px).clamp(0, 1)
        hl = (torch.sqrt((dx + 0.35 * r) ** 2 + (dy + 0.35 * r) ** 2) / (1.4 * r)).clamp(0, 1)
        fill = colour * (1.25 - 0.55 * hl[:, None]) + 0.35 * (1 - 2.5 * hl[:, None]).clamp(0, 1)
    else:  # rotated box (signed distance), lit from above
        c, si = torch.cos(angle), torch.sin(angle)
        u, v = dx * c + dy * si, dy * c - dx * si
        qx, qy = u.abs() - r * 1.15, v.abs() - r * 0.8
        d = torch.hypot(qx.clamp(min=0), qy.clamp(min=0)) + torch.maximum(qx, qy).clamp(max=0)
        alpha = (0.5 - d / px).clamp(0, 1)
        fill = colour * (1.1 - 0.3 * ((v / r + 0.8) / 1.6).clamp(0, 1)[:, None])
    return _over(img, fill, alpha * fade)


# --- audio -------------------------------------------------------------------------------


def soundtrack(sc: Scene, n: int) -> np.ndarray:
    """Pad chords, bass and a panned arpeggio: float32 (2, n) in [-1, 1]."""
    t = np.arange(n, dtype=np.float64) / SAMPLE_RATE
    bar = 2.0 / min(max(sc.motion, 0.5), 2.0)  # one chord per bar
    prog = _MINOR if sc.minor else _MAJOR
    chord = (t // bar).astype(np.int64) % 4
    tc = t % bar
    degree = np.array([d for d, _ in prog])[chord]
    triad = np.array([tri for _, tri in prog])[chord]  # n x 3 semitones

    def phase(midi: np.ndarray, detune: float = 0.0) -> np.ndarray:
        freq = 440.0 * 2 ** ((midi - 69) / 12) * (1 + detune)
        return 2 * np.pi * np.cumsum(freq) / SAMPLE_RATE  # continuous across note changes

    pad = np.zeros((2, n))
    for v in range(3):
        for side, detune in ((0, -0.0015), (1, 0.0015)):  # slight detune: stereo width
            ph = phase(sc.root_midi + 12 + degree + triad[:, v], detune)
            pad[side] += 0.1 * (np.sin(ph) + 0.25 * np.sin(2 * ph))
    pad *= np.clip(tc / 0.4, 0, 1) * np.clip((bar - tc) / 0.4, 0, 1)
    ph = phase(sc.root_midi + degree)
    bass = 0.25 * (np.sin(ph) + 0.3 * np.sin(2 * ph)) * np.exp(-1.5 * tc) * np.clip(tc / 0.01, 0, 1)
    bass *= np.clip((bar - tc) / 0.05, 0, 1)

    beat = bar / 4
    tb = t % beat
    order = np.array([0, 1, 2, 3, 2, 1, 0, 3])[(t // beat).astype(np.int64) % 8]
    tones = np.concatenate([triad, np.full((n, 1), 12)], axis=1)[np.arange(n), order]
    ph = phase(sc.root_midi + 24 + degree + tones)
    arp = 0.2 * (np.sin(ph) + 0.15 * np.sin(3 * ph))
    arp *= (1 - np.exp(-tb / 0.004)) * np.exp(-6 * tb) * np.clip((beat - tb) / 0.01, 0, 1)

    # Equal-power pan following the main shape's x on screen (zoom keeps its side).
    control = np.arange(0.0, n / SAMPLE_RATE + 0.02, 0.01)  # 100 Hz control rate
    x, _, _ = shape_path(sc.shapes[-1], torch.from_numpy(control * sc.motion).float())
    pan = np.interp(t, control, (x / sc.aspect).clamp(0, 1).double().numpy()) * np.pi / 2
    mix = pad + bass + np.sqrt(2) * arp * np.stack([np.cos(pan), np.sin(pan)])
    peak = float(np.abs(mix).max()) if n else 0.0
    edges = np.clip(np.minimum(t, t[::-1]) / 0.01, 0, 1)  # 10 ms fades, no clicks
    return (mix * edges * (0.7 / peak if peak > 0 else 1.0)).astype(np.float32)
