"""LTX-2 joint video + audio, text-, image- and first/last-frame-to-video, one denoise
step at a time.

The entry's ``spec.workflows`` (default ``["t2v"]``) say which loops it serves: ``t2v``
mirrors ``LTX2Pipeline.__call__``, ``i2v`` ``LTX2ImageToVideoPipeline.__call__``
(``image=``), ``flf2v`` ``LTX2ConditionPipeline.__call__`` (``conditions=`` a first frame
at index 0 and a last one at -1); what the keyframe loops do differently is in
ltx2/i2v.py, their state classes in ltx2/state.py. Each job runs the loop of its
keyframes (none, a first, a first and a last). For ``t2v`` (diffusers 0.42):
``prepare`` = everything before its denoising loop (``check_inputs``, Gemma prompt
encoding with the [negative, positive] CFG batch, the text connectors, packed video and
audio latents drawn from the job's generator in that order, sigmas ``1 → 1/N`` shifted by
``mu`` of the video sequence length on two private scheduler copies (video and audio, as
``__call__`` deep-copies one for audio), RoPE coordinates), ``step`` = one loop iteration
(batched CFG pass, then the optional spatio-temporal-guidance and modality-isolation
passes, all combined in x0 space with guidance rescale, one step per scheduler:
ltx2/guidance.py),
``decode`` = what follows the loop (unpack, de-normalise, optional decode-timestep noise
from the job's generator, video VAE, audio VAE → mel → vocoder).

Request: ``width``/``height`` (multiples of 32), ``num_frames`` (8k+1 for the released
VAE), ``fps`` = ``frame_rate``, ``guidance_scale`` (default 3.0), ``negative_prompt``
(default ""). Extras (``request.extra``), the ``__call__`` arguments of the same names and
defaults: ``stg_scale`` (1.0), ``modality_scale`` (3.0), ``guidance_rescale`` (0.7),
``audio_guidance_scale`` (7.0), ``audio_stg_scale`` (1.0), ``audio_modality_scale`` (3.0),
``audio_guidance_rescale`` (0.7), ``use_cross_timestep`` (True), ``motion_speed`` (1.0),
``decode_timestep`` (0.0), ``decode_noise_scale`` (= decode_timestep), plus
``stg_blocks``: comma-separated block indices for ``spatio_temporal_guidance_blocks``
(default "28"; "" disables STG). As in ``__call__``, an ``audio_*`` value of 0 falls back
to the video value. Options: ``vae_use_tiling`` / ``vae_use_slicing``. Keyframe jobs:
``image_crf`` (the keyframes' H.264 re-compression; default the model's, 0 skips it).

Not supported (``__call__`` features outside this adapter): prompt enhancement, the
duration head's automatic ``num_frames``, input latents and ``noise_scale`` (only used
with them), ``num_videos_per_prompt`` > 1, ``LTX2ConditionPipeline`` conditions beyond a
first and a last keyframe at strength 1 (video clips, other indices). A diffusers cache
hook (FirstBlockCache …) on the shared transformer would mix jobs that are interleaved
step by step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
import torch
from diffusers import LTX2Pipeline
from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift, retrieve_timesteps
from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

from models.catalog import Workflow
from workers.pipelines.base import GenerationRequest, Media, StepState
from workers.pipelines.diffusers.ltx2.guidance import (
    KNOBS,
    guidance_scales,
    guided_step,
    stg_blocks,
)
from workers.pipelines.diffusers.ltx2.i2v import (
    VideoStart,
    check_keyframes,
    check_workflows,
    image_crf,
    loaded_class,
    video_start,
    workflow_pipelines,
)
from workers.pipelines.diffusers.ltx2.state import (
    LTX2ConditionState,
    LTX2ImageState,
    LTX2State,
)
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import (
    call_default,
    decode_video,
    job_scheduler,
    make_generator,
    sampling,
    to_uint8,
)
from workers.pipelines.diffusers.shared.entry import EntryOptions
from workers.pipelines.diffusers.shared.keyframes import (
    Keyframes,
    SourceVideo,
    job_workflow,
    keyframes_of,
)
from workers.pipelines.diffusers.shared.packed import (
    LatentGrid,
    decode_noise,
    latent_grid,
    packed_preview,
    prompt_batch,
    unpacked,
)

# The state class of each workflow's jobs.
STATES: dict[Workflow, type[LTX2State]] = {
    "t2v": LTX2State,
    "i2v": LTX2ImageState,
    "flf2v": LTX2ConditionState,
}

# Every ``request.extra`` key this adapter reads (FAMILY_SPECS declares the same).
EXTRA_PARAMS = (
    *KNOBS,
    "stg_blocks",
    "use_cross_timestep",
    "motion_speed",
    "decode_timestep",
    "decode_noise_scale",
    "image_crf",  # i2v / flf2v (ltx2/i2v.py)
    "frame_indices",  # read by the API: which keyframe is first or last
)


@dataclass(frozen=True)
class _Audio:
    """A job's audio latents as ``prepare_audio_latents`` draws them, and their size."""

    latents: torch.Tensor
    num_frames: int
    latent_mel_bins: int


