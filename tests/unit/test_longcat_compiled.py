"""LongCat-AudioDiT's compiled blocks on the tiny pipeline (``longcat_fixtures``), CPU.

Every clip length is a new number of latent frames and every prompt a new number of
tokens, so the blocks compile with both symbolic (``dynamic=True``) at worker start
(``warm_up``): then no clip length, prompt length or pair of them compiles anything, in
its prepare or while it denoises; a 1-frame clip (dynamo specialises a size of 1) compiles
once, in its prepare. Dynamo's ``eager`` backend traces and guards as inductor does, and
runs the graph's ops as they are, so the audio is bit-equal to the eager adapter's;
``aot_eager`` (AOT autograd's functionalised graph) is too, here (within ``AOT_BOUND``,
should a release decompose an op differently). Inductor
itself, on this CPU: the same 2 graphs for 6 lengths, audio within 8.2e-6 of eager (peak
about 5), 110 s to compile on 2 busy cores, so not in the suite; on the GPU it is
``benchmarks/gpu/longcat_speech.py``'s.

Bucketed lengths (``buckets``, the CUDA-graph setting): the same function of the clip's
own frames and tokens, so the audio is eager's within ``BUCKET_BOUND`` of its peak.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.unit.longcat_fixtures import tiny_longcat_pipeline
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.longcat_audio.adapter import LongCatAudioAdapter
from workers.pipelines.diffusers.longcat_audio.buckets import bucket
from workers.pipelines.diffusers.shared.compiled import graphs_made

# aot_eager's audio against eager's, absolute (the tiny model's peaks are 2 to 6;
# measured: 0).
AOT_BOUND = 1e-6
# Bucketed against unbucketed, relative to the clip's peak (measured: 2.4e-6 at most).
BUCKET_BOUND = 5e-6
# Prompts and given lengths (seconds at 8 kHz, 256 samples a frame: 31.25 frames a
# second) that put the two lengths everywhere: frames = tokens (7, 8), frames = the
# DiT's width (32), tokens = its head size (8), 2 frames, long and short prompts, a
# negative prompt of its own length, no guidance.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("Hello there, friend.", {}),
    ("Hi", {}),
    ("The trains run on time today, and on other days too.", {}),
    ("seven t", {"options": {"duration_seconds": 7 * 256 / 8000}}),
    ("eight ch", {"options": {"duration_seconds": 8 * 256 / 8000}}),
    ("Hello, world.", {"options": {"duration_seconds": 32 * 256 / 8000}}),
    ("Two frames.", {"options": {"duration_seconds": 2 * 256 / 8000}}),
    ("Hello there, friend!", {"negative_prompt": "robotic, muffled voice"}),
    ("No guidance here.", {"guidance_scale": 1.0}),  # one row a pass, not two
]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _request(text: str, **kw: Any) -> GenerationRequest:
    base: dict[str, Any] = dict(
        prompt=text, duration_s=5.0, num_inference_steps=2, seed=7, guidance_scale=4.0
    )
    return GenerationRequest.audio(**(base | kw))


def _adapter(**kw: Any) -> LongCatAudioAdapter:
    adapter = LongCatAudioAdapter(pipe=tiny_longcat_pipeline(), **kw)
    adapter.load("cpu")
    return adapter


def _audio(adapter: LongCatAudioAdapter, request: GenerationRequest) -> torch.Tensor:
    state = adapter.prepare(request)
    try:
        while not state.done:
            adapter.step(state)
    finally:
        adapter.end()
    return adapter.decode_audio(state)


@pytest.fixture(scope="module")
def eager() -> LongCatAudioAdapter:
    return _adapter()


@pytest.mark.parametrize(("backend", "bound"), [("eager", 0.0), ("aot_eager", AOT_BOUND)])
def test_one_warm_up_compiles_every_length(
    eager: LongCatAudioAdapter, backend: str, bound: float
) -> None:
    adapter = _adapter(compile="blocks", compile_backend=backend)
    assert adapter.compiler.enabled and adapter.compiler.dynamic is True
    before = graphs_made()
    adapter.warm_up()
    warm = graphs_made() - before
    # A job's rows: 2 under guidance (a symbolic count), 1 without (dynamo specialises a
    # size of 1); the first block's input is a view, the others' are not: four graphs at
    # most, whatever the lengths.
    assert 2 <= warm <= 4
    for text, kw in CASES:
        request = _request(text, **kw)
        audio = _audio(adapter, request)
        assert adapter.last_recompiles == 0  # nothing compiled while it denoised
        assert (audio - _audio(eager, request)).abs().max().item() <= bound
    assert graphs_made() - before == warm  # nor in any prepare

    # A 1-frame clip: dynamo specialises the size 1, so more graphs (the first block's
    # and the others'), in its prepare.
    one_frame = _request("x", options={"duration_seconds": 256 / 8000})
    assert (_audio(adapter, one_frame) - _audio(eager, one_frame)).abs().max() <= bound
    assert adapter.last_recompiles == 0 and graphs_made() - before <= warm + 2
    made = graphs_made()
    _audio(adapter, _request("y", options={"duration_seconds": 256 / 8000}))
    assert graphs_made() == made and adapter.last_recompiles == 0


def test_blocks_compile_by_default_on_cuda_only() -> None:
    """The family's default: compiled on CUDA, eager on the CPU; ``compile = "off"``
    keeps them eager anywhere. No CUDA graphs unless the entry's mode asks."""
    adapter = LongCatAudioAdapter(pipe=object())
    assert adapter.entry.compiles_blocks(torch.device("cuda"))
    assert not adapter.entry.compiles_blocks(torch.device("cpu"))
    off = LongCatAudioAdapter(pipe=object(), compile="off")
    assert not off.entry.compiles_blocks(torch.device("cuda"))
    assert not adapter.buckets and not adapter.compiler.clone_outputs
    graphs = LongCatAudioAdapter(pipe=object(), compile_mode="reduce-overhead")
    assert graphs.buckets and graphs.compiler.clone_outputs
    assert not LongCatAudioAdapter(pipe=object(), compile_mode="max-autotune-no-cudagraphs").buckets
    assert not LongCatAudioAdapter(
        pipe=object(), compile_mode="reduce-overhead", buckets=False
    ).buckets


