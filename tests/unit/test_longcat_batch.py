"""LongCat's batched steps (``longcat_audio/batch.py``) driven by the worker's step batcher
(``workers/jobs/batcher.py``): concurrent jobs of one model denoised as one batch, each
with its own loop, seed, stop gates, progress and PCM stream.

A job alone runs the same one pass over its own rows (``guidance_batch``, the default),
within ``LONE_BOUND`` of ``__call__``'s two passes. The tiny pipeline
(``longcat_fixtures``), CPU, float32. A batched job is its solo job to rounding: measured
at most 1.7e-6 of the clip's peak (against two passes a step) over 30 runs of five jobs
whose batches were made up differently each time (different prompts and lengths, seeds,
step counts, guidance, a negative prompt, jobs joining at other steps), with and without
bucketed lengths; tested within ``BATCH_BOUND`` of the peak (docs/adapters.md). Pure
unit: the job runs' rows are fakes, no bus.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.db import Job
from models.errors import JobLost, JobTimedOut
from models.events import ChunkEvent, ProgressEvent
from models.job_specs import AudioSpec
from models.memory_plan import MemoryPlan
from storage.jobs import Lease
from storage.settings import Settings
from tests.unit.longcat_fixtures import tiny_longcat_pipeline
from workers.common.failpoints import Failpoints
from workers.jobs.batcher import DeviceShare, StepBatcher, stepping
from workers.jobs.output import make_output
from workers.jobs.run import JobRun
from workers.pipelines.base import GenerationRequest, StepState, SupportsStepBatch
from workers.pipelines.diffusers.longcat_audio.adapter import (
    LongCatAudioAdapter,
    solo_pass,
    step_timestep,
)
from workers.pipelines.diffusers.longcat_audio.batch import Row, batched_forward, text_side

# A batched job's audio against its solo job's, relative to the solo clip's peak.
BATCH_BOUND = 1e-5
# A lone job's one pass a step against its two passes (``__call__``'s), relative to the
# clip's peak (measured: 2.0e-6 at most over 64 jobs under guidance; docs/adapters.md).
LONE_BOUND = 1e-5
# One batched pass against the transformer's own forward, row by row, relative to the
# row's peak (measured: 1.5e-6).
FORWARD_BOUND = 1e-5
# (text, seed, guidance, negative prompt, steps): other lengths of clip and prompt,
# guidance and none, a negative prompt, other step counts.
JOBS: list[tuple[str, int, float, str | None, int]] = [
    ("Hello there, friend.", 1, 4.0, None, 6),
    ("The trains run on time today, and on other days too.", 2, 4.0, "robotic", 6),
    ("Hi.", 3, 1.0, None, 4),
    ("Good morning to you all.", 4, 3.0, None, 8),
]


def _request(text: str, seed: int, guidance: float, negative: str | None, steps: int) -> Any:
    return GenerationRequest.audio(
        prompt=text,
        duration_s=5.0,
        num_inference_steps=steps,
        seed=seed,
        guidance_scale=guidance,
        negative_prompt=negative,
    )


@pytest.fixture()
def pipe() -> Any:
    """A pipeline of the test's own: the first adapter loaded on a pipeline keeps its
    blocks' cancel gates."""
    return tiny_longcat_pipeline()


def _adapter(pipe: Any, **kw: Any) -> LongCatAudioAdapter:
    adapter = LongCatAudioAdapter(pipe=pipe, **kw)
    adapter.load("cpu")
    return adapter


def _solo(adapter: LongCatAudioAdapter, request: GenerationRequest) -> torch.Tensor:
    state = adapter.prepare(request)
    while not state.done:
        adapter.step(state)
    adapter.end()
    return adapter.decode_audio(state)


def _peak_diff(got: torch.Tensor, solo: torch.Tensor) -> float:
    assert got.shape == solo.shape
    return float((got - solo).abs().max() / solo.abs().max())


def _on_threads(target: Callable[[Any], None], args: Iterable[Any], timeout: float) -> None:
    """``target(arg)`` for each of ``args``, each on a thread of its own: all started, then
    each joined within ``timeout`` seconds."""
    threads = [threading.Thread(target=target, args=(arg,)) for arg in args]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)


