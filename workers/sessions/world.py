"""World sessions on a worker: one thread per session slot.

The API owns the client socket and the protocol; the worker owns the model state. They
talk over two Redis Streams (``oq:session:{id}:in`` commands, ``…:out`` outputs):

    in  (API → worker): reference_image (+ PNG), interaction, stop, keepalive
    out (worker → API): accepted, started, chunk (+ fMP4 bytes), finished, failed, keepalive

(``models/session_bus.py``; ``workers/sessions/slot.py`` holds the slot's life and clocks.)

Between any two denoise steps the runner drains commands (a stop or interaction jumps
ahead of further computation), so ``session.stop`` or a vanished client ends the session
within one step and frees the slot. If the API falls silent (no command or keep-alive for
``lost_after_s``), the runner stops on its own.

An interaction read there goes to the pipeline's ``interact`` at once; where it enters is
the model's (``workers/pipelines/world_rules.py``, the spec's ``interaction_at``): with
``"step"`` (Helios, ``reference/world``) the chunk under way takes it from its next step
while one is left, and that chunk's ``started_event_ids`` name it; read after the chunk's
last step (the device then decodes it in the same turn, reading nothing), it enters the
next chunk, from its first step, as with ``"chunk"``. So one read before the chunk's
last step is in the chunk the device finishes next, where ``"chunk"`` would wait out that
chunk and make a whole chunk more. One that arrives while the chunk's last step runs, on
a model that can run that step again (``SupportsStepRestart``: Helios), is not left for
the next chunk: the session's follower (``SessionStop``) notes it, the step's block gate
stops the step (``StepRestart``; a stop keeps priority), the loop reads it as any other
and runs the step again, conditioned on it. The partial step is the cost (logged); each
interaction restarts at most once, since the gates ask only about ones not yet read.

A session outlives its worker when its model takes snapshots (Helios): each chunk goes
out together with a checkpoint of the session, and a worker placed again for it
(``attempt`` > 1, when the API found its worker dead) goes on from the last chunk sent
(``workers/sessions/world_checkpoint.py``).

Pacing (:class:`Playback`): the client plays the video in real time from the first chunk,
so a chunk begins only while at most ``max_chunks_ahead`` chunks (the session's
``extra_params``, else ``realtime.video_lead_chunks``; 0: unpaced) are ahead of that
clock; an interaction then reaches the screen within about that many chunks. The wait
is a blocking read of the session's commands, so a stop ends it at once, and an
interaction read during it is queued for the chunk the wait is holding back.
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from models.errors import InvalidJobInput
from models.realtime_video_chunks import ChunkLattice
from models.session_bus import (
    ChunkOutput,
    FailedOutput,
    FinishedOutput,
    InteractionCommand,
    ReferenceImageCommand,
    StartedOutput,
    StopCommand,
    WorldSessionConfig,
)
from storage.bus import EventBus
from storage.session_checkpoint import CheckpointStore
from storage.settings import Settings
from workers.common.failpoints import Failpoints
from workers.common.memory import forget_frames
from workers.media.fmp4 import FragmentedMP4Writer
from workers.pipelines.base import (
    SupportsChunkStream,
    SupportsStepRestart,
    WorldConfig,
    WorldPipeline,
    checkpoints,
    step_stops,
)
from workers.pipelines.registry import PipelineRegistry
from workers.sessions.delivery import ChunkTimes, DeliveryLane, LaneStream
from workers.sessions.slot import SessionSlot, SlotRunner
from workers.sessions.turns import (
    CapacityExceeded,
    Demand,
    FairTurns,
    RealtimeCapacity,
    SessionStop,
    SessionStopped,
    StepRestart,
)
from workers.sessions.world_checkpoint import SessionCheckpoint

log = logging.getLogger(__name__)


class Playback:
    """The client's playback clock as the worker can know it: real time from the moment
    the first chunk was sent, against the video time of the chunks sent so far."""

    def __init__(self, fps: float, lead_chunks: int) -> None:
        self._lock = threading.Lock()  # sent on the delivery lane, read by the device's loop
        self.fps, self.lead = fps, lead_chunks
        self.began: float | None = None  # when chunk 0 went out
        self.video_s = 0.0  # video time sent
        self.chunk_s = 0.0  # the last chunk's length

    def sent(self, frames: int, now: float) -> None:
        with self._lock:
            if self.began is None:
                self.began = now
            self.chunk_s = frames / self.fps
            self.video_s += self.chunk_s

    def wait_s(self, now: float) -> float:
        """How long to wait before beginning the next chunk (0: begin now)."""
        with self._lock:
            if not self.lead or self.began is None:
                return 0.0
            ahead = self.video_s - (now - self.began)
            return max(0.0, ahead - self.lead * self.chunk_s)


def lead_chunks(default: int, extra: dict[str, Any]) -> int:
    """The session's pacing bound: ``extra_params.max_chunks_ahead``, else ``default``."""
    asked = extra.get("max_chunks_ahead")
    return default if asked is None else int(asked)


