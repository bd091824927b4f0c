"""Length buckets for LongCat's compiled blocks (``buckets = true``; on by default with CUDA
graphs of either kind: ``compile_mode = "reduce-overhead"``, or the step graphs of
graphs.py).

The blocks compile once with both sequence lengths symbolic (the clip's latent frames
and the prompt's tokens: ``dynamic=True``), so a new length compiles nothing; but CUDA
graphs record one graph per distinct pair of lengths. Bucketing rounds each length up to
the next size of :func:`bucket`'s ladder, so a worker sees at most some twenty of each,
whatever the requests:

* the **frames** in ``prepare``: the latents (the job's noise, then zeros), the zero
  ``latent_cond`` and the frames' mask padded to the bucket, the mask false on the
  padding. The transformer is written for padded batches: the padding is zeroed at the
  input embedding, masked out of self-attention as a key, zeroed after attention and at
  the output, and every other layer works frame by frame, so the clip's own frames get
  the same function of its inputs (the rounding differs: other kernel shapes). The
  padding's prediction is 0, so it stays 0 through the steps, and ``decode`` takes the
  clip's frames only;
* the **tokens** inside each block (:class:`TextBuckets`, a forward pre-hook): the text
  after the transformer's text embedding and ConvNeXt layers, its mask and its rotary
  tables, padded with zeros and a false mask, which cross-attention masks out as keys.
  Not before the transformer: its ConvNeXt layers' GRN normalises over the whole
  sequence, so padded text would change the real tokens' features.

Padding costs at most 7 positions or a quarter more, which a launch-bound step does not
feel.
"""

from __future__ import annotations

from typing import Any

import torch


def bucket(n: int) -> int:
    """``n`` rounded up to a multiple of 8 up to 64, then to a quarter of its power of two
    (80, 96, 112, 128, 160, …): at most 7 or 25 % more, 20 sizes up to 512."""
    step = max(8, 1 << max(0, n.bit_length() - 3))
    return -(-n // step) * step


def padded(x: torch.Tensor, size: int, dim: int = 1) -> torch.Tensor:
    """``x`` with zeros (False for a mask) appended along ``dim`` up to ``size``."""
    shape = list(x.shape)
    shape[dim] = size - x.shape[dim]
    return torch.cat([x, x.new_zeros(shape)], dim=dim) if shape[dim] > 0 else x


class TextBuckets:
    """Pads the text inputs of every block (``cond``, ``cond_mask``, ``cond_rope``) to
    :func:`bucket` of their length: a forward pre-hook of each block. The transformer
    hands every block of a pass the same tensors, so they are padded once a pass (the
    last pass's are kept until the next, or :meth:`clear`)."""

    def __init__(self) -> None:
        self._source: torch.Tensor | None = None
        self._padded: dict[str, Any] = {}

    def install(self, blocks: list[torch.nn.Module]) -> None:
        for block in blocks:
            block.register_forward_pre_hook(self, with_kwargs=True)

    def clear(self) -> None:
        self._source, self._padded = None, {}

    def __call__(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        cond = kwargs.get("cond")
        if cond is None:
            return None
        if cond is not self._source:
            self._source, self._padded = cond, _padded_text(kwargs)
        return (args, kwargs | self._padded) if self._padded else None


def _padded_text(kwargs: dict[str, Any]) -> dict[str, Any]:
    cond = kwargs["cond"]
    size = bucket(cond.shape[1])
    if size == cond.shape[1]:
        return {}
    mask = kwargs.get("cond_mask")
    if mask is None:  # every token counts: the padding must not
        mask = torch.ones(cond.shape[:2], dtype=torch.bool, device=cond.device)
    out: dict[str, Any] = {"cond": padded(cond, size), "cond_mask": padded(mask, size)}
    if kwargs.get("cond_rope") is not None:
        out["cond_rope"] = tuple(padded(t, size, dim=0) for t in kwargs["cond_rope"])
    return out