def test_the_batched_pass_is_the_forward(pipe: Any) -> None:
    """One row: bit-equal to ``transformer.forward`` as the unbatched step calls it
    (``solo_pass``); rows of other lengths, texts and timesteps in one pass: each row within
    ``FORWARD_BOUND``, its padding zero."""
    adapter = _adapter(pipe)
    transformer = adapter.pipe.transformer
    states = [adapter.prepare(_request(*job)) for job in JOBS]
    for at, s in enumerate(states):  # each at another step
        s.step_index = at % s.num_steps
    rows: list[tuple[Row, torch.Tensor]] = []
    with torch.no_grad():
        for s in states:
            t = step_timestep(s)
            for embeds, mask in (
                (s.prompt_embeds, s.text_mask),
                (s.negative_prompt_embeds, s.negative_text_mask),
            ):
                solo = solo_pass(transformer, s, embeds, mask)
                row = Row(s.latents, s.mask, s.latent_cond, t, text_side(transformer, embeds, mask))
                assert torch.equal(batched_forward(transformer, [row]), solo)
                rows.append((row, solo))
        out = batched_forward(transformer, [row for row, _ in rows])
    assert len({row.latents.shape[1] for row, _ in rows}) == 4  # every clip's length its own
    for at, (row, solo) in enumerate(rows):
        frames = row.latents.shape[1]
        assert _peak_diff(out[at : at + 1, :frames], solo) <= FORWARD_BOUND
        assert not out[at, frames:].any()


def _run_batched(
    adapter: LongCatAudioAdapter,
    requests: list[GenerationRequest],
    *,
    late: int | None = None,
    stops: dict[int, Callable[[int, int], BaseException | None]] | None = None,
) -> tuple[dict[int, Any], list[list[int]]]:
    """Each request's job on a thread of its own, its steps through one batcher: each
    job's audio (or the exception its loop raised) and each batch's step indexes. Job
    ``late`` starts once job 0 has made 2 steps; ``stops[i](step, block)`` is job i's
    stop question."""
    batcher = StepBatcher(adapter, size=len(requests), wait_s=0.05, name="tiny")
    batches: list[list[int]] = []
    step_batch = adapter.step_batch

    def recorded(states: Any) -> None:
        batches.append([s.step_index for s in states])
        step_batch(states)

    adapter.step_batch = recorded  # type: ignore[method-assign]
    two_steps = threading.Event()
    out: dict[int, Any] = {}

    def job(i: int) -> None:
        if i == late:
            two_steps.wait(10)
        try:
            state = batcher.call(lambda: adapter.prepare(requests[i]))
            question = (stops or {}).get(i, lambda step, block: None)
            with stepping(adapter, batcher) as stepper:
                while not state.done:
                    stepper.step(state, functools.partial(question, state.step_index))
                    if i == 0 and state.step_index == 2:
                        two_steps.set()
                    if (exc := question(state.step_index, 0)) is not None:
                        raise exc  # the loop's own gate between steps
            batcher.call(adapter.end)
            out[i] = adapter.decode_audio(state)
        except Exception as exc:
            out[i] = exc
            two_steps.set()

    _on_threads(job, range(len(requests)), 30)
    del adapter.step_batch
    batcher.close()
    return out, batches


@pytest.mark.parametrize("buckets", [False, True], ids=["lengths", "buckets"])
def test_batched_jobs_are_their_solo_jobs(pipe: Any, buckets: bool) -> None:
    """Four jobs, one joining two steps late: batches of several jobs at different steps,
    each job's audio its solo job's within ``BATCH_BOUND``; their own seeds give their own
    noise (the same text, another seed: another clip)."""
    adapter = _adapter(pipe, buckets=buckets)
    assert isinstance(adapter, SupportsStepBatch)
    requests = [_request(*job) for job in JOBS]
    requests.append(_request(JOBS[0][0], 99, *JOBS[0][2:]))  # job 0's text, another seed
    solo = [_solo(adapter, r) for r in requests]
    out, batches = _run_batched(adapter, requests, late=3)
    assert max(len(b) for b in batches) >= 3
    assert any(len(set(b)) > 1 for b in batches)  # jobs at different steps in one pass
    assert sum(len(b) for b in batches) == sum(r.num_inference_steps for r in requests)
    for i in range(len(requests)):
        assert isinstance(out[i], torch.Tensor), out[i]
        assert _peak_diff(out[i], solo[i]) <= BATCH_BOUND, i
    assert _peak_diff(out[4], out[0]) > 0.1  # another seed, another clip


