"""The load generator's plan (``benchmarks/load/run.py``): the workload file and the arrival
process. Pure: no I/O besides reading the file, every random choice from a given RNG.

The workload file is TOML (``benchmarks/load/workloads/cpu_mixed.toml``)::

    name = "cpu_mixed"          # optional; the file's stem otherwise
    prompt = "a small kite"     # optional; every create's prompt (a counter is appended)
    poll_interval_s = 0.25      # pause between two GETs when the server sends no
                                # openai-poll-after-ms header (it does: 1 s by default)

    [[shape]]                   # video request shapes, one table each; at least one
    weight = 3                  # share among the shapes (> 0)
    size = "64x48"              # WxH
    seconds = 0.5               # or num_frames = 8
    fps = 16                    # optional
    steps = 4                   # num_inference_steps
    model = "reference/video"   # optional; the server's default otherwise

    [behaviours]                # client behaviours, share of arrivals each (>= 0, one > 0)
    poll = 40                   # create, then GET /v1/videos/{id} until terminal
    sse = 20                    # create, then GET /v1/videos/{id}/events until `done`
    sync = 10                   # POST /v1/videos/sync, read the MP4
    cancel = 10                 # create, POST …/cancel after cancel.delay_s, then poll
    sync_disconnect = 5         # POST /v1/videos/sync, hang up after sync_disconnect.delay_s
    audio = 10                  # POST /v1/audio/generations, then poll its object
    idempotent_retry = 5        # create twice with one Idempotency-Key, then poll

    [cancel]
    delay_s = [0.0, 3.0]        # uniform range

    [sync_disconnect]
    delay_s = [0.5, 3.0]

    [audio]
    seconds = 1.0
    steps = 4
    response_format = "wav"     # optional
    model = "reference/audio"   # optional

    [ttl]                       # optional: a `ttl` on a share of every kind of create
    share = 0.2                 # 0 … 1
    seconds = 20                # int > 0

Unknown keys and bad values raise :class:`WorkloadError` naming the key
(``shape[2].steps``, ``behaviours.pol``).
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BEHAVIOURS = ("poll", "sse", "sync", "cancel", "sync_disconnect", "audio", "idempotent_retry")
PROFILES = ("poisson", "step", "burst")
_SIZE_RE = re.compile(r"^[0-9]{1,5}x[0-9]{1,5}$")


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the file and the key."""


def _given(**fields: Any) -> dict[str, Any]:
    """The optional body fields a shape sets (None: left to the server's default)."""
    return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True)
class Shape:
    """One video request shape of the mix."""

    weight: float
    size: str
    steps: int
    seconds: float | None = None
    num_frames: int | None = None
    fps: float | None = None
    model: str | None = None

    def body(self) -> dict[str, Any]:
        """The shape's fields of a ``POST /v1/videos`` body."""
        return {
            "size": self.size,
            "num_inference_steps": self.steps,
            **_given(
                num_frames=self.num_frames, seconds=self.seconds, fps=self.fps, model=self.model
            ),
        }

    @property
    def label(self) -> str:
        length = f"{self.num_frames}f" if self.num_frames is not None else f"{self.seconds}s"
        return f"{self.size}/{length}/{self.steps}st"


@dataclass(frozen=True)
class AudioShape:
    seconds: float = 1.0
    steps: int = 4
    response_format: str | None = None
    model: str | None = None

    def body(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "num_inference_steps": self.steps,
            **_given(response_format=self.response_format, model=self.model),
        }


@dataclass(frozen=True)
class Workload:
    name: str
    shapes: tuple[Shape, ...]
    behaviours: dict[str, float]
    prompt: str = "load test: a small green kite over a field"
    poll_interval_s: float = 0.25
    cancel_delay_s: tuple[float, float] = (0.0, 3.0)
    disconnect_delay_s: tuple[float, float] = (0.5, 3.0)
    audio: AudioShape = field(default_factory=AudioShape)
    ttl_share: float = 0.0
    ttl_s: int | None = None

    def describe(self) -> dict[str, Any]:
        """The workload as the report records it."""
        return {
            "name": self.name,
            "shapes": [{"weight": s.weight, **s.body()} for s in self.shapes],
            "behaviours": self.behaviours,
            "poll_interval_s": self.poll_interval_s,
            "cancel_delay_s": list(self.cancel_delay_s),
            "sync_disconnect_delay_s": list(self.disconnect_delay_s),
            "audio": self.audio.body(),
            "ttl": {"share": self.ttl_share, "seconds": self.ttl_s},
        }


