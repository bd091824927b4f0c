"""Fixtures that unit test modules opt into by name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """The module's tiny pipelines on one intra-op thread. Their tensors are too small to
    gain from more, and the suite's two xdist workers each start with a thread per core:
    on two cores the four threads wait on each other (test_cogvideox_i2v.py took 55-61 s
    so, 19-28 s on one thread a worker). Every frame a test compares is computed inside
    the module, so all of them alike."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
