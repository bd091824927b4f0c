"""An adapter's ``offload_entry_points`` (workers/pipelines/diffusers/shared/offload.py:
``group_blocks``): the submodules a pipeline calls directly, hooked on their own by
``offload = "group"``, and every autoencoder's parts, which its encode and decode call.

diffusers' H3 text encoding calls ``text_encoder.model(...)``, and block-level group
offloading onloads a component's top level (everything outside its top-level block lists)
at the component's own ``forward``, which then never runs: on an H100 the first job of a
``group`` entry failed in ``prepare`` with the embedding's weights still on the host. Here
diffusers' own ``apply_group_offloading`` runs on the CPU (no stream: the onload and
offload devices are both the host) over the tiny seeded H3, and what it onloads while the
prompt is encoded is recorded: with the adapter's entry points, every weight of the
language model the encoding reads is onloaded; without them, none is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import torch
from diffusers.hooks.group_offloading import ModuleGroup
from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds

from models.memory_plan import MemoryPlan
from models.registry import CatalogError
from tests.unit.diffusers_fixtures import (
    tiny_cogvideox_pipeline,
    tiny_ltx_pipeline,
    tiny_wan_pipeline,
)
from tests.unit.diffusers_fixtures_av import tiny_ltx2_pipeline, tiny_stable_audio_pipeline
from tests.unit.longcat_fixtures import tiny_longcat_pipeline
from tests.unit.offload_fixtures import offloaded_on_cpu
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.minimax_h3.decode import stream_frames
from workers.pipelines.diffusers.minimax_h3.random_weights import TOY_CONFIG, random_pipeline
from workers.pipelines.diffusers.shared.memory import MemoryLayout
from workers.pipelines.diffusers.shared.offload import group_blocks, nested_groups

POINTS = MiniMaxH3Adapter.offload_entry_points


@pytest.fixture(scope="module")
def pipe() -> Any:
    return random_pipeline("cpu", torch.float32, text_layers=2, config=TOY_CONFIG)


@pytest.fixture
def onloaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ModuleGroup]]:
    """The groups diffusers' hooks onload, in order."""
    groups: list[ModuleGroup] = []
    original = ModuleGroup.onload_

    def record(self: ModuleGroup) -> None:
        groups.append(self)
        original(self)

    monkeypatch.setattr(ModuleGroup, "onload_", record)
    yield groups


def _weights(groups: list[ModuleGroup]) -> set[int]:
    out = {id(p) for group in groups for p in group.parameters}
    out |= {id(p) for group in groups for module in group.modules for p in module.parameters()}
    return out


def _encode_offloaded(pipe: Any, block_modules: list[str] | None) -> None:
    """The prompt encoded as the H3 pipeline encodes it, the text encoder offloaded."""
    offloaded_on_cpu(pipe.text_encoder, block_modules)
    ids = pipe.tokenizer("a red fox in the snow").input_ids
    get_qwen3vl_prompt_embeds(pipe.text_encoder, pipe.processor, ids, text_encoder_layer=2)


def test_the_h3_entry_points_onload_every_weight_the_text_encoding_reads(
    onloaded: list[ModuleGroup],
) -> None:
    pipe: Any = random_pipeline("cpu", torch.float32, text_layers=2, config=TOY_CONFIG)
    names = group_blocks(pipe, {}, POINTS, "m")["text_encoder"]
    _encode_offloaded(pipe, names)
    language = pipe.text_encoder.model.language_model
    assert {id(p) for p in language.parameters()} <= _weights(onloaded)
    # the decoder layers each their own group, streamed (not the encoder whole at once)
    layer_groups = [g for g in onloaded if any(m in language.layers for m in g.modules)]
    assert len(layer_groups) == len(language.layers) > 1


def test_without_them_the_text_encoding_onloads_nothing(onloaded: list[ModuleGroup]) -> None:
    """What the GPU met: the root's group waits for a ``forward`` that is never called."""
    pipe: Any = random_pipeline("cpu", torch.float32, text_layers=2, config=TOY_CONFIG)
    _encode_offloaded(pipe, None)
    assert not _weights(onloaded) & {id(p) for p in pipe.text_encoder.model.parameters()}


