"""MiniMax-H3 joint video + stereo audio (diffusers' modular ``MiniMaxH3Blocks``), one
denoise step at a time.

H3 is modular only: its integration is a tree of pipeline blocks with no ``__call__`` to
mirror. So this adapter runs diffusers' own blocks and only cuts the denoising loop open:

* ``prepare``: the blocks before the loop, exactly as ``pipe(...)`` runs them: media
  preparation (keyframes onto the canvas, references normalised), the Qwen3-VL text
  encoder, the VAE encoders (keyframe anchors, reference latents), then the workflow's
  core-denoise blocks up to the loop (packed layout, noise drawn from the job's generator,
  both schedules);
* ``step``: one iteration of the loop block (``loop_step``): one transformer forward over
  the packed sequence, then the video and the audio scheduler's update;
* ``decode``: the loop's state written back, ``after_denoise`` (unpack), then the video
  VAE and the audio VAE (32 kHz stereo).

Each job runs against a view of the shared pipeline with its own two schedulers, so jobs
interleaved step by step never share scheduler state. Bit-equality with
``pipe(prompt=…, generator=…)`` is tested per workflow (tests/unit/test_minimax_h3.py).

Workflows: ``t2va`` (prompt only), ``fl2va`` (a first and/or last keyframe) and
``ref2va`` (ordered image, video and audio references). A deployment loads one checkpoint
partition: ``transformer`` (t2va, fl2va) or ``transformer_ref`` (ref2va), set by the
registry entry's ``spec.workflows``; a job for a workflow the deployment did
not load is refused naming the field that asked for it.

Steps: H3's schedulers count ``num_inference_steps`` as sigma points, so N gives N - 1
transformer evaluations (vLLM-Omni's convention for H3, which its ComfyUI node's Turbo
settings rely on: 5 points, 4 evaluations). An entry with the adapter option ``steps =
"evaluations"`` counts them as evaluations instead (N runs N, from N + 1 sigma points):
FastH3's, to which the node's FastH3 path sends 4. The job's ``num_steps`` is the
evaluations. The checkpoint is guidance-distilled: no negative prompt, no guidance scale.

Attention: SDPA, or with the registry entry's ``attention = "vsa"`` the joint blocks run
fastvideo-kernel's video sparse attention over a per-job block layout (minimax_h3/vsa.py; the text
refiner keeps SDPA). Load refuses VSA without the kernel or a CUDA device. With
``attention = "cudnn"`` the whole transformer, token refiner included, runs cuDNN's fused
attention (shared/attention.py; refused off a CUDA device).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Unpack

import torch
from diffusers.modular_pipelines import MiniMaxH3Blocks, ModularPipeline, PipelineState
from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ModularPipeline

from models.catalog import Workflow
from models.errors import InvalidJobInput
from models.registry import CatalogError
from workers.pipelines.base import (
    DecodeStream,
    GenerationRequest,
    LoraSlot,
    Media,
    StepState,
)
from workers.pipelines.diffusers.minimax_h3.decode import stream_frames, streamable
from workers.pipelines.diffusers.minimax_h3.inputs import call_inputs, shifts_of, step_count
from workers.pipelines.diffusers.minimax_h3.processor import load_processor, takes_video
from workers.pipelines.diffusers.minimax_h3.state import H3State
from workers.pipelines.diffusers.minimax_h3.vsa import (
    VsaContext,
    install_vsa,
    kernel_name,
    load_kernel,
    vsa_layout,
)
from workers.pipelines.diffusers.shared import attention
from workers.pipelines.diffusers.shared.adapter import DiffusersAdapter
from workers.pipelines.diffusers.shared.common import (
    frames_uint8,
    make_generator,
    pixels_uint8,
    sampling,
)
from workers.pipelines.diffusers.shared.entry import EntryOptions

Partition = Literal["transformer", "transformer_ref"]
# The checkpoint partition each workflow denoises with.
PARTITIONS: dict[Workflow, Partition] = {
    "t2va": "transformer",
    "fl2va": "transformer",
    "ref2va": "transformer_ref",
}
# The wire field that asks for each workflow (named in a refusal).
WORKFLOW_FIELDS: dict[Workflow, str] = {
    "t2va": "prompt",
    "fl2va": "input_reference",
    "ref2va": "input_references",
}
# Blocks of the core-denoise sequence that run after the loop (in ``decode``).
_AFTER_LOOP = ("denoise", "after_denoise")


def partition_of(workflows: list[Workflow]) -> Partition:
    """The one checkpoint partition a deployment of ``workflows`` loads."""
    partitions = {PARTITIONS[w] for w in workflows}
    if len(partitions) != 1:
        raise ValueError(
            "a MiniMax-H3 deployment loads one checkpoint partition: serve t2va/fl2va "
            "(transformer) and ref2va (transformer_ref) as two models"
        )
    return partitions.pop()


def workflows_of(partition: Partition) -> list[Workflow]:
    """The workflows a deployment of ``partition`` serves."""
    return [w for w, p in PARTITIONS.items() if p == partition]


def workflow_of(request: GenerationRequest) -> Workflow:
    """``ref2va`` with references, ``fl2va`` with keyframes, else ``t2va``; an explicit
    ``extra["task"]`` must agree."""
    if request.references:
        found: Workflow = "ref2va"
    elif request.reference_image is not None or request.last_image is not None:
        found = "fl2va"
    else:
        found = "t2va"
    asked = request.extra.get("task")
    if asked is not None and asked != found:
        raise InvalidJobInput(
            f"task {asked!r} does not match the inputs, which make a {found} request",
            param="extra_params.task",
        )
    return found


@dataclass(frozen=True)
class FusedLora:
    """A LoRA fused into the denoiser at start-up (FastH3's 4-step adapter): a local
    safetensors file, its pinned sha256 and the fusing scale."""

    path: str
    sha256: str
    scale: float = 1.0

    def verify(self) -> None:
        """Refuse to start unless the file's sha256 is the pinned one (names the file)."""
        try:
            with open(self.path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise ValueError(f"fused_lora {self.path}: cannot read it ({exc})") from exc
        if digest != self.sha256.lower():
            raise ValueError(
                f"fused_lora {self.path}: sha256 is {digest}, the registry pins "
                f"{self.sha256}; refusing to start"
            )

    def fuse(self, pipe: Any, partition: Partition) -> None:
        """Load it into ``partition``, fuse it at ``scale``, drop the adapter layers."""
        pipe.load_lora_weights(
            self.path,
            adapter_name="fused",
            load_into_transformer_ref=partition == "transformer_ref"
            and getattr(pipe, "transformer", None) is not None,
        )
        pipe.fuse_lora(components=[partition], lora_scale=self.scale, adapter_names=["fused"])
        pipe.unload_lora_weights()


class MiniMaxH3Adapter(DiffusersAdapter[H3State]):
    """``MiniMaxH3ModularPipeline`` (MiniMax-H3 text/keyframes/references → video + audio)."""

    family = "diffusers.minimax_h3"
    pipeline_class = MiniMaxH3ModularPipeline
    # diffusers' H3 text encoding calls ``text_encoder.model`` (it reads a hidden state,
    # not the LM head), and Qwen3-VL's model calls its language model's ``embed_tokens``
    # before the language model's forward: each its own group, the decoder layers streamed.
    # The audio VAE's decoder indexes its upsamplers (lists of lists) without calling the
    # inner lists: ``ups`` makes each layer a group. (The VAEs' parts, which their encode
    # and decode call, are every autoencoder's: offload.py.)
    offload_entry_points = {
        "text_encoder": ("model", "language_model", "embed_tokens"),
        "audio_vae": ("ups",),
    }

    def __init__(
        self,
        path: str | None = None,
        *,
        fused_lora: dict[str, Any] | None = None,
        steps: str = "sigma_points",
        random_text_layers: int = 4,
        random_config: dict[str, dict[str, Any]] | None = None,
        **options: Unpack[EntryOptions],
    ) -> None:
        super().__init__(path, **options)
        # ``weights = "random"`` (minimax_h3/random_weights.py): the text encoder's depth, and
        # config overrides of the parts (a smaller variant).
        self.random_text_layers = random_text_layers
        self.random_config = dict(random_config or {})
        # FastH3: a LoRA fused into the denoiser at load, pinned by its sha256.
        self.fused_lora = FusedLora(**fused_lora) if fused_lora is not None else None
        # What a request's num_inference_steps counts (inputs.StepCount): FastH3 owns its
        # schedule and counts evaluations, as the ComfyUI node's FastH3 path sends them.
        self.steps = step_count(steps)
        self.partition: Partition = partition_of(self.spec.workflows or ["t2va", "fl2va"])
        # The whole block tree, whatever a workflow-loaded pipeline's own ``blocks`` hold:
        # the adapter runs its branches by name (blocks keep no state).
        self.blocks: Any = MiniMaxH3Blocks()
        self.workflows = [w for w in workflows_of(self.partition) if w in self.spec.workflows]
        # Keyframes and references reach ``_prepare``, which refuses a workflow the
        # deployment did not load naming the field that asked for it.
        self.takes_references = True
        # attention = "vsa": the joint blocks' layout holder (installed by ``load``).
        self.vsa: VsaContext | None = None
        # H3 pads no prompt: every prompt length is a new packed length. Static graphs
        # (two per length: the time embedding's two row counts) met dynamo's limit of 8
        # after 4 lengths, and every later length ran eager. Automatic dynamic compiles
        # the warm-up's length static and, at the second length, one graph with the
        # length symbolic, which every later length reuses.
        self.compiler.dynamic = None
        # Set once a new length compiled nothing: later lengths skip the trial step.
        self._lengths_compiled = 0
        self._lengths_covered = False

    def _from_pretrained(self) -> Any:
        """The modular pipeline with this deployment's partition only (``workflow=``);
        the processor through :func:`load_processor` (no torchvision: images only)."""
        path = self.entry.path
        assert path is not None
        pipe = ModularPipeline.from_pretrained(path, workflow=self.workflows[0])
        names = [n for n in pipe.pretrained_component_names if n != "processor"]
        pipe.load_components(names=names, dtype=self.entry.dtype, local_files_only=True)
        pipe.update_components(processor=load_processor(Path(path) / "processor"))
        return pipe

    def random_pipeline(self, device: str) -> Any:
        """Default configs, seeded random weights, on ``device`` (minimax_h3/random_weights.py)."""
        from workers.pipelines.diffusers.minimax_h3.random_weights import random_pipeline

        return random_pipeline(
            device,
            self.entry.dtype,
            partition=self.partition,
            text_layers=self.random_text_layers,
            config=self.random_config,
        )

    def load(self, device: str) -> None:
        """Load (``DiffusersAdapter.load``; the deployment's LoRA, if any, fused by
        ``_change_weights``, checked against its pinned sha256 first, refusing to
        start on a mismatch), then the VAE decoder compiled and VSA installed where
        asked for."""
        if self.fused_lora is not None:
            self.fused_lora.verify()
        kernel = load_kernel(torch.device(device)) if self._takes_vsa else None
        super().load(device)
        if self.compiler.enabled:  # the video VAE's decoder too: half its decode time
            self.compiler.compile_module(self._loaded().vae.decoder, "H3 video VAE decoder")
        if kernel is not None:
            assert self.spec.vsa_topk is not None
            self.vsa = VsaContext(topk=self.spec.vsa_topk, kernel=kernel)
            install_vsa(getattr(self._loaded(), self.partition), self.vsa)
        if not attention.takes_cudnn(self.spec):  # cuDNN's: logged as the base installs it
            how = f"; {kernel_name()}, top-k {self.spec.vsa_topk}" if kernel is not None else ""
            attention.log_roles(self.spec, how)

    def _change_weights(self, pipe: Any) -> None:
        """The deployment's LoRA fused first: before a per-request LoRA's slot, and before
        FP8 quantization where the entry asks for it (fused in the loaded dtype)."""
        if self.fused_lora is not None:
            self.fused_lora.fuse(pipe, self.partition)

    def use_lora(self, cache: LoraSlot) -> None:
        """Per-request LoRA into the ``transformer`` partition (t2va, fl2va): the slot
        of lora.py, as for the other families. A ``transformer_ref`` deployment refuses
        it at start: diffusers' H3 loader routes an adapter to ``transformer`` unless told
        otherwise, and the slot's hot-swap serves that component only."""
        if self.partition != "transformer":
            raise CatalogError(
                f"model {self.spec.name!r} lists lora, but per-request LoRA serves the "
                "transformer partition (t2va, fl2va), not transformer_ref (ref2va)"
            )
        super().use_lora(cache)

    @property
    def _takes_vsa(self) -> bool:
        return self.spec.attention.get("blocks") == "vsa"

    def _view(self, pipe: Any, request: GenerationRequest | None = None) -> Any:
        """The shared pipeline with this job's own copies of both schedulers (the loop
        steps them: their step index is per job), shifted by the request's
        ``flow_shift`` (video) and ``extra_params.audio_flow_shift`` (audio)."""
        view = copy.copy(pipe)
        shifts = shifts_of(request) if request is not None else (None, None)
        for name, shift in zip(("scheduler", "audio_scheduler"), shifts, strict=True):
            scheduler = copy.deepcopy(getattr(pipe, name))
            if shift is not None:
                scheduler.set_shift(float(shift))
            vars(view)[name] = scheduler
        return view

    def _prepare(self, pipe: Any, request: GenerationRequest) -> H3State:
        workflow = workflow_of(request)
        for i, ref in enumerate(request.references):
            if ref.kind == "video" and not takes_video(pipe.processor):
                raise InvalidJobInput(
                    f"{self.spec.name}: this worker has no Qwen3-VL video processor "
                    "(torchvision is not installed), so it takes no video reference",
                    param=f"input_references[{i}]",
                )
        if workflow not in self.workflows:
            loaded = ", ".join(self.workflows)
            raise InvalidJobInput(
                f"{self.spec.name} serves {loaded} (it loaded the {self.partition} partition), "
                f"not {workflow}",
                param=WORKFLOW_FIELDS[workflow],
            )
        generator = make_generator(request.seed)
        components = self._view(pipe, request)
        blocks = self.blocks
        state = PipelineState()
        inputs = call_inputs(request, generator, int(pipe.audio_sampling_rate), self.steps)
        inputs["output_type"] = "pt"  # frames stay on the device until uint8 (decode)
        for param in blocks.inputs:  # as ModularPipeline.__call__ fills its state
            name = param.name
            if name is None:
                continue
            if name in inputs:
                state.set(name, inputs[name], param.kwargs_type)
            elif name not in state.values:
                state.set(name, param.default, param.kwargs_type)
        # The API checked sizes, durations and references before storing the job; a
        # diffusers ValueError here is a bug, so it fails as internal_error, its text logged.
        for name in ("before_encode", "text_encoder", "vae_encoder"):
            components, state = blocks.sub_blocks[name](components, state)
        core = blocks.sub_blocks["denoise"].sub_blocks[workflow]
        for name, block in core.sub_blocks.items():
            if name in _AFTER_LOOP:
                continue
            components, state = block(components, state)
        loop = core.sub_blocks["denoise"]
        block_state = loop.get_block_state(state)
        timesteps = block_state.timesteps
        layout = None
        if self.vsa is not None:
            rows = block_state.denoiser_input_fields
            layout = vsa_layout(rows["token_tags"], rows["position_ids"]).to(self.device)
        return H3State(
            **sampling(
                request, generator, components.scheduler, timesteps, block_state.latents, 1.0, False
            ),
            workflow=workflow,
            components=components,
            pipeline_state=state,
            loop=loop,
            core=core,
            block_state=block_state,
            vsa_layout=layout,
        )

    def _step(self, pipe: Any, s: H3State) -> None:
        i = s.step_index
        if self.vsa is not None:
            self.vsa.use(s.vsa_layout)
        s.components, s.block_state = s.loop.loop_step(
            s.components, s.block_state, i=i, t=s.timesteps[i]
        )

    def _compile_for(self, state: H3State, why: str) -> None:
        """Compile the blocks for the packed sequence's length: one step of a deep copy of
        the job's loop state and schedulers, so the job's own are untouched. The length
        holds the prompt's text rows (H3 pads no prompt), so a new prompt length compiles
        here, in prepare, not in the job's first step."""
        key = (
            state.workflow,
            tuple(state.block_state.latents.shape),
            tuple(state.block_state.audio_latents.shape),
            int(state.block_state.denoiser_input_fields["token_tags"].numel()),
        )

        def run() -> None:
            # Steps differ in how many distinct noise levels the rows are at (the time
            # embedding's rows): as many trial steps as it takes to meet each count.
            plan = state.block_state.row_timestep_plan
            counts = {len(plan[i][0]) for i in range(state.num_steps)}
            trial = copy.copy(state)
            trial.components = self._view(state.components)
            trial.block_state = copy.deepcopy(state.block_state)
            while counts and trial.step_index < trial.num_steps:
                counts.discard(len(plan[trial.step_index][0]))
                self._step(self._loaded(), trial)
                trial.step_index += 1
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        compiling = self.compiler.enabled and self.compiler.failed is None
        if compiling and not self._lengths_covered and key not in self.compiler.shapes:
            self.compiler.ensure(key, run, why)
            self._lengths_compiled += 1
            # a third length compiled nothing: the symbolic graphs cover lengths
            self._lengths_covered = self._lengths_compiled > 2 and self.compiler.last_made == 0
        size = (state.pipeline_state.get("latent_height"), state.pipeline_state.get("latent_width"))

        def clip() -> None:
            self.decode_one_clip(state)

        self.compiler.ensure(("vae", *size), clip, why)

    @torch.no_grad()
    def decode_one_clip(self, state: H3State) -> torch.Tensor:
        """One temporal clip of zeros at the job's latent size through the video VAE: what
        compiles its decoder for that size (each clip of a job has the same shape)."""
        vae = state.components.vae
        height, width = (state.pipeline_state.get(n) for n in ("latent_height", "latent_width"))
        frames = vae.tokens_chunk_size + vae.token_overlap
        dtype = next(vae.post_quant_conv.parameters()).dtype
        z = torch.zeros(1, vae.config.latent_channels, frames, height, width, dtype=dtype)
        clip: torch.Tensor = vae._decode_clip(z.to(self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return clip

    def _unpacked(self, s: H3State) -> tuple[Any, Any]:
        """The loop's state written back and unpacked (``after_denoise``)."""
        pipe_state = s.pipeline_state
        s.loop.set_block_state(pipe_state, s.block_state)
        return s.core.sub_blocks["after_denoise"](s.components, pipe_state)

    @torch.no_grad()
    def decode(self, state: StepState) -> Media:
        """Unpacked, then both VAEs: frames at 24 fps and the stereo soundtrack at the
        audio VAE's rate."""
        components, pipe_state = self._unpacked(self._state(state))
        components, pipe_state = self.blocks.sub_blocks["decode"](components, pipe_state)
        videos = pipe_state.get("videos")  # (1, T, 3, H, W) in [0, 1], on the device
        audio = pipe_state.get("audio")
        return Media(
            frames=frames_uint8(videos[0]),
            fps=float(components.fps),
            audio=audio[0].float().cpu().numpy(),
            sample_rate=int(pipe_state.get("sampling_rate")),
        )

    def decode_stream(self, state: StepState) -> DecodeStream | None:
        """What ``decode`` makes, the soundtrack first (the audio VAE), then the frames
        one temporal clip of the video VAE at a time (minimax_h3/decode.py), bit-equal; None where
        the VAE is not diffusers' own (``decode`` then)."""
        s = self._state(state)
        if not streamable(s.components.vae):
            return None
        with torch.no_grad():
            components, pipe_state = self._unpacked(s)
            decoders = self.blocks.sub_blocks["decode"].sub_blocks
            components, pipe_state = decoders["audio"](components, pipe_state)
            audio = pipe_state.get("audio")[0].float().cpu().numpy()
            vae, device = components.vae, components._execution_device

            def column(values: Any) -> torch.Tensor:
                return torch.tensor(values, device=device).view(1, -1, 1, 1, 1)

            mean, std = column(vae.config.latents_mean), column(vae.config.latents_std)
            latents = pipe_state.get("latents") * std + mean
            pixel_mean, pixel_std = column(components.pixel_mean), column(components.pixel_std)

        def convert(video: torch.Tensor) -> torch.Tensor:  # the video decode step's, per piece
            video = (video.float() * pixel_std + pixel_mean).clamp(0, 1)
            # left on the GPU: the encoder's yuv420p is made there (media.decode_streamed)
            return pixels_uint8(components.video_processor.postprocess_video(video, "pt")[0])

        return DecodeStream(
            stream_frames(vae, latents, convert),
            audio=audio,
            sample_rate=int(pipe_state.get("sampling_rate")),
        )