@pytest.mark.parametrize("job", JOBS, ids=["cfg", "negative-prompt", "no-cfg", "cfg-3"])
def test_a_lone_job_is_its_two_pass_job(pipe: Any, job: tuple[Any, ...]) -> None:
    """A job alone, one pass of its rows a step (``guidance_batch``, the default) against
    ``__call__``'s two passes (``guidance_batch = false``, bit-equal to ``__call__``:
    test_diffusers_longcat.py): within ``LONE_BOUND`` of the peak under guidance; without
    guidance its one row is the forward bit for bit, so the audio is too."""
    request = _request(*job)
    one_pass = _solo(_adapter(pipe), request)
    two_passes = _solo(_adapter(pipe, guidance_batch=False), request)
    if request.guidance_scale > 1.0:
        assert _peak_diff(one_pass, two_passes) <= LONE_BOUND
    else:
        assert torch.equal(one_pass, two_passes)


def test_an_offloaded_transformer_keeps_two_passes() -> None:
    """Offloading moves the transformer in at its ``forward``, which one pass skips."""
    assert LongCatAudioAdapter(pipe=object()).guidance_batch
    for offload in ("model", "group"):
        plan = MemoryPlan(offload=offload)
        assert not LongCatAudioAdapter(pipe=object(), memory=plan).guidance_batch


def test_a_worker_of_one_job_at_a_time_runs_one_pass(pipe: Any, tmp_path: Path) -> None:
    """``OMNIQ_WORKER__BATCH_SIZE=1`` (the default): no batcher, the job's loop steps alone
    (``make_output`` without one). Each step is one pass over the job's two rows (the
    blocks see 2 rows; ``transformer.forward`` never runs), and the text side is made once
    for the job (the prompt's and the null's), not once a step. Its PCM is the same job's
    in a batch (through a batcher, alone in it) sample for sample, and its two-pass job's
    to a PCM16 step."""
    adapter = _adapter(pipe)
    transformer = adapter.pipe.transformer
    forwards, rows, texts = [], [], []  # transformer calls, each pass's rows, text sides
    transformer.register_forward_pre_hook(lambda m, a: forwards.append(1))
    transformer.blocks[0].register_forward_pre_hook(
        lambda m, a, kw: rows.append(kw["hidden_states"].shape[0]), with_kwargs=True
    )
    transformer.text_embed.register_forward_pre_hook(lambda m, a: texts.append(1))
    text, seed, steps = JOBS[1][0], 5, 6

    def pcm(model: LongCatAudioAdapter, name: str, batcher: StepBatcher | None = None) -> Any:
        run, events = _job_run(0, text, seed, steps)
        (tmp_path / name).mkdir()
        make_output(model, run, GenerationRequest(run.spec), tmp_path / name, 0, batcher)
        return _pcm(events)

    alone = pcm(adapter, "alone")
    assert not forwards and rows == [2] * steps and len(texts) == 2
    batcher = StepBatcher(adapter, size=3, wait_s=0.01, name="tiny")
    batched = pcm(adapter, "batched", batcher)
    batcher.close()
    assert alone.size and np.array_equal(alone, batched)
    two_passes = pcm(_adapter(pipe, guidance_batch=False), "two-passes")
    assert np.abs(alone.astype(int) - two_passes).max() <= 1


