"""``reference/world``: a procedural, steerable world streamed chunk by chunk (no weights).

The streaming counterpart of ``reference/video`` for ``WS /v1/realtime/video`` sessions:
CPU, nothing to download, deterministic per seed. It does not understand language; it
reuses reference/video's scene (prompt words and seed pick sky, terrain, palette, shapes)
and renderer, and adds what a world model session needs:

* **Chunks.** A session of ``num_frames`` frames is cut the way the LingBot-World server
  cuts it (the arithmetic lives in ``models/realtime_video_chunks.py``, which the API resolves
  ``session.start`` with): 3 latent frames per chunk, temporal compression 4, so
  ``chunks = ((num_frames - 1) // 4 + 1) // 3``; chunk 0 holds 9 frames, every later
  chunk 12, ``(chunks * 3 - 1) * 4 + 1`` frames in all (``num_frames`` is rounded down to
  that). Each chunk is produced by ``steps_per_chunk`` flow-matching Euler steps
  (``step``); ``take_chunk`` hands out its frames and moves on to the next chunk.
* **Camera.** Each latent frame of a chunk carries a set of actions from ``w a s d``
  (``camera_action_script``: one entry per chunk, each a list of three action lists).
  ``w`` dollies forward (zoom in towards the horizon), ``s`` back, ``a`` / ``d`` pan left /
  right (the terrain and the shape on it move at full speed, the sky at 15 %, small
  flying shapes at half speed: parallax). The camera has a little inertia and its
  position carries over from chunk to chunk.
* **Interactions.** ``interact`` queues a prompt and/or camera change that takes effect
  in the chunk under way while one of its steps is left (the spec's ``interaction_at =
  "step"``), else in the next chunk; a new prompt cross-fades from the current look to the
  new scene over ``transition_chunks`` chunks (0: a cut). A chunk is rendered whole at its
  first step and its Euler steps walk the noise to that render, so a change entering a
  chunk under way renders it again, its camera from where the chunk began, and the
  remaining steps walk to the new render: the chunk is the one the change would have made
  queued before its first step. The state reports which events started, were active and
  completed in each chunk (``events_for_chunk``).

It implements :class:`workers.pipelines.base.WorldPipeline` and draws scenes with the
public ``workers/pipelines/procedural/``. All per-session state lives in
:class:`WorldState`, so sessions share one pipeline. See ``docs/reference-world.md``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from models.catalog import REFERENCE_WORLD
from models.errors import InvalidJobInput
from models.realtime_video_chunks import (
    CAMERA_KEYS,
    LATENT_FRAMES_PER_CHUNK,
    TEMPORAL_COMPRESSION,
    camera_block_problem,
    chunks_for_frames,
    frames_for_chunks,
)
from workers.pipelines import procedural as proc
from workers.pipelines.base import (
    ActionBlock,
    ChunkEvents,
    GenerationRequest,
    NoWeights,
    WorldConfig,
    WorldPipeline,
)
from workers.pipelines.procedural import Scene
from workers.pipelines.world_rules import (
    QueuedEvent,
    check_event_id,
    check_prompt,
    check_size,
    check_transition,
    end_chunk,
    enters_chunk_under_way,
    entry_chunk,
    last_chunk_events,
)

PAN_SPEED = 0.6  # frame heights per second while "a" or "d" is held
ZOOM_RATE = 0.5  # natural-log zoom per second while "w" or "s" is held
ZOOM_RANGE = (0.7, 3.0)  # the dolly stops at these magnifications
CAMERA_LAG = 0.1  # seconds: time constant of the camera's inertia
_SMALL_SHAPE_PARALLAX = 0.5  # small shapes fly between the sky (0.15) and the ground (1)
_U64 = 2**64 - 1

_Block = tuple[frozenset[str], frozenset[str], frozenset[str]]


def num_chunks_for(num_frames: int) -> int:
    """Chunks in a session of ``num_frames`` frames (0 when too few for one)."""
    return chunks_for_frames(num_frames) if num_frames >= 1 else 0


def chunk_frame_range(chunk: int) -> tuple[int, int]:
    """Global frame indices ``[start, stop)`` of chunk ``chunk``."""
    return (frames_for_chunks(chunk) if chunk else 0), frames_for_chunks(chunk + 1)


@dataclass
class _Event(QueuedEvent):
    prompt: str | None
    camera: _Block | None


@dataclass
class _Layer:
    """A scene faded in over frames ``start .. full`` (weight 1 from ``full`` on)."""

    scene: Scene
    start: int
    full: int

    def weights(self, frames: torch.Tensor) -> torch.Tensor:
        if self.full <= self.start:
            return (frames >= self.start).float()
        return ((frames - self.start + 1) / (self.full - self.start + 1)).clamp(0, 1)


@dataclass
class _Camera:
    pan: float = 0.0  # frame heights to the right
    log_zoom: float = 0.0
    pan_velocity: float = 0.0
    zoom_velocity: float = 0.0


@dataclass(kw_only=True)
class WorldState:
    """One session: its config, chunk and step counters, camera, look and events.

    Read ``chunk_index`` (the chunk being generated), ``step_index`` (steps done in it),
    ``num_chunks``, ``num_frames`` (after rounding), ``steps_per_chunk``, ``prompt`` (the
    latest one) and ``done``; the rest is the pipeline's business.
    """

    config: WorldConfig
    num_chunks: int
    num_frames: int
    steps_per_chunk: int
    sigmas: torch.Tensor  # steps_per_chunk + 1 values from 1 down to 0 (float64)
    scene: Scene  # the look every layer fades in over
    prompt: str
    chunk_index: int = 0
    step_index: int = 0
    layers: list[_Layer] = field(default_factory=list)
    camera: _Camera = field(default_factory=_Camera)
    camera_override: _Block | None = None  # set by an interaction: replaces the script
    chunk_camera: _Camera | None = None  # the camera as the chunk in progress began
    events: list[_Event] = field(default_factory=list)
    last_events: ChunkEvents | None = None
    # The chunk in progress (None between chunks).
    target: torch.Tensor | None = None  # uint8 T×3×H×W: the clean render
    clean: torch.Tensor | None = None  # latent target: 2x pooled, [-1, 1]
    mean: torch.Tensor | None = None
    latents: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        """All chunks have been taken."""
        return self.chunk_index >= self.num_chunks


class ReferenceWorldPipeline(NoWeights, WorldPipeline[WorldState]):
    """Streams a procedural world in chunks; share one instance across sessions.

    Session loop (the caller checks stop, stall and deadlines between calls)::

        state = pipe.start(config)
        while not state.done:
            while not pipe.chunk_done(state):
                pipe.step(state)                  # one Euler step of the current chunk
            frames = pipe.take_chunk(state)       # uint8 T×H×W×3: 9, then 12 per chunk
            started, active, completed = pipe.events_for_chunk(state)

    ``interact`` may be called at any point between those calls.
    """

    spec = REFERENCE_WORLD

    # The CPU until ``load`` selects a device (there are no weights to move).
    _device = torch.device("cpu")

    def load(self, device: str) -> None:
        """Select the device (``cpu`` or ``cuda[:n]``); there are no weights."""
        self._device = proc.select_device(device)

    def start(self, config: WorldConfig) -> WorldState:
        """Check the config and build the session state (cheap: nothing is rendered yet)."""
        chunks = _validate(config)
        sigmas = proc.shifted_sigmas(config.steps_per_chunk, config.flow_shift)
        return WorldState(
            config=config,
            num_chunks=chunks,
            num_frames=frames_for_chunks(chunks),
            steps_per_chunk=config.steps_per_chunk,
            sigmas=sigmas,
            scene=self._scene(config, config.prompt),
            prompt=config.prompt,
        )

    def num_chunks(self, state: WorldState) -> int:
        return state.num_chunks

    def chunk_done(self, state: WorldState) -> bool:
        """All steps of the current chunk have run: ``take_chunk`` may be called."""
        return not state.done and state.step_index >= state.steps_per_chunk

    def step(self, state: WorldState) -> None:
        """One Euler step of the current chunk (the first one also renders the chunk)."""
        if state.done:
            raise RuntimeError("the session has no chunk left to generate")
        if state.step_index >= state.steps_per_chunk:
            raise RuntimeError(f"chunk {state.chunk_index} is finished; call take_chunk")
        if state.step_index == 0:
            self._begin_chunk(state)
        assert state.latents is not None and state.clean is not None and state.mean is not None
        proc.euler_step(state.latents, state.clean, state.mean, state.sigmas, state.step_index)
        state.step_index += 1

    def take_chunk(self, state: WorldState) -> np.ndarray:
        """The finished chunk's frames (uint8 T×H×W×3); advances to the next chunk."""
        if not self.chunk_done(state):
            raise RuntimeError(
                f"chunk {state.chunk_index} is not finished "
                f"({state.step_index}/{state.steps_per_chunk} steps)"
            )
        assert state.target is not None
        # After the last step the latents equal the encoded render, so the decoded
        # frames are the render itself.
        frames = state.target.permute(0, 2, 3, 1).contiguous().cpu().numpy()
        state.target = state.clean = state.mean = state.latents = state.chunk_camera = None
        end_chunk(state)
        return frames

    def events_for_chunk(self, state: WorldState) -> ChunkEvents:
        """(started, active, completed) event ids of the chunk ``take_chunk`` returned last.

        An event is *started* in the chunk it takes effect in (see ``interact``), *active*
        from there to the chunk its transition ends in (``max(1, transition_chunks)``
        chunks in all), and *completed* in that last chunk. Lists keep the queue order.
        """
        return last_chunk_events(state)

    def interact(
        self,
        state: WorldState,
        prompt: str | None,
        camera: str | ActionBlock | None,
        transition_chunks: int,
        event_id: str,
    ) -> None:
        """Queue a change that takes effect from the first chunk that can still take it.

        That is the current chunk while one of its steps is left to run (with the spec's
        ``interaction_at = "step"``; with ``"chunk"``, only if none has run yet), which is
        then rendered again with the change; otherwise the chunk after it.

        ``prompt``: the new look, cross-faded in over ``transition_chunks`` chunks (0: a
        cut at the first frame of that chunk). ``camera``: the actions for every later
        chunk, replacing ``camera_action_script`` for the rest of the session: either a
        block like one script entry (three per-latent-frame lists, ``[["w"], ["w"], []]``)
        or a string of keys held throughout (``"w"``, ``"wd"``; ``""`` stands still).
        None leaves the prompt or the camera as it is.
        Raises ``DuplicateEventError`` for an ``event_id`` already used in this session,
        ``InvalidJobInput`` for anything else malformed. An event queued during the last chunk
        has no chunk left to take effect in and never shows up in ``events_for_chunk``.
        """
        check_event_id(event_id, (e.event_id for e in state.events))
        if prompt is not None:
            check_prompt(prompt)
        keys = None if camera is None else _camera_block(camera)
        check_transition(transition_chunks, state.done)
        first = entry_chunk(state, self.spec.interaction_at)
        event = _Event.queued(event_id, first, transition_chunks, prompt=prompt, camera=keys)
        state.events.append(event)
        if enters_chunk_under_way(state, event):  # the rest of this chunk's steps take it
            self._apply(state, event)
            _settle(state)
            assert state.chunk_camera is not None
            state.camera = replace(state.chunk_camera)  # its camera moves again from there
            state.target, state.clean, state.mean = self._render(state)

    # --- one chunk ---------------------------------------------------------------------

    def _scene(self, config: WorldConfig, prompt: str) -> Scene:
        request = GenerationRequest.video(
            prompt=prompt,
            width=config.width,
            height=config.height,
            num_frames=config.num_frames,
            fps=config.fps,
            num_inference_steps=1,
            seed=config.seed,
            negative_prompt=config.negative_prompt,
            reference_image=config.reference_image,
        )
        return proc.build_scene(request, 1.0, "static", self._device)

    def _begin_chunk(self, state: WorldState) -> None:
        """Apply the chunk's events, move the camera, render the chunk, draw the noise."""
        k, cfg = state.chunk_index, state.config
        for event in state.events:
            if event.first_chunk == k:
                self._apply(state, event)
        _settle(state)
        state.chunk_camera = replace(state.camera)
        state.target, clean, state.mean = self._render(state)
        digest = hashlib.blake2b(f"{cfg.seed & _U64}:{k}".encode(), digest_size=8).digest()
        generator = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest, "big") >> 1)
        state.clean = clean
        state.latents = torch.randn(clean.shape, generator=generator).to(self._device)

    def _apply(self, state: WorldState, event: _Event) -> None:
        """Event ``event`` from the first frame of the chunk under way: its camera for
        this chunk and every later one, its scene faded in over its chunks."""
        start = chunk_frame_range(state.chunk_index)[0]
        if event.camera is not None:
            state.camera_override = event.camera
        if event.prompt is not None:
            full = start  # a cut, unless it fades in up to the last frame of last_chunk
            if event.transition_chunks:
                full = chunk_frame_range(event.last_chunk)[1] - 1
            state.layers.append(_Layer(self._scene(state.config, event.prompt), start, full))
            state.prompt = event.prompt

    def _render(self, state: WorldState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The chunk under way as the camera moves through it: its frames (uint8
        T×3×H×W), their latent target and its mean."""
        cfg = state.config
        start, stop = chunk_frame_range(state.chunk_index)
        pan, zoom = _move_camera(state, start, stop)
        frames = torch.arange(start, stop, dtype=torch.float32, device=self._device)
        h, w = cfg.height, cfg.width
        target = torch.empty((stop - start, 3, h, w), dtype=torch.uint8, device=self._device)
        for a, b in proc.chunks(stop - start, h * w, proc.RENDER_BUDGET):
            img = _render(state.scene, frames[a:b], pan[a:b], zoom[a:b])
            for layer in state.layers:
                weight = layer.weights(frames[a:b]).view(-1, 1, 1, 1)
                over = _render(layer.scene, frames[a:b], pan[a:b], zoom[a:b])
                img = torch.lerp(img, over, weight)
            target[a:b] = img.mul_(255).round_()
        clean = proc.encode(target)
        return target, clean, clean.mean(dim=(0, 2, 3), keepdim=True)


def _settle(state: WorldState) -> None:
    """A layer that is fully faded in by the first frame of the chunk under way becomes
    the base look (with every layer under it)."""
    start = chunk_frame_range(state.chunk_index)[0]
    for i in reversed(range(len(state.layers))):
        if state.layers[i].full <= start:
            state.scene = state.layers[i].scene
            del state.layers[: i + 1]
            break


def _actions(state: WorldState, frame: int) -> frozenset[str]:
    """The actions held during global frame ``frame``."""
    latent = (frame + TEMPORAL_COMPRESSION - 1) // TEMPORAL_COMPRESSION
    chunk, j = divmod(latent, LATENT_FRAMES_PER_CHUNK)
    if state.camera_override is not None:
        return state.camera_override[j]
    script = state.config.camera_action_script
    if script is None or chunk >= len(script):
        return frozenset()
    return frozenset(script[chunk][j])


def _move_camera(state: WorldState, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance the camera through frames ``start:stop``; their pan and zoom."""
    cam, dt = state.camera, 1.0 / state.config.fps
    ease = 1 - math.exp(-dt / CAMERA_LAG)
    low, high = math.log(ZOOM_RANGE[0]), math.log(ZOOM_RANGE[1])
    pans, zooms = [], []
    for frame in range(start, stop):
        keys = _actions(state, frame)
        pan_goal = PAN_SPEED * (("d" in keys) - ("a" in keys))
        zoom_goal = ZOOM_RATE * (("w" in keys) - ("s" in keys))
        cam.pan_velocity += (pan_goal - cam.pan_velocity) * ease
        cam.zoom_velocity += (zoom_goal - cam.zoom_velocity) * ease
        if frame > 0:  # frame 0 shows the starting view
            cam.pan += cam.pan_velocity * dt
            cam.log_zoom = min(high, max(low, cam.log_zoom + cam.zoom_velocity * dt))
        pans.append(cam.pan)
        zooms.append(math.exp(cam.log_zoom))
    return torch.tensor(pans), torch.tensor(zooms)


def _render(sc: Scene, frames: torch.Tensor, pan: torch.Tensor, zoom: torch.Tensor) -> torch.Tensor:
    """Frames (global indices) of scene ``sc`` seen by the camera: T×3×H×W in [0, 1].

    Like reference/video's renderer with its camera replaced: the view zooms around the
    horizon's centre and pans; the main shape moves with the ground, small shapes at half
    speed, and the shapes repeat every two frame widths so a long pan keeps meeting them.
    """
    dev = frames.device
    h, w, a = sc.height, sc.width, sc.aspect
    t = frames.view(-1, 1, 1) / sc.fps  # scene time (motion 1)
    pan = pan.to(dev, torch.float32).view(-1, 1, 1)
    zoom = zoom.to(dev, torch.float32).view(-1, 1, 1)
    x, y, px = proc.camera_view(sc, zoom, sc.horizon, dev)  # zoom around the horizon
    if sc.image is not None:
        img, fade = proc.image_frames(sc, x, y, pan, t)  # shapes fade in
    else:
        img, fade = proc.background(sc, x, y, pan, t, px), torch.ones_like(t)
    for i, shape in enumerate(sc.shapes):
        parallax = 1.0 if i == len(sc.shapes) - 1 else _SMALL_SHAPE_PARALLAX
        wrapped = torch.remainder(x + parallax * pan + a / 2, 2 * a) - a / 2
        img = proc.draw_shape(img, shape, wrapped, y, t, px, fade)
    return img.clamp(0, 1).expand(-1, 3, h, w).contiguous()


def _validate(cfg: WorldConfig) -> int:
    """Check the config; return the number of chunks."""
    check_prompt(cfg.prompt)
    spec = REFERENCE_WORLD
    check_size(spec, cfg.width, cfg.height)
    if not cfg.fps > 0:
        raise InvalidJobInput(f"fps must be positive, got {cfg.fps}")
    chunks = num_chunks_for(cfg.num_frames)
    if chunks < 1:
        raise InvalidJobInput(f"num_frames must be at least 9 (one chunk), got {cfg.num_frames}")
    if not spec.min_steps <= cfg.steps_per_chunk <= spec.max_steps:
        raise InvalidJobInput(
            f"steps_per_chunk must be in [{spec.min_steps}, {spec.max_steps}], "
            f"got {cfg.steps_per_chunk}"
        )
    if not cfg.flow_shift > 0:
        raise InvalidJobInput(f"flow_shift must be positive, got {cfg.flow_shift}")
    img, shape = cfg.reference_image, (cfg.height, cfg.width, 3)
    if img is not None and (img.dtype != np.uint8 or img.shape != shape):
        raise InvalidJobInput(f"reference_image must be uint8 {shape}, got {img.dtype} {img.shape}")
    if cfg.camera_action_script is not None:
        validate_action_script(cfg.camera_action_script, chunks)
    return chunks


def validate_action_script(script: Any, chunks: int | None = None) -> None:
    """Raise InvalidJobInput naming the first problem of a ``camera_action_script``.

    It must be a list with at most ``chunks`` entries (one per chunk; missing ones hold
    the camera), each a list of exactly three lists (one per latent frame) of actions
    drawn from ``"w" "a" "s" "d"`` (``[[], [], []]`` holds).
    """
    name = "camera_action_script"
    if not isinstance(script, list | tuple):
        raise InvalidJobInput(
            f"{name} must be a list with one entry per chunk, got {type(script).__name__}"
        )
    if chunks is not None and len(script) > chunks:
        raise InvalidJobInput(
            f"{name} has {len(script)} entries but the session has {chunks} chunks"
        )
    for i, entry in enumerate(script):
        problem = camera_block_problem(entry, f"{name}[{i}]")
        if problem is not None:
            raise InvalidJobInput(problem)


def _camera_block(camera: Any) -> _Block:
    """An interaction's ``camera`` (a key string or a three-list block) as a block."""
    if isinstance(camera, str):
        if set(camera) - set(CAMERA_KEYS):
            raise InvalidJobInput(f"camera must use only 'w', 'a', 's', 'd', got {camera!r}")
        keys = frozenset(camera)
        return keys, keys, keys
    if camera_block_problem(camera, "camera") is not None:
        raise InvalidJobInput(
            "camera must be a string of 'w', 'a', 's', 'd' or three per-latent-frame lists "
            f"of them, got {camera!r}"
        )
    first, second, third = (frozenset(a) for a in camera)
    return first, second, third
