"""The stack half of the world benchmark (``benchmarks/gpu/world.py``): ``omniqueue up``
serving the random-weight Helios-Distilled as a registry entry, WebSocket clients on
``/v1/realtime/video`` (``benchmarks/realtime/world_client.py``), and up's log and the
workers' ``/metrics`` read for what the worker alone knows.

Part ``stack``: one realtime worker, two session slots, the entry's ``max_sessions = 2``
(the measured capacity would admit only the sessions that keep real time; the two-session
figure needs both). After a warm-up session (the compiled blocks' graphs for every pyramid
stage, and the memory baseline):

* a session of ``--chunks`` chunks, unpaced (``extra_params.max_chunks_ahead = 0``), with
  ``--interactions`` prompt changes, each sent at a random moment after a chunk:
  ``world_delivered_fps``, ``world_interaction_to_chunk_s`` (median; each one kept);
* two such sessions at once: ``world_two_sessions_fps_min``, the slower one's rate;
* ``--stops`` sessions, each closed cleanly at a random moment of its second chunk:
  ``world_stop_p95_ms``, the close → the worker's ``session …: stopped`` line (logged once
  the step stopped before its next block and the session's tensors are dropped: the
  device idle), same clock;
* ``world_first_chunk_s``: ``session.start`` → the first chunk received, median over the
  single sessions above (warm), each kept;
* ``world_memory_after_mib``: the worker's ``omniqueue_gpu_memory_allocated_bytes`` after
  all that, against the baseline after the warm-up (``/metrics``; none on a CPU worker).

Part ``takeover``: two realtime workers with one slot each, both warmed up (sessions until
each has served one), then a session whose worker (the holder of its lease) is SIGKILLed
right after chunk ``--kill-after`` arrives: ``world_takeover_gap_s`` = the kill → the next
chunk received, on the same socket. None, with the reason, where this tree has no
takeover (``storage/session_checkpoint.py``) or the session did not survive. The two
workers share one GPU (the card's memory is not split between them: no memory fraction,
no budget); ``takeover_memory_after_load_mib`` is what each holds once both are ready.

``--quantization fp8`` puts ``quantization = "fp8"`` in both parts' entries (each worker
quantizes its own transformer at load); a model the worker would refuse fails the part
before up starts (``refusal``). Both parts also record each worker's compiled-blocks
fallbacks (``compile_fallbacks``: FP8 tensors compile, or the blocks run eager).
``--attention cudnn`` puts ``attention = "cudnn"`` in both entries likewise (refused off a
CUDA GPU before up starts). ``--vae-channels-last`` puts the adapter option
``vae_channels_last = true`` in both entries (the VAE decoder's weights channels-last).

``--worker-env KEY=VALUE`` (repeatable) goes into up's environment, so its workers' settings:
an A/B of one worker setting on the same host (``OMNIQ_WORKER__CHECKPOINT_LOOKAHEAD=0``,
``OMNIQ_REALTIME__STREAM_CHUNK_DECODE=false``); each part records what it was given
(``worker_env``, ``takeover_worker_env``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import pct
from benchmarks.embedded_stack import Stack, log_time
from benchmarks.gpu.h3_stack import inline_toml
from benchmarks.gpu.plans import (
    attention_args,
    gauge_mib,
    memory_args,
    mode_suffix,
    plan_toml,
    refusal,
    vae_layout_arg,
    worker_metrics,
)
from benchmarks.realtime.world_client import (
    Chunk,
    SessionRun,
    close_after,
    run_session,
    send_prompt,
)

MODEL = "BestWishYsh/Helios-Distilled/random"
PROMPT = "a lighthouse on a cliff at dusk, waves breaking below, gulls circling"
PROMPTS = ["the same lighthouse in a snow storm", "a ship passing at night", "sunrise, calm"]
FPS = 24
CHUNK_FRAMES = 33


def entry_args(p: argparse.ArgumentParser) -> None:
    """The served entry's options that :func:`registry_text` reads: ``--device``,
    ``--dtype``, ``--compile``, ``--tiny``, the memory plan's ``--quantization``, the
    attention backend's ``--attention`` and the VAE decoder's ``--vae-channels-last``."""
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--compile", default="blocks", choices=("blocks", "off"))
    p.add_argument("--tiny", action="store_true", help="TINY_CONFIG on the CPU, 64x64")
    p.add_argument(
        "--worker-env",
        action="append",
        type=env_pair,
        default=[],
        metavar="KEY=VALUE",
        help="set in the stack's and the takeover's up (its workers' settings: an A/B of "
        "e.g. OMNIQ_WORKER__CHECKPOINT_LOOKAHEAD); repeatable; recorded as worker_env",
    )
    memory_args(p, offload=False)
    attention_args(p)
    vae_layout_arg(p)


def env_pair(text: str) -> tuple[str, str]:
    """``--worker-env``'s ``KEY=VALUE`` (an empty value is one: unset by the settings)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value


