"""What ``num_inference_steps`` counts on a MiniMax-H3 deployment (issue 45 item 3).

vLLM-Omni's ComfyUI node sends FastH3 ``num_inference_steps = 4``: its transformer
evaluations. A base H3 entry counts sigma points (5 give 4 evaluations, the Turbo LoRAs'
convention); a FastH3 entry with the adapter option ``steps = "evaluations"`` declares 4,
runs 4 evaluations for the node's 4, bit-equal to what 5 sigma points ran on the entry
before, and refuses 5 naming the field (docs/adapters.md says why)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.validation import parse_create, resolve
from models.catalog import FAMILY_SPECS, ModelSpec
from models.errors import InvalidRequest
from models.registry import parse_registry
from storage.settings import Settings
from tests.unit.h3_fixtures import h3_request, tiny_h3_lora, tiny_h3_pipe
from tests.unit.job_steps import run_job
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.registry import build_adapter

ROOT = Path(__file__).resolve().parents[2]
SIZE = 64
# what the node's FastH3 path sends (every value a string)
NODE = {"num_inference_steps": "4", "guidance_scale": "1.0", "true_cfg_scale": "1.0"}


def _fast_spec(steps: int) -> ModelSpec:
    """A FastH3 entry's spec: one schedule of ``steps``, no CFG."""
    fixed = {"min_steps": steps, "max_steps": steps, "default_steps": steps, "no_cfg": True}
    return FAMILY_SPECS["diffusers.minimax_h3"].model_copy(update=fixed)


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    path = tmp_path_factory.mktemp("fasth3") / "fasth3.safetensors"
    return {"path": str(path), "sha256": tiny_h3_lora(path)}


def _fast(fused: dict[str, str], schedule: int, **options: Any) -> MiniMaxH3Adapter:
    pipe = tiny_h3_pipe(canvas_short_edge=SIZE, canvas_max_pixels=SIZE * SIZE * 2)
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=_fast_spec(schedule), fused_lora=fused, **options)
    adapter.load("cpu")
    return adapter


def test_four_evaluations_are_what_five_sigma_points_ran(fused: dict[str, str]) -> None:
    evaluations = _fast(fused, 4, steps="evaluations")
    request = h3_request(num_inference_steps=4)
    state = evaluations.prepare(request)
    assert state.num_steps == 4 and len(state.timesteps) == 4  # 4 transformer evaluations
    evaluations.end()
    media = run_job(evaluations, request)
    # the entry as it was (sigma points, 5), whose frames are diffusers' own with the LoRA
    # fused (test_minimax_h3.py): bit-equal
    before = run_job(_fast(fused, 5), h3_request(num_inference_steps=5))
    assert np.array_equal(media.frames, before.frames)
    assert media.audio is not None and before.audio is not None
    assert np.array_equal(media.audio, before.audio)


def test_a_base_entry_still_counts_sigma_points(fused: dict[str, str]) -> None:
    state = _fast(fused, 5).prepare(h3_request(num_inference_steps=5))
    assert state.num_steps == 4


def test_an_unknown_count_refuses_to_start() -> None:
    with pytest.raises(ValueError, match="steps must be 'sigma_points' or 'evaluations'"):
        MiniMaxH3Adapter(pipe=tiny_h3_pipe(), spec=_fast_spec(4), steps="evaluation")


def test_the_api_takes_the_node_s_4_and_refuses_the_turbo_count() -> None:
    specs = {"FastH3": _fast_spec(4)}
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    ok = resolve(parse_create({"model": "FastH3", "prompt": "p", **NODE}), specs, settings)
    assert ok.num_inference_steps == 4
    turbo = parse_create({"model": "FastH3", "prompt": "p", **NODE, "num_inference_steps": "5"})
    with pytest.raises(InvalidRequest, match="num_inference_steps must be 4") as err:
        resolve(turbo, specs, settings)
    assert err.value.param == "num_inference_steps"


def test_the_documented_fasth3_entry_counts_evaluations() -> None:
    """docs/adapters.md's FastH3 example, as a registry: its spec takes the node's 4 and
    its adapter counts them as evaluations."""
    text = (ROOT / "docs" / "adapters.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    (example,) = [b for b in blocks if "MiniMax-H3/FastH3" in b]
    served = parse_registry(example)["MiniMaxAI/MiniMax-H3/FastH3"]
    spec = served.spec
    assert (spec.min_steps, spec.max_steps, spec.default_steps, spec.no_cfg) == (4, 4, 4, True)
    adapter = build_adapter(served)
    assert isinstance(adapter, MiniMaxH3Adapter) and adapter.steps == "evaluations"
