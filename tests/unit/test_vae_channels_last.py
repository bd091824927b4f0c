"""The adapter option ``vae_channels_last`` of ``diffusers.helios`` and ``diffusers.wan``
(``workers/pipelines/diffusers/shared/vae_layout.py``): the VAE decoder's 3-D convolution
weights in ``channels_last_3d`` once loaded, the encoder's left as they were, and the
frames a session's streamed decode and a job's decode make with it against the default
layout's, on the tiny pipelines (CPU, float32, offline).

The GPU's channels-last convolutions run other cuDNN algorithms, whose bf16 rounding moved
the frames by up to 0.046 (``benchmarks/gpu/vae_decode.py``); the CPU's float32 ones
measured bit-equal here (torch 2.13, diffusers 0.42: max difference 0 for the float frames
and the uint8 ones alike), so the bounds below (1e-5 in [-1, 1], one uint8 level) leave
room for another CPU kernel without hiding a wrong layout, which moves frames by far more.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from models.catalog import FAMILY_SPECS
from models.memory_plan import MemoryPlan
from models.registry import ServedModel
from tests.unit.helios_fixtures import SEQ_LEN, SIZE, tiny_helios_pipeline
from tests.unit.test_diffusers_video import _run
from tests.unit.test_wan_i2v import WAN, _request
from tests.unit.video_workflows import keyframe
from tests.unit.wan_i2v_fixtures import WORKFLOWS, tiny_wan_i2v_pipeline
from workers.pipelines.base import WorldConfig
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.shared.vae_layout import conv_weights_to
from workers.pipelines.diffusers.shared.wan_decode import decode_pieces
from workers.pipelines.diffusers.wan.adapter import WanAdapter

FLOAT_BOUND = 1e-5  # frames in [-1, 1]
UINT8_BOUND = 1  # levels
IMAGE = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
CL = torch.channels_last_3d


def _conv_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in module.parameters() if p.dim() == 5]


def _decoder_only_channels_last(vae: Any) -> None:
    decoder, encoder = _conv_weights(vae.decoder), _conv_weights(vae.encoder)
    assert decoder and all(w.is_contiguous(memory_format=CL) for w in decoder)
    assert encoder and not any(w.is_contiguous(memory_format=CL) for w in encoder)


def test_conv_weights_to_changes_every_5d_parameter_in_place_and_back() -> None:
    """Every 3-D convolution's weight, the parameter objects kept (hooks hold them), and
    nothing of another rank; ``contiguous_format`` undoes it (the benchmark's A/B)."""
    vae = tiny_helios_pipeline().vae
    params = list(vae.decoder.parameters())
    others = {id(p): p.data_ptr() for p in params if p.dim() != 5}
    count = conv_weights_to(vae.decoder)
    assert count == len(_conv_weights(vae.decoder)) > 0
    assert [id(p) for p in vae.decoder.parameters()] == [id(p) for p in params]
    assert all(p.data_ptr() == others[id(p)] for p in params if p.dim() != 5)
    _decoder_only_channels_last(vae)
    conv_weights_to(vae.decoder, torch.contiguous_format)
    assert all(w.is_contiguous() for w in _conv_weights(vae.decoder))


def test_the_streamed_decode_with_channels_last_weights_is_the_default_layouts() -> None:
    """Wan's VAE decoded latent frame by latent frame (``decode_pieces``: a Helios chunk's,
    a Wan job's streamed decode) and whole, against the same VAE in the default layout
    (measured max difference 0)."""
    vae = tiny_helios_pipeline().vae
    z = torch.randn(1, 16, 9, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        default = torch.cat(list(decode_pieces(vae, z)), dim=2)
        conv_weights_to(vae.decoder)
        pieces = torch.cat(list(decode_pieces(vae, z)), dim=2)
        whole = vae.decode(z, return_dict=False)[0]
    assert (pieces - default).abs().max() <= FLOAT_BOUND
    assert (whole - default).abs().max() <= FLOAT_BOUND


def _helios_session(channels_last: bool, i2v: bool) -> tuple[np.ndarray, HeliosWorldAdapter]:
    """Two chunks of a tiny Helios session, each streamed (``stream_chunk``)."""
    adapter = HeliosWorldAdapter(
        pipe=tiny_helios_pipeline(),
        dtype="float32",
        max_sequence_length=SEQ_LEN,
        vae_channels_last=channels_last,
    )
    adapter.load("cpu")
    image = {"reference_image": IMAGE} if i2v else {}
    config = WorldConfig(
        prompt="a red ball", width=SIZE, height=SIZE, num_frames=66, fps=24.0, seed=3,
        steps_per_chunk=2, **image,
    )  # fmt: skip
    state, chunks = adapter.start(config), []
    for _ in range(adapter.num_chunks(state)):
        while not adapter.chunk_done(state):
            adapter.step(state)
        chunks.append(np.concatenate(list(adapter.stream_chunk(state))))
    return np.concatenate(chunks), adapter


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
def test_a_helios_session_with_the_option_makes_the_default_layouts_frames(i2v: bool) -> None:
    """A session's streamed chunks with ``vae_channels_last`` against one without (I2V:
    the reference image encoded by the untouched encoder); measured max difference 0."""
    default, _ = _helios_session(False, i2v)
    frames, adapter = _helios_session(True, i2v)
    _decoder_only_channels_last(adapter.pipe.vae)
    assert frames.shape == default.shape == (66, SIZE, SIZE, 3)
    assert np.abs(frames.astype(int) - default.astype(int)).max() <= UINT8_BOUND


def test_a_wan_image_job_with_the_option_makes_the_default_layouts_frames() -> None:
    """A Wan 2.1 I2V job (its keyframe through the VAE's encoder) decoded whole and
    streamed, with ``vae_channels_last`` against without; measured max difference 0."""
    request = _request(reference_image=keyframe(1))
    runs = []
    for channels_last in (False, True):
        adapter = WAN.adapter(
            tiny_wan_i2v_pipeline("2.1"), WORKFLOWS["2.1"], vae_channels_last=channels_last
        )
        frames, media = _run(adapter, request)
        state = adapter.prepare(request)
        while not state.done:
            adapter.step(state)
        stream = adapter.decode_stream(state)
        assert stream is not None
        runs.append((frames, media.frames, np.concatenate([np.asarray(c) for c in stream.chunks])))
    _decoder_only_channels_last(adapter.pipe.vae)
    (frames, uint8, streamed), (cl_frames, cl_uint8, cl_streamed) = runs
    assert np.abs(cl_frames - frames).max() <= FLOAT_BOUND
    for got, expected in ((cl_uint8, uint8), (cl_streamed, streamed)):
        assert np.abs(got.astype(int) - expected.astype(int)).max() <= UINT8_BOUND


@pytest.mark.parametrize("offload", ["model", "group"])
def test_the_option_is_refused_with_an_offload_naming_both(offload: str) -> None:
    plan = MemoryPlan(offload=offload)  # type: ignore[arg-type]
    for cls in (WanAdapter, HeliosWorldAdapter):
        with pytest.raises(ValueError) as refused:
            cls(pipe=object(), memory=plan, vae_channels_last=True)
        assert "vae_channels_last = true" in str(refused.value)
        assert f"offload = {offload!r}" in str(refused.value)
        cls(pipe=object(), memory=plan)  # without the option: built


def test_a_registry_entry_s_adapter_options_reach_the_constructor() -> None:
    """``[model.adapter_options] vae_channels_last = true`` as the registry passes it; off
    by default."""
    for family, cls in (("diffusers.helios", HeliosWorldAdapter), ("diffusers.wan", WanAdapter)):
        spec = FAMILY_SPECS[family].model_copy(update={"name": "tiny"})
        entry = {"name": "tiny", "adapter": family, "path": "/nowhere", "spec": spec}
        on = cls.build(ServedModel(**entry, adapter_options={"vae_channels_last": True}))
        assert on.vae_channels_last is True
        assert cls.build(ServedModel(**entry)).vae_channels_last is False