def entry_config(args: argparse.Namespace) -> None:
    """``args.random_config`` and ``args.seq_len`` of the entry: Helios-Distilled's; with
    ``--tiny``, ``TINY_CONFIG`` on the CPU at 64x64, float32, no compile."""
    args.random_config, args.seq_len = {}, 512
    if args.tiny:
        from workers.pipelines.diffusers.helios.random_weights import TINY_CONFIG

        args.random_config, args.seq_len = TINY_CONFIG, 16
        args.device, args.dtype, args.compile = "cpu", "float32", "off"
        args.width = args.height = 64


def registry_text(args: argparse.Namespace, max_sessions: int, workers: int = 1) -> str:
    """The entry ``workers`` realtime workers serve on one GPU. With FP8 and more than one,
    each builds its random transformer on the host (``random_transformer_on_host``: a
    minute of one CPU core) for its FP8 plan to place layer by layer, as a checkpoint
    loads: built on the device, each would hold its BF16 copy (37.5 GiB with the text
    encoder) while it quantizes, and two doing so at once would leave ~2 GiB of an 80 GB
    card."""
    seq = f"max_sequence_length = {args.seq_len}\n" if args.seq_len != 512 else ""
    if workers > 1 and args.quantization == "fp8":
        seq += "random_transformer_on_host = true\n"
    if args.vae_channels_last:
        seq += "vae_channels_last = true\n"
    return f"""
[[model]]
name = "{MODEL}"
adapter = "diffusers.helios"
weights = "random"
dtype = "{args.dtype}"
compile = "{args.compile}"
max_sessions = {max_sessions}
{plan_toml(args)}[model.adapter_options]
{seq}random_config = {inline_toml(args.random_config)}
[model.spec]
default_size = [{args.width}, {args.height}]
default_steps = 3
"""


def start_event(args: argparse.Namespace, chunks: int, seed: int) -> dict[str, Any]:
    """Distilled's session: 3 steps a chunk (pyramid [1, 1, 1]), no CFG, unpaced."""
    return {
        "type": "session.start",
        "model": MODEL,
        "prompt": PROMPT,
        "width": args.width,
        "height": args.height,
        "num_frames": CHUNK_FRAMES * chunks,
        "fps": FPS,
        "seed": seed,
        "num_inference_steps": 3,
        "guidance_scale": 1.0,
        "extra_params": {"max_chunks_ahead": 0},
    }


def open_stack(args: argparse.Namespace, work: Path, realtime: int, slots: int) -> Stack:
    registry = work / f"models-{realtime}.toml"
    registry.write_text(registry_text(args, max_sessions=slots, workers=realtime))
    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_MODELS": MODEL,
        "OMNIQ_WORKER__DEVICE": args.device,
        "OMNIQ_WORKER__RANDOM_WEIGHTS": "true",
        "OMNIQ_REALTIME__SLOTS": str(slots),
        "OMNIQ_REALTIME__CAPACITY_PROBE": "false",
        # The warm-up session's first chunk compiles every pyramid stage's graph: a step
        # longer than the 10 s of silence after which the API calls a worker lost (a dead
        # worker is still found at once, by its lease), and a session placed meanwhile
        # waits for it instead of being refused.
        "OMNIQ_REALTIME__LOST_AFTER_S": "600",
        "OMNIQ_REALTIME__ADMISSION_TIMEOUT_S": "600",
        **dict(args.worker_env),
    }
    stack = Stack(workers=0, env=env, args=("--realtime-workers", str(realtime)))
    stack.start(timeout=600)
    return stack