class LTX2Adapter(DiffusersAdapter[LTX2State]):
    """``LTX2Pipeline`` (Lightricks LTX-2 text-to-video with sound) and, for an entry
    serving ``i2v`` / ``flf2v``, ``LTX2ImageToVideoPipeline`` / ``LTX2ConditionPipeline``
    (ltx2/i2v.py)."""

    family = "diffusers.ltx2"
    pipeline_class: Any = LTX2Pipeline
    default_workflows = ("t2v",)
    _pipeline_for = staticmethod(loaded_class)

    def __init__(self, path: str | None = None, **options: Unpack[EntryOptions]) -> None:
        super().__init__(path, **options)
        # Each served workflow's pipeline over the loaded modules (load).
        self._pipes: dict[Workflow, Any] = {}

    def load(self, device: str) -> None:
        """``DiffusersAdapter.load``, then ltx2/i2v.py's ``check_workflows`` (refusing to
        start on a mismatch), each served workflow's pipeline built, and dynamo's recompile
        limit made room for every workflow's graphs."""
        super().load(device)
        pipe = self._loaded()
        check_workflows(self.spec.name, pipe, self.workflows)
        self._pipes = workflow_pipelines(pipe, self.workflows)
        if self.compiler.enabled:
            # dynamo's recompile limit (8) counts every graph of the blocks' one forward:
            # LTX-2 makes 3 per workflow and shape (its guidance passes differ in batch
            # and flags), so a few shapes of three workflows would pass it and fail a job.
            # (``cache_size_limit``: torch 2.4's name, an alias of ``recompile_limit`` since.)
            room = 3 * len(self.workflows) * (len(self.entry.warmup) + 2)
            limit = torch._dynamo.config.cache_size_limit
            torch._dynamo.config.cache_size_limit = max(limit, room)

    def _compile_for(self, state: LTX2State, why: str) -> None:
        """``DiffusersAdapter._compile_for`` on a copy whose audio scheduler is its own
        too (the trial step advances both schedulers' step index)."""
        trial = copy.copy(state)
        trial.audio_scheduler = copy.deepcopy(state.audio_scheduler)
        super()._compile_for(trial, why)

    def _prepare(self, pipe: Any, request: GenerationRequest) -> LTX2State:
        """Everything before the loop of the ``__call__`` of the job's workflow's pipeline
        (``LTX2Pipeline`` for t2v; the keyframes' part: ltx2/i2v.py)."""
        keys = keyframes_of(request, self.spec.name, self.workflows)
        assert not isinstance(keys, SourceVideo)  # LTX-2 serves no v2v (check_workflows)
        # The guidance knobs default to the loaded pipeline's ``__call__``'s.
        scales, blocks = guidance_scales(pipe, request), stg_blocks(pipe, request)
        pipe = self._pipes[job_workflow(keys)]
        extra = request.extra
        cross = extra.get("use_cross_timestep", call_default(pipe, "use_cross_timestep"))
        motion_speed = float(extra.get("motion_speed", call_default(pipe, "motion_speed")))
        cond_fps = conditioning_frame_rate(request.fps, motion_speed)
        _check_inputs(pipe, request, keys, scales, blocks)
        do_cfg = scales["guidance_scale"] > 1.0 or scales["audio_guidance_scale"] > 1.0
        device = pipe._execution_device

        # Prompt encoding ([negative, positive] under CFG), then the text connectors.
        seq_len = self.entry.max_sequence_length
        embeds, mask = prompt_batch(pipe, request, do_cfg, device, seq_len)
        if keys is not None and keys.workflow == "flf2v":
            padding_side = pipe.tokenizer_padding_side
        else:
            padding_side = getattr(pipe.tokenizer, "padding_side", "left")
        video_embeds, audio_embeds, conn_mask = pipe.connectors(
            embeds, mask, padding_side=padding_side
        )

        # Video then audio latents, both from the job's generator (noise_scale 0; the
        # keyframe conditions' 1, all noise unless a token is conditioned).
        generator = make_generator(request.seed)
        grid = latent_grid(pipe, request)
        start = video_start(pipe, keys, request, do_cfg, embeds.dtype, cond_fps, device, generator)
        keyed = dict[str, Any](start.keyed)
        audio = _audio_latents(pipe, request, keys, device, generator)
        scheduler, audio_scheduler, timesteps, audio_timesteps = _schedules(
            pipe, request, keys, start.latents.shape[1], device
        )
        if keys is not None and keys.workflow == "flf2v":
            keyed["audio_timesteps"] = audio_timesteps
        video_coords, audio_coords = _coords(pipe, start, audio, grid, cond_fps, do_cfg)
        text = (video_embeds, audio_embeds, conn_mask)
        scale = scales["guidance_scale"]
        return STATES[job_workflow(keys)](
            **sampling(request, generator, scheduler, timesteps, start.latents, scale, do_cfg),
            **keyed,
            audio_scheduler=audio_scheduler,
            audio_latents=audio.latents,
            dtype=embeds.dtype,
            scales=scales,
            stg_blocks=blocks,
            use_cross_timestep=bool(cross),
            embeds=video_embeds,
            audio_embeds=audio_embeds,
            attention_mask=conn_mask,
            video_coords=video_coords,
            audio_coords=audio_coords,
            **_guide(text, (video_coords, audio_coords), do_cfg),
            conditioning_fps=cond_fps,
            grid=grid,
            audio_num_frames=audio.num_frames,
            latent_mel_bins=audio.latent_mel_bins,
        )

    def _step(self, pipe: Any, s: LTX2State) -> None:
        """One loop iteration (ltx2/guidance.py)."""
        guided_step(pipe, s)

    @torch.no_grad()
    def decode_frames(self, state: StepState) -> np.ndarray:
        """Video tail of ``__call__``: the appended keyframe tokens dropped (flf2v), unpack,
        decode-timestep noise (timestep-conditioned VAEs, drawn from the job's generator as
        ``__call__`` does), de-normalise, decode; float32 T×H×W×3 in [0, 1]."""
        pipe, s = self._loaded(), self._state(state)
        vae = pipe.vae
        latents = unpacked(pipe, s.latents[:, : s.grid.tokens], s.grid).to(s.dtype)
        timestep: torch.Tensor | None = None
        if vae.config.timestep_conditioning:
            latents, timestep = decode_noise(pipe, latents, s.request.extra, s.generator)
        latents = pipe._denormalize_latents(
            latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
        )
        return decode_video(pipe, s.request, latents.to(vae.dtype), timestep)

    @torch.no_grad()
    def decode_audio(self, state: StepState) -> torch.Tensor:
        """Audio tail of ``__call__``: de-normalise, unpack, audio VAE → mel → vocoder;
        B×channels×samples (``LTX2PipelineOutput.audio``)."""
        pipe, s = self._loaded(), self._state(state)
        audio_vae = pipe.audio_vae
        latents = pipe._denormalize_audio_latents(
            s.audio_latents, audio_vae.latents_mean, audio_vae.latents_std
        )
        latents = pipe._unpack_audio_latents(
            latents, s.audio_num_frames, num_mel_bins=s.latent_mel_bins
        )
        mel = audio_vae.decode(latents.to(audio_vae.dtype), return_dict=False)[0]
        audio: torch.Tensor = pipe.vocoder(mel)
        return audio

    def preview(self, state: StepState) -> np.ndarray | None:
        """Grey middle latent frame of the grid's video latents (B×C×F×h×w)."""
        s = self._state(state)
        return packed_preview(self._loaded(), s.latents[:, : s.grid.tokens], s.grid)

    def decode(self, state: StepState) -> Media:
        """uint8 frames at the request's fps plus float32 (channels, samples) audio at the
        vocoder's ``output_sampling_rate``."""
        s = self._state(state)
        frames = to_uint8(self.decode_frames(s))
        audio = self.decode_audio(s)[0].float().cpu().numpy()
        return Media(
            frames=frames,
            fps=s.request.fps,
            audio=np.ascontiguousarray(audio, dtype=np.float32),
            sample_rate=int(self._loaded().vocoder.config.output_sampling_rate),
        )


