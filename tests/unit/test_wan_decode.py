"""Wan's VAE decoded latent frame by latent frame (``shared/wan_decode.py``) and a Helios
chunk handed out as it decodes (``HeliosWorldAdapter.stream_chunk``): the pieces come
1 frame, then 4 per latent frame, and together they are the whole decode bit for bit;
the VAE's feature cache is empty after; a VAE the loop cannot stand in for is decoded
whole, in one piece; so is a chunk taken whole (``take_chunk``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.unit.diffusers_fixtures import tiny_wan_pipeline
from tests.unit.helios_fixtures import SEQ_LEN, first_chunk_stepped, tiny_helios_pipeline
from workers.pipelines.base import SupportsChunkStream
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.helios.inputs import latent_stats
from workers.pipelines.diffusers.shared.common import frames_uint8
from workers.pipelines.diffusers.shared.wan_decode import decode_pieces, streams


def test_the_pieces_are_the_whole_decode_and_leave_no_cache() -> None:
    pipe: Any = tiny_wan_pipeline()
    vae = pipe.vae
    assert streams(vae)  # a VAE that has not decoded yet too
    z = torch.randn(1, 16, 4, 4, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = vae.decode(z, return_dict=False)[0]
    pieces = list(decode_pieces(vae, z))
    assert [p.shape[2] for p in pieces] == [1, 4, 4, 4]
    assert torch.equal(torch.cat(pieces, dim=2), whole)
    assert all(cached is None for cached in vae._feat_map)


def test_a_tiling_or_patched_vae_is_not_streamed() -> None:
    pipe: Any = tiny_wan_pipeline()
    vae = pipe.vae
    vae.enable_tiling()
    assert not streams(vae)

    class Patched(type(vae)):  # type: ignore[misc]
        def _decode(self, z: torch.Tensor, return_dict: bool = True) -> Any:
            return super()._decode(z, return_dict)

    vae.disable_tiling()
    assert streams(vae)
    vae.__class__ = Patched
    assert not streams(vae)


@pytest.fixture(scope="module")
def adapter() -> HeliosWorldAdapter:
    built = HeliosWorldAdapter(pipe=tiny_helios_pipeline(), max_sequence_length=SEQ_LEN)
    built.load("cpu")
    return built


def _finished_chunk(adapter: HeliosWorldAdapter) -> tuple[Any, np.ndarray]:
    """A session's first chunk with its steps run, and its frames as ``vae.decode`` of
    the whole chunk makes them (``__call__``'s decode and post-processing)."""
    state = first_chunk_stepped(adapter, seed=3, steps_per_chunk=2)
    pipe = adapter._loaded()
    vae = pipe.vae
    mean, inv_std = latent_stats(vae, torch.device("cpu"))
    latents = state.latents
    assert latents is not None
    with torch.no_grad():
        video = vae.decode(latents.to(vae.dtype) / inv_std + mean, return_dict=False)[0]
        whole = frames_uint8(pipe.video_processor.postprocess_video(video, output_type="pt")[0])
    return state, whole


def test_a_helios_chunk_streams_as_it_decodes(adapter: HeliosWorldAdapter) -> None:
    assert isinstance(adapter, SupportsChunkStream)
    state, whole = _finished_chunk(adapter)
    pieces = adapter.stream_chunk(state)
    # the session moved on at the call, before any of the decode ran
    assert (state.chunk_index, state.step_index, state.latents) == (1, 0, None)
    got = list(pieces)
    assert [len(p) for p in got] == [1] + [4] * 8
    np.testing.assert_array_equal(np.concatenate(got), whole)
    assert all(p.flags.c_contiguous for p in got)  # channels interleaved before the copy


def test_a_helios_chunk_on_a_vae_that_does_not_stream_comes_whole(
    adapter: HeliosWorldAdapter,
) -> None:
    state, whole = _finished_chunk(adapter)
    vae = adapter._loaded().vae
    vae.use_tiling = True  # asked for; too small a video for a tile to engage
    try:
        got = list(adapter.stream_chunk(state))
    finally:
        vae.use_tiling = False
    assert [len(p) for p in got] == [33]
    np.testing.assert_array_equal(got[0], whole)


def test_a_helios_chunk_taken_whole_is_one_decode_of_the_same_frames(
    adapter: HeliosWorldAdapter,
) -> None:
    """``take_chunk`` (a session with the streamed decode off) decodes the chunk in one
    ``vae.decode``: one post-processing, the frames of the streamed pieces."""
    state, whole = _finished_chunk(adapter)
    processor = adapter._loaded().video_processor
    calls: list[int] = []
    postprocess = processor.postprocess_video

    def counted(video: torch.Tensor, **kwargs: Any) -> Any:
        calls.append(video.shape[2])
        return postprocess(video, **kwargs)

    processor.postprocess_video = counted
    try:
        got = adapter.take_chunk(state)
    finally:
        del processor.postprocess_video
    assert calls == [33]
    np.testing.assert_array_equal(got, whole)
