"""Prompt words and seed -> a :class:`Scene`: everything needed to render any frame.

No language understanding: the words pick from fixed vocabularies (colours, sky moods,
terrains, round or boxy nouns, motion verbs), a colour word colours the noun right after
it, and a hash of the words xor the seed drives every random choice, so the same prompt
and seed give the same scene and a different seed varies its layout.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass

import torch

from workers.pipelines.base import GenerationRequest

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


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def build_scene(req: GenerationRequest, motion: float, camera: str, device: torch.device) -> Scene:
    """The scene of ``req``: palette and terrain from its words (less its negative
    prompt's), layout from their hash and its seed, grading from ``guidance_scale``, its
    ``reference_image`` (on ``device``) as the background; ``motion`` scales scene time
    and ``camera`` ("static", "pan", "zoom") is how :func:`~.render.render` films it."""
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
