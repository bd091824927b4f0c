"""One output of a job run: prepare → step × N → decode → encode, into a directory.

The executor (``workers/jobs/executor.py``) claims the job, calls :func:`make_output` once
per output (a video job's ``n``), uploads what they made and completes the job. Between
two steps the run (:class:`workers.jobs.run.JobRun`) checks the stop gates and the
deadline and records progress; the stage's time and the progress events are its too.
A :class:`VideoSpec` becomes an MP4, its thumbnail and its spritesheet
(``workers/media/mp4.py``), checked against the spec (``workers/jobs/output_check.py``); an
:class:`AudioSpec` one file in the requested format (``workers/media/audio.py``), and,
when it asks for it, its PCM16 samples as ``chunk`` events: after each step for an
adapter whose steps make the audio (``take_audio``, :mod:`workers.media.pcm_stream`),
after each window for one that decodes in windows (``decode_audio_stream``), else right
after decoding.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from pathlib import Path
from typing import Any

from models.job_specs import AudioJobOutput, AudioSpec, VideoSpec
from workers.common import metrics
from workers.jobs.batcher import StepBatcher, stepping
from workers.jobs.output_check import Expected, check_mp4
from workers.jobs.run import DENOISE_END, STAGE_START, JobRun
from workers.media.audio import EXTENSIONS, MEDIA_TYPES, encode_audio, output_rate, prepare_audio
from workers.media.mp4 import Streamed, decode_streamed, encode_video, finish_video
from workers.media.pcm_stream import PcmStream, SupportsAudioDecodeStream
from workers.pipelines.base import (
    GenerationRequest,
    Media,
    Pipeline,
    SupportsAudioPieces,
    SupportsDecodeStream,
    SupportsPreview,
    checkpoints,
)

log = logging.getLogger(__name__)

# (artifact variant, path, content type) of each file an output made.
Files = list[tuple[str, Path, str]]


def make_output(
    pipe: Pipeline,
    run: JobRun,
    request: GenerationRequest,
    out: Path,
    index: int,
    batcher: StepBatcher | None = None,
) -> tuple[Files, dict[str, Any], float]:
    """One output: prepare → step × N → decode → encode into ``out`` (its MP4 checked
    against the spec); its files, the row's extra values and its inference seconds. With
    a ``batcher`` (a worker that batches the model's steps: batcher.py) the prepare runs
    on its device thread and each step in its next batch; the rest is the job's own."""
    job, spec = run.job, run.spec
    started = time.monotonic()
    run.failpoint("prepare")
    with checkpoints(run.stop_point()):
        prepare = functools.partial(pipe.prepare, request)
        state = prepare() if batcher is None else batcher.call(prepare)
        del prepare
    del request
    run.enter("denoise")
    preview_every = run.settings.worker.preview_every
    in_step = run.in_step_stop()
    step_seconds = metrics.STEP_SECONDS.labels(job.model)
    # PCM published as the steps make it (adapters with ``take_audio``).
    pcm = PcmStream(run, spec) if isinstance(spec, AudioSpec) and spec.stream_pcm else None
    with stepping(pipe, batcher) as stepper:
        while not state.done:
            run.failpoint(f"step:{state.step_index}")
            run.blocks = 0
            step_started = time.monotonic()
            run.in_step = True
            stepper.step(state, in_step)
            run.in_step = False
            step_seconds.observe(time.monotonic() - step_started)
            run.step = state.step_index
            span = DENOISE_END - STAGE_START["denoise"]
            progress = STAGE_START["denoise"] + span * state.step_index // state.num_steps
            run.report(progress, force=state.done)
            if pcm is not None and isinstance(pipe, SupportsAudioPieces):
                pcm.feed(pipe.take_audio(state))
            due = preview_every and state.step_index % preview_every == 0 and not state.done
            if due and isinstance(pipe, SupportsPreview):
                run.preview(pipe, state)
    if batcher is not None:
        log.info("job %s: denoised in batches of up to %d jobs", job.id, stepper.largest)

    run.enter("decode")
    run.failpoint("decode")
    streamed: Streamed | None = None  # the MP4 written while it decoded
    # The raw frames' SHA-256, when logged (``worker.log_frame_digests``).
    frames_digest = hashlib.sha256() if run.settings.worker.log_frame_digests else None
    with checkpoints(run.stop_point()):
        media: Media | None = None
        if isinstance(spec, VideoSpec) and isinstance(pipe, SupportsDecodeStream):
            streamed = decode_streamed(pipe, state, spec.fps, out, frames_digest)
        elif pcm is not None and not pcm.started and isinstance(pipe, SupportsAudioDecodeStream):
            pieces = pipe.decode_audio_stream(state)
            media = pcm.decode(pieces) if pieces is not None else None
        if streamed is None and media is None:
            media = pipe.decode(state)
    del state
    inference_time = time.monotonic() - started

    run.enter("encode")
    run.failpoint("encode")
    extra_values: dict[str, Any] = {}
    if streamed is not None:
        files = finish_video(streamed.middle, out, streamed.sprites)
    elif isinstance(spec, AudioSpec):
        assert media is not None
        files, output = _encode_audio(run, spec, media, out, pcm)
        extra_values["output"] = output.model_dump()
    else:
        assert media is not None
        files = encode_video(media, out, frames_digest)
    if isinstance(spec, VideoSpec):
        if streamed is not None:
            made_sound = streamed.has_audio
        else:
            made_sound = media is not None and media.audio is not None
        check_mp4(out / "video.mp4", Expected.of(spec, audio=made_sound))
    del media
    if frames_digest is not None and isinstance(spec, VideoSpec):
        which = "" if index == 0 else f" output {index}"
        log.info("job %s:%s frames sha256 %s", job.id, which, frames_digest.hexdigest())
    return files, extra_values, inference_time


def _encode_audio(
    run: JobRun, spec: AudioSpec, media: Media, tmp: Path, pcm: PcmStream | None
) -> tuple[Files, AudioJobOutput]:
    """Convert to the artifact's rate and channels, stream it as PCM16 chunks when the
    spec asks for it (before the encode, so listeners need not wait for it), encode.
    A clip streamed during the steps (``pcm``) is encoded as it was streamed."""
    fmt = spec.response_format
    if media.audio is None or not media.sample_rate:
        raise RuntimeError(f"model {run.job.model} made no audio")
    if pcm is not None and pcm.started:
        audio = pcm.finish(media.audio, media.sample_rate)
    else:
        rate = output_rate(fmt, media.sample_rate, spec.sample_rate)
        audio = prepare_audio(media.audio, media.sample_rate, rate=rate, channels=spec.channels)
        if spec.stream_pcm:
            run.stream_pcm(audio)
    path = tmp / f"audio.{EXTENSIONS[fmt]}"
    encode_audio(audio, fmt, path)
    output = AudioJobOutput(
        sample_rate=audio.sample_rate, channels=audio.channels, num_samples=audio.num_samples
    )
    return [("audio", path, MEDIA_TYPES[fmt])], output
