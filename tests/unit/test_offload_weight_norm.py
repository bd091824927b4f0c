"""Group offloading over layers with ``torch.nn.utils.weight_norm`` (offload.py:
``fold_weight_norm``).

weight_norm computes a layer's weight in a forward pre-hook, before the layer's
``forward``, where diffusers' group offloading onloads the layer's tensors: on an H100 the
MiniMax-H3 audio decode of a ``group`` entry failed with a convolution's weight on the
host. diffusers' own hooks run here on the CPU (onload and offload devices both the host)
over the tiny seeded audio decoders, and what the weight-norm hook reads is checked
against what the groups had onloaded when it ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from diffusers.hooks.group_offloading import ModuleGroup
from torch.nn.utils.weight_norm import WeightNorm

from tests.unit.diffusers_fixtures_av import tiny_stable_audio_pipeline
from tests.unit.offload_fixtures import offloaded_on_cpu
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.minimax_h3.random_weights import TOY_CONFIG, random_pipeline
from workers.pipelines.diffusers.shared import offload
from workers.pipelines.diffusers.shared.offload import fold_weight_norm, group_blocks


def _h3_audio() -> tuple[Any, list[str], torch.Tensor]:
    pipe: Any = random_pipeline("cpu", torch.float32, text_layers=2, config=TOY_CONFIG)
    names = group_blocks(pipe, {}, MiniMaxH3Adapter.offload_entry_points, "m")["audio_vae"]
    audio = pipe.audio_vae
    return audio, names, torch.randn(1, audio.config.latent_channels, 4)


def _stable_audio() -> tuple[Any, list[str], torch.Tensor]:
    pipe: Any = tiny_stable_audio_pipeline()
    vae = pipe.vae
    names = group_blocks(pipe, {}, {}, "m")["vae"]
    return vae, names, torch.randn(1, vae.config.decoder_input_channels, 8)


DECODERS: dict[str, Callable[[], tuple[Any, list[str], torch.Tensor]]] = {
    "h3_audio": _h3_audio,
    "stable_audio": _stable_audio,
}


@pytest.fixture
def stale(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The layers whose weight-norm hook ran before their group was onloaded."""
    onloaded: set[int] = set()
    found: list[str] = []
    onload, call = ModuleGroup.onload_, WeightNorm.__call__

    def record_onload(self: ModuleGroup) -> None:
        onloaded.update(id(p) for m in self.modules for p in m.parameters())
        onloaded.update(id(p) for p in self.parameters)
        onload(self)

    def record_call(self: WeightNorm, module: torch.nn.Module, inputs: Any) -> None:
        if id(getattr(module, f"{self.name}_v")) not in onloaded:
            found.append(type(module).__name__)
        call(self, module, inputs)

    monkeypatch.setattr(ModuleGroup, "onload_", record_onload)
    monkeypatch.setattr(WeightNorm, "__call__", record_call)
    yield found


def _weight_norm_hooks(module: torch.nn.Module) -> int:
    return sum(
        isinstance(hook, WeightNorm)
        for m in module.modules()
        for hook in m._forward_pre_hooks.values()
    )


def test_weight_norm_reads_its_layer_before_the_group_is_onloaded(stale: list[str]) -> None:
    """What the GPU met: offloaded as it was, H3's audio decoder's upsamplers (each a group
    of its own: ``offload_entry_points``) ran their weight-norm hooks on tensors their
    groups had not onloaded yet (on a GPU, still on the host). (Stable Audio's layers sit
    inside blocks whose group is onloaded first, so folding changes nothing there.)"""
    vae, names, z = _h3_audio()
    assert _weight_norm_hooks(vae) > 0
    offloaded_on_cpu(vae, names)
    vae.decode(z)
    assert stale


@pytest.mark.parametrize("family", list(DECODERS))
def test_folded_the_decode_reads_only_onloaded_weights_and_is_unchanged(
    family: str, stale: list[str]
) -> None:
    vae, names, z = DECODERS[family]()
    expected = vae.decode(z).sample  # weight norm computes the weight at each call
    stale.clear()  # that decode's, before any group
    layers = _weight_norm_hooks(vae)
    assert fold_weight_norm(vae) == layers
    assert _weight_norm_hooks(vae) == 0
    offloaded_on_cpu(vae, names)
    torch.testing.assert_close(vae.decode(z).sample, expected)
    assert not stale


def test_group_offload_folds_before_it_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's ``group_offload`` folds a component's weight norm first (the hooks
    themselves are diffusers', recorded here: a stream needs a GPU)."""
    seen: list[int] = []
    monkeypatch.setattr(
        "diffusers.hooks.apply_group_offloading",
        lambda module, **_: seen.append(_weight_norm_hooks(module)),
    )
    vae, names, _ = _stable_audio()
    offload.group_offload(vae, torch.device("cpu"), names)
    assert seen == [0]
