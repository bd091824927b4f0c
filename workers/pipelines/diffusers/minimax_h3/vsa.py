"""Video sparse attention (VSA) for MiniMax-H3's joint blocks: a registry entry's
``attention = "vsa"`` with ``vsa_topk`` (docs/adapters.md, "VSA").

VSA (fastvideo-kernel) splits the sequence into blocks of 64 rows and attends in two
branches whose outputs add up: a *compressed* branch (each query block's mean against
every key block's mean, dense), and a *sparse* branch (full attention, row by row, to the
``topk`` key blocks whose means scored highest for that query block).

H3 packs one job into one sequence of text, audio and video rows. The blocks follow the
rows' modality and place: the video rows of each latent grid in 4x4x4 tiles of their
``(t, h, w)`` indices in that grid (VSA's tile; H3's rotary positions are rescaled floats,
so each coordinate is ranked within its grid), the text and the audio rows in runs of 64
in sequence order. A partial tile is a partial block (the kernel takes each block's row count). The
layout depends only on the packed sequence, so :func:`vsa_layout` runs once per job and
every forward of its steps reuses it (:class:`VsaContext`).

The kernel is fastvideo-kernel 0.3.5's ``video_sparse_attn`` on a CUDA device. Its sm_90
op ships compiled against torch 2.12; where it does not load, the package runs its Triton
kernels (same results), and :func:`kernel_name` says which. It runs as one custom op
(``omniqueue::video_sparse_attn``), so a compiled block keeps it in its graph.
:func:`reference_vsa` is the same arithmetic in plain torch: the CPU tests' kernel and the
device benchmark's check.

Roles: the 50 joint blocks take VSA; the text refiner (70 rows at the qualification
shape), like any sequence of fewer than :data:`VSA_MIN_ROWS` rows, keeps SDPA.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_minimax_h3 import (
    MiniMaxH3AttnProcessor,
    _apply_rotary_emb,
)

log = logging.getLogger(__name__)

VSA_BLOCK = 64  # rows per block: fastvideo-kernel's 64-row path
VSA_TILE = (4, 4, 4)  # (t, h, w) latent positions per video block
# Below two full blocks there is nothing to select among: SDPA (the text refiner).
VSA_MIN_ROWS = 2 * VSA_BLOCK
VSA_KERNEL_VERSION = "0.3.5"

# (q, k, v [B, H, S, D], block sizes [blocks], query block sizes, topk) -> [B, H, S, D]
VsaKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor
]


@dataclass(frozen=True)
class VsaLayout:
    """Where each row of one packed sequence sits in the padded block layout."""

    row_slot: torch.Tensor  # (rows,) long: the row's slot, block * 64 + place in block
    block_sizes: torch.Tensor  # (blocks,) int32: each block's row count (1..64)

    @property
    def blocks(self) -> int:
        return int(self.block_sizes.numel())

    def to(self, device: torch.device) -> VsaLayout:
        return VsaLayout(self.row_slot.to(device), self.block_sizes.to(device))


@dataclass
class VsaContext:
    """The layout of the job being stepped, read by every joint block's processor (one
    job steps at a time per worker; the adapter sets it before each step)."""

    topk: int
    kernel: VsaKernel
    layout: VsaLayout | None = None
    calls: dict[str, int] = field(default_factory=lambda: {"vsa": 0, "sdpa": 0})

    def use(self, layout: VsaLayout | None) -> None:
        """Step with ``layout`` from now on, copied into tensors of the context's own (in
        place where the shapes agree, so a compiled block sees the same inputs job after
        job; never the job's own, which interleaved jobs would overwrite)."""
        held = self.layout
        if layout is None:
            self.layout = None
        elif (
            held is not None
            and held.row_slot.shape == layout.row_slot.shape
            and held.block_sizes.shape == layout.block_sizes.shape
        ):
            held.row_slot.copy_(layout.row_slot)
            held.block_sizes.copy_(layout.block_sizes)
        else:
            self.layout = VsaLayout(layout.row_slot.clone(), layout.block_sizes.clone())


def _segments(grid: np.ndarray) -> np.ndarray:
    """A segment number per video row: a new latent grid (a keyframe, a reference, the
    target) starts wherever a row does not come after the previous one in ``(t, h, w)``
    order."""
    if len(grid) == 0:
        return np.zeros(0, np.int64)
    step = np.diff(grid, axis=0)
    first = np.argmax(step != 0, axis=1)  # the first coordinate that changed
    changed = step[np.arange(len(step)), first]
    after = (step != 0).any(axis=1) & (changed > 0)
    return np.concatenate([[0], np.cumsum(~after)])