def _check_inputs(
    pipe: Any,
    request: GenerationRequest,
    keys: Keyframes | None,
    scales: dict[str, float],
    blocks: list[int] | None,
) -> None:
    """``check_inputs`` of the job's workflow's pipeline (an ``i2v`` job's keyframe and
    ``image_crf`` too), then what the keyframe loops need beyond it (ltx2/i2v.py)."""
    image: dict[str, Any] = {}
    if keys is not None and keys.workflow == "i2v":
        image = {"image": keys.first, "image_crf": image_crf(request)}
    pipe.check_inputs(
        prompt=request.prompt,
        height=request.height,
        width=request.width,
        spatio_temporal_guidance_blocks=blocks,
        stg_scale=scales["stg_scale"],
        audio_stg_scale=scales["audio_stg_scale"],
        num_frames=request.num_frames,
        **image,
    )
    check_keyframes(pipe, keys, request)


def _audio_latents(
    pipe: Any,
    request: GenerationRequest,
    keys: Keyframes | None,
    device: Any,
    generator: torch.Generator,
) -> _Audio:
    """``prepare_audio_latents`` for the clip's length, from the job's generator after the
    video's noise (noise_scale 0; the keyframe conditions' 1)."""
    audio_per_second = (
        pipe.audio_sampling_rate
        / pipe.audio_hop_length
        / float(pipe.audio_vae_temporal_compression_ratio)
    )
    num_frames = round(request.num_frames / request.fps * audio_per_second)
    num_mel_bins = pipe.audio_vae.config.mel_bins
    latents = pipe.prepare_audio_latents(
        1,
        num_channels_latents=pipe.audio_vae.config.latent_channels,
        audio_latent_length=num_frames,
        num_mel_bins=num_mel_bins,
        noise_scale=0.0 if keys is None or keys.workflow == "i2v" else 1.0,
        dtype=torch.float32,
        device=device,
        generator=generator,
    )
    return _Audio(latents, num_frames, num_mel_bins // pipe.audio_vae_mel_compression_ratio)


def _schedules(
    pipe: Any, request: GenerationRequest, keys: Keyframes | None, tokens: int, device: Any
) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """Timesteps (sigmas ``1 → 1/N`` shifted by ``mu`` of the video's ``tokens``) on two
    private scheduler copies, video and audio (``LTX2ConditionPipeline``'s own
    ``audio_scheduler`` where it has one); only ``LTX2Pipeline`` sets a begin index.
    (video scheduler, audio scheduler, video timesteps, audio timesteps)."""
    steps = request.num_inference_steps
    sigmas: Any = np.linspace(1.0, 1 / steps, steps)
    config = pipe.scheduler.config
    mu = calculate_shift(
        tokens,
        config.get("base_image_seq_len", 1024),
        config.get("max_image_seq_len", 4096),
        config.get("base_shift", 0.95),
        config.get("max_shift", 2.05),
    )
    audio_base = pipe.scheduler
    if keys is not None and keys.workflow == "flf2v" and pipe.audio_scheduler is not None:
        audio_base = pipe.audio_scheduler
    scheduler, audio_scheduler = job_scheduler(pipe.scheduler), job_scheduler(audio_base)
    audio_timesteps, _ = retrieve_timesteps(
        audio_scheduler, steps, device, None, sigmas=sigmas, mu=mu
    )
    timesteps, _ = retrieve_timesteps(scheduler, steps, device, None, sigmas=sigmas, mu=mu)
    if keys is None:
        scheduler.set_begin_index(0)
        audio_scheduler.set_begin_index(0)
    return scheduler, audio_scheduler, timesteps, audio_timesteps


def _coords(
    pipe: Any, start: VideoStart, audio: _Audio, grid: LatentGrid, fps: float, do_cfg: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE coordinates of the video (and the appended keyframe's) and the audio, at
    the conditioning frame rate; doubled for the CFG batch."""
    latents = start.latents
    video_coords = pipe.transformer.rope.prepare_video_coords(
        latents.shape[0], grid.num_frames, grid.height, grid.width, latents.device, fps=fps
    )
    audio_coords = pipe.transformer.audio_rope.prepare_audio_coords(
        audio.latents.shape[0], audio.num_frames, audio.latents.device
    )
    if start.keyframe_coords is not None:
        video_coords = torch.cat([video_coords, start.keyframe_coords], dim=2)
    if do_cfg:
        video_coords = video_coords.repeat((2,) + (1,) * (video_coords.ndim - 1))
        audio_coords = audio_coords.repeat((2,) + (1,) * (audio_coords.ndim - 1))
    return video_coords, audio_coords


def _guide(
    text: tuple[torch.Tensor, ...], coords: tuple[torch.Tensor, ...], do_cfg: bool
) -> dict[str, Any]:
    """The ``guide_*`` fields: what the STG and modality passes condition on, ``text``
    (the connectors' video and audio embeddings and their mask) and ``coords`` (video,
    audio) of the positive half of the CFG batch (the text's second half; the coordinates'
    halves are alike, the first is taken)."""
    if do_cfg:
        text = tuple(x.chunk(2, dim=0)[1] for x in text)
        coords = tuple(x.chunk(2, dim=0)[0] for x in coords)
    embeds, audio_embeds, mask = text
    video_coords, audio_coords = coords
    return {
        "guide_embeds": embeds,
        "guide_audio_embeds": audio_embeds,
        "guide_attention_mask": mask,
        "guide_video_coords": video_coords,
        "guide_audio_coords": audio_coords,
    }