def memory_mib(stack: Stack) -> dict[str, float]:
    """Each realtime worker's ``omniqueue_gpu_memory_allocated_bytes`` in MiB (empty on
    CPU workers, which serve no such gauge)."""
    return gauge_mib(stack, "omniqueue_gpu_memory_allocated_bytes", "realtime worker")


def compile_fallbacks(stack: Stack) -> dict[str, float]:
    """Each realtime worker's ``omniqueue_compile_fallbacks_total`` (0: compiled)."""
    return {
        worker: values.get("omniqueue_compile_fallbacks_total", 0.0)
        for worker, values in worker_metrics(stack).items()
        if worker.startswith("realtime worker")
    }


def refused(args: argparse.Namespace, max_sessions: int, workers: int = 1) -> str | None:
    """What a worker would refuse of the part's entry before loading it (None: nothing)."""
    return refusal(registry_text(args, max_sessions, workers), MODEL, args.device)


def stopped_at(stack: Stack, session_id: str, timeout: float = 60.0) -> float | None:
    """Epoch seconds of the worker's ``session <id>: stopped`` line."""
    stamp = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) "
    pattern = re.compile(stamp + r".*session " + re.escape(session_id) + ": stopped")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in stack.log_path.read_text(errors="replace").splitlines():
            if m := pattern.match(line):
                return log_time(m[1], m[2])
        time.sleep(0.05)
    return None


def chunk_breakdown(stack: Stack, session_id: str | None) -> dict[str, float] | None:
    """Where the session's chunks spent their time, mean ms per chunk by stage, from the
    worker's ``session <id>: N chunks, mean ms per chunk: denoise … send …`` line
    (``workers/sessions/delivery.py``'s ChunkTimes); None before the session ended."""
    if session_id is None:
        return None
    pattern = re.compile(
        r"session " + re.escape(session_id) + r": (\d+) chunks, mean ms per chunk: (.*)$"
    )
    for line in stack.log_path.read_text(errors="replace").splitlines():
        if m := pattern.search(line):
            words = m[2].split()
            stages = {k: float(v) for k, v in zip(words[::2], words[1::2], strict=True)}
            return {"chunks": float(m[1]), **stages}
    return None


def kept_log(args: argparse.Namespace, part: str) -> str | None:
    """Where up's stderr of ``part`` is copied (``--keep-logs DIR``), or None."""
    name = f"up_{part}{mode_suffix(args)}.log"
    return str(Path(args.keep_logs, name)) if args.keep_logs else None


def ws_url(stack: Stack) -> str:
    return stack.url.replace("http://", "ws://", 1) + "/v1/realtime/video"


def interacting(count: int, rng: random.Random) -> Any:
    """A hook that sends ``count`` prompt changes, after chunks 3, 6, 9…, each at a
    random moment of the next chunk's making (the last gap between two chunks)."""

    async def hook(run: SessionRun, ws: Any, chunk: Chunk) -> bool:
        sent = len(run.tasks)
        if chunk.index >= 3 and chunk.index % 3 == 0 and sent < count and len(run.chunks) > 1:
            gap = run.chunks[-1].arrived - run.chunks[-2].arrived
            prompt = PROMPTS[sent % len(PROMPTS)]
            send = send_prompt(ws, run, f"p{sent}", prompt, rng.uniform(0, gap * 0.9))
            run.tasks.append(asyncio.create_task(send))
        return False

    return hook