# How often the device's loop looks again at a full delivery lane (reading commands).
LANE_POLL_S = 0.005

# What a session's config hands the world pipeline as it is.
_WORLD_FIELDS = {"prompt", "width", "height", "num_frames", "fps", "seed", "negative_prompt"}


class WorldSessionRunner(SlotRunner[WorldSessionConfig]):
    def __init__(
        self,
        settings: Settings,
        pipelines: PipelineRegistry,
        bus: EventBus,
        worker_id: str,
        persist: Any = None,
    ) -> None:
        super().__init__(settings, pipelines, bus, worker_id)
        # Callable(session_id, config, path) -> artifact id, for extra_params.persist.
        self.persist = persist
        self.failpoints = Failpoints(settings.worker.failpoints_file)
        # Each chunk sent with where its session stands (``workers/sessions/world_checkpoint.py``).
        self.checkpoints = CheckpointStore(bus, settings.realtime.checkpoint_ttl_s)
        # The device, one step at a time, for every session of this worker; how many
        # sessions of each model keep real time (``workers/sessions/turns.py``).
        self.turns = FairTurns()
        fixed = {name: m.max_sessions for name, m in pipelines.models.items()}
        self.capacity = RealtimeCapacity(settings.realtime.capacity_headroom, fixed)

    def serve(self, slot: SessionSlot, config: WorldSessionConfig) -> str:
        try:
            with self.capacity.session(config.model, _demand(config)):
                return self._serve(slot, config)
        except CapacityExceeded as exc:  # raised on entry only: nothing ran
            log.info("session %s refused: %s", slot.id, exc)
            slot.send(FailedOutput(code="resource_exhausted", message=str(exc)))
            return "resource_exhausted"

    def _serve(self, slot: SessionSlot, config: WorldSessionConfig) -> str:
        tmp = Path(tempfile.mkdtemp(prefix=f"omniq-{slot.id}-", dir=self.settings.worker.tmp_dir))
        stop = SessionStop(self.bus, slot.inbox)
        try:
            return self._roll_out(slot, config, tmp, stop)
        finally:
            stop.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def probe(self) -> None:
        """Measure each world model whose registry entry fixes no ``max_sessions``: one
        chunk at its defaults, timed, sets its load (and so how many sessions it takes);
        without it the first session's chunks do."""
        for name, model in self.pipelines.models.items():
            if not model.spec.streaming or model.max_sessions is not None:
                continue
            pipe = self.pipelines.get(name)
            if not isinstance(pipe, WorldPipeline):
                continue
            spec = pipe.spec
            width, height = spec.default_size
            lattice = ChunkLattice(first=spec.frame_offset, every=spec.frame_multiple)
            config = WorldConfig(
                prompt="a capacity probe",
                width=width,
                height=height,
                num_frames=lattice.first,
                fps=float(spec.default_fps),
                seed=0,
                steps_per_chunk=spec.default_steps,
            )
            state = pipe.start(config)
            began = time.perf_counter()
            while not pipe.chunk_done(state):
                pipe.step(state)
            frames = pipe.take_chunk(state)
            demand = Demand(width, height, config.fps, config.steps_per_chunk)
            self.capacity.measured(name, time.perf_counter() - began, demand.work(len(frames)))
            log.info("%s", self.capacity.describe(name, demand))

    @staticmethod
    def _interact(pipe: WorldPipeline[Any], state: Any, cmd: InteractionCommand) -> None:
        """Queue an interaction; the API already checked its shape and its event id, so
        a change the model still refuses is logged and the session goes on."""
        transition = cmd.transition_chunks
        if transition is None:  # neither the interaction nor the start set one
            transition = pipe.spec.default_transition_chunks
        try:
            pipe.interact(state, cmd.prompt, cmd.camera, int(transition), cmd.event_id)
        except InvalidJobInput as exc:
            log.warning("interaction %s ignored: %s", cmd.event_id, exc)

    @staticmethod
    def _reference_image(slot: SessionSlot) -> Any:
        """The first frame the API put on the session's ``in`` stream (a PNG already
        fitted to the session size), as uint8 H×W×3, or None."""
        for entry in slot.first_commands():
            if isinstance(entry.event, ReferenceImageCommand) and entry.data:
                import io

                import numpy as np
                from PIL import Image

                with Image.open(io.BytesIO(entry.data)) as image:
                    return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
        return None

    def _roll_out(
        self, slot: SessionSlot, config: WorldSessionConfig, tmp: Path, stop: SessionStop
    ) -> str:
        pipe = self.pipelines.world(config.model)
        world = _world_config(config)
        checkpoint = SessionCheckpoint(self.checkpoints, slot, config, pipe)
        if checkpoint.taking_over:  # its worker died: from the last chunk it sent
            state, writer, sent = checkpoint.resume(world)
        else:
            world.reference_image = self._reference_image(slot)
            state = pipe.start(world)
            writer, sent = FragmentedMP4Writer(world.width, world.height, world.fps), 0
            slot.send(StartedOutput())
        extra = config.extra_params
        persisted = open(tmp / "session.mp4", "wb") if extra.get("persist") else None  # noqa: SIM115
        if persisted is not None and sent:
            checkpoint.copy_sent(persisted, sent)
        lead = lead_chunks(self.settings.realtime.video_lead_chunks, extra)
        rollout = _Rollout(
            slot, pipe, state, writer, checkpoint, persisted, Playback(world.fps, lead), sent
        )
        try:
            with DeliveryLane(slot.id) as lane:
                stopped = self._chunks(rollout, config, world, stop, lane)
                if not stopped:
                    lane.drain()  # every chunk made goes out before the session's last words
            tail = writer.close()
            if tail and not stopped:
                if persisted is not None:
                    persisted.write(tail)
                slot.send(ChunkOutput(kind="trailer", produced_at=time.time()), tail)
        finally:
            checkpoint.close()  # the lane is closed: no chunk waits for a packing now
            if persisted is not None:
                persisted.close()
        rollout.times.log_summary(slot.id)
        artifact_id = None
        if persisted is not None and not stopped and self.persist is not None:
            artifact_id = self.persist(slot.id, config, tmp / "session.mp4")
        slot.send(FinishedOutput(stopped=stopped, artifact_id=artifact_id))
        checkpoint.ended()
        return "stopped" if stopped else "completed"

    def _chunks(
        self,
        run: _Rollout,
        config: WorldSessionConfig,
        world: WorldConfig,
        stop: SessionStop,
        lane: DeliveryLane,
    ) -> bool:
        """The device's loop: commands, pacing, steps; each chunk made is handed to the
        delivery lane. Returns whether the session was stopped."""
        slot, pipe, state = run.slot, run.pipe, run.state
        total = pipe.num_chunks(state)
        restarts = None  # whether the step in flight may run again (a chunk's last)
        if isinstance(pipe, SupportsStepRestart):
            restarts = functools.partial(pipe.restarts_step, state)
        between_chunks, wait_ms = True, None
        streamed = self.settings.realtime.stream_chunk_decode
        device_s = denoise_s = 0.0  # the current chunk's time at the device, and denoising
        while run.made < total:
            lane.check()  # a failed send (the session taken over) ends the session here
            for entry in slot.commands(block_ms=wait_ms):
                if isinstance(entry.event, StopCommand):
                    return True
                if isinstance(entry.event, InteractionCommand):
                    self._interact(pipe, state, entry.event)
            now = time.monotonic()
            if slot.api_lost(now):
                return True
            slot.keepalive(now)
            wait = run.playback.wait_s(now) if between_chunks else 0.0
            if between_chunks and lane.full:  # delivery is behind: let it catch up
                wait = LANE_POLL_S
            if wait > 0:  # paced: the client has enough to play; read commands meanwhile
                beat = max(slot.next_beat_in(now), 0.001)
                wait_ms = max(1, round(min(wait, beat) * 1000))
                continue
            wait_ms, between_chunks = None, False
            # a chunk's last step, on a model that may run it again, stops for an
            # interaction read since: read at the top of the loop, it enters this chunk
            gate = stop.gate(slot.after, restarts) if restarts is not None else stop.reason
            with self.turns.turn():
                began = time.perf_counter()
                try:  # a stop lands before the next block or decoder layer
                    with step_stops(gate), checkpoints(stop.check):
                        pipe.step(state)
                        stepped = time.perf_counter()
                        made = run.decode(lane, streamed) if pipe.chunk_done(state) else None
                except SessionStopped as exc:  # inside the step or the decode
                    # its traceback's frames hold the step's activations: cleared, as a
                    # job's are, so nothing keeps them through the exception
                    forget_frames(exc)
                    return True
                except StepRestart as exc:  # inside the step: it runs again, no chunk yet
                    forget_frames(exc)
                    log.info(
                        "session %s: %s; chunk %d's last step runs again", slot.id, exc, run.made
                    )
                    stepped, made = time.perf_counter(), None
                ended = time.perf_counter()
                device_s += ended - began
            denoise_s += stepped - began
            if made is not None:
                work = _demand(config, world.steps_per_chunk).work(made.frames)
                self.capacity.measured(config.model, device_s, work)
                device = (denoise_s, ended - stepped)  # denoise, decode
                device_s = denoise_s = 0.0
                between_chunks = True
                run.made_chunk(made, device, self.failpoints)
        return False


