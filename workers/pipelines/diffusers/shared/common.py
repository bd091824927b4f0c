"""Shared pieces of the diffusers adapters: per-job RNG and scheduler, guidance, VAE
options, postprocessing, previews, and the adapter base class (its constructor:
``entry.py``; loading helpers: ``loading.py``).

Every adapter drives a diffusers pipeline with its own step loop: ``prepare`` mirrors what
the pipeline's ``__call__`` does before its denoising loop, ``step`` one loop iteration,
``decode`` what follows it. The pipeline object is shared by all jobs of a worker, so no
per-request value is ever written to it: each job gets its own scheduler copy and RNG.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast, get_args

import numpy as np
import torch

from models.errors import InvalidJobInput, InvalidLora
from models.registry import WarmupShape
from workers.pipelines.base import GenerationRequest, Media, Pipeline, StepState
from workers.pipelines.diffusers.shared import cache_tiers
from workers.pipelines.diffusers.shared.compiled import graphs_made
from workers.pipelines.diffusers.shared.entry import DiffusersEntry
from workers.pipelines.diffusers.shared.loading import (
    DTYPE_KWARG,
    install_checkpoints,
    own_weights,
)
from workers.pipelines.diffusers.shared.lora import LoraCache
from workers.pipelines.parallel import Parallel

log = logging.getLogger(__name__)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """The job's RNG. Kept on the CPU by default: diffusers' ``randn_tensor`` draws on the
    generator's device and moves the noise, so one seed gives the same initial noise on any
    device (and matches ``pipe(..., generator=torch.Generator().manual_seed(seed))``)."""
    return torch.Generator(device=device).manual_seed(int(seed))


def clone_generator(generator: torch.Generator) -> torch.Generator:
    """An independent generator in the same state (to draw without advancing the job's)."""
    clone = torch.Generator(device=generator.device)
    clone.set_state(generator.get_state())
    return clone


def job_scheduler(base: Any, flow_shift: float | None = None) -> Any:
    """A private scheduler for one job (multistep schedulers such as UniPC keep state).

    Without ``flow_shift`` a deep copy of the pipeline's scheduler; with it a fresh one via
    ``from_config`` with that shift (``flow_shift`` for UniPC/DPM-style flow schedulers,
    ``shift`` for ``FlowMatchEulerDiscreteScheduler``), as diffusers' docs do for Wan.
    """
    if flow_shift is None:
        return copy.deepcopy(base)
    config = base.config
    if config.get("use_dynamic_shifting"):
        name = type(base).__name__
        raise InvalidJobInput(f"{name} shifts by resolution here; flow_shift has no effect")
    if "flow_shift" in config:
        return type(base).from_config(config, flow_shift=float(flow_shift))
    if "shift" in config:
        return type(base).from_config(config, shift=float(flow_shift))
    raise InvalidJobInput(f"flow_shift is not supported by {type(base).__name__}")


def call_default(pipe: Any, name: str) -> Any:
    """The default of a ``__call__`` argument of ``pipe`` (e.g. ``guidance_scale``)."""
    return inspect.signature(type(pipe).__call__).parameters[name].default


def guidance_scale(pipe: Any, request: GenerationRequest) -> float:
    """``request.guidance_scale``, or the pipeline's own ``__call__`` default when None."""
    value = request.guidance_scale
    return float(call_default(pipe, "guidance_scale") if value is None else value)


def cfg(uncond: torch.Tensor, cond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance, written as every diffusers video pipeline writes it."""
    return uncond + scale * (cond - uncond)


def extra_step_kwargs(scheduler: Any, generator: torch.Generator, eta: float) -> dict[str, Any]:
    """``prepare_extra_step_kwargs`` of the pipelines, checked against the job scheduler."""
    params = set(inspect.signature(scheduler.step).parameters)
    out: dict[str, Any] = {}
    if "eta" in params:
        out["eta"] = eta
    if "generator" in params:
        out["generator"] = generator
    return out


@contextlib.contextmanager
def vae_options(vae: Any, tiling: bool | None, slicing: bool | None) -> Iterator[None]:
    """Apply ``vae_use_tiling``/``vae_use_slicing`` for one decode, then restore.

    ``enable_tiling()`` etc. mutate the shared VAE, so the request's choice is set around
    its own decode only (decodes of one worker run one at a time). Unsupported: ignored.
    """
    saved: list[tuple[str, bool]] = []
    for attr, want in (("use_tiling", tiling), ("use_slicing", slicing)):
        verb = attr.removeprefix("use_")
        if want is None or not hasattr(vae, attr) or not hasattr(vae, f"enable_{verb}"):
            continue
        saved.append((attr, bool(getattr(vae, attr))))
        getattr(vae, f"enable_{verb}" if want else f"disable_{verb}")()
    try:
        yield
    finally:
        for attr, was in saved:
            setattr(vae, attr, was)


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] → uint8, rounding as diffusers' ``numpy_to_pil`` does."""
    return (np.clip(frames, 0.0, 1.0) * 255).round().astype(np.uint8)


def grey_preview(latents: torch.Tensor, channel_dim: int, frame_dim: int) -> np.ndarray:
    """A cheap preview: the middle latent frame, mean over channels, contrast-stretched
    to grey (uint8 h×w×3 at latent resolution). No model is run."""
    x = latents[0].float()
    c, f = channel_dim - 1, frame_dim - 1
    x = x.mean(dim=c)  # drop channels
    f = f if f < c else f - 1
    x = x.select(f, x.shape[f] // 2)
    lo, hi = torch.quantile(x.flatten(), torch.tensor([0.02, 0.98], device=x.device))
    grey = ((x - lo) / (hi - lo).clamp_min(1e-6)).clamp(0, 1)
    img = (grey * 255).round().to(torch.uint8).cpu().numpy()
    return np.repeat(img[:, :, None], 3, axis=2)


@dataclass(kw_only=True)
class DiffusersState(StepState):
    """Per-request state shared by the diffusers adapters (never stored on the adapter)."""

    request: GenerationRequest
    generator: torch.Generator
    scheduler: Any
    timesteps: torch.Tensor
    latents: torch.Tensor
    guidance_scale: float
    do_cfg: bool
    # Other input shapes at the same latents (LTX's per-token timesteps): blocks of its own.
    compile_variant: str = ""


def sampling(
    request: GenerationRequest,
    generator: torch.Generator,
    scheduler: Any,
    timesteps: torch.Tensor,
    latents: torch.Tensor,
    guidance_scale: float,
    do_cfg: bool,
) -> dict[str, Any]:
    """The :class:`DiffusersState` fields every adapter fills the same way, for a state's
    constructor (``State(**sampling(…), own=…)``); the job has as many steps as its
    schedule has timesteps."""
    return {
        "num_steps": len(timesteps),
        "request": request,
        "generator": generator,
        "scheduler": scheduler,
        "timesteps": timesteps,
        "latents": latents,
        "guidance_scale": guidance_scale,
        "do_cfg": do_cfg,
    }


def cfg_batch(latents: torch.Tensor, do_cfg: bool) -> torch.Tensor:
    """The model input of one step: ``latents`` twice (the [negative, positive] batch)
    under classifier-free guidance, else as they are."""
    return torch.cat([latents] * 2) if do_cfg else latents


def batched_prediction(
    pipe: Any, latent_model_input: torch.Tensor, t: torch.Tensor, **conditioning: Any
) -> torch.Tensor:
    """One transformer pass over a step's whole model input (the CFG batch: the
    ``"cond_uncond"`` cache context) at timestep ``t``; the prediction in float32."""
    timestep = t.expand(latent_model_input.shape[0])
    with pipe.transformer.cache_context("cond_uncond"):
        prediction: torch.Tensor = pipe.transformer(
            hidden_states=latent_model_input,
            timestep=timestep,
            attention_kwargs=None,
            return_dict=False,
            **conditioning,
        )[0]
    return prediction.float()


def decode_video(pipe: Any, request: GenerationRequest, *latents: Any) -> np.ndarray:
    """``vae.decode(*latents)`` under the request's VAE options, post-processed to float32
    T×H×W×3 in [0, 1] (``postprocess_video(output_type="np")`` of the one video)."""
    opts = request.sampler
    with vae_options(pipe.vae, opts.vae_use_tiling, opts.vae_use_slicing):
        video = pipe.vae.decode(*latents, return_dict=False)[0]
    frames: np.ndarray = pipe.video_processor.postprocess_video(video, output_type="np")
    return frames[0]


S = TypeVar("S", bound=DiffusersState)


class DiffusersAdapter(DiffusersEntry, Pipeline, Generic[S]):
    """Common loading and the :class:`Pipeline` calls, run without autograd on the loaded
    pipe and the adapter's own state class; subclasses implement ``_prepare`` (what
    ``__call__`` does before its loop), ``_step`` (one loop iteration, without advancing
    ``step_index``) and ``_decode_frames`` (what follows the loop, for video)."""

    family: str = ""
    # Defined by subclasses: the diffusers pipeline class loaded from ``path``.
    pipeline_class: Any = None
    state_class: type[S]  # the type argument: ``class LTXAdapter(DiffusersAdapter[LTXState])``
    # Runs classifier-free guidance as two passes through ``self.parallel.cfg_pair`` (so
    # a ``cfg`` worker group can put them on two ranks).
    cfg_parallel = False
    # Takes keyframes and references (``reference_image``, ``last_image``,
    # ``references``); the others are text-to-video/audio and refuse them.
    takes_references = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            args = get_args(base)
            if args and isinstance(args[0], type) and issubclass(args[0], DiffusersState):
                cls.state_class = cast(Any, args[0])

    def __init__(self, path: str | None = None, **kwargs: Any) -> None:
        """``DiffusersEntry``'s constructor (entry.py)."""
        super().__init__(path, **kwargs)
        # This process's share of a step (workers/pipelines/parallel.py): all of it, unless a
        # worker group's rank.
        self.parallel = Parallel()
        # Graphs dynamo had made when the running job's prepare ended (None: no job).
        self._graphs_at_denoise: int | None = None
        self.last_recompiles = 0  # graphs made while the last job denoised
        # Per-request LoRA (workers/pipelines/diffusers/shared/lora.py), for models that list
        # ``lora``: set by ``use_lora`` before ``load``; None refuses a job's adapter.
        self.lora: LoraCache | None = None

    def use_lora(self, cache: LoraCache) -> None:
        """Serve per-request LoRA through ``cache`` (its slot goes into the pipe at
        ``load``, before anything compiles the transformer's blocks; called after ``load``,
        the first LoRA job installs it)."""
        self.lora = cache

    def load(self, device: str) -> None:
        """``from_pretrained(path, dtype=…, local_files_only=True)`` (or the injected pipe,
        whose dtype is left as it is), checked to be the family's pipeline class, moved to
        ``device``."""
        if self.pipe is None and self.random_weights:
            self.pipe = self._random_pipeline(device)
        elif self.pipe is None:
            self.pipe = self._from_pretrained()
            if torch.device(device).type == "cpu":
                own_weights(self.pipe)
        if not isinstance(self.pipe, self.pipeline_class):
            raise TypeError(
                f"{type(self).__name__} drives {self.pipeline_class.__name__}, "
                f"got {type(self.pipe).__name__}"
            )
        self.pipe.to(device)
        self.device = torch.device(device)
        self._on_device(self.pipe)
        if self.lora is not None:
            self.lora.install(self.pipe)
        install_checkpoints(self.pipe)
        self.gate.device = self.device
        self.gate.install(self.pipe)
        offered = set(cache_tiers.family_tiers(self.family))
        unknown = sorted(set(self.spec.quality_tiers) - offered - {"lossless"})
        if unknown:
            raise ValueError(
                f"{self.spec.name}: {self.family} has no quality tier {', '.join(unknown)}"
            )
        mode = self.compile or ("blocks" if self.device.type == "cuda" else "off")
        if mode == "blocks":
            self.compiler.install(self.pipe)

    def _on_device(self, pipe: Any) -> None:
        """Loaded on the device, before the LoRA slot, the gates and the compiled blocks
        go in: where an adapter changes the weights themselves (H3 fuses its deployment's
        LoRA). By default nothing."""
        return None

    def _from_pretrained(self) -> Any:
        """The pipeline of ``path`` (a modular pipeline's adapter loads its own way)."""
        return self.pipeline_class.from_pretrained(
            self.path, local_files_only=True, **{DTYPE_KWARG: self.dtype}
        )

    def _random_pipeline(self, device: str) -> Any:
        """The pipeline from default configs with seeded random weights, built on
        ``device`` (a registry entry's ``weights = "random"``; benchmarks only)."""
        raise ValueError(f"{self.spec.name}: {self.family} has no random-weights loading mode")

    def warm_up(self) -> None:
        """Compile the blocks for each of the registry's ``warmup`` shapes (at worker
        start, before it takes jobs): a short request of that shape is prepared and one
        step of it run on a copy of its state."""
        if not self.compiler.enabled:
            return
        for shape in self.warmup:
            request = self._warm_up_request(shape)
            with torch.no_grad():
                state = self._prepare(self._loaded(), request)
                self._compile_for(state, "warmup")
            del state

    def _warm_up_request(self, shape: WarmupShape) -> GenerationRequest:
        """The short request a warm-up prepares for ``shape`` (an adapter whose model
        needs more than a prompt adds it)."""
        return GenerationRequest.video(
            prompt="warm-up",
            width=shape.width,
            height=shape.height,
            num_frames=shape.num_frames,
            fps=float(self.spec.default_fps),
            num_inference_steps=2,
            seed=0,
        )

    def _compile_for(self, state: S, why: str) -> None:
        """Compile the blocks for ``state``'s input shapes unless done: one step of a copy
        of the state (its own scheduler and RNG, so the job's are untouched)."""
        name = type(state).__name__ + state.compile_variant
        key = (name, tuple(state.latents.shape), state.do_cfg)
        pipe = self._loaded()

        def run() -> None:
            trial = copy.copy(state)
            trial.scheduler = copy.deepcopy(state.scheduler)
            trial.generator = clone_generator(state.generator)
            self._step(pipe, trial)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        self.compiler.ensure(key, run, why)

    def _compiled(self, when: str, seconds: float) -> None:
        from workers.common import metrics

        metrics.COMPILE_SECONDS.labels(self.spec.name, when).observe(seconds)

    def _compile_failed(self, reason: str) -> None:
        from workers.common import metrics

        metrics.COMPILE_FALLBACKS.labels(self.spec.name).inc()

    def _loaded(self) -> Any:
        if self.pipe is None:
            raise RuntimeError(f"{type(self).__name__}.load() was not called")
        return self.pipe

    def _seq_len(self, default: int) -> int:
        return default if self.max_sequence_length is None else self.max_sequence_length

    def _state(self, state: StepState) -> S:
        if not isinstance(state, self.state_class):
            name = self.state_class.__name__
            raise TypeError(f"expected a {name}, got {type(state).__name__}")
        return state

    @torch.no_grad()
    def prepare(self, request: GenerationRequest) -> S:
        """Everything ``__call__`` does before its loop, then what the job runs with: the
        blocks compiled for its shape (once per shape), its cache tier installed (removed
        again by ``end``). An adapter that does not ``takes_references`` refuses an input
        reference."""
        has_references = request.reference_image is not None or request.last_image is not None
        if not self.takes_references and (has_references or request.references):
            raise InvalidJobInput(f"{self.spec.name} does not take an input_reference")
        pipe = self._loaded()
        cache_tiers.remove(pipe)  # nothing of an earlier job's tier, whatever happened
        if not self.spec.offers(request.quality):
            raise InvalidJobInput(f"{self.spec.name} has no quality tier {request.quality!r}")
        if self.lora is not None:
            self.lora.activate(pipe, request.lora)  # until end(); None: the base model
        elif request.lora is not None:
            raise InvalidLora(f"{self.spec.name} is not served with LoRA on this worker")
        state = self._prepare(pipe, request)
        self._compile_for(state, "prepare")
        cache_tiers.install(
            pipe, cache_tiers.cache_config(self.family, request.quality, state.num_steps)
        )
        self._graphs_at_denoise = graphs_made() if self.compiler.enabled else None
        return state

    def end(self) -> None:
        """After every job (the executor's ``finally``): the cache tier's hooks and their
        state removed, the job's LoRA adapter (if any) out of the pipe, and what the job
        compiled while it denoised counted."""
        if self.pipe is not None:
            cache_tiers.remove(self.pipe)
            if self.lora is not None:
                self.lora.release(self.pipe)
        start, self._graphs_at_denoise = self._graphs_at_denoise, None
        self.last_recompiles = 0 if start is None else graphs_made() - start
        if self.last_recompiles > 0:
            from workers.common import metrics

            made = self.last_recompiles
            log.warning("%s: %d graph(s) compiled while a job denoised", self.spec.name, made)
            metrics.RECOMPILES.labels(self.spec.name).inc(self.last_recompiles)

    @torch.no_grad()
    def step(self, state: StepState) -> None:
        """One iteration of ``__call__``'s denoising loop."""
        s = self._state(state)
        self.gate.begin_step()
        self._step(self._loaded(), s)
        s.step_index += 1

    @torch.no_grad()
    def decode_frames(self, state: StepState) -> np.ndarray:
        """The decoded video as float32 T×H×W×3 in [0, 1], i.e. what
        ``pipe(..., output_type="np").frames[0]`` returns."""
        return self._decode_frames(self._loaded(), self._state(state))

    def decode(self, state: StepState) -> Media:
        """``decode_frames`` as uint8 at the request's fps."""
        s = self._state(state)
        return Media(frames=to_uint8(self.decode_frames(s)), fps=s.request.fps)

    @abc.abstractmethod
    def _prepare(self, pipe: Any, request: GenerationRequest) -> S: ...

    @abc.abstractmethod
    def _step(self, pipe: Any, s: S) -> None: ...

    def _decode_frames(self, pipe: Any, s: S) -> np.ndarray:
        """Video adapters override this; an audio adapter overrides ``decode`` instead."""
        raise TypeError(f"{self.spec.name} makes audio, not video frames")
