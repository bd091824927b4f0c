"""MiniMax-H3 step-executed (workers/pipelines/diffusers/minimax_h3/adapter.py) against diffusers'
own modular pipeline call, on the tiny seeded pipeline of h3_fixtures: every workflow's
frames and soundtrack are bit-equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from api.validation import parse_create, resolve
from models.catalog import FAMILY_SPECS
from models.errors import InvalidJobInput, InvalidRequest
from models.job_specs import SamplerOptions
from storage.settings import Settings
from tests.unit.h3_fixtures import h3_request, tiny_h3_lora, tiny_h3_pipe
from tests.unit.job_steps import run_job
from workers.pipelines.base import GenerationRequest, Media, MediaReference
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.minimax_h3.inputs import call_inputs, shifts_of
from workers.pipelines.diffusers.shared.common import make_generator, to_uint8

SIZE = 64
FRAMES = 124  # 17 * 7 + 5: 5.17 s at 24 fps, the shortest H3 makes


@pytest.fixture(scope="module")
def pipe() -> Any:
    return tiny_h3_pipe(canvas_short_edge=SIZE, canvas_max_pixels=SIZE * SIZE * 2)


def _request(**kw: Any) -> GenerationRequest:
    return h3_request(**kw)


def _adapter(pipe: Any, partition: str = "transformer") -> MiniMaxH3Adapter:
    base = FAMILY_SPECS["diffusers.minimax_h3"]
    ref = base.model_copy(update={"workflows": ["ref2va"]})
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=ref if partition == "transformer_ref" else base)
    adapter.load("cpu")
    return adapter


def _run(adapter: MiniMaxH3Adapter, request: GenerationRequest) -> Media:
    media: Media = run_job(adapter, request)
    return media


def _reference(pipe: Any, request: GenerationRequest) -> tuple[np.ndarray, np.ndarray, int]:
    """diffusers' own call; the request's shifts set on the pipeline's schedulers as a
    diffusers user would (``scheduler.set_shift``), then put back."""
    inputs = call_inputs(request, make_generator(request.seed))
    video, audio_shift = shifts_of(request)
    saved = pipe.scheduler.shift, pipe.audio_scheduler.shift
    if video is not None:
        pipe.scheduler.set_shift(video)
    if audio_shift is not None:
        pipe.audio_scheduler.set_shift(audio_shift)
    try:
        out = pipe(**inputs, output_type="np")
    finally:
        pipe.scheduler.set_shift(saved[0])
        pipe.audio_scheduler.set_shift(saved[1])
    frames = to_uint8(np.asarray(out.get("videos")[0]))
    audio = out.get("audio")[0].float().numpy()
    return frames, audio, int(out.get("sampling_rate"))


def _frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)


def _assert_same(pipe: Any, adapter: MiniMaxH3Adapter, request: GenerationRequest) -> Media:
    media = _run(adapter, request)
    frames, audio, rate = _reference(pipe, request)
    assert media.frames.shape == (FRAMES, SIZE, SIZE, 3)
    assert np.array_equal(media.frames, frames)
    assert media.audio is not None and media.audio.shape[0] == 2  # stereo
    assert np.array_equal(media.audio, audio)
    assert media.sample_rate == rate == 32000 and media.fps == 24.0
    return media


def test_t2va_is_bit_equal_to_the_modular_pipeline(pipe: Any) -> None:
    adapter = _adapter(pipe)
    state = adapter.prepare(_request())
    assert state.num_steps == 2  # 3 sigma points: 2 transformer evaluations
    adapter.end()
    media = _assert_same(pipe, adapter, _request())
    assert media.audio is not None  # 40 audio latents a second, 800 samples each
    assert media.audio.shape[1] == round(FRAMES / 24 * 40) * 800
    assert abs(media.audio.shape[1] / 32000 - FRAMES / 24) < 1 / 24


@pytest.mark.parametrize("which", ["first", "last", "both"])
def test_fl2va_is_bit_equal_to_the_modular_pipeline(pipe: Any, which: str) -> None:
    first = _frame(1) if which in ("first", "both") else None
    last = _frame(2) if which in ("last", "both") else None
    _assert_same(pipe, _adapter(pipe), _request(reference_image=first, last_image=last))


def test_ref2va_with_an_image_and_an_audio_clip_is_bit_equal(pipe: Any) -> None:
    tone = np.sin(np.linspace(0, 440 * 2 * np.pi, 32000, dtype=np.float32))[None].repeat(2, 0)
    refs = [
        MediaReference(kind="image", frames=_frame(3)),
        MediaReference(kind="audio", audio=tone * 0.3, sample_rate=32000),
    ]
    _assert_same(pipe, _adapter(pipe, "transformer_ref"), _request(references=refs))


def test_flow_shifts_are_the_job_s_own_and_bit_equal(pipe: Any) -> None:
    request = _request(sampler=SamplerOptions(flow_shift=5.0), extra={"audio_flow_shift": 1.5})
    media = _assert_same(pipe, _adapter(pipe), request)
    assert pipe.scheduler.shift == 12.0 and pipe.audio_scheduler.shift == 3.0  # untouched
    assert not np.array_equal(media.frames, _run(_adapter(pipe), _request()).frames)


def test_interleaved_jobs_keep_their_own_schedules(pipe: Any) -> None:
    """Two jobs stepped alternately give what each gives alone."""
    adapter = _adapter(pipe)
    a, b = adapter.prepare(_request(seed=1)), adapter.prepare(_request(seed=2))
    while not (a.done and b.done):
        for s in (a, b):
            if not s.done:
                adapter.step(s)
    media_a = adapter.decode(a)
    adapter.end()
    assert np.array_equal(media_a.frames, _run(adapter, _request(seed=1)).frames)


def test_a_workflow_the_deployment_did_not_load_is_refused_by_field(pipe: Any) -> None:
    t2va = _adapter(pipe, "transformer")
    refs = [MediaReference(kind="image", frames=_frame(3))]
    with pytest.raises(InvalidJobInput, match="transformer partition") as err:
        t2va.prepare(_request(references=refs))
    assert err.value.param == "input_references"
    ref = _adapter(pipe, "transformer_ref")
    with pytest.raises(InvalidJobInput) as err:
        ref.prepare(_request(reference_image=_frame(1)))
    assert err.value.param == "input_reference"
    with pytest.raises(InvalidJobInput) as err:
        ref.prepare(_request())
    assert err.value.param == "prompt"


def test_a_task_that_disagrees_with_the_inputs_is_refused(pipe: Any) -> None:
    with pytest.raises(InvalidJobInput, match="t2va") as err:
        _adapter(pipe).prepare(_request(extra={"task": "fl2va"}))
    assert err.value.param == "extra_params.task"


def test_a_cancel_lands_between_transformer_blocks(pipe: Any) -> None:
    """The block gate stops a step inside the forward (as for Wan)."""
    from workers.pipelines.base import step_stops

    adapter = _adapter(pipe)
    state = adapter.prepare(_request())
    seen: list[int] = []

    class Stop(Exception):
        pass

    def reason(block: int) -> BaseException | None:
        seen.append(block)
        return Stop() if block == 2 else None

    with pytest.raises(Stop), step_stops(reason):
        adapter.step(state)
    adapter.end()
    assert state.step_index == 0 and max(seen) == 2
    assert torch.is_tensor(state.block_state.latents)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ({"seconds": "4"}, "seconds"),  # 96 frames snap to 107: under 5 s
        ({"seconds": "15"}, "seconds"),  # 360 frames snap to 362: over 15 s
        ({"num_frames": 100}, "num_frames"),
        ({"num_frames": 361}, "num_frames"),
        ({"fps": 12}, "fps"),  # H3 makes 24 fps only
        ({"size": "500x288"}, "size"),  # not a multiple of 32
    ],
)
def test_h3_requests_outside_its_lattice_are_refused_by_field(
    raw: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        _resolve_h3(**raw)
    assert err.value.param == param


def test_h3_seconds_snap_to_its_frame_lattice_at_24_fps() -> None:
    ten = _resolve_h3(seconds="10")
    assert (ten.num_frames, ten.fps) == (243, 24.0)  # 240 snapped up to 17 * 14 + 5
    assert (ten.width, ten.height) == (1344, 768)  # H3's own 16:9 canvas


def _resolve_h3(**raw: Any) -> Any:
    specs = {"MiniMaxAI/MiniMax-H3": FAMILY_SPECS["diffusers.minimax_h3"]}
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    body = {"model": "MiniMaxAI/MiniMax-H3", "prompt": "a cat", **raw}
    return resolve(parse_create(body), specs, settings)


def _fast_spec() -> Any:
    return FAMILY_SPECS["diffusers.minimax_h3"].model_copy(
        update={"min_steps": 5, "max_steps": 5, "default_steps": 5, "no_cfg": True}
    )


def test_fasth3_fuses_its_pinned_lora_bit_equal_to_diffusers(tmp_path: Path) -> None:
    lora = tmp_path / "fasth3.safetensors"
    digest = tiny_h3_lora(lora)
    fast = MiniMaxH3Adapter(
        pipe=tiny_h3_pipe(canvas_short_edge=SIZE, canvas_max_pixels=SIZE * SIZE * 2),
        spec=_fast_spec(),
        fused_lora={"path": str(lora), "sha256": digest},
    )
    fast.load("cpu")
    assert not any("lora" in name for name, _ in fast.pipe.transformer.named_modules())
    request = _request(num_inference_steps=5)
    media = _run(fast, request)
    assert fast.prepare(request).num_steps == 4  # 5 sigma points: 4 evaluations
    fast.end()
    reference = tiny_h3_pipe(canvas_short_edge=SIZE, canvas_max_pixels=SIZE * SIZE * 2)
    base_frames, _, _ = _reference(reference, request)
    reference.load_lora_weights(str(lora), adapter_name="fused")
    reference.fuse_lora(components=["transformer"], lora_scale=1.0, adapter_names=["fused"])
    frames, audio, _ = _reference(reference, request)
    assert np.array_equal(media.frames, frames) and np.array_equal(media.audio, audio)
    assert not np.array_equal(frames, base_frames)  # the LoRA changed the result


def test_a_fused_lora_whose_sha256_differs_refuses_to_start(tmp_path: Path) -> None:
    lora = tmp_path / "fasth3.safetensors"
    tiny_h3_lora(lora)
    adapter = MiniMaxH3Adapter(
        pipe=tiny_h3_pipe(), spec=_fast_spec(), fused_lora={"path": str(lora), "sha256": "0" * 64}
    )
    with pytest.raises(ValueError, match=f"fused_lora {lora}: sha256 is [0-9a-f]{{64}}"):
        adapter.load("cpu")


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ({"num_inference_steps": 30}, "num_inference_steps"),
        ({"guidance_scale": 5}, "guidance_scale"),
    ],
)
def test_fasth3_refuses_another_schedule(raw: dict[str, Any], param: str) -> None:
    specs = {"FastH3": _fast_spec()}
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    with pytest.raises(InvalidRequest) as err:
        resolve(parse_create({"model": "FastH3", "prompt": "p", **raw}), specs, settings)
    assert err.value.param == param
    # what the node sends for FastH3 (every value a string)
    node = {"num_inference_steps": "5", "guidance_scale": "1.0", "true_cfg_scale": "1.0"}
    ok = resolve(parse_create({"model": "FastH3", "prompt": "p", **node}), specs, settings)
    assert ok.num_inference_steps == 5


@pytest.mark.parametrize("num_frames", [124, 141])
def test_the_streamed_decode_is_bit_equal_and_muxes_the_soundtrack(
    pipe: Any, tmp_path: Path, num_frames: int
) -> None:
    """The executor's decode (frames clip by clip while x264 encodes, the soundtrack
    first) against the whole decode, at two lengths (the VAE's end padding differs)."""
    import av

    from workers.jobs.output_check import Expected, check_mp4
    from workers.media.mp4 import decode_streamed

    adapter = _adapter(pipe)
    request = _request(num_frames=num_frames)
    state = adapter.prepare(request)
    while not state.done:
        adapter.step(state)
    whole = adapter.decode(state)
    stream = adapter.decode_stream(state)
    assert stream is not None and stream.audio is not None
    chunks = list(stream.chunks)
    assert len(chunks) > 1
    # left on the device (yuv420p is made there): the same frames
    assert all(isinstance(chunk, torch.Tensor) for chunk in chunks)
    np.testing.assert_array_equal(torch.cat(chunks).numpy(), whole.frames)
    np.testing.assert_array_equal(stream.audio, whole.audio)
    assert stream.sample_rate == whole.sample_rate
    streamed = decode_streamed(adapter, state, 24.0, tmp_path)
    adapter.end()
    assert streamed is not None and streamed.has_audio
    np.testing.assert_array_equal(streamed.middle, whole.frames[num_frames // 2])
    mp4 = tmp_path / "video.mp4"
    check_mp4(mp4, Expected(SIZE, SIZE, 24.0, num_frames, audio=True))
    with av.open(str(mp4)) as container:
        assert container.streams.audio[0].channels == 2
        assert sum(1 for _ in container.decode(video=0)) == num_frames


@pytest.mark.parametrize("latent_frames", [23, 24, 37])  # end padding of 4, 3 and 0 latents
def test_stream_frames_cuts_the_end_padding_as_the_vae_does(latent_frames: int) -> None:
    from tests.unit.h3_fixtures import tiny_h3_components
    from workers.pipelines.diffusers.minimax_h3.decode import stream_frames, streamable

    vae = tiny_h3_components()["vae"]
    assert streamable(vae)
    z = torch.randn(1, vae.config.latent_channels, latent_frames, 4, 4, generator=make_generator(0))
    with torch.no_grad():
        whole = vae.decode(z).sample[0].transpose(0, 1).numpy()
    chunks = list(stream_frames(vae, z, lambda v: v[0].transpose(0, 1).numpy()))
    assert len(chunks) > 1
    np.testing.assert_array_equal(np.concatenate(chunks), whole)


def test_one_clip_of_the_job_s_size_decodes_for_the_vae_warm_up(pipe: Any) -> None:
    adapter = _adapter(pipe)
    state = adapter.prepare(_request())
    clip = adapter.decode_one_clip(adapter._state(state))
    adapter.end()
    vae = pipe.vae
    assert clip.shape[:2] == (1, 3) and clip.shape[-2:] == (SIZE, SIZE)
    frames = (vae.tokens_chunk_size + vae.token_overlap) * vae.temporal_compression_ratio
    assert clip.shape[2] == frames  # a whole clip: what every clip of the job decodes


def test_prompt_lengths_share_graphs_compiled_in_prepare_not_in_a_step(pipe: Any) -> None:
    """H3's packed sequence holds the prompt's text rows: each prompt length is a new
    length of the compiled blocks (dynamo's eager backend here: its tracing and guards).
    The first length compiles static graphs and the second symbolic ones, both in prepare;
    from then on every length reuses them, with no trial step: nine lengths make no more
    graphs than dynamo's limit of 8 per code (static graphs hit it at the fifth length
    and ran eager from there), nothing compiles while a job denoises, and the frames are
    the eager adapter's."""
    from workers.pipelines.diffusers.shared.compiled import graphs_made

    torch._dynamo.reset()
    compiled = MiniMaxH3Adapter(
        pipe=pipe,
        spec=FAMILY_SPECS["diffusers.minimax_h3"],
        compile="blocks",
        compile_backend="eager",
    )
    compiled.load("cpu")
    before = graphs_made()
    prompts = ["a red ball" + " rolling" * n for n in range(9)]
    runs = []
    for prompt in prompts:
        runs.append(_run(compiled, _request(prompt=prompt)).frames)
        assert compiled.last_recompiles == 0  # nothing compiled while it denoised
    assert compiled.compiler.failed is None
    assert graphs_made() - before <= 8
    block_keys = [k for k in compiled.compiler.shapes if k[0] != "vae"]
    assert len(block_keys) == 3  # two lengths compiled, a third found them enough
    assert ("vae", 4, 4) in compiled.compiler.shapes
    compiled.compile = "off"  # the same pipeline object, eager from here
    compiled.compiler.give_up("the test's eager reference")
    for prompt, frames in zip(prompts[::4], runs[::4], strict=True):
        np.testing.assert_array_equal(_run(compiled, _request(prompt=prompt)).frames, frames)
