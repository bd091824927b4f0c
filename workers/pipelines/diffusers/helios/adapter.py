"""Helios (``diffusers.HeliosPipeline`` and ``HeliosPyramidPipeline``) as a steerable world
stream, one denoise step at a time.

Helios is autoregressive: it makes a video ``num_latent_frames_per_chunk`` (9) latent
frames, i.e. 33 pixel frames, at a time, each chunk conditioned on a compressed history
of the latent frames before it (16 + 2 + 1, patched coarser the older they are) and on a
first-frame anchor (the reference image's latents for I2V, else the first chunk's first
latent frame). That is a world session's shape already, so this adapter mirrors
``HeliosPipeline.__call__`` and ``HeliosPyramidPipeline.__call__`` (diffusers 0.42) with
their chunk loop turned inside out:

* ``start`` = steps 1-5 (checks, prompt encoding, the image's latents and the initial
  history for I2V) with the session's own RNG and scheduler copy;
* the first ``step`` of a chunk also does the top of the chunk loop (history split, the
  chunk's noise, its timesteps); each ``step`` is one iteration of the denoising loop (the
  CFG pair when ``guidance_scale > 1``, then the scheduler's step), for the pyramid
  pipeline one step of one of its stages (``helios/steps.py``);
* ``take_chunk`` = the bottom of the chunk loop (anchor, history append, VAE decode of the
  chunk's 9 latent frames) and ``postprocess_video``, rounded to uint8 on the device by
  :func:`~workers.pipelines.diffusers.shared.common.frames_uint8` (the arithmetic of
  ``to_uint8``); ``stream_chunk`` hands the same frames out as each latent frame decodes
  (``helios/decode.py``), so a session encodes them while the rest decodes.

So a session's chunks, concatenated, are bit-equal to either pipeline's video for the same
prompt, seed and ``num_frames = 33 * chunks``, except where ``__call__`` trims its end to
``4k + 1`` frames: a session hands out every chunk whole (33 frames each; the chunk
lattice has no end to trim to), so its last ``(chunks - 1) % 4`` frames are ones
``__call__`` decodes and drops.

What differs from ``__call__``: ``num_frames`` is rounded down to whole chunks (the
pipeline rounds up); the history keeps only the frames the model reads (the pipeline
keeps them all); ``flow_shift`` is ignored (Helios shifts by resolution, ``mu``). Session
options (``extra_params``): ``guidance_scale`` (default: the pipeline's, 5.0; 1.0 for the
distilled checkpoints) and, for the pyramid pipeline, ``pyramid_num_inference_steps_list``
(default: ``steps_per_chunk`` shared evenly by the stages). Not here: V2V,
``keep_first_frame=False``, ``is_amplify_first_chunk``, camera control (Helios has none).
The loop is ``workers/pipelines/base.py``'s ``WorldPipeline``; prompt changes (which
enter the chunk under way at its next step), and the ``snapshot`` / ``restore`` of a
session between chunks that lets another worker take it over: ``helios/session.py``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Self, Unpack

import numpy as np
import torch
from diffusers import DiffusionPipeline, HeliosPipeline, HeliosPyramidPipeline
from diffusers.pipelines.helios import pipeline_helios, pipeline_helios_pyramid

from models.catalog import FAMILY_SPECS
from models.errors import InvalidJobInput
from models.memory_plan import MemoryReport
from models.realtime_video_chunks import ChunkLattice
from models.registry import ServedModel
from workers.pipelines.base import (
    ActionBlock,
    ChunkEvents,
    WorldConfig,
    WorldPipeline,
)
from workers.pipelines.blocks import BlockGate
from workers.pipelines.diffusers.helios.decode import chunk_frames
from workers.pipelines.diffusers.helios.inputs import check_config, image_latents, pyramid_steps
from workers.pipelines.diffusers.helios.session import (
    HeliosState,
    check_event,
    chunk_embeddings,
    queue_event,
    restore_session,
    session_snapshot,
)
from workers.pipelines.diffusers.helios.steps import (
    HISTORY_SIZES,
    LATENT_FRAMES_PER_CHUNK,
    PyramidStages,
    one_stage_step,
    pyramid_begin_chunk,
    pyramid_step,
    shift_mu,
)
from workers.pipelines.diffusers.shared import attention
from workers.pipelines.diffusers.shared.common import call_default, make_generator
from workers.pipelines.diffusers.shared.entry import DiffusersEntry, EntryOptions, entry_options
from workers.pipelines.diffusers.shared.loading import (
    DTYPE_KWARG,
    install_checkpoints,
    own_weights,
)
from workers.pipelines.diffusers.shared.memory import MemoryLayout
from workers.pipelines.diffusers.shared.vae_layout import decoder_channels_last, refuse_with_offload
from workers.pipelines.snapshots import pack, to_host, unpack
from workers.pipelines.world_rules import end_chunk, last_chunk_events

# Every ``WorldConfig.extra`` key this adapter reads (FAMILY_SPECS declares the same).
EXTRA_PARAMS = ("guidance_scale", "pyramid_num_inference_steps_list")


class _Plan(NamedTuple):
    """What a session's config resolves to, before anything is encoded."""

    chunks: int
    steps: int  # per chunk
    pyramid: PyramidStages | None
    guidance_scale: float