class _Rollout:
    """One session's rollout: what the device's loop and the delivery lane share. The
    loop calls :meth:`decode`, then :meth:`made_chunk`; the lane encodes the chunk's
    pieces as they come and then sends it, in order."""

    def __init__(
        self,
        slot: SessionSlot,
        pipe: WorldPipeline[Any],
        state: Any,
        writer: FragmentedMP4Writer,
        checkpoint: SessionCheckpoint,
        persisted: IO[bytes] | None,
        playback: Playback,
        sent: int,
    ) -> None:
        self.slot, self.pipe, self.state, self.writer = slot, pipe, state, writer
        self.checkpoint, self.persisted, self.playback = checkpoint, persisted, playback
        self.made = sent  # media chunks made (and handed over) so far
        self.times = ChunkTimes()

    def decode(self, lane: DeliveryLane, streamed: bool) -> _Outgoing:
        """Take the chunk whose steps have all run, on the device's thread: each piece
        of frames goes to the lane as it decodes (``streamed`` and ``SupportsChunkStream``;
        else the chunk whole, encoded beside the next denoise), and the lane encodes it
        while the next decodes. A stop or an error inside the decode abandons the chunk:
        nothing of it is sent (the session ends)."""
        out = _Outgoing(self.writer)
        stream = lane.stream(out.encode)
        try:
            for piece in _pieces(self.pipe, self.state, streamed):
                stream.put(piece)
                out.frames += len(piece)
        except BaseException:
            stream.abandon()
            raise
        out.stream = stream
        return out

    def made_chunk(
        self, out: _Outgoing, device: tuple[float, float], failpoints: Failpoints
    ) -> None:
        """Capture what chunk ``made`` needs of the session now (its events, its
        checkpoint, whose packing begins), and end its stream on the lane with the rest
        of its delivery: its fragment muxed, then sent with the checkpoint. ``device``:
        the chunk's denoise and decode seconds."""
        index, self.made = self.made, self.made + 1
        begun, active, completed = self.pipe.events_for_chunk(self.state)
        began = time.perf_counter()
        captured = self.checkpoint.capture(self.state)
        made = time.perf_counter()
        times = self.times  # the lane's alone

        def deliver() -> None:
            # the chunk is made and the session ours (a stop ended the loop before it)
            failpoints.hit(f"session_chunk:{index}", lambda: True, self.slot.attempt)
            muxing = time.perf_counter()
            data = self.writer.end_chunk()
            encoded = time.perf_counter()
            if self.persisted is not None:
                self.persisted.write(data)
            chunk = ChunkOutput(
                kind="media",
                generation_chunk_index=index,
                num_frames=out.frames,
                produced_at=time.time(),
                started_event_ids=begun,
                active_event_ids=active,
                completed_event_ids=completed,
            )
            pack_s = self.checkpoint.send(chunk, data, captured, self.writer)  # and where it stands
            self.playback.sent(out.frames, time.monotonic())
            sent = time.perf_counter()
            stages = {"denoise": device[0], "decode": device[1], "capture": made - began}
            stages |= {"encode": out.encode_s + encoded - muxing, "pack": pack_s}
            times.add(index, stages | {"send": sent - encoded, "tail": sent - made})

        assert out.stream is not None
        out.stream.end(deliver)