def _grid_indices(grid: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """Integer ``(t, h, w)`` indices of video rows within their segment: each rotary
    coordinate's rank among that segment's values (H3's positions are rescaled floats)."""
    out = np.zeros(grid.shape, np.int64)
    for segment in np.unique(segments):
        rows = segments == segment
        for axis in range(3):
            out[rows, axis] = np.unique(grid[rows, axis], return_inverse=True)[1]
    return out


def vsa_layout(
    token_tags: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    tile: tuple[int, int, int] = VSA_TILE,
    block: int = VSA_BLOCK,
) -> VsaLayout:
    """The block layout of one packed sequence (tags: 0 video, 1 text, 2 audio; rotary
    positions ``(t, h, w)``), on the CPU: video rows grouped by grid and by tile of their
    indices in it, the others in runs of ``block`` in sequence order; a group of more than
    ``block`` rows is cut in order."""
    tags = token_tags.detach().cpu().numpy().astype(np.int64)
    rows = np.arange(len(tags))
    key = np.zeros((len(tags), 5), np.int64)  # tag, segment, tile t, tile h, tile w
    key[:, 0] = tags
    video = tags == 0
    grid = position_ids.detach().cpu().numpy()[video]
    segments = _segments(grid)
    key[video, 1] = segments
    key[video, 2:] = _grid_indices(grid, segments) // np.asarray(tile, np.int64)
    for tag in np.unique(tags[~video]):
        run = tags == tag
        key[run, 1] = np.arange(int(run.sum())) // block
    order = np.lexsort((rows, *key.T[::-1]))
    ordered = key[order]
    new_group = np.concatenate([[True], (np.diff(ordered, axis=0) != 0).any(axis=1)])
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(len(order)), 0))
    rank = np.arange(len(order)) - group_start  # place within the group
    new_block = new_group | (rank % block == 0)
    block_id = np.cumsum(new_block) - 1
    row_slot = np.empty(len(order), np.int64)
    row_slot[order] = block_id * block + rank % block
    sizes = np.bincount(block_id)
    return VsaLayout(
        row_slot=torch.from_numpy(row_slot),
        block_sizes=torch.from_numpy(sizes.astype(np.int32)),
    )