def test_the_bucket_ladder() -> None:
    sizes = sorted({bucket(n) for n in range(1, 513)})
    assert sizes[:8] == [8, 16, 24, 32, 40, 48, 56, 64]
    assert sizes[8:] == [80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512]
    assert all(n <= bucket(n) <= max(n + 7, 1.25 * n) for n in range(1, 2000))


def test_bucketed_lengths_give_the_clip_within_the_bound(eager: LongCatAudioAdapter) -> None:
    """``buckets``: the frames padded in prepare (noise, then zeros, masked), the tokens
    inside each block; the clip's length and audio are the unbucketed ones'."""
    adapter = _adapter(buckets=True)
    seen: list[tuple[int, int]] = []

    def spy(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if module is adapter.pipe.transformer.blocks[0]:
            seen.append((kwargs["hidden_states"].shape[1], kwargs["cond"].shape[1]))

    handle = adapter.pipe.transformer.blocks[0].register_forward_pre_hook(spy, with_kwargs=True)
    try:
        for text, kw in CASES:
            request = _request(text, **kw)
            state = adapter.prepare(request)
            assert state.latents.shape[1] == bucket(state.frames)
            assert not state.mask[0, state.frames :].any() and state.mask[0, : state.frames].all()
            assert not state.latents[0, state.frames :].any()
            adapter.end()
            audio, reference = _audio(adapter, request), _audio(eager, request)
            assert audio.shape == reference.shape
            peak = reference.abs().max().item()
            assert (audio - reference).abs().max().item() <= BUCKET_BOUND * peak
            assert not state.latents[0, state.frames :].any()  # the padding stays zero
    finally:
        handle.remove()
    # Every block saw bucket sizes only (the spy runs after the padding hook).
    assert seen and all(
        frames == bucket(frames) and tokens == bucket(tokens) for frames, tokens in seen
    )


def test_bucketed_compiled_blocks_compile_once() -> None:
    adapter = _adapter(compile="blocks", compile_backend="eager", buckets=True)
    before = graphs_made()
    adapter.warm_up()
    warm = graphs_made() - before
    for text, kw in CASES:
        _audio(adapter, _request(text, **kw))
        assert adapter.last_recompiles == 0
    assert graphs_made() - before == warm


def test_cloned_outputs_change_nothing(eager: LongCatAudioAdapter) -> None:
    """The CUDA-graph setting's clone of each block's output (pytorch#152887), here
    without CUDA graphs: the same audio. No ``warm_up``: the job's prepare compiles the
    blocks for its own class of lengths (half the graphs, half the seconds), and the clone
    wraps whatever graph runs."""
    adapter = LongCatAudioAdapter(
        pipe=tiny_longcat_pipeline(), compile="blocks", compile_backend="eager"
    )
    adapter.compiler.clone_outputs = True
    adapter.load("cpu")
    before = graphs_made()
    text, kw = CASES[0]
    request = _request(text, **kw)
    assert torch.equal(_audio(adapter, request), _audio(eager, request))
    assert graphs_made() > before  # the blocks ran compiled


def _batched(adapter: LongCatAudioAdapter, requests: list[GenerationRequest]) -> list[torch.Tensor]:
    """The requests' jobs stepped together (``step_batch``), each decoded."""
    states = [adapter.prepare(r) for r in requests]
    while not all(s.done for s in states):
        adapter.step_batch([s for s in states if not s.done])
    adapter.end()
    return [adapter.decode_audio(s) for s in states]


@pytest.mark.parametrize("guidance_batch", [True, False], ids=["one-pass", "two-passes"])
def test_batched_steps_compile_at_warm_up_only(guidance_batch: bool) -> None:
    """A lone job's pass under guidance is 2 rows (``guidance_batch``), a symbolic row
    count that ``warm_up`` compiled, so ``warm_up_batch`` compiles nothing more; with two
    passes a step (1 row each) it compiles the blocks for batches (3 rows). Either way
    batches of other sizes (4 and 10 rows, the first the tiny DiT's head count) and
    lengths then compile nothing, and their audio is eager's batched audio bit for bit."""
    eager = _adapter()
    adapter = _adapter(compile="blocks", compile_backend="eager", guidance_batch=guidance_batch)
    adapter.warm_up()
    before = graphs_made()
    adapter.warm_up_batch(4)
    warm = graphs_made() - before
    assert warm == 0 if guidance_batch else 1 <= warm <= 2
    for count in (2, 5):
        requests = [_request(text, **kw) for text, kw in CASES[:count]]
        for got, want in zip(_batched(adapter, requests), _batched(eager, requests), strict=True):
            assert torch.equal(got, want)
        assert adapter.last_recompiles == 0
    assert graphs_made() - before == warm
    adapter.warm_up_batch(4)  # once only
    assert graphs_made() - before == warm