class _Outgoing:
    """A chunk on its way out: the device's thread hands its pieces over (and counts
    their frames), the lane encodes each as it comes (and times it)."""

    def __init__(self, writer: FragmentedMP4Writer) -> None:
        self.writer = writer
        self.stream: LaneStream[np.ndarray] | None = None  # once every piece is handed over
        self.frames = 0
        self.encode_s = 0.0

    def encode(self, piece: np.ndarray) -> None:
        began = time.perf_counter()
        self.writer.add_frames(piece)
        self.encode_s += time.perf_counter() - began


def _pieces(pipe: WorldPipeline[Any], state: Any, streamed: bool) -> Iterator[np.ndarray]:
    """The finished chunk's frames: piece by piece as they decode where the model can
    (``SupportsChunkStream``) and ``streamed`` (``OMNIQ_REALTIME__STREAM_CHUNK_DECODE``),
    else whole (``take_chunk``)."""
    if streamed and isinstance(pipe, SupportsChunkStream):
        return pipe.stream_chunk(state)
    return iter((pipe.take_chunk(state),))


def _world_config(config: WorldSessionConfig) -> WorldConfig:
    """What the world pipeline is started with: the session's fields, its extras."""
    extra = config.extra_params
    world = WorldConfig(
        **config.model_dump(include=_WORLD_FIELDS),
        camera_action_script=extra.get("camera_action_script"),
        extra=dict(extra),
    )
    if extra.get("flow_shift"):
        world.flow_shift = float(extra["flow_shift"])
    if config.num_inference_steps is not None:
        world.steps_per_chunk = config.num_inference_steps
    return world


def _demand(config: WorldSessionConfig, steps: int | None = None) -> Demand:
    """What ``config`` asks of the device (``steps``: per chunk, where the pipeline's own
    default replaced a missing ``num_inference_steps``)."""
    steps = steps or config.num_inference_steps or WorldConfig.steps_per_chunk
    return Demand(config.width, config.height, config.fps, steps)