def test_the_h3_vaes_run_with_every_weight_onloaded(onloaded: list[ModuleGroup]) -> None:
    """The video decode as this adapter runs it (a clip at a time, ``_decode_clip``), the
    soundtrack's (``audio_vae.decode``) and both encodes (references), each VAE offloaded
    with its entry points: every weight of both was onloaded. (The audio decoder's
    upsamplers are lists of lists its ``forward`` indexes: ``ups`` is named so that each
    layer is hooked, not the inner list whose ``forward`` never runs.)"""
    pipe: Any = random_pipeline("cpu", torch.float32, text_layers=2, config=TOY_CONFIG)
    names = group_blocks(pipe, {}, POINTS, "m")
    vae, audio = pipe.vae, pipe.audio_vae
    offloaded_on_cpu(vae, names["vae"])
    offloaded_on_cpu(audio, names["audio_vae"])
    latents = torch.randn(1, vae.config.latent_channels, 7, 2, 2)
    assert list(stream_frames(vae, latents, lambda video: video[0].permute(1, 2, 3, 0)))
    audio.decode(torch.randn(1, audio.config.latent_channels, 4))
    vae.encode(torch.randn(1, 3, vae.config.clip_length, 32, 32))
    audio.encode(torch.randn(1, 1, audio.hop_length * 8))
    every = [*vae.parameters(), *audio.parameters()]
    assert {id(p) for p in every} <= _weights(onloaded)


def test_an_entry_point_group_offloading_would_not_reach_is_named(pipe: Any) -> None:
    with pytest.raises(CatalogError) as refused:
        group_blocks(pipe, {}, {"text_encoder": ("model", "embed_tokens")}, "acme/h3")
    assert str(refused.value) == (
        "model 'acme/h3': offload = 'group' hooks text_encoder's embed_tokens on their own "
        "(its pipeline calls them directly), and Qwen3VLForConditionalGeneration has no such "
        "child under the others"
    )
    # a component the pipeline does not load has none to hook
    assert "image_encoder" not in group_blocks(pipe, {}, {"image_encoder": ("model",)}, "m")


