"""LongCat's denoise step for several jobs at once: one transformer pass over every row of
every job (``LongCatAudioAdapter.step_batch``, the ``SupportsStepBatch`` capability that
the worker's step batcher drives: ``workers/jobs/batcher.py``), and for one job alone,
whose conditional and null rows share one pass the same way (the adapter's
``guidance_batch``, on by default).

``LongCatAudioDiTTransformer.forward`` (diffusers 0.42.1) is split in two here:

* **the text side** (:func:`text_side`): the text embedding, the four ConvNeXt layers and
  the masked fill, then the mean of the text that global AdaLN adds to the timestep. It
  runs once per job and prompt, alone and unpadded, and is kept in the job's state: its
  ConvNeXt layers' GRN normalises over the whole sequence, so padded text would change the
  real tokens' features (this is why diffusers' own batched ``__call__``, which pads the
  prompts, is not its solo calls). It depends on the prompt only, not on the step, so one
  computation serves every step, as equal to the forward's own as the same kernels on the
  same tensor make it (bit for bit on the CPU);
* **the rest** (:func:`batched_forward`): what follows, from the timestep embedding to the
  output projection, over a batch of rows, one row a pass of one job (its conditional and,
  under guidance, its null pass). Each row has its own timestep (the DiT embeds one per
  row and global AdaLN is per row), so jobs at different steps share a pass. The rows'
  frames are padded to the longest with zeros and a false mask, and their text to the
  longest with zeros and a false mask: the DiT is written for padded batches (the padding
  is zeroed at the input embedding, masked out of self-attention as a key, zeroed after
  attention and at the output; the text's padding is masked out of cross-attention as a
  key), and every other layer works frame by frame, so each row gets the function of its
  own inputs that its solo pass computes. Only the rounding differs (other kernel shapes:
  docs/adapters.md gives the measured bound).

:func:`batched_forward` is checked against ``transformer.forward`` row by row
(``tests/unit/test_longcat_batch.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workers.pipelines.diffusers.longcat_audio.buckets import padded


@dataclass(frozen=True)
class TextSide:
    """One prompt's text as the transformer's blocks see it: 1×tokens×dim, its mask
    (1×tokens), and its mean over the real tokens (1×dim)."""

    cond: torch.Tensor
    mask: torch.Tensor
    mean: torch.Tensor


@dataclass(frozen=True)
class Row:
    """One pass of one job in a batched step: its latents (1×frames×latent_dim), their mask
    (1×frames), the latent condition, the timestep (a 1-element tensor, already divided by
    the scheduler's ``num_train_timesteps`` as the adapter's step does) and its text."""

    latents: torch.Tensor
    mask: torch.Tensor
    latent_cond: torch.Tensor
    timestep: torch.Tensor
    text: TextSide


def text_side(transformer: torch.nn.Module, embeds: torch.Tensor, mask: torch.Tensor) -> TextSide:
    """The forward's text side for one prompt's ``embeds`` (1×tokens×text_dim, already in
    the latents' dtype) and ``mask``: exactly its operations, in its order."""
    model: Any = transformer
    config = model.config
    text_mask = mask.bool()
    cond = model.text_embed(embeds, text_mask)
    if config.text_conv:
        cond = model.text_conv_layer(cond)
        cond = cond.masked_fill(text_mask.logical_not().unsqueeze(-1), 0.0)
    text_len = text_mask.sum(1).clamp(min=1).to(cond.dtype)
    mean = cond.sum(1) / text_len.unsqueeze(1)
    return TextSide(cond=cond, mask=text_mask, mean=mean)


@dataclass(frozen=True)
class PassInputs:
    """A pass's rows stacked and padded: what :func:`forward_pass` reads (the tensors a
    CUDA graph of the pass copies its inputs into: graphs.py)."""

    hidden_states: torch.Tensor  # rows×frames×latent_dim
    attention_mask: torch.Tensor  # rows×frames
    latent_cond: torch.Tensor  # rows×frames×latent_dim
    cond: torch.Tensor  # rows×tokens×dim: the text sides
    cond_mask: torch.Tensor  # rows×tokens
    text_mean: torch.Tensor  # rows×dim
    timestep: torch.Tensor  # rows, in the latents' dtype


def pass_inputs(rows: Sequence[Row], tokens: int | None = None) -> PassInputs:
    """``rows`` stacked: their frames padded to the longest with zeros and a false mask,
    their text likewise to the longest or to ``tokens`` where that is more (a bucket)."""
    length = max(row.latents.shape[1] for row in rows)
    tokens = max([row.text.cond.shape[1] for row in rows] + [tokens or 0])
    hidden_states = torch.cat([padded(row.latents, length) for row in rows])
    return PassInputs(
        hidden_states=hidden_states,
        attention_mask=torch.cat([padded(row.mask, length) for row in rows]),
        latent_cond=torch.cat([padded(row.latent_cond, length) for row in rows]),
        cond=torch.cat([padded(row.text.cond, tokens) for row in rows]),
        cond_mask=torch.cat([padded(row.text.mask, tokens) for row in rows]),
        text_mean=torch.cat([row.text.mean for row in rows]),
        timestep=torch.cat([row.timestep.reshape(1) for row in rows]).to(hidden_states.dtype),
    )


def batched_forward(transformer: torch.nn.Module, rows: Sequence[Row]) -> torch.Tensor:
    """The forward's part after the text side, over ``rows`` at once (module docstring):
    rows×frames×latent_dim, frames the longest row's, each row's prediction in its first
    frames (zeros on its padding)."""
    return forward_pass(transformer, pass_inputs(rows))


def forward_pass(transformer: torch.nn.Module, inputs: PassInputs) -> torch.Tensor:
    """The forward's part after the text side over stacked rows (:func:`pass_inputs`):
    exactly its operations, in its order; no host synchronisation (a CUDA graph
    captures it whole)."""
    model: Any = transformer
    config = model.config
    hidden_states, attention_mask = inputs.hidden_states, inputs.attention_mask
    cond, cond_mask = inputs.cond, inputs.cond_mask
    dtype = hidden_states.dtype
    timestep_embed = model.time_embed(inputs.timestep)
    hidden_states = model.input_embed(hidden_states, attention_mask)
    if model.use_latent_condition:
        latent_cond = model.latent_embed(inputs.latent_cond.to(dtype), attention_mask)
        both = torch.cat([hidden_states, latent_cond], dim=-1)
        hidden_states = model.latent_cond_embedder(both)
    residual = hidden_states.clone() if config.long_skip else None
    rope = model.rotary_embed(hidden_states, hidden_states.shape[1])
    cond_rope = model.rotary_embed(cond, cond.shape[1])
    norm_cond = timestep_embed
    adaln_global_out = None
    if config.adaln_type == "global":
        if config.adaln_use_text_cond:
            norm_cond = timestep_embed + inputs.text_mean
        adaln_global_out = model.adaln_global_mlp(norm_cond)
    for block in model.blocks:
        hidden_states = block(
            hidden_states=hidden_states,
            timestep_embed=timestep_embed,
            cond=cond,
            mask=attention_mask,
            cond_mask=cond_mask,
            rope=rope,
            cond_rope=cond_rope,
            adaln_global_out=adaln_global_out,
        )
    if residual is not None:
        hidden_states = hidden_states + residual
    hidden_states = model.norm_out(hidden_states, norm_cond)
    hidden_states = model.proj_out(hidden_states)
    out: torch.Tensor = hidden_states * attention_mask.unsqueeze(-1).to(dtype)
    return out