def test_a_member_that_stops_leaves_the_others_alone(pipe: Any) -> None:
    """Job 1's stop comes inside a batched step: the step runs on for all, job 1 stops at
    its own gate after it, and the others' audio is still their solo jobs'. When every
    member of a step asks to stop, the step stops and each is raised its own reason."""
    adapter = _adapter(pipe)
    requests = [_request(*job) for job in JOBS[:3]]
    solo = [_solo(adapter, r) for r in requests]

    def cancelled(step: int, block: int) -> BaseException | None:
        return JobLost() if (step, block) >= (2, 1) else None

    out, batches = _run_batched(adapter, requests, stops={1: cancelled})
    assert isinstance(out[1], JobLost)
    assert sum(len(b) for b in batches) == 6 + 3 + 4  # job 1 made steps 0, 1, 2
    for i in (0, 2):
        assert _peak_diff(out[i], solo[i]) <= BATCH_BOUND

    states = [adapter.prepare(r) for r in requests[:2]]
    batcher = StepBatcher(adapter, size=2, wait_s=1.0, name="tiny")
    errors: dict[int, BaseException] = {}
    reasons = [JobLost(), JobTimedOut("past its deadline")]

    def member(i: int) -> None:
        with stepping(adapter, batcher) as stepper:
            try:
                stepper.step(states[i], lambda block: reasons[i])
            except Exception as exc:
                errors[i] = exc

    _on_threads(member, range(2), 10)
    batcher.close()
    assert errors == {0: reasons[0], 1: reasons[1]}
    assert [s.step_index for s in states] == [0, 0]  # no step was made