def test_the_layout_adds_them_to_a_group_plan_only(
    pipe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.pipelines.diffusers.shared import memory

    given: list[dict[str, list[str]]] = []
    monkeypatch.setattr(memory, "offload", lambda pipe, plan, dev, blocks, *a: given.append(blocks))
    monkeypatch.setattr(memory, "plan_host_copies", lambda *a: None)
    plan = MemoryPlan(offload="group", offload_blocks=["text_encoder.model.language_model.layers"])
    MemoryLayout("m", plan, POINTS).place(pipe, "cpu")
    assert given[-1]["text_encoder"] == list(POINTS["text_encoder"])
    assert given[-1]["vae"] == ["encoder", "quant_conv", "post_quant_conv", "decoder"]
    assert given[-1]["transformer"] == []
    MemoryLayout("m", MemoryPlan(), POINTS).place(pipe, "cpu")
    assert given[-1] == {}


def _hooked_with_a_stream(component: torch.nn.Module, names: list[str] | None) -> None:
    """diffusers' block-level hooks with prefetching, as ``use_stream=True`` makes them on
    a GPU (a stand-in stream: making the hooks moves nothing; pageable host copies)."""
    from diffusers.hooks.group_offloading import (
        GroupOffloadingConfig,
        GroupOffloadingType,
        _apply_group_offloading,
    )

    cpu = torch.device("cpu")
    config = GroupOffloadingConfig(
        onload_device=cpu,
        offload_device=cpu,
        offload_type=GroupOffloadingType.BLOCK_LEVEL,
        non_blocking=True,
        record_stream=True,  # (no wait on a stream when the hooks first offload)
        low_cpu_mem_usage=True,
        num_blocks_per_group=1,
        stream=cast(Any, object()),
        block_modules=names,
    )
    _apply_group_offloading(component, config)


@pytest.mark.parametrize(
    ("component", "nested"),
    [("text_encoder", True), ("vae", False), ("audio_vae", False), ("transformer", False)],
)
def test_a_component_with_nested_groups_is_offloaded_without_the_stream(
    component: str, nested: bool
) -> None:
    """What the H100 met once the entry points were named: the text encoder's prefetch
    hooks, one per level of ``model`` / ``language_model`` / ``embed_tokens``, each mark
    the layers below them and diffusers refuses the second mark. ``nested_groups`` is
    what the layout asks (``offload.unstreamed``) before it uses the stream: it says so for
    the text encoder alone, and diffusers accepts the others' hooks with a stream."""
    pipe: Any = random_pipeline("cpu", torch.float32, text_layers=2, config=TOY_CONFIG)
    names = group_blocks(pipe, {}, POINTS, "m")[component] or None
    module = getattr(pipe, component)
    assert nested_groups(module, set(names or ())) is nested
    if nested:
        with pytest.raises(ValueError, match="layer_execution_tracker already exists"):
            _hooked_with_a_stream(module, names)
    else:
        _hooked_with_a_stream(module, names)


def test_wans_vae_streams_its_encoder_and_decoder_side_by_side() -> None:
    """The class's own block modules (Wan's VAE: encoder and decoder, no group of the
    root's) are levels side by side, not one above another: streamed, as on the GPU."""
    vae: Any = cast(Any, tiny_wan_pipeline()).vae
    names = list(vae._group_offload_block_modules)
    assert not nested_groups(vae, set(names))
    _hooked_with_a_stream(vae, names)


def _video_latents(vae: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    cfg = vae.config
    channels = cfg.get("latent_channels") or cfg.get("z_dim")
    extra = {"temb": torch.tensor([0.05])} if cfg.get("timestep_conditioning") else {}
    return torch.randn(1, channels, 2, 4, 4), extra


Latents = Callable[[Any], tuple[torch.Tensor, dict[str, Any]]]
FAMILY_VAES: dict[str, tuple[Callable[[], Any], str, Latents]] = {
    "ltx": (tiny_ltx_pipeline, "vae", _video_latents),
    "cogvideox": (tiny_cogvideox_pipeline, "vae", _video_latents),
    "wan": (tiny_wan_pipeline, "vae", _video_latents),
    "ltx2": (tiny_ltx2_pipeline, "vae", _video_latents),
    "longcat_audio": (
        tiny_longcat_pipeline,
        "vae",
        lambda vae: (torch.randn(1, vae.config.latent_dim, 8), {}),
    ),
    "stable_audio": (
        tiny_stable_audio_pipeline,
        "vae",
        lambda vae: (torch.randn(1, vae.config.decoder_input_channels, 8), {}),
    ),
}


@pytest.mark.parametrize("family", list(FAMILY_VAES))
def test_every_familys_vae_decodes_with_its_decoder_onloaded(
    family: str, onloaded: list[ModuleGroup]
) -> None:
    """An autoencoder's ``decode`` calls its decoder, never its ``forward``: where its
    class names no block modules (all but Wan's), its parts are groups of their own, and a
    decode onloads every weight of its decoder (none, as LTX's and CogVideoX's were)."""
    make, component, latents = FAMILY_VAES[family]
    pipe = make()
    vae = getattr(pipe, component)
    offloaded_on_cpu(vae, group_blocks(pipe, {}, {}, "m")[component])
    z, extra = latents(vae)
    vae.decode(z, **extra)
    decoder = [p for n, p in vae.named_parameters() if n.startswith(("decoder", "post_quant"))]
    assert {id(p) for p in decoder} <= _weights(onloaded)


def test_offload_blocks_under_a_text_encoder_nest_its_groups() -> None:
    """``offload_blocks = ["text_encoder.encoder.block"]`` on Wan's UMT5: the root holds
    the shared embedding and the encoder its final norm, one level above the other, so
    that text encoder goes without the stream too (docs/configuration.md says so)."""
    encoder = cast(Any, tiny_wan_pipeline()).text_encoder
    assert nested_groups(encoder, {"encoder"})
    with pytest.raises(ValueError, match="layer_execution_tracker already exists"):
        _hooked_with_a_stream(encoder, ["encoder"])
