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
passes, all combined in x0 space with guidance rescale, one step per scheduler),
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
from typing import Any

import numpy as np
import torch
from diffusers import LTX2Pipeline
from diffusers.pipelines.ltx2.pipeline_ltx2 import (
    calculate_shift,
    rescale_noise_cfg,
    retrieve_timesteps,
)
from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

from models.catalog import Workflow
from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest, Media, StepState
from workers.pipelines.diffusers.ltx2.i2v import (
    check_keyframes,
    check_workflows,
    image_crf,
    loaded_class,
    model_timesteps,
    next_video_latents,
    video_start,
    workflow_pipelines,
)
from workers.pipelines.diffusers.ltx2.state import (
    LTX2ConditionState,
    LTX2ImageState,
    LTX2State,
)
from workers.pipelines.diffusers.shared.common import (
    call_default,
    cfg_batch,
    decode_video,
    grey_preview,
    guidance_scale,
    job_scheduler,
    make_generator,
    sampling,
    to_uint8,
)
from workers.pipelines.diffusers.shared.keyframes import SourceVideo, job_workflow, keyframes_of
from workers.pipelines.diffusers.shared.packed import PackedLatentsAdapter

# The state class of each workflow's jobs.
STATES: dict[Workflow, type[LTX2State]] = {
    "t2v": LTX2State,
    "i2v": LTX2ImageState,
    "flf2v": LTX2ConditionState,
}

_KNOBS = (
    "stg_scale",
    "modality_scale",
    "guidance_rescale",
    "audio_guidance_scale",
    "audio_stg_scale",
    "audio_modality_scale",
    "audio_guidance_rescale",
)
# Every ``request.extra`` key this adapter reads (FAMILY_SPECS declares the same).
EXTRA_PARAMS = (
    *_KNOBS,
    "stg_blocks",
    "use_cross_timestep",
    "motion_speed",
    "decode_timestep",
    "decode_noise_scale",
    "image_crf",  # i2v / flf2v (ltx2/i2v.py)
    "frame_indices",  # read by the API: which keyframe is first or last
)


