"""Realtime video sessions on a worker: one thread per session slot.

The API owns the client socket and the protocol; the worker owns the model state. They
talk over two Redis Streams (``oq:session:{id}:in`` commands, ``…:out`` outputs):

    in  (API → worker): stop, interaction, keepalive
    out (worker → API): accepted, started, chunk (+ fMP4 bytes), finished, failed, keepalive

Between any two denoise steps the runner drains commands (a stop or interaction jumps
ahead of further computation), so ``session.stop`` or a vanished client ends the session
within one step and frees the slot. If the API falls silent (no command or keep-alive for
``lost_after_s``), the runner stops on its own.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from models.errors import InvalidJobInput
from storage.bus import EventBus
from storage.constants import session_abandoned_key, session_in_key, session_out_key
from storage.settings import Settings
from workers.failpoints import Failpoints
from workers.failures import classify, log_level
from workers.fmp4 import FragmentedMP4Writer
from workers.pipelines.base import WorldConfig, WorldPipeline
from workers.pipelines.registry import PipelineRegistry

log = logging.getLogger(__name__)


class SessionRunner:
    def __init__(
        self,
        settings: Settings,
        pipelines: PipelineRegistry,
        bus: EventBus,
        worker_id: str,
        persist: Any = None,
    ) -> None:
        self.settings = settings
        self.pipelines = pipelines
        self.bus = bus
        self.worker_id = worker_id
        # Callable(session_id, owner, model, path) -> artifact id, for extra_params.persist.
        self.persist = persist
        self.failpoints = Failpoints(settings.worker.failpoints_file)

    def run(self, session_id: str, config: dict[str, Any]) -> str:
        out, inbox = session_out_key(session_id), session_in_key(session_id)
        if self.bus.redis.exists(session_abandoned_key(session_id)):
            return "abandoned"  # the API gave up waiting for a slot
        self.bus.publish(out, {"type": "accepted", "worker_id": self.worker_id})
        tmp = Path(
            tempfile.mkdtemp(prefix=f"omniq-{session_id}-", dir=self.settings.worker.tmp_dir)
        )
        try:
            outcome = self._roll_out(session_id, config, out, inbox, tmp)
        except Exception as exc:
            code, message = classify(exc)
            log.log(log_level(code), "session %s failed: %s", session_id, code, exc_info=exc)
            self.bus.publish(out, {"type": "failed", "code": code.value, "message": message})
            outcome = code.value
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("session %s: %s", session_id, outcome)
        return outcome

    @staticmethod
    def _interact(pipe: WorldPipeline[Any], state: Any, event: dict[str, Any]) -> None:
        """Queue an interaction; the API already checked its shape and its event id, so
        a change the model still refuses is logged and the session goes on."""
        try:
            pipe.interact(
                state,
                event.get("prompt"),
                event.get("camera"),
                int(event.get("transition_chunks") or 0),
                event["event_id"],
            )
        except InvalidJobInput as exc:
            log.warning("interaction %s ignored: %s", event.get("event_id"), exc)

    def _reference_image(self, inbox: str) -> Any:
        """The first frame the API put on the session's ``in`` stream (a PNG already
        fitted to the session size), as uint8 H×W×3, or None."""
        for entry in self.bus.read(inbox, "0-0", count=10):
            if entry.type == "reference_image" and entry.data:
                import io

                import numpy as np
                from PIL import Image

                with Image.open(io.BytesIO(entry.data)) as image:
                    return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
        return None

    def _roll_out(
        self, session_id: str, config: dict[str, Any], out: str, inbox: str, tmp: Path
    ) -> str:
        rt = self.settings.realtime
        pipe = self.pipelines.world(config["model"])
        extra = config.get("extra_params") or {}
        world = WorldConfig(
            prompt=config["prompt"],
            width=config["width"],
            height=config["height"],
            num_frames=config["num_frames"],
            fps=config["fps"],
            seed=config["seed"],
            negative_prompt=config.get("negative_prompt"),
            camera_action_script=extra.get("camera_action_script"),
            extra=dict(extra),
        )
        if extra.get("flow_shift"):
            world.flow_shift = float(extra["flow_shift"])
        world.reference_image = self._reference_image(inbox)
        state = pipe.start(world)
        total = pipe.num_chunks(state)
        writer = FragmentedMP4Writer(world.width, world.height, world.fps)
        persisted = open(tmp / "session.mp4", "wb") if extra.get("persist") else None  # noqa: SIM115
        self.bus.publish(out, {"type": "started"})
        after, heard, beat = "0-0", time.monotonic(), 0.0
        stopped = False
        sent = 0
        try:
            while sent < total:
                for entry in self.bus.read(inbox, after, count=100):
                    after, heard = entry.id, time.monotonic()
                    kind = entry.event.get("type")
                    if kind == "stop":
                        stopped = True
                    elif kind == "interaction":
                        self._interact(pipe, state, entry.event)
                now = time.monotonic()
                if stopped or now - heard > rt.lost_after_s:
                    stopped = True
                    break
                if now - beat >= rt.keepalive_s:
                    beat = now
                    self.bus.publish(out, {"type": "keepalive"})
                pipe.step(state)
                if pipe.chunk_done(state):
                    frames = pipe.take_chunk(state)
                    # a stop is read between steps only, so the session is ours here
                    self.failpoints.hit(f"session_chunk:{sent}", lambda: True)
                    data = writer.write_chunk(frames)
                    begun, active, completed = pipe.events_for_chunk(state)
                    if persisted is not None:
                        persisted.write(data)
                    self.bus.publish(
                        out,
                        {
                            "type": "chunk",
                            "kind": "media",
                            "generation_chunk_index": sent,
                            "num_frames": len(frames),
                            "produced_at": time.time(),
                            "started_event_ids": begun,
                            "active_event_ids": active,
                            "completed_event_ids": completed,
                        },
                        data,
                    )
                    sent += 1
            tail = writer.close()
            if tail and not stopped:
                if persisted is not None:
                    persisted.write(tail)
                self.bus.publish(
                    out, {"type": "chunk", "kind": "trailer", "produced_at": time.time()}, tail
                )
        finally:
            if persisted is not None:
                persisted.close()
        artifact_id = None
        if persisted is not None and not stopped and self.persist is not None:
            artifact_id = self.persist(session_id, config, tmp / "session.mp4")
        self.bus.publish(out, {"type": "finished", "stopped": stopped, "artifact_id": artifact_id})
        return "stopped" if stopped else "completed"