class _Row:
    """A job row as a run's writes see it (``JobStore``'s fenced methods)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def still_owned(self, job_id: str, lease: Lease) -> bool:
        return True

    def update_running(self, job_id: str, lease: Lease, **values: Any) -> bool:
        self.steps.append(values["step"])
        return True


def _job_run(i: int, text: str, seed: int, steps: int) -> tuple[JobRun, list[Any]]:
    spec = AudioSpec.model_validate(
        {
            "model": "tiny/longcat",
            "prompt": text,
            "duration_ms": 5000,
            "seed": seed,
            "num_inference_steps": steps,
            "options": {"guidance_scale": 4.0},
            "response_format": "pcm",
            "stream_pcm": True,
        }
    )
    job = Job.new(spec, id=f"audio_batch{i}", owner="test")
    job.attempt, job.started_at = 1, job.created_at
    events: list[Any] = []

    def publish(job: Job, event: Any, data: bytes | None) -> str | None:
        events.append((event, data))
        return None

    settings = Settings(worker={"progress_interval_s": 0.005})
    run = JobRun(job, Lease("w", 1), _Row(), settings, publish, Failpoints(None))  # type: ignore[arg-type]
    return run, events


def _pcm(events: list[Any]) -> np.ndarray:
    return np.frombuffer(b"".join(d for e, d in events if isinstance(e, ChunkEvent)), "<i2")


def test_each_job_keeps_its_progress_and_its_stream(pipe: Any, tmp_path: Path) -> None:
    """Three jobs through ``make_output`` on threads of their own, one batcher: each
    reports its own steps (up to its own count) and streams its own PCM, its solo job's
    to a PCM16 step; the job whose run is cancelled inside a batched step stops after
    it, alone, its stream never begun."""
    adapter = _adapter(pipe)
    jobs = [(JOBS[0][0], 5, 5), (JOBS[1][0], 6, 7), (JOBS[3][0], 7, 6)]
    solo = []
    for i, (text, seed, steps) in enumerate(jobs):
        run, events = _job_run(i, text, seed, steps)
        (tmp_path / f"solo{i}").mkdir()
        make_output(adapter, run, GenerationRequest(run.spec), tmp_path / f"solo{i}", 0)
        solo.append(_pcm(events))
    runs = [_job_run(i, text, seed, steps) for i, (text, seed, steps) in enumerate(jobs)]
    cancelled = runs[1][0]
    question = cancelled.in_step_stop

    def cancel_in_step_3() -> Any:
        ask = question()

        def reason(block: int) -> BaseException | None:
            if cancelled.step == 2 and block == 1:
                cancelled.stop.set()  # the bus watch, while the batch is in step 3
            return ask(block)

        return reason

    cancelled.in_step_stop = cancel_in_step_3  # type: ignore[method-assign]
    batcher = StepBatcher(adapter, size=3, wait_s=0.05, name="tiny")
    outcome: dict[int, Any] = {}

    def job(i: int) -> None:
        run, _ = runs[i]
        out = tmp_path / f"batched{i}"
        out.mkdir()
        run.start(None, None)
        try:
            outcome[i] = make_output(adapter, run, GenerationRequest(run.spec), out, 0, batcher)
        except Exception as exc:
            outcome[i] = exc
        finally:
            run.close()

    _on_threads(job, range(3), 30)
    batcher.close()
    assert isinstance(outcome[1], JobLost)
    assert batcher.largest == 3
    for i in (0, 2):
        run, events = runs[i]
        done = [e.step for e, _ in events if isinstance(e, ProgressEvent) and e.stage == "denoise"]
        assert done == sorted(done) and done[-1] == run.spec.num_inference_steps
        assert run.jobs.steps[-1] == run.spec.num_inference_steps  # type: ignore[attr-defined]
        pcm = _pcm(events)
        assert len(pcm) == len(solo[i]) and np.abs(pcm.astype(int) - solo[i]).max() <= 1
    assert cancelled.step == 3 and not _pcm(runs[1][1]).size


def test_the_device_is_shared_by_batched_jobs_or_held_alone() -> None:
    """Up to ``size`` jobs of batched models at once; a job of another model waits for
    them to end, and a batched job that comes after it waits for it."""
    share = DeviceShare(2)
    order: list[str] = []
    release = threading.Event()

    def hold(name: str, batched: bool) -> None:
        with share.hold(batched=batched):
            order.append(f"+{name}")
            if name.startswith("b"):
                release.wait(5)
            order.append(f"-{name}")

    def start(name: str, batched: bool) -> threading.Thread:
        thread = threading.Thread(target=hold, args=(name, batched))
        thread.start()
        return thread

    threads = [start("b1", True), start("b2", True)]
    while share.running < 2:
        time.sleep(0.001)
    threads.append(start("alone", False))
    time.sleep(0.05)
    threads.append(start("b3", True))  # after the waiting one: not before it
    time.sleep(0.05)
    assert share.running == 2 and order == ["+b1", "+b2"]
    release.set()
    for thread in threads:
        thread.join(5)
    assert order.index("+alone") > max(order.index("-b1"), order.index("-b2"))
    assert order.index("+b3") > order.index("-alone")


def test_a_step_that_fails_fails_every_member(pipe: Any) -> None:
    """An error of the batched call (out of memory) is raised to each member of it."""
    adapter = _adapter(pipe)
    batcher = StepBatcher(adapter, size=2, wait_s=1.0, name="tiny")
    states: list[StepState] = [adapter.prepare(_request(*job)) for job in JOBS[:2]]
    failure = torch.OutOfMemoryError("out of memory")

    def fails(states: Any) -> None:
        raise failure

    adapter.step_batch = fails  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def member(state: StepState) -> None:
        with stepping(adapter, batcher) as stepper:
            try:
                stepper.step(state, lambda block: None)
            except torch.OutOfMemoryError as exc:
                errors.append(exc)

    _on_threads(member, states, 10)
    del adapter.step_batch
    batcher.close()
    assert errors == [failure, failure]


class _Slow:
    """A batching adapter whose step takes 30 ms, whatever the batch (launch-bound)."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def step_batch(self, states: Any) -> None:
        self.batches.append(len(states))
        time.sleep(0.03)
        for state in states:
            state.step_index += 1

    def warm_up_batch(self, size: int) -> None: ...


def test_a_job_that_comes_during_a_batch_joins_the_next_one() -> None:
    """Job 2's first step comes while a batch of the others runs. The next batch waits
    from when the device is free, so it takes all three, and so do the ones after it:
    the job that came late does not run alone in the others' wake, step after step (as
    it did while the wait was counted from when its step came)."""
    slow = _Slow()
    batcher = StepBatcher(slow, size=3, wait_s=0.01, name="slow")  # type: ignore[arg-type]
    started = threading.Event()

    def job(i: int) -> None:
        if i == 2:
            started.wait(5)
            time.sleep(0.01)  # inside the first batch
        state = StepState(num_steps=6)
        with stepping(slow, batcher) as stepper:  # type: ignore[arg-type]
            while not state.done:
                started.set()
                stepper.step(state, lambda block: None)

    _on_threads(job, range(3), 10)
    batcher.close()
    assert sum(slow.batches) == 18 and slow.batches.count(3) >= 4, slow.batches