@dataclass(frozen=True)
class Arrival:
    """One planned arrival: when (seconds from the level's start) and what."""

    at: float
    behaviour: str
    shape: Shape
    ttl: int | None


def _fail(where: str, key: str, message: str) -> WorkloadError:
    return WorkloadError(f"{where}: {key}: {message}")


def _check_keys(where: str, prefix: str, table: dict[str, Any], known: set[str]) -> None:
    for key in table:
        if key not in known:
            allowed = ", ".join(sorted(known))
            raise _fail(where, f"{prefix}{key}", f"unknown key (known: {allowed})")


def _number(where: str, key: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(where, key, f"must be a number, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise _fail(where, key, f"must be {'> 0' if positive else '>= 0'}, not {value!r}")
    return float(value)


def _int(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(where, key, f"must be an integer >= 1, not {value!r}")
    return value


def _text(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, key, f"must be a non-empty string, not {value!r}")
    return value


def _range(where: str, key: str, value: Any) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise _fail(where, key, f"must be [low, high] seconds, not {value!r}")
    low, high = (_number(where, key, v) for v in value)
    if low > high:
        raise _fail(where, key, f"low {low} is above high {high}")
    return low, high


def _table(where: str, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, key, "must be a table")
    return value


def _shape(where: str, i: int, raw: Any) -> Shape:
    key = f"shape[{i}]"
    raw = _table(where, key, raw)
    _check_keys(
        where,
        f"{key}.",
        raw,
        {"weight", "size", "seconds", "num_frames", "fps", "steps", "model"},
    )
    for required in ("size", "steps"):
        if required not in raw:
            raise _fail(where, f"{key}.{required}", "missing")
    size = _text(where, f"{key}.size", raw["size"])
    if not _SIZE_RE.match(size):
        raise _fail(where, f"{key}.size", f"must be WxH (e.g. 64x48), not {size!r}")
    if "seconds" in raw and "num_frames" in raw:
        raise _fail(where, f"{key}.seconds", "give seconds or num_frames, not both")
    return Shape(
        weight=_number(where, f"{key}.weight", raw.get("weight", 1), positive=True),
        size=size,
        steps=_int(where, f"{key}.steps", raw["steps"]),
        seconds=_number(where, f"{key}.seconds", raw["seconds"], positive=True)
        if "seconds" in raw
        else None,
        num_frames=_int(where, f"{key}.num_frames", raw["num_frames"])
        if "num_frames" in raw
        else None,
        fps=_number(where, f"{key}.fps", raw["fps"], positive=True) if "fps" in raw else None,
        model=_text(where, f"{key}.model", raw["model"]) if "model" in raw else None,
    )


def parse_workload(data: dict[str, Any], where: str = "workload") -> Workload:
    """A :class:`Workload` from the parsed TOML ``data``; ``where`` names it in errors."""
    top = {
        "name",
        "prompt",
        "poll_interval_s",
        "shape",
        "behaviours",
        "cancel",
        "sync_disconnect",
        "audio",
        "ttl",
    }
    _check_keys(where, "", data, top)
    raw_shapes = data.get("shape")
    if not isinstance(raw_shapes, list) or not raw_shapes:
        raise _fail(where, "shape", "at least one [[shape]] table is needed")
    shapes = tuple(_shape(where, i, raw) for i, raw in enumerate(raw_shapes))

    raw_behaviours = _table(where, "behaviours", data.get("behaviours", {"poll": 1}))
    _check_keys(where, "behaviours.", raw_behaviours, set(BEHAVIOURS))
    behaviours = {
        name: _number(where, f"behaviours.{name}", raw_behaviours.get(name, 0))
        for name in BEHAVIOURS
    }
    if not any(behaviours.values()):
        raise _fail(where, "behaviours", "every share is 0")

    cancel = _table(where, "cancel", data.get("cancel", {}))
    _check_keys(where, "cancel.", cancel, {"delay_s"})
    disconnect = _table(where, "sync_disconnect", data.get("sync_disconnect", {}))
    _check_keys(where, "sync_disconnect.", disconnect, {"delay_s"})
    audio = _table(where, "audio", data.get("audio", {}))
    _check_keys(where, "audio.", audio, {"seconds", "steps", "response_format", "model"})
    ttl = _table(where, "ttl", data.get("ttl", {}))
    _check_keys(where, "ttl.", ttl, {"share", "seconds"})
    ttl_share = _number(where, "ttl.share", ttl.get("share", 0.0))
    if ttl_share > 1:
        raise _fail(where, "ttl.share", f"must be at most 1, not {ttl_share}")
    if ttl_share > 0 and "seconds" not in ttl:
        raise _fail(where, "ttl.seconds", "missing (ttl.share is above 0)")

    return Workload(
        name=_text(where, "name", data.get("name", where)),
        prompt=_text(where, "prompt", data.get("prompt", Workload.prompt)),
        poll_interval_s=_number(
            where, "poll_interval_s", data.get("poll_interval_s", 0.25), positive=True
        ),
        shapes=shapes,
        behaviours=behaviours,
        cancel_delay_s=_range(where, "cancel.delay_s", cancel.get("delay_s", [0.0, 3.0])),
        disconnect_delay_s=_range(
            where, "sync_disconnect.delay_s", disconnect.get("delay_s", [0.5, 3.0])
        ),
        audio=AudioShape(
            seconds=_number(where, "audio.seconds", audio.get("seconds", 1.0), positive=True),
            steps=_int(where, "audio.steps", audio.get("steps", 4)),
            response_format=_text(where, "audio.response_format", audio["response_format"])
            if "response_format" in audio
            else None,
            model=_text(where, "audio.model", audio["model"]) if "model" in audio else None,
        ),
        ttl_share=ttl_share,
        ttl_s=_int(where, "ttl.seconds", ttl["seconds"]) if "seconds" in ttl else None,
    )


def load_workload(path: Path) -> Workload:
    """Read and check a workload file (TOML)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise WorkloadError(f"{path}: {exc}") from exc
    workload = parse_workload(data, where=str(path))
    if "name" not in data:
        workload = dataclasses.replace(workload, name=path.stem)
    return workload


@dataclass(frozen=True)
class Profile:
    """How arrivals are spread over a level.

    - ``poisson``: exponential gaps at the level's rate;
    - ``step``: Poisson whose rate is the level's times ``factors[k]`` during the k-th
      ``period_s`` window, cycling (factors averaging 1 keep the level's mean rate);
    - ``burst``: ``burst_size`` arrivals at once every ``burst_size / rate`` seconds (the
      level's mean rate, no randomness in the times).
    """

    kind: str = "poisson"
    factors: tuple[float, ...] = (0.5, 1.5)
    period_s: float = 10.0
    burst_size: int = 10

    def __post_init__(self) -> None:
        if self.kind not in PROFILES:
            raise ValueError(f"profile {self.kind!r}: one of {', '.join(PROFILES)}")
        if not self.factors or any(f < 0 for f in self.factors):
            raise ValueError("step factors must be >= 0, at least one")
        if self.period_s <= 0 or self.burst_size < 1:
            raise ValueError("step period must be > 0 and burst size >= 1")


def _poisson(rate: float, start: float, end: float, rng: random.Random) -> list[float]:
    times: list[float] = []
    if rate <= 0:
        return times
    t = start + rng.expovariate(rate)
    while t < end:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def arrival_times(
    rate: float, duration: float, rng: random.Random, profile: Profile | None = None
) -> list[float]:
    """Arrival times in [0, duration) for a mean ``rate`` per second, by ``profile``."""
    profile = profile or Profile()
    if rate <= 0 or duration <= 0:
        return []
    if profile.kind == "poisson":
        return _poisson(rate, 0.0, duration, rng)
    if profile.kind == "burst":
        gap = profile.burst_size / rate
        times = []
        t = 0.0
        while t < duration:
            times += [t] * profile.burst_size
            t += gap
        return times
    times = []
    k = 0
    while k * profile.period_s < duration:
        factor = profile.factors[k % len(profile.factors)]
        start = k * profile.period_s
        times += _poisson(rate * factor, start, min(duration, start + profile.period_s), rng)
        k += 1
    return times


def pick(weights: dict[str, float], rng: random.Random) -> str:
    """A key of ``weights`` drawn in proportion to its weight."""
    names = [k for k, w in weights.items() if w > 0]
    return rng.choices(names, weights=[weights[k] for k in names])[0]


def plan_level(
    workload: Workload,
    rate: float,
    duration: float,
    rng: random.Random,
    profile: Profile | None = None,
) -> list[Arrival]:
    """Every arrival of one level: its time, behaviour, video shape and ttl."""
    shape_weights = {str(i): s.weight for i, s in enumerate(workload.shapes)}
    out = []
    for at in arrival_times(rate, duration, rng, profile):
        behaviour = pick(workload.behaviours, rng)
        shape = workload.shapes[int(pick(shape_weights, rng))]
        ttl = workload.ttl_s if rng.random() < workload.ttl_share else None
        out.append(Arrival(at=at, behaviour=behaviour, shape=shape, ttl=ttl))
    return out