def part_stack(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    if (why := refused(args, 2)) is not None:
        return {"world_delivered_fps": None, "stack_error": f"refused before up: {why}"}
    out: dict[str, Any] = {"worker_env": dict(args.worker_env)}
    began = time.time()
    stack = open_stack(args, work, realtime=1, slots=2)
    try:
        out["worker_ready_s"] = round(stack.workers_ready(1, args.ready_timeout) - began, 1)
        out["memory_after_load_mib"] = memory_mib(stack)
        asyncio.run(_sessions(args, stack, out))
    except Exception as exc:  # what was measured before it stands
        out["stack_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["compile_fallbacks"] = compile_fallbacks(stack)
        stack.close(out, kept_log(args, "stack"))
    return out


async def _sessions(args: argparse.Namespace, stack: Stack, out: dict[str, Any]) -> None:
    """The part's measures, each written to ``out`` as it is made."""
    url, rng = ws_url(stack), random.Random(7)
    warm = await run_session(url, start_event(args, 2, seed=100))
    out["warmup_session"] = warm.summary()
    baseline = memory_mib(stack)
    main = await run_session(
        url, start_event(args, args.chunks, seed=1), interacting(args.interactions, rng)
    )
    out["session"] = main.summary()
    out["world_delivered_fps"] = out["session"]["delivered_fps"]
    out["chunk_breakdown_ms"] = chunk_breakdown(stack, main.session_id)
    latencies = main.interaction_latencies()
    out["interactions_s"] = {k: None if v is None else round(v, 3) for k, v in latencies.items()}
    carried = [v for v in latencies.values() if v is not None]
    out["world_interaction_to_chunk_s"] = round(statistics.median(carried), 3) if carried else None
    pair = await asyncio.gather(
        *(run_session(url, start_event(args, args.chunks, seed=10 + i)) for i in range(2))
    )
    out["two_sessions"] = [r.summary() for r in pair]
    rates = [r.delivered_fps() for r in pair]
    out["world_two_sessions_fps_min"] = (
        round(min(r for r in rates if r is not None), 2) if None not in rates else None
    )
    stops = [await _stopped_session(args, stack, url, rng, i) for i in range(args.stops)]
    out["stops"] = stops
    stop_ms = [s["close_to_worker_stopped_ms"] for s in stops]
    stop_ms = [x for x in stop_ms if x is not None]
    out["world_stop_p95_ms"] = round(pct(stop_ms, 0.95), 1) if stop_ms else None
    firsts = [main.first_chunk_s] + [s["first_chunk_s"] for s in stops]
    firsts = [round(x, 3) for x in firsts if x is not None]
    out["first_chunks_s"] = firsts
    out["world_first_chunk_s"] = round(statistics.median(firsts), 3) if firsts else None
    after = memory_mib(stack)
    out["world_memory_baseline_mib"] = baseline or None
    out["world_memory_after_mib"] = after or None
    if not after:
        out["memory_note"] = "no omniqueue_gpu_memory_allocated_bytes: not a CUDA worker"


async def _stopped_session(
    args: argparse.Namespace, stack: Stack, url: str, rng: random.Random, i: int
) -> dict[str, Any]:
    """A session closed at a random moment of its second chunk (the worker mid-step)."""
    delay: list[float] = []

    async def hook(run: SessionRun, ws: Any, chunk: Chunk) -> bool:
        gap = run.first_chunk_s or 1.0
        delay.append(rng.uniform(0.05, 0.95) * min(gap, CHUNK_FRAMES / FPS))
        await close_after(ws, run, delay[0])
        return True

    run = await run_session(url, start_event(args, 4, seed=200 + i), hook)
    stopped = stopped_at(stack, run.session_id) if run.session_id else None
    close = run.closed_wall
    return {
        "first_chunk_s": run.first_chunk_s,
        "close_delay_ms": round(delay[0] * 1000, 1) if delay else None,
        "close_to_worker_stopped_ms": (
            round((stopped - close) * 1000, 1) if stopped is not None and close else None
        ),
        "errors": run.errors,
    }


def takeover_missing() -> str | None:
    """Why this tree cannot take a world session over, or None."""
    try:
        import storage.session_checkpoint  # noqa: F401
        import workers.sessions.world_checkpoint  # noqa: F401
    except ImportError as exc:
        return f"no worker takeover in this tree ({exc})"
    from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter

    if not hasattr(HeliosWorldAdapter, "snapshot"):
        return "the Helios adapter takes no snapshots in this tree"
    return None


def part_takeover(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    missing = takeover_missing() or too_small(args) or refused(args, 1, workers=2)
    if missing is not None:
        return {"world_takeover_gap_s": None, "takeover_note": missing}
    out: dict[str, Any] = {"takeover_workers_per_gpu": 2}
    out["takeover_worker_env"] = dict(args.worker_env)
    stack = open_stack(args, work, realtime=2, slots=1)
    try:
        stack.workers_ready(2, args.ready_timeout)
        out["takeover_memory_after_load_mib"] = memory_mib(stack)
        out |= asyncio.run(_takeover(args, stack))
    except Exception as exc:  # one measure: the rest of the run stands
        out["world_takeover_gap_s"] = None
        out["takeover_note"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["compile_fallbacks_takeover"] = compile_fallbacks(stack)
        code = stack.stop()
        out["takeover_up_exit_code"] = code
        stack.remove(keep_log=kept_log(args, "takeover"))
    return out


def too_small(args: argparse.Namespace) -> str | None:
    """Why two BF16 workers cannot share this GPU (each ~40 GB: the 14 B transformer, the
    text encoder, a session's activations), or None."""
    import torch

    if args.quantization != "none" or not args.device.startswith("cuda"):
        return None
    if not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    if total >= 90:
        return None
    return (
        f"two BF16 workers (~40 GB each) do not fit this GPU's {total:.0f} GiB: "
        "run the takeover with --quantization fp8"
    )


def _lease_holder_pid(stack: Stack, session_id: str, attempt: int = 1) -> int | None:
    """The pid in the worker id (``host:pid:name``) holding the session's lease."""
    import redis

    from storage.constants import session_lease_key
    from storage.session_lease import parse_lease

    client = redis.Redis(port=stack.valkey_port())
    try:
        holder = client.get(session_lease_key(session_id, attempt))
    finally:
        client.close()
    if not holder:
        return None
    return int(parse_lease(holder)[0].split(":")[1])


async def _takeover(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    url = ws_url(stack)
    served: set[int] = set()

    async def note_pid(run: SessionRun, ws: Any, chunk: Chunk) -> bool:
        if chunk.index == 0 and run.session_id:
            pid = await asyncio.to_thread(_lease_holder_pid, stack, run.session_id)
            if pid is not None:
                served.add(pid)
        return False

    rounds = 0
    while len(served) < 2 and rounds < 4:  # both workers warm (their graphs compiled)
        rounds += 1
        starts = [start_event(args, 2, seed=300 + 2 * rounds + i) for i in (0, 1)]
        await asyncio.gather(*(run_session(url, start, note_pid) for start in starts))
    out: dict[str, Any] = {"warmup_rounds": rounds, "workers_warmed": len(served)}
    killed: dict[str, float] = {}

    async def kill(run: SessionRun, ws: Any, chunk: Chunk) -> bool:
        if chunk.index == args.kill_after and run.session_id and not killed:
            pid = await asyncio.to_thread(_lease_holder_pid, stack, run.session_id)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed["at"] = time.monotonic()
                run.notes["killed_pid"] = pid
        elif killed and "gap" not in killed:
            killed["gap"] = chunk.arrived - killed["at"]
            run.notes["next_chunk_index"] = chunk.index
        return False

    run = await run_session(url, start_event(args, args.kill_after + 4, seed=2), kill)
    out["takeover_session"] = run.summary()
    indices = [c.index for c in run.chunks]
    out["takeover_chunks_in_order"] = indices == list(range(len(indices)))
    if "gap" in killed and not run.errors:
        out["world_takeover_gap_s"] = round(killed["gap"], 3)
    else:
        out["world_takeover_gap_s"] = None
        why = "no worker was killed" if not killed else f"the session ended: {run.errors}"
        out["takeover_note"] = why
    return out