def reference_vsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_sizes: torch.Tensor,
    q_block_sizes: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """fastvideo-kernel's ``video_sparse_attn`` (64-row blocks, no gate) in plain torch,
    over padded ``[B, H, blocks * 64, D]`` tensors whose padding rows are zero."""
    b, h, s, d = q.shape
    blocks = s // VSA_BLOCK
    sizes = block_sizes.to(q.device, torch.float32)

    def means(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        summed = x.float().view(b, h, blocks, VSA_BLOCK, d).sum(3)
        return (summed / n.view(1, 1, -1, 1)).to(x.dtype)

    qc, kc, vc = (
        means(q, q_block_sizes.to(q.device, torch.float32)),
        means(k, sizes),
        means(v, sizes),
    )
    scores = qc @ kc.transpose(-2, -1) / math.sqrt(d)
    compressed = (torch.softmax(scores, dim=-1) @ vc).repeat_interleave(VSA_BLOCK, dim=2)
    chosen = scores.topk(min(topk, blocks), dim=-1).indices
    selected = torch.zeros(b, h, blocks, blocks, dtype=torch.bool, device=q.device)
    selected.scatter_(-1, chosen, True)
    real = torch.arange(VSA_BLOCK, device=q.device)[None, :] < block_sizes.to(q.device)[:, None]
    allowed = selected.repeat_interleave(VSA_BLOCK, 2).repeat_interleave(VSA_BLOCK, 3)
    allowed = allowed & real.reshape(1, 1, 1, -1)
    sparse = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return compressed + sparse


def kernel_name() -> str:
    """Which fastvideo-kernel path runs the sparse branch here (for the log line)."""
    import importlib

    bsa = importlib.import_module(
        "fastvideo_kernel.block_sparse_attn"
    )  # the module, not the function

    forward, _ = bsa._get_sm90_ops()
    compiled = forward is not None and bsa._is_sm90() and not bsa._force_triton()
    return f"fastvideo-kernel {VSA_KERNEL_VERSION} ({'sm_90 op' if compiled else 'Triton'})"


def load_kernel(device: torch.device) -> VsaKernel:
    """fastvideo-kernel's ``video_sparse_attn``, or a ValueError naming what is missing
    (the worker refuses the model at load)."""
    if device.type != "cuda":
        raise ValueError(f"attention = 'vsa' runs fastvideo-kernel on a CUDA device, not {device}")
    try:
        import fastvideo_kernel
    except ImportError as exc:
        raise ValueError(
            f"attention = 'vsa' needs fastvideo-kernel {VSA_KERNEL_VERSION} "
            f"(pip install 'fastvideo-kernel=={VSA_KERNEL_VERSION}'): {exc}"
        ) from exc
    version = getattr(fastvideo_kernel, "__version__", "?")
    if version != VSA_KERNEL_VERSION:
        log.warning(
            "fastvideo-kernel %s, not %s: VSA is untested with it", version, VSA_KERNEL_VERSION
        )

    def run(q: Any, k: Any, v: Any, sizes: Any, q_sizes: Any, topk: int) -> torch.Tensor:
        out: torch.Tensor = torch.ops.omniqueue.video_sparse_attn(q, k, v, sizes, q_sizes, topk)
        return out

    return run


# fastvideo-kernel's call as one opaque op, so that a compiled block (fullgraph) keeps it
# whole: its Triton launches and the top-k mask stay outside the traced graph.
@torch.library.custom_op("omniqueue::video_sparse_attn", mutates_args=(), device_types="cuda")
def _video_sparse_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_sizes: torch.Tensor,
    q_block_sizes: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    import fastvideo_kernel

    out: torch.Tensor = fastvideo_kernel.video_sparse_attn(
        q, k, v, block_sizes, q_block_sizes, topk, block_size=VSA_TILE
    )
    return out


@_video_sparse_attn.register_fake
def _video_sparse_attn_fake(q: torch.Tensor, *_: Any) -> torch.Tensor:
    return torch.empty_like(q)  # what tracing sees: the output has the query's shape


class H3VsaProcessor(MiniMaxH3AttnProcessor):
    """MiniMax-H3's attention processor with the sparse kernel in place of SDPA, over the
    layout of :class:`VsaContext` (SDPA where there is none or the sequence is short)."""

    def __init__(self, context: VsaContext) -> None:
        self.context = context

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if attn.fused_projections:
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = (
                attn.to_q(hidden_states),
                attn.to_k(hidden_states),
                attn.to_v(hidden_states),
            )
        query = attn.norm_q(query.unflatten(-1, (attn.heads, -1)))
        key = attn.norm_k(key.unflatten(-1, (attn.heads, -1)))
        value = value.unflatten(-1, (attn.heads, -1))
        if rotary_emb is not None:
            query = _apply_rotary_emb(query, *rotary_emb)
            key = _apply_rotary_emb(key, *rotary_emb)
        layout = self.context.layout
        if layout is None or attention_mask is not None or query.shape[1] < VSA_MIN_ROWS:
            if not torch.compiler.is_compiling():
                self.context.calls["sdpa"] += 1
            out = dispatch_attention_fn(
                query,
                key,
                value,
                attn_mask=attention_mask,
                backend=self._attention_backend,
                parallel_config=self._parallel_config,
            )
        else:
            out = self._sparse(query, key, value, layout)
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))

    def _sparse(self, q: Any, k: Any, v: Any, layout: VsaLayout) -> torch.Tensor:
        """``[B, S, H, D]`` rows scattered into the padded block layout, the kernel, and
        gathered back in the sequence's order (compiled with the block on CUDA)."""
        if not torch.compiler.is_compiling():  # counted where nothing traces it
            self.context.calls["vsa"] += 1
        b, _, h, d = q.shape
        slots = layout.row_slot

        def padded(x: torch.Tensor) -> torch.Tensor:
            out = x.new_zeros(b, layout.blocks * VSA_BLOCK, h, d).index_copy_(1, slots, x)
            return out.transpose(1, 2).contiguous()

        sizes = layout.block_sizes
        out = self.context.kernel(padded(q), padded(k), padded(v), sizes, sizes, self.context.topk)
        return out.transpose(1, 2).index_select(1, slots)


def install_vsa(transformer: Any, context: VsaContext) -> int:
    """Every joint block's attention through :class:`H3VsaProcessor` (the text refiner's
    keep SDPA); returns how many."""
    processor = H3VsaProcessor(context)
    for block in transformer.transformer_blocks:
        block.attn.set_processor(processor)
    return len(transformer.transformer_blocks)