class HeliosWorldAdapter(WorldPipeline[HeliosState]):
    """``HeliosPipeline`` (Helios-Base) or ``HeliosPyramidPipeline`` (Helios-Mid,
    Helios-Distilled) streamed chunk by chunk; one instance is shared by every session of
    a worker.

    Built as the diffusers job adapters are (``shared.adapter.DiffusersAdapter``, which is
    a job ``Pipeline`` and so cannot be the base here), from the same registry settings
    (entry.py): a local ``path`` loaded with ``from_pretrained`` or an injected ``pipe``,
    cancel gates between the transformer's blocks, checkpoints in the text encoder and
    VAE, compiled blocks on CUDA."""

    family = "diffusers.helios"

    def __init__(
        self,
        path: str | None = None,
        *,
        random_config: dict[str, dict[str, Any]] | None = None,
        random_transformer_on_host: bool = False,
        vae_channels_last: bool = False,
        **options: Unpack[EntryOptions],
    ) -> None:
        """``path`` and ``options`` as a diffusers job adapter takes them (entry.py);
        ``random_config`` overrides the random-weights mode's part configs and
        ``random_transformer_on_host`` builds its transformer on the CPU for the memory
        plan to place (helios/random_weights.py); ``vae_channels_last``: the VAE
        decoder's weights channels-last once placed (shared/vae_layout.py)."""
        self.entry = DiffusersEntry.of(type(self).__name__, path, options)
        spec = options.get("spec")
        self.spec = spec if spec is not None else FAMILY_SPECS[self.family]
        self.pipe: Any = options.get("pipe")
        self.device = torch.device("cpu")
        self.memory = MemoryLayout(self.spec.name, self.entry.memory)  # FP8 (``load``)
        self.gate = BlockGate(self.device)  # cancel points between the blocks (``load``)
        self.compiler = self.entry.compiler()
        self.random_config = dict(random_config or {})
        self.random_transformer_on_host = random_transformer_on_host
        if vae_channels_last:
            refuse_with_offload(self.spec.name, self.entry.memory)
        self.vae_channels_last = vae_channels_last
        self.lattice = ChunkLattice(first=self.spec.frame_offset, every=self.spec.frame_multiple)

    @classmethod
    def build(cls, model: ServedModel) -> Self:
        """The adapter of a registry entry, with its compiled-blocks settings and
        random-weights mode (entry.py)."""
        return cls(**entry_options(model))

    # --- loading ----------------------------------------------------------------------

    def load(self, device: str) -> None:
        """The pipeline of ``path`` (``from_pretrained(…, local_files_only=True)``: its
        ``model_index.json`` says which of the two Helios pipelines) or the injected pipe
        (dtype as it is) on ``device``, with the cancel points and compiled blocks
        ``DiffusersAdapter.load`` installs, the entry's memory plan (FP8 weights;
        memory.py) as it applies it, and its attention backend (attention.py)."""
        self.memory.check(device, HeliosPipeline)
        attention.refuse_off_cuda(self.spec, device)  # attention = "cudnn"
        if self.pipe is None and self.entry.random_weights:
            from workers.pipelines.diffusers.helios.random_weights import random_pipeline

            seq_len = self.entry.max_sequence_length or 512
            self.pipe = random_pipeline(
                device,
                self.entry.dtype,
                config=self.random_config,
                max_sequence_length=seq_len,
                transformer_on_host=self.random_transformer_on_host,
            )
        elif self.pipe is None:
            self.pipe = DiffusionPipeline.from_pretrained(
                self.entry.path, local_files_only=True, **{DTYPE_KWARG: self.entry.dtype}
            )
            if torch.device(device).type == "cpu":
                own_weights(self.pipe)
        if not isinstance(self.pipe, HeliosPipeline | HeliosPyramidPipeline):
            name = type(self.pipe).__name__
            raise TypeError(
                f"{type(self).__name__} drives HeliosPipeline or HeliosPyramidPipeline, got {name}"
            )
        pipe: Any = self.pipe  # diffusers' pipelines are untyped for mypy
        if not hasattr(pipeline_helios, "ftfy") or not hasattr(pipeline_helios_pyramid, "ftfy"):
            # Helios cleans every prompt with ftfy and fails with a NameError without it.
            raise RuntimeError("Helios needs the ftfy package for its prompt cleaning")
        stages = pipe.scheduler.config.get("stages", 1)
        if isinstance(pipe, HeliosPipeline) and stages != 1:
            raise ValueError(
                f"{self.spec.name}: a {stages}-stage scheduler is HeliosPyramidPipeline's; "
                "HeliosPipeline runs one stage"
            )
        self.memory.place(pipe, device)
        if self.vae_channels_last:  # once the weights are where they stay
            decoder_channels_last(pipe)
        self.device = torch.device(device)
        attention.install(pipe, self.spec)
        install_checkpoints(pipe)
        self.gate.device = self.device
        self.gate.install(pipe)
        if self.entry.compiles_blocks(self.device):
            self.compiler.install(pipe)

    def memory_report(self) -> MemoryReport | None:
        """What ``load`` did with the entry's memory plan (None without one)."""
        return self.memory.report

    def warm_up(self) -> None:
        """Compile the blocks for each registry ``warmup`` shape: one step of a one-chunk
        session of that shape (for the pyramid pipeline one step of each stage, whose
        latents have a size of their own), thrown away (its RNG and scheduler are its
        own)."""
        if not self.compiler.enabled:
            return
        pipe = self._loaded()
        stages = 1
        extra: dict[str, Any] = {}
        if isinstance(pipe, HeliosPyramidPipeline):
            stages = int(self._loaded().scheduler.config.stages)
            extra = {"pyramid_num_inference_steps_list": [1] * stages}
        for shape in self.entry.warmup:
            config = WorldConfig(
                prompt="warm-up",
                width=shape.width,
                height=shape.height,
                num_frames=self.lattice.first,
                fps=float(self.spec.default_fps),
                seed=0,
                steps_per_chunk=stages,
                extra=extra,
            )

            def run(config: WorldConfig = config) -> None:
                state = self.start(config)
                while not self.chunk_done(state):
                    self.step(state)

            self.compiler.ensure((shape.width, shape.height), run, "warmup")

    def _loaded(self) -> Any:
        if self.pipe is None:
            raise RuntimeError(f"{type(self).__name__}.load() was not called")
        return self.pipe

    # --- a session --------------------------------------------------------------------

    @torch.no_grad()
    def start(self, config: WorldConfig) -> HeliosState:
        """``__call__``'s steps 1-5: the prompts encoded once, the reference image's
        latents and noise drawn (I2V), the zero history; no chunk begun."""
        pipe = self._loaded()
        plan = self._plan(pipe, config)
        embeds, negative = pipe.encode_prompt(
            prompt=config.prompt,
            negative_prompt=config.negative_prompt,
            do_classifier_free_guidance=plan.guidance_scale > 1.0,
            num_videos_per_prompt=1,
            max_sequence_length=self._seq_len(pipe),
            device=pipe._execution_device,
        )
        dtype = pipe.transformer.dtype
        negative = None if negative is None else negative.to(dtype)
        state = self._state(pipe, config, plan, embeds.to(dtype), negative)
        if config.reference_image is not None:
            state.image_latents, fake = image_latents(pipe, config, state.generator)
            state.history_latents = torch.cat([state.history_latents[:, :, :-1], fake], dim=2)
        return state

    def snapshot(self, state: HeliosState) -> bytes:
        """The session between chunks (``helios.session.session_snapshot``), packed: a few
        MB at 640x384 (the history, UniPC's last model outputs, the embeddings)."""
        return self.capture_snapshot(state)()

    def capture_snapshot(self, state: HeliosState) -> Callable[[], bytes]:
        """:meth:`snapshot` in two halves: the session copied off the device now, packed
        when the callable is called (on the session's delivery lane)."""
        host = to_host(session_snapshot(state))
        return functools.partial(pack, host)

    @torch.no_grad()
    def restore(self, config: WorldConfig, data: bytes) -> HeliosState:
        """The session :meth:`snapshot` packed, on this worker: its config checked and its
        schedule made again, the rest as it was; no text encoder, no VAE."""
        pipe = self._loaded()
        saved = unpack(data, self.device)
        plan = self._plan(pipe, config)
        state = self._state(
            pipe, config, plan, saved["prompt_embeds"], saved["negative_prompt_embeds"]
        )
        restore_session(state, saved)
        return state

    def num_chunks(self, state: HeliosState) -> int:
        return state.num_chunks

    def chunk_done(self, state: HeliosState) -> bool:
        """All steps of the current chunk have run: ``take_chunk`` may be called."""
        return not state.done and state.step_index >= state.steps_per_chunk

    @torch.no_grad()
    def step(self, state: HeliosState) -> None:
        """One iteration of the denoising loop of the current chunk (the first also begins
        the chunk: its history, noise, timesteps and prompt embeddings)."""
        if state.done:
            raise RuntimeError("the session has no chunk left to generate")
        if state.step_index >= state.steps_per_chunk:
            raise RuntimeError(f"chunk {state.chunk_index} is finished; call take_chunk")
        pipe = self._loaded()
        if state.latents is None:
            self._begin_chunk(pipe, state)
        self.gate.begin_step()
        if state.pyramid is not None:
            pyramid_step(pipe, state, state.pyramid)
        else:
            one_stage_step(pipe, state)
        state.step_index += 1

    def restarts_step(self, state: HeliosState) -> bool:
        """``SupportsStepRestart``: the step in flight is the chunk's last (with
        ``interaction_at = "step"``). Stopped inside the transformer, a step left the
        chunk as it was before its forward, with what it had drawn before it kept (the
        chunk's noise, a stage's renoising: ``_begin_chunk``, ``steps._begin_stage``);
        the scheduler's step, the one that may draw noise after, had not run."""
        at_step = self.spec.interaction_at == "step"
        return at_step and state.step_index == state.steps_per_chunk - 1

    def take_chunk(self, state: HeliosState) -> np.ndarray:
        """The bottom of ``__call__``'s chunk loop: the chunk's 33 frames as uint8
        T×H×W×3, decoded whole (one ``vae.decode``, one copy to the host: a session with
        ``OMNIQ_REALTIME__STREAM_CHUNK_DECODE`` off; the same frames as
        :meth:`stream_chunk`'s pieces). Moves on to the next chunk."""
        return np.concatenate(list(self._chunk(state, streamed=False)))

    def stream_chunk(self, state: HeliosState) -> Iterator[np.ndarray]:
        """``SupportsChunkStream``: the bottom of ``__call__``'s chunk loop, the anchor
        (T2V: the first chunk's first latent frame) and the history now, and the session
        moved on to the next chunk; the chunk's VAE decode as the iterator is read, its
        frames as each latent frame decodes (1, then 4 each: ``helios/decode.py``)."""
        return self._chunk(state, streamed=True)

    @torch.no_grad()
    def _chunk(self, state: HeliosState, streamed: bool) -> Iterator[np.ndarray]:
        """:meth:`stream_chunk`'s work; ``streamed`` False: its frames in one piece."""
        if not self.chunk_done(state):
            raise RuntimeError(
                f"chunk {state.chunk_index} is not finished "
                f"({state.step_index}/{state.steps_per_chunk} steps)"
            )
        pipe = self._loaded()
        latents = state.latents
        assert latents is not None
        if state.image_latents is None:
            state.image_latents = latents[:, :, 0:1].clone()  # not a view holding the chunk
        keep = sum(HISTORY_SIZES)
        state.history_latents = torch.cat([state.history_latents, latents], dim=2)[:, :, -keep:]
        state.latents = state.timesteps = state.chunk_embeds = state.history = None
        end_chunk(state)
        return chunk_frames(pipe, latents, streamed)

    def events_for_chunk(self, state: HeliosState) -> ChunkEvents:
        """(started, active, completed) event ids of the chunk ``take_chunk`` returned
        last, as ``reference/world`` reports them."""
        return last_chunk_events(state)

    @torch.no_grad()
    def interact(
        self,
        state: HeliosState,
        prompt: str | None,
        camera: str | ActionBlock | None,
        transition_chunks: int,
        event_id: str,
    ) -> None:
        """Queue a new prompt, blended in over ``transition_chunks`` chunks
        (``helios/session.py``): from the next step of the chunk under way while one is
        left (the spec's ``interaction_at = "step"``), else from the first chunk not yet
        begun. It is encoded here, once, so the step it conditions does not wait for the
        text encoder. ``camera`` is refused: Helios has no camera conditioning."""
        if camera is not None:
            raise InvalidJobInput(f"camera: {self.spec.name} has no camera conditioning")
        check_event(state, event_id, transition_chunks)
        if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
            raise InvalidJobInput("prompt must be a non-empty string")
        embeds = None
        if prompt is not None:
            pipe = self._loaded()
            embeds, _ = pipe.encode_prompt(
                prompt=prompt,
                do_classifier_free_guidance=False,
                max_sequence_length=self._seq_len(pipe),
                device=pipe._execution_device,
            )
            embeds = embeds.to(pipe.transformer.dtype)
            state.prompt = prompt
        queue_event(state, event_id, transition_chunks, embeds, self.spec.interaction_at)

    # --- pieces of ``__call__`` -------------------------------------------------------

    def _plan(self, pipe: Any, config: WorldConfig) -> _Plan:
        """Check the config (a pyramid's step list too, before any encoding)."""
        chunks = check_config(self.spec, self.lattice, config)
        steps, pyramid = config.steps_per_chunk, None
        if isinstance(pipe, HeliosPyramidPipeline):
            pyramid = PyramidStages(pyramid_steps(pipe, config))
            steps = sum(pyramid.steps)
        scale = float(config.extra.get("guidance_scale", call_default(pipe, "guidance_scale")))
        return _Plan(chunks, steps, pyramid, scale)

    def _state(
        self,
        pipe: Any,
        config: WorldConfig,
        plan: _Plan,
        embeds: torch.Tensor,
        negative: torch.Tensor | None,
    ) -> HeliosState:
        """A session of ``config`` conditioned on these embeddings: its own RNG and
        scheduler copy, the zero history (T2V), no chunk begun."""
        spatial = pipe.vae_scale_factor_spatial
        h, w = config.height // spatial, config.width // spatial
        channels = pipe.transformer.config.in_channels
        history = torch.zeros(
            1,
            channels,
            sum(HISTORY_SIZES),
            h,
            w,
            device=pipe._execution_device,
            dtype=torch.float32,
        )
        return HeliosState(
            config=config,
            num_chunks=plan.chunks,
            steps_per_chunk=plan.steps,
            guidance_scale=plan.guidance_scale,
            do_cfg=plan.guidance_scale > 1.0,
            generator=make_generator(config.seed),
            scheduler=copy.deepcopy(pipe.scheduler),
            sigmas=np.linspace(0.999, 0.0, plan.steps + 1)[:-1],
            mu=shift_mu(pipe, (LATENT_FRAMES_PER_CHUNK, h, w)),
            prompt=config.prompt,
            prompt_embeds=embeds,
            negative_prompt_embeds=negative,
            history_latents=history,
            image_latents=None,
            pyramid=plan.pyramid,
        )

    def _begin_chunk(self, pipe: Any, state: HeliosState) -> None:
        """The top of ``__call__``'s chunk loop (``keep_first_frame``): the history split
        with the anchor in front of the 1x part, the chunk's noise, its timesteps."""
        dtype = pipe.transformer.dtype
        long, mid, x1 = state.history_latents[:, :, -sum(HISTORY_SIZES) :].split(
            list(HISTORY_SIZES), dim=2
        )
        prefix = state.image_latents
        if prefix is None:  # the first chunk of a T2V session
            prefix = torch.zeros_like(x1[:, :, :1])
        short = torch.cat([prefix, x1], dim=2)
        state.history = (short.to(dtype), mid.to(dtype), long.to(dtype))
        cfg_ = state.config
        window = (LATENT_FRAMES_PER_CHUNK - 1) * pipe.vae_scale_factor_temporal + 1
        state.latents = pipe.prepare_latents(
            1,
            pipe.transformer.config.in_channels,
            cfg_.height,
            cfg_.width,
            window,
            dtype=torch.float32,
            device=pipe._execution_device,
            generator=state.generator,
        )
        if state.pyramid is not None:
            pyramid_begin_chunk(state, state.pyramid)
        else:
            state.scheduler.set_timesteps(
                state.steps_per_chunk,
                device=pipe._execution_device,
                sigmas=state.sigmas,
                mu=state.mu,
            )
            state.timesteps = state.scheduler.timesteps
        state.chunk_embeds = chunk_embeddings(state, state.chunk_index)

    def _seq_len(self, pipe: Any) -> int:
        return self.entry.seq_len(int(call_default(pipe, "max_sequence_length")))