class LTX2Adapter(PackedLatentsAdapter[LTX2State]):
    """``LTX2Pipeline`` (Lightricks LTX-2 text-to-video with sound) and, for an entry
    serving ``i2v`` / ``flf2v``, ``LTX2ImageToVideoPipeline`` / ``LTX2ConditionPipeline``
    (ltx2/i2v.py)."""

    family = "diffusers.ltx2"
    pipeline_class: Any = LTX2Pipeline
    _pipeline_for = staticmethod(loaded_class)

    def __init__(self, path: str | None = None, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        # Each served workflow's pipeline over the loaded modules (load).
        self._pipes: dict[Workflow, Any] = {}

    def _load_workflows(self, pipe: Any) -> None:
        """ltx2/i2v.py's ``check_workflows``, each served workflow's pipeline built, and
        dynamo's recompile limit made room for every workflow's graphs."""
        check_workflows(self.spec.name, pipe, self.workflows)
        self._pipes = workflow_pipelines(pipe, self.workflows)
        if self.compiler.enabled:
            # dynamo's recompile limit (8) counts every graph of the blocks' one forward:
            # LTX-2 makes 3 per workflow and shape (its guidance passes differ in batch
            # and flags), so a few shapes of three workflows would pass it and fail a job.
            # (``cache_size_limit``: torch 2.4's name, an alias of ``recompile_limit`` since.)
            room = 3 * len(self.workflows) * (len(self.warmup) + 2)
            limit = torch._dynamo.config.cache_size_limit
            torch._dynamo.config.cache_size_limit = max(limit, room)

    def _compile_for(self, state: LTX2State, why: str) -> None:
        """``DiffusersAdapter._compile_for`` on a copy whose audio scheduler is its own
        too (the trial step advances both schedulers' step index)."""
        trial = copy.copy(state)
        trial.audio_scheduler = copy.deepcopy(state.audio_scheduler)
        super()._compile_for(trial, why)

    def _scales(self, request: GenerationRequest) -> dict[str, float]:
        """Guidance knobs: request.extra, else ``__call__``'s defaults; ``audio_* or video``."""
        pipe = self._loaded()
        s = {"guidance_scale": guidance_scale(pipe, request)}
        for name in _KNOBS:
            value = request.extra.get(name)
            s[name] = float(call_default(pipe, name) if value is None else value)
        for name in ("guidance_scale", "stg_scale", "modality_scale", "guidance_rescale"):
            s[f"audio_{name}"] = s[f"audio_{name}"] or s[name]
        return s

    def _stg_blocks(self, request: GenerationRequest) -> list[int] | None:
        raw = request.extra.get("stg_blocks")
        if raw is None:
            default = call_default(self._loaded(), "spatio_temporal_guidance_blocks")
            return None if default is None else [int(block) for block in default]
        try:
            blocks = [int(part) for part in str(raw).replace(" ", "").split(",") if part]
        except ValueError:
            raise InvalidJobInput(
                f"stg_blocks must be comma-separated integers, got {raw!r}"
            ) from None
        return blocks or None

    def _prepare(self, pipe: Any, request: GenerationRequest) -> LTX2State:
        """Everything before the loop of the ``__call__`` of the job's workflow's pipeline
        (``LTX2Pipeline`` for t2v; the keyframes' part: ltx2/i2v.py)."""
        keys = keyframes_of(request, self.spec.name, self.workflows)
        assert not isinstance(keys, SourceVideo)  # LTX-2 serves no v2v (check_workflows)
        pipe = self._pipes[job_workflow(keys)]
        height, width = request.height, request.width
        num_frames, fps, extra = request.num_frames, request.fps, request.extra
        scales = self._scales(request)
        stg_blocks = self._stg_blocks(request)
        cross = extra.get("use_cross_timestep", call_default(pipe, "use_cross_timestep"))
        motion_speed = float(extra.get("motion_speed", call_default(pipe, "motion_speed")))
        cond_fps = conditioning_frame_rate(fps, motion_speed)
        image: dict[str, Any] = {}
        if keys is not None and keys.workflow == "i2v":
            image = {"image": keys.first, "image_crf": image_crf(request)}
        pipe.check_inputs(
            prompt=request.prompt,
            height=height,
            width=width,
            spatio_temporal_guidance_blocks=stg_blocks,
            stg_scale=scales["stg_scale"],
            audio_stg_scale=scales["audio_stg_scale"],
            num_frames=num_frames,
            **image,
        )
        check_keyframes(pipe, keys, request)
        do_cfg = scales["guidance_scale"] > 1.0 or scales["audio_guidance_scale"] > 1.0
        device = pipe._execution_device

        # Prompt encoding ([negative, positive] under CFG), then the text connectors.
        embeds, mask = self._prompt_batch(pipe, request, do_cfg, device)
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
        grid = self._latent_grid(pipe, request)
        start = video_start(pipe, keys, request, do_cfg, embeds.dtype, cond_fps, device, generator)
        latents, keyed = start.latents, dict[str, Any](start.keyed)
        audio_per_second = (
            pipe.audio_sampling_rate
            / pipe.audio_hop_length
            / float(pipe.audio_vae_temporal_compression_ratio)
        )
        audio_num_frames = round(num_frames / fps * audio_per_second)
        num_mel_bins = pipe.audio_vae.config.mel_bins
        latent_mel_bins = num_mel_bins // pipe.audio_vae_mel_compression_ratio
        audio_latents = pipe.prepare_audio_latents(
            1,
            num_channels_latents=pipe.audio_vae.config.latent_channels,
            audio_latent_length=audio_num_frames,
            num_mel_bins=num_mel_bins,
            noise_scale=0.0 if keys is None or keys.workflow == "i2v" else 1.0,
            dtype=torch.float32,
            device=device,
            generator=generator,
        )

        # Timesteps on two private scheduler copies (video, audio: LTX2ConditionPipeline's
        # own audio_scheduler where it has one); only LTX2Pipeline sets a begin index.
        steps = request.num_inference_steps
        sigmas: Any = np.linspace(1.0, 1 / steps, steps)
        config = pipe.scheduler.config
        mu = calculate_shift(
            latents.shape[1],
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
        elif keys.workflow == "flf2v":
            keyed["audio_timesteps"] = audio_timesteps

        # RoPE coordinates (and the appended keyframe's); the guidance passes use the
        # positive half of the batch.
        video_coords = pipe.transformer.rope.prepare_video_coords(
            latents.shape[0],
            grid.num_frames,
            grid.height,
            grid.width,
            latents.device,
            fps=cond_fps,
        )
        audio_coords = pipe.transformer.audio_rope.prepare_audio_coords(
            audio_latents.shape[0], audio_num_frames, audio_latents.device
        )
        if start.keyframe_coords is not None:
            video_coords = torch.cat([video_coords, start.keyframe_coords], dim=2)
        guide = (video_embeds, audio_embeds, conn_mask, video_coords, audio_coords)
        if do_cfg:
            video_coords = video_coords.repeat((2,) + (1,) * (video_coords.ndim - 1))
            audio_coords = audio_coords.repeat((2,) + (1,) * (audio_coords.ndim - 1))
            guide = (
                video_embeds.chunk(2, dim=0)[1],
                audio_embeds.chunk(2, dim=0)[1],
                conn_mask.chunk(2, dim=0)[1],
                video_coords.chunk(2, dim=0)[0],
                audio_coords.chunk(2, dim=0)[0],
            )
        state_class = STATES[job_workflow(keys)]
        return state_class(
            **sampling(
                request, generator, scheduler, timesteps, latents, scales["guidance_scale"], do_cfg
            ),
            **keyed,
            audio_scheduler=audio_scheduler,
            audio_latents=audio_latents,
            dtype=embeds.dtype,
            scales=scales,
            stg_blocks=stg_blocks,
            use_cross_timestep=bool(cross),
            embeds=video_embeds,
            audio_embeds=audio_embeds,
            attention_mask=conn_mask,
            video_coords=video_coords,
            audio_coords=audio_coords,
            guide_embeds=guide[0],
            guide_audio_embeds=guide[1],
            guide_attention_mask=guide[2],
            guide_video_coords=guide[3],
            guide_audio_coords=guide[4],
            conditioning_fps=cond_fps,
            grid=grid,
            audio_num_frames=audio_num_frames,
            latent_mel_bins=latent_mel_bins,
        )

    def _forward(
        self,
        s: LTX2State,
        video: torch.Tensor,
        audio: torch.Tensor,
        times: tuple[torch.Tensor, ...],
        *,
        guide: bool,
        isolate: bool = False,
        stg: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One transformer call with the loop's arguments (``times``: ``model_timesteps``);
        float32 velocity predictions."""
        pipe = self._loaded()
        dtype = s.dtype
        embeds = (
            (s.guide_embeds, s.guide_audio_embeds, s.guide_attention_mask)
            if guide
            else (s.embeds, s.audio_embeds, s.attention_mask)
        )
        coords = (
            (s.guide_video_coords, s.guide_audio_coords)
            if guide
            else (s.video_coords, s.audio_coords)
        )
        out_video, out_audio = pipe.transformer(
            hidden_states=video.to(dtype),
            audio_hidden_states=audio.to(dtype),
            encoder_hidden_states=embeds[0],
            audio_encoder_hidden_states=embeds[1],
            timestep=times[0],
            audio_timestep=times[1],
            sigma=times[2],
            audio_sigma=times[3],
            encoder_attention_mask=embeds[2],
            audio_encoder_attention_mask=embeds[2],
            **s.grid.transformer_kwargs(),
            fps=s.conditioning_fps,
            audio_num_frames=s.audio_num_frames,
            video_coords=coords[0],
            audio_coords=coords[1],
            isolate_modalities=isolate,
            spatio_temporal_guidance_blocks=stg,
            perturbation_mask=None,
            use_cross_timestep=s.use_cross_timestep,
            attention_kwargs=None,
            return_dict=False,
        )
        return out_video.float(), out_audio.float()

    def _step(self, pipe: Any, s: LTX2State) -> None:
        """One loop iteration: CFG / STG / modality guidance in x0 space, both schedulers."""
        i, sc = s.step_index, s.scales
        latents, audio_latents = s.latents, s.audio_latents
        video_sched, audio_sched = s.scheduler, s.audio_scheduler

        def x0(sample: torch.Tensor, v: torch.Tensor, sched: Any) -> torch.Tensor:
            return pipe.convert_velocity_to_x0(sample, v, i, sched)

        video_in, audio_in = cfg_batch(latents, s.do_cfg), cfg_batch(audio_latents, s.do_cfg)
        times = model_timesteps(s, video_in.shape[0])
        with pipe.transformer.cache_context("cond_uncond"):
            pred_v, pred_a = self._forward(s, video_in, audio_in, times, guide=False)
        # Deltas that are off stay 0, as in __call__ (``x + 0`` is exact).
        cfg_v: torch.Tensor | float = 0.0
        cfg_a: torch.Tensor | float = 0.0
        stg_v: torch.Tensor | float = 0.0
        stg_a: torch.Tensor | float = 0.0
        mod_v: torch.Tensor | float = 0.0
        mod_a: torch.Tensor | float = 0.0
        if s.do_cfg:
            uncond_v, pred_v = pred_v.chunk(2)
            pred_v, uncond_v = x0(latents, pred_v, video_sched), x0(latents, uncond_v, video_sched)
            cfg_v = (sc["guidance_scale"] - 1) * (pred_v - uncond_v)
            uncond_a, pred_a = pred_a.chunk(2)
            pred_a = x0(audio_latents, pred_a, audio_sched)
            uncond_a = x0(audio_latents, uncond_a, audio_sched)
            cfg_a = (sc["audio_guidance_scale"] - 1) * (pred_a - uncond_a)
            times = tuple(x.chunk(2, dim=0)[0] for x in times)
        else:
            pred_v = x0(latents, pred_v, video_sched)
            pred_a = x0(audio_latents, pred_a, audio_sched)

        if s.do_stg:
            with pipe.transformer.cache_context("uncond_stg"):
                stg_pv, stg_pa = self._forward(
                    s, latents, audio_latents, times, guide=True, stg=s.stg_blocks
                )
            stg_v = sc["stg_scale"] * (pred_v - x0(latents, stg_pv, video_sched))
            stg_a = sc["audio_stg_scale"] * (pred_a - x0(audio_latents, stg_pa, audio_sched))
        if s.do_modality:
            with pipe.transformer.cache_context("uncond_modality"):
                mod_pv, mod_pa = self._forward(
                    s, latents, audio_latents, times, guide=True, isolate=True
                )
            mod_v = (sc["modality_scale"] - 1) * (pred_v - x0(latents, mod_pv, video_sched))
            mod_a = (sc["audio_modality_scale"] - 1) * (
                pred_a - x0(audio_latents, mod_pa, audio_sched)
            )

        guided_v = pred_v + cfg_v + stg_v + mod_v
        guided_a = pred_a + cfg_a + stg_a + mod_a
        if sc["guidance_rescale"] > 0:
            guided_v = rescale_noise_cfg(guided_v, pred_v, guidance_rescale=sc["guidance_rescale"])
        if sc["audio_guidance_rescale"] > 0:
            guided_a = rescale_noise_cfg(
                guided_a, pred_a, guidance_rescale=sc["audio_guidance_rescale"]
            )
        velocity_a = pipe.convert_x0_to_velocity(audio_latents, guided_a, i, audio_sched)
        s.latents = next_video_latents(pipe, s, guided_v)
        t = s.timesteps[i]
        s.audio_latents = audio_sched.step(velocity_a, t, audio_latents, return_dict=False)[0]

    def _decode_frames(self, pipe: Any, s: LTX2State) -> np.ndarray:
        """Video tail of ``__call__``: the appended keyframe tokens dropped (flf2v), unpack,
        decode-timestep noise (timestep-conditioned VAEs, drawn from the job's generator as
        ``__call__`` does), de-normalise, decode."""
        vae = pipe.vae
        latents = self._unpacked(s.latents[:, : s.grid.tokens], s).to(s.dtype)
        timestep: torch.Tensor | None = None
        if vae.config.timestep_conditioning:
            latents, timestep = self._decode_noise(latents, s.request.extra, s.generator)
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
        latents = self._unpacked(s.latents[:, : s.grid.tokens], s)
        return grey_preview(latents, channel_dim=1, frame_dim=2)

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
