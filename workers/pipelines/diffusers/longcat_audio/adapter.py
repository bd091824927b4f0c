"""LongCat-AudioDiT text-to-speech (``diffusers.LongCatAudioDiTPipeline``) one denoise step
at a time.

Mirrors ``LongCatAudioDiTPipeline.__call__`` (diffusers 0.42.1) for one prompt:
``prepare`` = everything before its loop (``check_inputs``, the normalised prompt, the
duration in latent frames, ``encode_prompt`` with its masks, the zero or encoded negative,
the zero ``latent_cond``, ``prepare_latents`` and the ``1 → 1/N`` sigma schedule on the
job's own scheduler), ``step`` = one loop iteration (the conditional pass, the null pass
when ``guidance_scale > 1`` and the guidance written as ``__call__`` writes it, the
scheduler step), ``decode`` = ``vae.decode(latents.permute(0, 2, 1))``.

One pass per step (adapter option ``guidance_batch``, on by default): a job's step runs
its conditional and null passes as one transformer pass of two rows, with its text side
made once for the job, not once a pass (batch.py): the code of a batched step
(``step_batch``) with one job in it. The step is launch-bound (a 1B DiT over a few hundred
tokens), so one pass of two rows costs about what one pass of one row costs: 48 against
99 ms a step on an H100, eager. The two rows round otherwise than two passes of one, so
under guidance the audio is ``__call__``'s to the last bits (docs/adapters.md gives the
bound; without guidance the one row is ``__call__``'s pass bit for bit);
``guidance_batch = false`` runs ``__call__``'s own two passes, bit-equal to it.

Duration, in latent frames of ``vae.config.downsampling_ratio`` samples:

* ``request.options["duration_seconds"]`` when the request gave a length (speech's
  ``duration_seconds``, generations' ``seconds``): ``__call__``'s ``audio_duration_s``;
* otherwise estimated from the text as ``__call__`` does (``_approx_duration_from_text``:
  0.082 s per Latin character, 0.21 s per CJK one), divided by ``speed`` when the request
  asks for one other than 1 (the model fills whatever duration it is given, so a longer
  clip is slower speech): ``__call__`` with ``audio_duration_s = estimate / speed``.

Either way at least one latent frame and at most ``max_wav_duration`` (30 s), as in
``__call__``. An explicit length with a ``speed`` other than 1 is refused (``speed``): the
two would contradict each other. The pipeline has no speaker input, so ``voice`` is not
read (the catalog does not declare it; ``docs/api.md`` says so).

Other differences from ``__call__`` (none change the numbers): one prompt, no precomputed
``latents``, no callbacks; the scheduler is the job's copy (``__call__`` sets timesteps on
the shared one); an empty ``negative_prompt`` counts as none (the zero embedding).

Compiled blocks (on CUDA unless the entry sets ``compile = "off"``): one graph set with
the clip's frames and the prompt's tokens symbolic (``dynamic=True``), made at worker
start by :meth:`LongCatAudioAdapter.warm_up` at lengths chosen to keep them symbolic, for
a job with guidance (two rows, a symbolic row count that batched steps reuse) and one
without (one row, a size dynamo specialises), so no job compiles while it denoises and
no new length compiles at all (a 1-frame clip or a 1-token prompt, which dynamo
specialises, compiles once in its prepare). With CUDA graphs (``compile_mode =
"reduce-overhead"``) the lengths are bucketed (buckets.py).

Step graphs (``step_graphs``, on by default with CUDA where the blocks record no CUDA
graphs of their own): each one-pass step's transformer pass replayed as one CUDA graph,
one per shape, lengths bucketed (graphs.py); a stop then lands between steps.

Batched steps (``step_batch``, the ``SupportsStepBatch`` capability: a worker that runs
several jobs at once batches their steps): the transformer's forward split at its text
side (batch.py), every job's conditional and null passes in one pass, each at its own
timestep; equal to the jobs' own steps to rounding (docs/adapters.md gives the bound).

Streaming: a job that streams PCM decodes window by window (decode.py,
``decode_audio_stream``), so its first chunk goes out before the last window is decoded;
``decode`` decodes the whole clip at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Unpack

import numpy as np
import torch
from diffusers import LongCatAudioDiTPipeline
from diffusers.pipelines.longcat_audio_dit.pipeline_longcat_audio_dit import (
    _lens_to_mask,
    _normalize_text,
)

from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest, Media, StepState
from workers.pipelines.diffusers.longcat_audio.batch import (
    Row,
    batched_forward,
    forward_pass,
    pass_inputs,
    text_side,
)
from workers.pipelines.diffusers.longcat_audio.buckets import TextBuckets, bucket, padded
from workers.pipelines.diffusers.longcat_audio.decode import (
    context_frames,
    decode_windows,
    decodes_whole_frames,
)
from workers.pipelines.diffusers.longcat_audio.duration import duration_frames
from workers.pipelines.diffusers.longcat_audio.graphs import PassGraphs
from workers.pipelines.diffusers.longcat_audio.state import LongCatAudioState
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import (
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
)
from workers.pipelines.diffusers.shared.entry import EntryOptions

# torch.compile modes that run the compiled blocks as CUDA graphs.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# The lengths the warm-up compiles the blocks at: primes, unlike each other and every
# fixed size of the model (widths, heads: multiples of 8), so that dynamo's first graph
# keeps them symbolic (it gives two equal sizes one symbol, and a size equal to a width
# becomes that constant).
WARM_UP_FRAMES, WARM_UP_TOKENS = 53, 37
# The rows of the batched warm-up (``warm_up_batch``): another prime, so that the batch
# size is symbolic too (a batch of 1, the solo step's, is dynamo's specialised size).
WARM_UP_ROWS = 3
# The streamed decode's windows grow from ``decode_window`` frames up to this many.
LARGEST_WINDOW = 128


class LongCatAudioAdapter(DiffusersAdapter[LongCatAudioState]):
    """``LongCatAudioDiTPipeline`` (e.g. meituan-longcat/LongCat-AudioDiT-1B); speech only."""

    family = "diffusers.longcat_audio"
    pipeline_class = LongCatAudioDiTPipeline

    def __init__(
        self,
        path: str | None = None,
        *,
        random_config: dict[str, dict[str, Any]] | None = None,
        decode_window: int = 16,
        buckets: bool | None = None,
        guidance_batch: bool = True,
        step_graphs: bool | None = None,
        **options: Unpack[EntryOptions],
    ) -> None:
        """``decode_window``: the streamed decode's first window in latent frames (0: a
        streamed job's PCM waits for the whole decode); ``buckets``: pad the lengths to
        buckets (buckets.py; default: where CUDA graphs of either kind run);
        ``guidance_batch``: a job's
        conditional and null passes as one pass of two rows (module docstring), False:
        ``__call__``'s two passes, bit for bit (so too where the entry offloads: an
        offloaded transformer moves in at its ``forward``, which the one pass skips);
        ``step_graphs``: each one-pass step replayed as one CUDA graph (graphs.py;
        default: on a CUDA device, where the pass runs as one and the blocks are not
        CUDA graphs of their own)."""
        super().__init__(path, **options)
        memory = self.entry.memory
        offloads = memory is not None and memory.offload != "none"
        self.guidance_batch = guidance_batch and not offloads
        cuda_graphs = self.entry.compile_mode in CUDA_GRAPH_MODES
        if step_graphs and cuda_graphs:
            raise ValueError(
                f"step_graphs and compile_mode = {self.entry.compile_mode!r} both record "
                "CUDA graphs (a pass's graph cannot hold the blocks' own): pick one"
            )
        if step_graphs and not self.guidance_batch:
            off = (
                f"offload = {memory.offload!r}" if memory and offloads else "guidance_batch = false"
            )
            raise ValueError(
                f"step_graphs and {off} do not combine: the graphs record the one-pass step, "
                "which the latter turns off"
            )
        self.step_graphs = step_graphs
        self.graphs: PassGraphs | None = None  # set by ``load`` where the steps are graphs
        # ``weights = "random"`` (longcat_audio/random_weights.py): per-part config overrides.
        self.random_config = dict(random_config or {})
        # Every clip length is a new sequence length and every prompt a new text length:
        # both symbolic in one graph set, made by ``warm_up``.
        self.compiler.dynamic = True
        self.compiler.clone_outputs = cuda_graphs
        self._buckets_option = buckets
        self.buckets = cuda_graphs if buckets is None else buckets
        self.text_buckets: TextBuckets | None = None
        self.decode_window = decode_window
        # The length classes compiled (which of frames, tokens, negative tokens are 1).
        self._length_classes: set[tuple[bool, ...]] = set()

    def random_pipeline(self, device: str) -> Any:
        """Default configs, seeded random weights, on ``device``
        (longcat_audio/random_weights.py)."""
        from workers.pipelines.diffusers.longcat_audio.random_weights import random_pipeline

        return random_pipeline(device, self.entry.dtype, config=self.random_config)

    def load(self, device: str) -> None:
        """The pipeline on ``device`` (the base's ``load``), the steps' graphs where they
        run (``step_graphs``: CUDA only), and the lengths bucketed where graphs of either
        kind record them (unless ``buckets`` says otherwise), with the blocks' text
        padding."""
        on_cuda = torch.device(device).type == "cuda"
        if self.step_graphs and not on_cuda:
            raise ValueError(f"step_graphs records CUDA graphs: not on {device}")
        super().load(device)
        cuda_graphs = self.entry.compile_mode in CUDA_GRAPH_MODES
        if self.step_graphs is not False and on_cuda and self.guidance_batch and not cuda_graphs:
            self.graphs = PassGraphs()
        if self._buckets_option is None:
            self.buckets = cuda_graphs or self.graphs is not None
        if self.buckets:
            self.text_buckets = TextBuckets()
            self.text_buckets.install(list(self._loaded().transformer.blocks))

    def warm_up(self) -> None:
        """Compile the blocks once for every length, before the worker takes jobs: one
        step of a short request whose frames and tokens are replaced by
        ``WARM_UP_FRAMES`` and ``WARM_UP_TOKENS`` (the registry's video ``warmup`` shapes
        mean nothing to speech), with guidance and without (under ``guidance_batch``
        two rows and one: other graphs)."""
        if not self.compiler.enabled:
            return
        request = GenerationRequest.audio(
            prompt="warm-up", duration_s=1.0, num_inference_steps=2, seed=0, guidance_scale=4.0
        )
        # Its passes run directly: the warm-up's lengths are no job's, so their step graphs
        # would only hold memory (a job's own prepare captures its shape's).
        graphs, self.graphs = self.graphs, None
        try:
            with torch.no_grad():
                state = _resized(
                    self._prepare(self._loaded(), request), WARM_UP_FRAMES, WARM_UP_TOKENS
                )
                self._compile_for(state, "warmup")
                self._compile_for(
                    dataclasses.replace(state, do_cfg=False, guidance_scale=1.0), "warmup"
                )
            del state
        finally:
            self.graphs = graphs

    def _compile_for(self, state: LongCatAudioState, why: str) -> None:
        """Compile the blocks unless a job of the same class did: lengths are symbolic, so
        only a length of 1 (which dynamo specialises) or the other row count (guidance or
        none) is another graph."""
        lengths = (
            state.frames,
            state.prompt_embeds.shape[1],
            state.negative_prompt_embeds.shape[1],
        )
        length_class = (*(n > 1 for n in lengths), state.do_cfg)
        if length_class not in self._length_classes:
            super()._compile_for(state, why)
            self._length_classes.add(length_class)

    def end(self) -> None:
        """The base's ``end``, and the last pass's padded text let go."""
        super().end()
        if self.text_buckets is not None:
            self.text_buckets.clear()

    def _prepare(self, pipe: Any, request: GenerationRequest) -> LongCatAudioState:
        """Everything ``__call__`` does before its denoising loop."""
        prompt = [request.prompt]
        negative_prompt = request.negative_prompt or None
        pipe.check_inputs(prompt, negative_prompt, "pt", ["latents"])
        scale = guidance_scale(pipe, request)
        # Where the pipe runs (loaded, or its offload hooks' device): ``__call__``'s
        # ``_execution_device``, which walks every module of every component to find
        # offload hooks (some 2 ms a prepare for the tiny model's 273 modules on the CPU).
        device = self.device

        normalized_prompts = [_normalize_text(text) for text in prompt]
        duration = duration_frames(pipe, request)
        length = bucket(duration) if self.buckets else duration  # frames the DiT sees

        prompt_embeds, prompt_embeds_len = pipe.encode_prompt(normalized_prompts, device)
        duration_tensor = torch.full((1,), duration, device=device, dtype=torch.long)
        mask = _lens_to_mask(duration_tensor, length=length)
        text_mask = _lens_to_mask(prompt_embeds_len, length=prompt_embeds.shape[1])
        if negative_prompt is None:
            negative_prompt_embeds = torch.zeros_like(prompt_embeds)
            negative_text_mask = text_mask
        else:
            negative_prompt_embeds, negative_len = pipe.encode_prompt([negative_prompt], device)
            negative_text_mask = _lens_to_mask(negative_len, length=negative_prompt_embeds.shape[1])

        dtype = prompt_embeds.dtype
        latent_cond = torch.zeros(1, length, pipe.latent_dim, device=device, dtype=dtype)
        generator = make_generator(request.seed)
        latents = pipe.prepare_latents(1, duration, device, dtype, generator=generator)
        latents = padded(latents, length)  # the clip's noise, then zeros

        steps = request.num_inference_steps
        if steps < 1:
            raise InvalidJobInput("num_inference_steps must be a positive integer")
        sigmas = torch.linspace(1.0, 1.0 / steps, steps, dtype=torch.float32).tolist()
        scheduler = job_scheduler(pipe.scheduler)
        scheduler.set_timesteps(sigmas=sigmas, device=device)
        scheduler.set_begin_index(0)
        timesteps = scheduler.timesteps
        # Every step's transformer timestep, as ``__call__`` makes it each step
        # (``t / num_train_timesteps`` in the text's dtype): elementwise, so the same bits.
        step_times = (timesteps / scheduler.config.num_train_timesteps).to(prompt_embeds.dtype)
        return LongCatAudioState(
            **sampling(request, generator, scheduler, timesteps, latents, scale, scale > 1.0),
            prompt_embeds=prompt_embeds,
            text_mask=text_mask,
            negative_prompt_embeds=negative_prompt_embeds,
            negative_text_mask=negative_text_mask,
            mask=mask,
            latent_cond=latent_cond,
            frames=duration,
            step_times=step_times,
        )

    def _step(self, pipe: Any, s: LongCatAudioState) -> None:
        """One iteration of ``__call__``'s loop: under ``guidance_batch`` the job's rows in
        one pass, as a batched step of this job alone; otherwise ``__call__``'s two passes."""
        if self.guidance_batch:
            self._denoise(pipe, [s])
            return
        transformer = pipe.transformer
        pred = solo_pass(transformer, s, s.prompt_embeds, s.text_mask)
        null_pred = None
        if s.do_cfg:
            null_pred = solo_pass(transformer, s, s.negative_prompt_embeds, s.negative_text_mask)
        _guided_step(s, pred, null_pred)

    @torch.no_grad()
    def step_batch(self, states: Sequence[StepState]) -> None:
        """One step of each job of ``states`` (each at its own step) as one transformer pass
        over their rows (``_denoise``)."""
        pipe, jobs = self._loaded(), [self._state(s) for s in states]
        self.gate.begin_step()
        self._denoise(pipe, jobs)
        for s in jobs:
            s.step_index += 1

    def _denoise(self, pipe: Any, jobs: Sequence[LongCatAudioState]) -> None:
        """One step of each of ``jobs`` as one transformer pass over their rows (batch.py):
        a job's conditional row and, under guidance, its null row; then each job's guidance
        and scheduler step, as ``__call__`` writes them. With bucketed lengths (CUDA graphs)
        the rows are padded to a power of two by repeating the last, so that a worker
        records graphs for five row counts, not sixteen (a lone job: 1 or 2 rows)."""
        rows = [row for s in jobs for row in self._rows(pipe, s)]
        count = len(rows)
        if self.buckets:
            rows += [rows[-1]] * ((1 << (count - 1).bit_length()) - count)
        predictions = self._pass(pipe.transformer, rows)
        at = 0
        for s in jobs:
            frames = s.latents.shape[1]
            pred = predictions[at : at + 1, :frames]
            null_pred = predictions[at + 1 : at + 2, :frames] if s.do_cfg else None
            at += 2 if s.do_cfg else 1
            _guided_step(s, pred, null_pred)

    def _pass(self, transformer: Any, rows: list[Row]) -> torch.Tensor:
        """The transformer's pass over ``rows`` (batch.py): replayed from its CUDA graph
        where the steps are graphs (graphs.py; the text padded to its bucket there, as
        the blocks' own padding would), run directly otherwise."""
        if self.graphs is None:
            return batched_forward(transformer, rows)
        tokens = bucket(max(row.text.cond.shape[1] for row in rows))
        inputs = pass_inputs(rows, tokens)
        predictions = self.graphs.run(transformer, inputs)
        return forward_pass(transformer, inputs) if predictions is None else predictions

    def _rows(self, pipe: Any, s: LongCatAudioState) -> list[Row]:
        """A job's rows in a pass: its conditional pass, and its null pass under guidance;
        their text sides made at the job's first step and kept (they depend on the prompt
        only)."""
        dtype = s.latents.dtype
        if s.text is None:
            s.text = text_side(pipe.transformer, s.prompt_embeds.to(dtype), s.text_mask)
        t = step_timestep(s)
        rows = [Row(s.latents, s.mask, s.latent_cond, t, s.text)]
        if s.do_cfg:
            if s.null_text is None:
                negative = s.negative_prompt_embeds.to(dtype)
                s.null_text = text_side(pipe.transformer, negative, s.negative_text_mask)
            rows.append(Row(s.latents, s.mask, s.latent_cond, t, s.null_text))
        return rows

    def warm_up_batch(self, size: int) -> None:
        """Compile the blocks for batched steps too (a batch of ``WARM_UP_ROWS`` rows at the
        warm-up's lengths), before the worker takes jobs; nothing when they are eager or
        ``size`` is 1."""
        if not self.compiler.enabled or size < 2:
            return
        pipe = self._loaded()
        request = GenerationRequest.audio(
            prompt="warm-up", duration_s=1.0, num_inference_steps=2, seed=0, guidance_scale=4.0
        )

        def run() -> None:
            state = _resized(self._prepare(pipe, request), WARM_UP_FRAMES, WARM_UP_TOKENS)
            batched_forward(pipe.transformer, self._rows(pipe, state)[:1] * WARM_UP_ROWS)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        with torch.no_grad():
            self.compiler.ensure(("LongCatAudioState", "batch", WARM_UP_ROWS), run, "warmup")

    @torch.no_grad()
    def decode_audio(self, state: StepState) -> torch.Tensor:
        """The audio VAE's decode: 1×1×samples, what ``pipe(..., output_type="pt").audios``
        returns."""
        pipe, s = self._loaded(), self._state(state)
        audio: torch.Tensor = pipe.vae.decode(s.latents[:, : s.frames].permute(0, 2, 1)).sample
        return audio

    def decode_audio_stream(self, state: StepState) -> Iterator[tuple[np.ndarray, int]] | None:
        """``decode``'s audio window by window (decode.py: equal to it to rounding), each
        float32 (1, samples) as soon as it is decoded; None where windows would not cut on
        frame boundaries or ``decode_window`` is 0."""
        pipe, s = self._loaded(), self._state(state)
        if self.decode_window < 1 or not decodes_whole_frames(pipe.vae):
            return None
        latents, rate = s.latents[:, : s.frames], int(pipe.sample_rate)
        context = context_frames(pipe.vae.decoder)

        @torch.no_grad()
        def pieces() -> Iterator[tuple[np.ndarray, int]]:
            first, largest = self.decode_window, LARGEST_WINDOW
            for audio in decode_windows(
                pipe.vae, latents, first=first, largest=largest, context=context
            ):
                yield np.ascontiguousarray(audio[0].float().cpu().numpy()), rate

        return pieces()

    def decode(self, state: StepState) -> Media:
        """Audio-only media: no frames (shape 0×0×0×3), float32 (1, samples) at the VAE's
        ``sample_rate`` (24 kHz for the released model)."""
        s = self._state(state)
        audio = self.decode_audio(s)[0].float().cpu().numpy()
        rate = int(self._loaded().sample_rate)
        return Media.audio_only(np.ascontiguousarray(audio, dtype=np.float32), rate, s.request.fps)


def step_timestep(s: LongCatAudioState) -> torch.Tensor:
    """The transformer's timestep at ``s``'s step as ``__call__`` gives it: one element,
    divided by the scheduler's ``num_train_timesteps``, in the text's dtype (a view of
    the job's ``step_times``: no kernel a step)."""
    return s.step_times[s.step_index : s.step_index + 1]


def _guided_step(s: LongCatAudioState, pred: torch.Tensor, null_pred: torch.Tensor | None) -> None:
    """``__call__``'s guidance (``null + (cond − null) × scale``; the conditional alone
    without a null pass) and its scheduler step, on ``s``'s latents."""
    if null_pred is not None:
        pred = null_pred + (pred - null_pred) * s.guidance_scale
    t = s.timesteps[s.step_index]
    s.latents = s.scheduler.step(pred, t, s.latents, return_dict=False)[0]


def solo_pass(
    transformer: Any, s: LongCatAudioState, embeds: torch.Tensor, text_mask: torch.Tensor
) -> torch.Tensor:
    """One pass of ``transformer.forward`` for ``s`` at its step with the text ``embeds``
    and ``text_mask`` (its prompt's or its negative's): the unbatched step's, which a
    batched pass's row must equal."""
    prediction: torch.Tensor = transformer(
        hidden_states=s.latents,
        encoder_hidden_states=embeds,
        encoder_attention_mask=text_mask,
        timestep=step_timestep(s),
        attention_mask=s.mask,
        latent_cond=s.latent_cond,
    ).sample
    return prediction


def _resized(state: LongCatAudioState, frames: int, tokens: int) -> LongCatAudioState:
    """``state`` with ``frames`` latent frames and ``tokens`` text tokens (the warm-up's
    lengths; values of no meaning: zeros, ones, the masks all true)."""
    latents, text = state.latents, state.prompt_embeds
    text = text.new_zeros(1, tokens, text.shape[2])
    text_mask = torch.ones(1, tokens, dtype=torch.bool, device=text.device)
    mask = torch.ones(1, frames, dtype=torch.bool, device=latents.device)
    return dataclasses.replace(
        state,
        latents=latents.new_ones(1, frames, latents.shape[2]),
        latent_cond=latents.new_zeros(1, frames, latents.shape[2]),
        mask=mask,
        frames=frames,
        prompt_embeds=text,
        text_mask=text_mask,
        negative_prompt_embeds=text,
        negative_text_mask=text_mask,
    )
