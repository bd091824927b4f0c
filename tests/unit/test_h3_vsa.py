"""MiniMax-H3's video sparse attention (``attention = "vsa"``): the block layout of a
packed sequence, the kernel's arithmetic (in plain torch, as fastvideo-kernel computes
it), the processor's round trip through the layout on the tiny transformer, and the
registry's checks. fastvideo-kernel itself runs on CUDA only: the device benchmark
compares it with :func:`reference_vsa` (benchmarks/gpu/h3.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from api.model_list import model_object
from models.catalog import FAMILY_SPECS
from models.registry import CatalogError, parse_registry
from storage.settings import LimitSettings
from tests.unit.h3_fixtures import h3_request, tiny_h3_pipe
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.minimax_h3.vsa import (
    VSA_BLOCK,
    VsaContext,
    install_vsa,
    load_kernel,
    reference_vsa,
    vsa_layout,
)

H3 = "diffusers.minimax_h3"


def _packed(text: int, audio: int, grids: list[tuple[int, int, int]]) -> tuple[Any, Any]:
    """Tags and ``(t, h, w)`` positions of a packed sequence: text, audio, then one video
    grid after another (the keyframe grids share the target's positions), rescaled and
    offset as H3's rotary coordinates are."""
    tags = [1] * text + [2] * audio
    pos = [[i, 0, 0] for i in range(text)] + [[i // 2, 0, i % 2] for i in range(audio)]
    for t_n, h_n, w_n in grids:
        for t in range(t_n):
            for h in range(h_n):
                for w in range(w_n):
                    tags.append(0)
                    pos.append([70 + t * 1.6667, (h - h_n / 2) * 0.37, (w - w_n / 2) * 0.37])
    return torch.tensor(tags), torch.tensor(pos, dtype=torch.float64)


def test_the_layout_tiles_each_video_grid_and_runs_text_and_audio_in_order() -> None:
    tags, pos = _packed(text=70, audio=100, grids=[(1, 6, 6), (9, 6, 6)])
    layout = vsa_layout(tags, pos)
    slots = layout.row_slot
    assert len(set(slots.tolist())) == len(tags)  # one slot per row
    block = slots // VSA_BLOCK
    sizes = torch.bincount(block, minlength=layout.blocks)
    assert torch.equal(sizes.int(), layout.block_sizes)
    assert int(layout.block_sizes.max()) <= VSA_BLOCK and int(layout.block_sizes.min()) >= 1
    for b in range(layout.blocks):
        rows = (block == b).nonzero().flatten()
        assert len(set(tags[rows].tolist())) == 1  # one modality per block
        if int(tags[rows[0]]) == 0:
            grids = {int(r) < 70 + 100 + 36 for r in rows}
            start = 70 + 100 + (0 if grids == {True} else 36)
            index = [
                ((int(r) - start) // 36, (int(r) - start) % 36 // 6, (int(r) - start) % 6)
                for r in rows
            ]
            tiles = {(t // 4, h // 4, w // 4) for t, h, w in index}
            assert len(tiles) == 1 and len(grids) == 1  # one tile of one grid
        else:  # a run of consecutive rows
            assert rows.tolist() == list(range(int(rows[0]), int(rows[0]) + len(rows)))
    # text 64 + 6, audio 64 + 36, keyframe 2x2 tiles of 4x4 / 4x2 / 2x4 / 2x2 positions,
    # target 3 x 2 x 2 tiles
    assert layout.blocks == 2 + 2 + 4 + 12


def _padded(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Rows ``[B, H, rows, D]`` into blocks of 64 with zero padding."""
    out = x.new_zeros(x.shape[0], x.shape[1], len(sizes) * VSA_BLOCK, x.shape[3])
    start = 0
    for b, n in enumerate(sizes):
        out[:, :, b * VSA_BLOCK : b * VSA_BLOCK + n] = x[:, :, start : start + n]
        start += n
    return out


def _real(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    return torch.cat([x[:, :, b * VSA_BLOCK : b * VSA_BLOCK + n] for b, n in enumerate(sizes)], 2)


def test_the_tiny_pipeline_s_packed_sequence_takes_few_blocks() -> None:
    """A real job's layout: about one block per 64 rows (a tile per block, not a row)."""
    adapter = _adapter(tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192))
    state = adapter._state(adapter.prepare(h3_request(width=128, height=128)))
    rows = state.block_state.denoiser_input_fields
    layout = vsa_layout(rows["token_tags"], rows["position_ids"])
    adapter.end()
    count = int(rows["token_tags"].numel())
    assert int(layout.block_sizes.sum()) == count
    assert layout.blocks <= 2 * -(-count // VSA_BLOCK)
    assert int((layout.block_sizes == VSA_BLOCK).sum()) >= layout.blocks // 2


def test_every_block_selected_is_dense_attention_plus_the_compressed_branch() -> None:
    torch.manual_seed(0)
    sizes = [64, 17, 40, 64]
    q, k, v = (torch.randn(1, 2, sum(sizes), 16) for _ in range(3))
    block_sizes = torch.tensor(sizes, dtype=torch.int32)
    padded = [_padded(x, sizes) for x in (q, k, v)]
    out = _real(reference_vsa(*padded, block_sizes, block_sizes, topk=len(sizes)), sizes)
    dense = F.scaled_dot_product_attention(q, k, v)
    means = [
        torch.stack([x[:, :, b * 64 : b * 64 + n].mean(2) for b, n in enumerate(sizes)], 2)
        for x in padded
    ]
    compressed = F.scaled_dot_product_attention(*means)
    expected = dense + compressed.repeat_interleave(torch.tensor(sizes), dim=2)
    assert torch.allclose(out, expected, atol=1e-5)


def test_the_sparse_branch_attends_to_the_top_k_blocks_only() -> None:
    torch.manual_seed(1)
    sizes = [64, 64, 30]
    q, k, v = (torch.randn(1, 1, sum(sizes), 8) for _ in range(3))
    block_sizes = torch.tensor(sizes, dtype=torch.int32)
    padded = [_padded(x, sizes) for x in (q, k, v)]
    out = reference_vsa(*padded, block_sizes, block_sizes, topk=1)
    qc, kc, vc = (
        torch.stack([x[:, :, b * 64 : b * 64 + n].mean(2) for b, n in enumerate(sizes)], 2)
        for x in padded
    )
    scores = qc @ kc.transpose(-2, -1) / 8**0.5
    best = int(scores[0, 0, 0].argmax())  # query block 0's one key block
    keys = slice(best * 64, best * 64 + sizes[best])
    sparse = F.scaled_dot_product_attention(
        q[:, :, :64], padded[1][:, :, keys], padded[2][:, :, keys]
    )
    compressed = torch.softmax(scores, -1) @ vc
    assert torch.allclose(out[:, :, :64], sparse + compressed[:, :, :1], atol=1e-5)


def _dense_kernel(q: Any, k: Any, v: Any, sizes: Any, q_sizes: Any, topk: int) -> torch.Tensor:
    """Full attention over the padded layout, padding keys masked: what the processor
    must give back as plain SDPA once gathered into the sequence's order."""
    real = torch.arange(VSA_BLOCK)[None, :] < sizes[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=real.reshape(1, 1, 1, -1))


def _adapter(pipe: Any, kernel: Any = None, topk: int = 64) -> MiniMaxH3Adapter:
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=FAMILY_SPECS[H3])
    adapter.load("cpu")
    if kernel is not None:  # what load() installs on CUDA, with this kernel
        adapter.vsa = VsaContext(topk=topk, kernel=kernel)
        install_vsa(pipe.transformer, adapter.vsa)
    return adapter


def _one_step(adapter: MiniMaxH3Adapter) -> tuple[torch.Tensor, torch.Tensor]:
    state = adapter.prepare(h3_request())
    try:
        adapter.step(state)
        block_state = adapter._state(state).block_state
        return block_state.latents.clone(), block_state.audio_latents.clone()
    finally:
        adapter.end()


def test_the_processor_round_trips_the_packed_rows_through_the_block_layout() -> None:
    plain = _one_step(_adapter(tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192)))
    pipe = tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192)
    adapter = _adapter(pipe, _dense_kernel)
    through_layout = _one_step(adapter)
    assert adapter.vsa is not None
    assert adapter.vsa.calls["vsa"] == len(pipe.transformer.transformer_blocks)
    assert adapter.vsa.calls["sdpa"] == 0  # the refiner keeps diffusers' own processor
    for a, b in zip(plain, through_layout, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_job_with_sparse_attention_runs_and_differs_from_dense() -> None:
    dense = _one_step(_adapter(tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192)))
    pipe = tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192)
    sparse = _one_step(_adapter(pipe, reference_vsa, topk=2))
    again = _one_step(
        _adapter(tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192), reference_vsa, topk=2)
    )
    assert all(torch.isfinite(x).all() for x in sparse)
    assert not torch.allclose(dense[0], sparse[0])
    assert all(torch.equal(a, b) for a, b in zip(sparse, again, strict=True))


def _entry(extra: str) -> str:
    return f'[[model]]\nname = "MiniMaxAI/MiniMax-H3"\nadapter = "{H3}"\npath = "/w"\n{extra}\n'


def test_the_registry_writes_the_attention_roles_that_v1_models_lists() -> None:
    model = parse_registry(_entry('attention = "vsa"\nvsa_topk = 32'))["MiniMaxAI/MiniMax-H3"]
    assert model.spec.attention == {"blocks": "vsa", "token_refiner": "sdpa"}
    listed = model_object(model.spec, LimitSettings())
    assert listed.attention == {"blocks": "vsa", "token_refiner": "sdpa"}
    assert listed.vsa_topk == 32
    default = parse_registry(_entry('attention = "vsa"'))["MiniMaxAI/MiniMax-H3"]
    assert default.spec.vsa_topk == 64
    plain = parse_registry(_entry(""))["MiniMaxAI/MiniMax-H3"]
    assert model_object(plain.spec, LimitSettings()).attention == {
        "blocks": "sdpa",
        "token_refiner": "sdpa",
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('attention = "vsa"\nvsa_topk = 0', "vsa_topk must be at least 1"),
        ('attention = "vsa"\nvsa_topk = -3', "vsa_topk must be at least 1"),
        ("vsa_topk = 64", "vsa_topk needs attention = 'vsa'"),
        ('attention = "sdpa"\nvsa_topk = 8', "vsa_topk needs attention = 'vsa'"),
        ('attention = "flash"', "attention"),
    ],
)
def test_bad_attention_settings_are_refused_at_load(extra: str, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        parse_registry(_entry(extra))


def test_vsa_is_refused_for_a_family_without_attention_roles() -> None:
    text = '[[model]]\nname = "wan"\nadapter = "diffusers.wan"\npath = "/w"\nattention = "vsa"\n'
    with pytest.raises(CatalogError, match=r"implemented for diffusers\.minimax_h3"):
        parse_registry(text)


def test_a_worker_without_cuda_refuses_a_vsa_model_at_load() -> None:
    spec = parse_registry(_entry('attention = "vsa"'))["MiniMaxAI/MiniMax-H3"].spec
    adapter = MiniMaxH3Adapter(pipe=tiny_h3_pipe(), spec=spec)
    with pytest.raises(ValueError, match="CUDA device"):
        adapter.load("cpu")
    with pytest.raises(ValueError, match="CUDA device"):
        load_kernel(torch.device("cpu"))


def test_interleaved_jobs_each_step_with_their_own_layout() -> None:
    """Two jobs of different shapes stepped alternately (the layout the blocks read is
    the context's own copy, set before each step) end where each ends alone."""
    pipe = tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192)
    adapter = _adapter(pipe, reference_vsa, topk=2)
    small, large = h3_request(), h3_request(width=128, height=128, seed=7)
    alone = []
    for request in (small, large):
        state = adapter.prepare(request)
        while not state.done:
            adapter.step(state)
        alone.append(adapter._state(state).block_state.latents.clone())
        adapter.end()
    a, b = adapter.prepare(small), adapter.prepare(large)
    while not (a.done and b.done):
        for state in (a, b):
            if not state.done:
                adapter.step(state)
    assert torch.equal(adapter._state(a).block_state.latents, alone[0])
    assert torch.equal(adapter._state(b).block_state.latents, alone[1])


def test_the_kernel_is_one_custom_op_for_compiled_blocks() -> None:
    op = torch.ops.omniqueue.video_sparse_attn
    q = torch.zeros(1, 2, 128, 16, device="meta")
    sizes = torch.full((2,), 64, dtype=torch.int32, device="meta")
    assert op(q, q, q, sizes, sizes, 1).shape == q.shape  # its fake: what tracing sees
