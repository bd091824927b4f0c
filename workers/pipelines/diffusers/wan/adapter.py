"""Wan 2.1 / 2.2 text-, image- and first/last-frame-to-video, one denoise step at a time.

Text-to-video (``t2v``) mirrors ``WanPipeline.__call__`` (diffusers 0.42), image-to-video
(``i2v``: a first frame) and first/last-frame-to-video (``flf2v``) mirror
``WanImageToVideoPipeline.__call__``: ``prepare`` = steps 1-5 (checks, rounding, prompt
encoding, the image encoder's features for Wan 2.1, timesteps, latents and the keyframes'
VAE condition), ``step`` = one iteration of step 6 (the denoising loop, including Wan 2.2's
two-transformer ``boundary_ratio`` switch with ``guidance_scale_2`` and the
``expand_timesteps`` per-token timesteps of TI2V-5B), ``decode`` = the tail (latent
de-normalisation, VAE decode, ``postprocess_video``).

The registry entry's ``spec.workflows`` says what a checkpoint serves (wan/i2v.py checks
it against the loaded components): ``["t2v"]`` (the default: ``WanPipeline``), ``["i2v"]``
(Wan 2.1 / 2.2 I2V), ``["flf2v"]`` (Wan 2.1 FLF2V), ``["i2v", "flf2v"]`` (Wan 2.2 I2V
A14B), ``["t2v", "i2v"]`` (Wan 2.2 TI2V-5B: one checkpoint, both loops), ``["t2v",
"v2v"]`` (a one-transformer T2V checkpoint; v2v is ``WanVideoToVideoPipeline``'s steps
1-5, wan/v2v.py, then the t2v loop). An image workflow loads the checkpoint as
``WanImageToVideoPipeline``; its ``t2v`` jobs run ``WanPipeline``'s loop over the same
modules.

Request options: ``guidance_scale_2``, ``boundary_ratio`` (overrides the pipeline's
config for this job), ``flow_shift`` (job scheduler built with that shift),
``vae_use_tiling`` / ``vae_use_slicing``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Literal, Unpack

import numpy as np
import torch
from diffusers import WanImageToVideoPipeline, WanPipeline
from diffusers.utils.torch_utils import get_module_execution_device

from models.catalog import Workflow
from models.errors import InvalidJobInput
from workers.pipelines.base import DecodeStream, GenerationRequest, Media, StepState
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import (
    call_default,
    cfg,
    decode_video,
    frames_media,
    grey_preview,
    guidance_scale,
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
    text_over_image,
)
from workers.pipelines.diffusers.shared.vae_layout import decoder_channels_last, refuse_with_offload
from workers.pipelines.diffusers.shared.wan_decode import decode_pieces, streams
from workers.pipelines.diffusers.wan.i2v import (
    IMAGE_WORKFLOWS,
    check_workflows,
    keyframe_latents,
    text_pipeline,
)
from workers.pipelines.diffusers.wan.prompt import encode_prompt
from workers.pipelines.diffusers.wan.state import WanState
from workers.pipelines.diffusers.wan.v2v import v2v_state

logger = logging.getLogger(__name__)


class WanAdapter(DiffusersAdapter[WanState]):
    """``WanPipeline`` (T2V 1.3B/14B, Wan 2.2 A14B with ``transformer_2``, TI2V-5B) and,
    for an entry serving ``i2v`` / ``flf2v``, ``WanImageToVideoPipeline`` (Wan 2.1 I2V and
    FLF2V, Wan 2.2 I2V A14B, TI2V-5B)."""

    family = "diffusers.wan"
    pipeline_class: Any = WanPipeline
    default_workflows = ("t2v",)
    # CFG as two passes through ``self.parallel.cfg_pair`` (a ``cfg`` worker group puts
    # them on two ranks: workers/pipelines/parallel.py).
    cfg_parallel: Literal[True] = True
    # t2v jobs of an image-to-video pipeline: WanPipeline over its modules (``load``).
    _text_pipe: Any = None

    def __init__(
        self,
        path: str | None = None,
        *,
        vae_channels_last: bool = False,
        **options: Unpack[EntryOptions],
    ) -> None:
        """``DiffusersAdapter``'s arguments (entry.py); ``vae_channels_last``: the VAE
        decoder's weights channels-last once placed (shared/vae_layout.py; refused with
        an offload)."""
        super().__init__(path, **options)
        if vae_channels_last:
            refuse_with_offload(self.spec.name, self.entry.memory)
        self.vae_channels_last = vae_channels_last

    @staticmethod
    def _pipeline_for(workflows: list[Workflow]) -> Any:
        """``WanImageToVideoPipeline`` for an entry serving an image workflow, else
        ``WanPipeline``."""
        return WanImageToVideoPipeline if set(IMAGE_WORKFLOWS) & set(workflows) else WanPipeline

    def load(self, device: str) -> None:
        """``DiffusersAdapter.load``, then the served workflows checked against the loaded
        components (wan/i2v.py; refusing to start on a mismatch) and, for ``t2v`` beside
        an image workflow, ``WanPipeline`` over the loaded modules."""
        super().load(device)
        pipe = self._loaded()
        if self.vae_channels_last:  # once the weights are where they stay
            decoder_channels_last(pipe)
        check_workflows(self.spec.name, pipe, self.workflows)
        image_class = WanImageToVideoPipeline
        self._text_pipe = text_over_image(pipe, self.workflows, image_class, text_pipeline)

    def _prepare(self, pipe: Any, request: GenerationRequest) -> WanState:
        """``__call__`` steps 1-5 (``WanPipeline``'s for t2v, else
        ``WanImageToVideoPipeline``'s; v2v: wan/v2v.py)."""
        keys = keyframes_of(request, self.spec.name, self.workflows)
        if isinstance(keys, SourceVideo):  # v2v: WanVideoToVideoPipeline's steps 1-5
            return v2v_state(pipe, request, keys, self.entry.max_sequence_length)
        text_pipe = pipe if keys is not None or self._text_pipe is None else self._text_pipe
        scale = guidance_scale(pipe, request)
        # 1. Check inputs, and the size rounded as __call__ rounds it.
        boundary_ratio = _check_inputs(pipe, text_pipe, request, keys)
        height, width, num_frames = _canvas(pipe, request)
        scale_2 = request.sampler.guidance_scale_2
        if boundary_ratio is not None and scale_2 is None:
            scale_2 = scale
        do_cfg = scale > 1.0
        device = pipe._execution_device

        # 3. Encode input prompt (and, for Wan 2.1 I2V / FLF2V, the keyframes).
        seq_len = self.entry.seq_len(call_default(pipe, "max_sequence_length"))
        embeds, negative_embeds, image_embeds = _encode(pipe, request, keys, seq_len, do_cfg)

        # 4. Prepare timesteps (on this job's scheduler copy).
        scheduler = job_scheduler(pipe.scheduler, request.sampler.flow_shift)
        scheduler.set_timesteps(request.num_inference_steps, device=device)
        timesteps = scheduler.timesteps

        # 5. Prepare latent variables (and, for an image workflow, the keyframes' condition).
        generator = make_generator(request.seed)
        condition = first_frame_mask = None
        if keys is None:
            latents = text_pipe.prepare_latents(
                1, _main(pipe).config.in_channels, height, width, num_frames, torch.float32,
                device, generator,
            )  # fmt: skip
        else:
            latents, condition, first_frame_mask = keyframe_latents(
                pipe, keys, height, width, num_frames, device, generator
            )
        scheduler.set_begin_index(0)
        boundary = (
            None
            if boundary_ratio is None
            else float(boundary_ratio) * scheduler.config.num_train_timesteps
        )
        return WanState(
            **sampling(request, generator, scheduler, timesteps, latents, scale, do_cfg),
            prompt_embeds=embeds,
            negative_prompt_embeds=negative_embeds,
            guidance_scale_2=scale if scale_2 is None else float(scale_2),
            boundary_timestep=boundary,
            transformer_dtype=_main(pipe).dtype,
            workflow=job_workflow(keys),
            condition=condition,
            first_frame_mask=first_frame_mask,
            image_embeds=image_embeds,
        )

    def _step(self, pipe: Any, s: WanState) -> None:
        """One iteration of ``__call__``'s step 6 (the denoising loop)."""
        i = s.step_index
        t = s.timesteps[i]
        if s.boundary_timestep is None or t >= s.boundary_timestep:
            model, scale = pipe.transformer, s.guidance_scale  # wan2.1 / high-noise stage
        else:
            model, scale = pipe.transformer_2, s.guidance_scale_2  # low-noise stage
        latents, mask = s.latents, s.first_frame_mask
        if s.condition is None:  # t2v
            latent_model_input = latents.to(s.transformer_dtype)
        elif mask is not None:  # TI2V-5B: the keyframe's latents in the first frame
            latent_model_input = ((1 - mask) * s.condition + mask * latents).to(s.transformer_dtype)
        else:  # Wan 2.1 / 2.2 I2V: the condition as more channels
            latent_model_input = torch.cat([latents, s.condition], dim=1).to(s.transformer_dtype)
        if pipe.config.expand_timesteps:
            # One timestep per token: mask[0][0][:, ::2, ::2] * t (t2v: an all-ones mask).
            if mask is None:
                mask = torch.ones(latents.shape, dtype=torch.float32, device=latents.device)
            timestep = (mask[0][0][:, ::2, ::2] * t).flatten().unsqueeze(0)
            timestep = timestep.expand(latents.shape[0], -1)
        else:
            timestep = t.expand(latents.shape[0])
        image = {} if s.image_embeds is None else {"encoder_hidden_states_image": s.image_embeds}
        cache_kwargs: dict[str, Any] = {
            "step_index": i,
            "sigma": float(s.scheduler.sigmas[i]),
            "num_inference_steps": len(s.timesteps),
        }

        def predict(cache: str, embeds: torch.Tensor | None) -> torch.Tensor:
            with model.cache_context(cache, **cache_kwargs):
                return model(
                    hidden_states=latent_model_input,
                    timestep=timestep,
                    encoder_hidden_states=embeds,
                    **image,
                    attention_kwargs=None,
                    return_dict=False,
                )[0]

        def cond() -> torch.Tensor:
            return predict("cond", s.prompt_embeds)

        if s.do_cfg:  # a second pass, not a batch: Wan runs CFG as __call__ does
            noise_cond, noise_uncond = self.parallel.cfg_pair(
                cond, lambda: predict("uncond", s.negative_prompt_embeds)
            )  # in a cfg worker group, on two ranks at once
            noise_pred = cfg(noise_uncond, noise_cond, scale)
        else:
            noise_pred = cond()
        s.latents = s.scheduler.step(noise_pred, t, latents, return_dict=False)[0]

    @torch.no_grad()
    def decode_frames(self, state: StepState) -> np.ndarray:
        """The tail of ``__call__``: de-normalise with the VAE's latents_mean/std, decode,
        ``postprocess_video``; float32 T×H×W×3 in [0, 1], what ``pipe(...,
        output_type="np").frames[0]`` returns."""
        pipe, s = self._loaded(), self._state(state)
        return decode_video(pipe, s.request, self._vae_latents(pipe, s))

    def decode(self, state: StepState) -> Media:
        """``decode_frames`` as uint8 at the request's fps."""
        return frames_media(self.decode_frames(state), self._state(state).request)

    @staticmethod
    def _vae_latents(pipe: Any, s: WanState) -> torch.Tensor:
        """The final latents (TI2V-5B's with the keyframe's first frame put back)
        de-normalised with the VAE's latents_mean/std, on its device."""
        vae = pipe.vae
        latents, mask = s.latents, s.first_frame_mask
        if mask is not None and s.condition is not None:
            latents = (1 - mask) * s.condition + mask * latents
        latents = latents.to(get_module_execution_device(vae), dtype=vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(
            latents.device, latents.dtype
        )
        return latents / std + mean

    def decode_stream(self, state: StepState) -> DecodeStream | None:
        """``decode_frames`` one latent frame at a time (1 video frame, then 4 each):
        ``AutoencoderKLWan._decode``'s own loop over its causal decoder, with the clamp and
        ``postprocess_video`` applied per chunk (both work frame by frame), so the chunks
        are bit-identical to the whole decode. None where that loop is not what
        ``vae.decode`` would run (tiling asked for or engaged, slicing of a batch, a
        patched VAE, an offload hook)."""
        pipe = self._loaded()
        s = self._state(state)
        vae = pipe.vae
        opts = s.request.sampler
        if opts.vae_use_tiling or not streams(vae):
            return None
        return DecodeStream(self._stream(pipe, s))

    def _stream(self, pipe: Any, s: WanState) -> Iterator[np.ndarray]:
        for piece in decode_pieces(pipe.vae, self._vae_latents(pipe, s)):
            with torch.no_grad():
                frames = pipe.video_processor.postprocess_video(piece, output_type="np")[0]
            yield to_uint8(frames)

    def preview(self, state: StepState) -> np.ndarray | None:
        """Grey middle latent frame (latents are B×C×F×h×w)."""
        return grey_preview(self._state(state).latents, channel_dim=1, frame_dim=2)


def _main(pipe: Any) -> Any:
    """The transformer that sets the shapes and dtype: ``transformer``, or Wan 2.2's
    ``transformer_2`` where a checkpoint has only the low-noise stage."""
    return pipe.transformer if pipe.transformer is not None else pipe.transformer_2


def _check_inputs(
    pipe: Any, text_pipe: Any, request: GenerationRequest, keys: Keyframes | None
) -> float | None:
    """``__call__``'s step 1 (``guidance_scale_2`` against this job's boundary ratio);
    the job's ``boundary_ratio`` (the request's, else the pipeline's config)."""
    opts = request.sampler
    prompt, negative_prompt = request.prompt, request.negative_prompt
    height, width = request.height, request.width
    boundary_ratio = (
        pipe.config.boundary_ratio if opts.boundary_ratio is None else opts.boundary_ratio
    )
    if keys is None:
        text_pipe.check_inputs(prompt, negative_prompt, height, width)
    else:
        pipe.check_inputs(prompt, negative_prompt, keys.first, height, width)
    if boundary_ratio is None and opts.guidance_scale_2 is not None:
        raise InvalidJobInput("guidance_scale_2 needs a boundary_ratio (a two-stage Wan 2.2 model)")
    if boundary_ratio is not None and pipe.transformer_2 is None:
        raise InvalidJobInput("boundary_ratio needs a Wan 2.2 model with transformer_2")
    return boundary_ratio


def _canvas(pipe: Any, request: GenerationRequest) -> tuple[int, int, int]:
    """(height, width, num_frames) as ``__call__`` rounds them (with a warning): the
    frames to ``4k + 1``, the size to the VAE's and patches' multiples."""
    height, width, num_frames = request.height, request.width, request.num_frames
    temporal = pipe.vae_scale_factor_temporal
    if num_frames % temporal != 1:
        logger.warning("num_frames - 1 has to be divisible by %d; rounding", temporal)
        num_frames = num_frames // temporal * temporal + 1
    num_frames = max(num_frames, 1)
    patch_size = _main(pipe).config.patch_size
    h_multiple = pipe.vae_scale_factor_spatial * patch_size[1]
    w_multiple = pipe.vae_scale_factor_spatial * patch_size[2]
    calc_height = height // h_multiple * h_multiple
    calc_width = width // w_multiple * w_multiple
    if (height, width) != (calc_height, calc_width):
        logger.warning("adjusting (%d, %d) -> (%d, %d)", height, width, calc_height, calc_width)
        height, width = calc_height, calc_width
    return height, width, num_frames


def _encode(
    pipe: Any, request: GenerationRequest, keys: Keyframes | None, seq_len: int, do_cfg: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``__call__``'s step 3 in the transformer's dtype: the prompt's embeddings, the
    negative's (None without CFG) and, for Wan 2.1 I2V / FLF2V (only its transformer takes
    them), the image encoder's features of the keyframes."""
    device, dtype = pipe._execution_device, _main(pipe).dtype
    embeds, negative = encode_prompt(
        pipe, request, seq_len=seq_len, do_cfg=do_cfg, device=device, dtype=dtype
    )
    image_embeds = None
    image_dim = None if pipe.transformer is None else pipe.transformer.config.image_dim
    if keys is not None and image_dim is not None:
        images = keys.first if keys.last is None else [keys.first, keys.last]
        image_embeds = pipe.encode_image(images, device).repeat(1, 1, 1).to(dtype)
    return embeds, negative, image_embeds
