"""The GPU stack benchmarks' memory modes (issue 44) and attention backend, as far as a CPU
can say: the registry entries they write for ``--quantization`` / ``--offload`` /
``--offload-budget-gib`` / ``--attention`` are the ones the registry reads (the plan and
the attention roles on the spec, refused where a worker refuses it, the evidence JSON
recording the backend), the world benchmark's targets take issue 44's names in FP8 mode,
and the H3 frontier's points parse, are refused or left out before anything starts. The
scripts run as the GPU host
runs them (``python -m benchmarks.gpu.…``, their ``--print-registry``, ``--targets-of``
and ``--dry-run``: nothing built, nothing started); tests import no benchmark."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from models.memory_plan import MemoryPlan, refused_combination
from models.registry import ServedModel, parse_registry

ROOT = Path(__file__).resolve().parents[2]
HELIOS = "BestWishYsh/Helios-Distilled/random"
H3 = "MiniMaxAI/MiniMax-H3/FastH3"


def bench(module: str, *args: str) -> str:
    """What the script prints for ``args``; a registry it prints (``--print-registry``,
    nothing read but the arguments) once per run of this module, as two tests read the
    plain world registry."""
    if "--print-registry" in args:
        return _printed(module, *args)
    return _bench(module, *args)


@functools.cache
def _printed(module: str, *args: str) -> str:
    return _bench(module, *args)


def _bench(module: str, *args: str) -> str:
    done = _module(module, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _module(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.gpu.<module> args`` from the repository root, as the GPU host
    runs it (``env``: variables added to this process's)."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.gpu.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


def entry(text: str, name: str) -> ServedModel:
    return parse_registry(text)[name]


def refused(model: ServedModel) -> str | None:
    plan = model.spec.memory
    assert plan is not None
    return refused_combination(
        plan,
        lora=model.spec.supports_lora,
        streaming=model.spec.streaming,
        compile=model.compile,
        devices=model.devices,
    )


def test_the_world_entries_carry_fp8_to_both_parts() -> None:
    texts = json.loads(bench("world", "--tiny", "--quantization", "fp8", "--print-registry"))
    for part, sessions in (("stack", 2), ("takeover", 1)):
        model = entry(texts[part], HELIOS)
        assert model.max_sessions == sessions
        assert model.spec.memory == MemoryPlan(quantization="fp8")
        assert model.spec.memory.fp8_on("transformer") and not model.spec.memory.fp8_on("vae")
        assert model.spec.streaming and refused(model) is None  # FP8 serves sessions
        # two workers on one GPU: each builds its BF16 transformer on the host
        on_host = model.adapter_options.get("random_transformer_on_host", False)
        assert on_host is (part == "takeover")
    plain = json.loads(bench("world", "--tiny", "--print-registry"))
    assert entry(plain["stack"], HELIOS).spec.memory is None
    assert "random_transformer_on_host" not in entry(plain["takeover"], HELIOS).adapter_options


def test_the_world_targets_take_issue_44_names_in_fp8_mode(tmp_path: Path) -> None:
    run: dict[str, Any] = {
        "world_raw_fps": 27.5,
        "world_delivered_fps": 23.0,
        "world_memory_baseline_mib": {"realtime worker 0": 30000.0},
        "world_memory_after_mib": {"realtime worker 0": 30010.0},
    }
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({**run, "quantization": "fp8"}))
    fp8 = json.loads(bench("world", "--targets-of", str(saved)))
    assert fp8["helios_fp8_raw_fps"] == 27.5 and fp8["world_fp8_delivered_fps"] == 23.0
    targets = fp8["targets"]
    assert targets["helios_fp8_raw_fps"]["pass"] is True
    assert targets["world_fp8_delivered_fps"]["pass"] is False  # >= 24
    assert "world_raw_fps" not in targets and targets["world_memory_after_mib"]["pass"] is True
    saved.write_text(json.dumps(run))  # a run of before the modes: BF16, issue 31's names
    bf16 = json.loads(bench("world", "--targets-of", str(saved)))
    assert bf16["quantization"] is None and bf16["helios_fp8_raw_fps"] is None
    assert bf16["targets"]["world_delivered_fps"]["pass"] is True  # >= 20.3
    assert "helios_fp8_raw_fps" not in bf16["targets"]


def test_the_h3_entry_carries_the_plan_and_the_registry_judges_it() -> None:
    fp8 = entry(bench("h3_stack", "--quantization", "fp8", "--print-registry"), H3)
    assert fp8.spec.memory == MemoryPlan(quantization="fp8")
    assert fp8.compile == "blocks" and refused(fp8) is None  # the fused LoRA is no slot
    assert "fused_lora" in fp8.adapter_options
    group = bench(
        "h3_stack", "--offload", "group", "--offload-budget-gib", "24", "--compile", "off",
        "--print-registry",
    )  # fmt: skip
    model = entry(group, H3)
    assert model.spec.memory == MemoryPlan(offload="group", offload_budget_gib=24)
    assert refused(model) is None
    both = bench(
        "h3_stack", "--quantization", "fp8", "--offload", "group", "--compile", "off",
        "--print-registry",
    )  # fmt: skip
    model = entry(both, H3)
    assert model.spec.memory == MemoryPlan(quantization="fp8", offload="group")
    assert refused(model) is None  # FP8 streams through group offloading (the GPU probe)


def test_the_frontier_points_are_refused_or_left_out_before_any_up() -> None:
    points = "bf16-none,fp8-group-24,fp8-none-0.001,bf16-group-40,fp8-group-0.001"
    out = json.loads(bench("h3_frontier", "--toy", "--dry-run", "--points", points))
    assert out["weights_gib"]["fp8"] <= out["weights_gib"]["none"]
    found = {p["point"]: p for p in out["h3_offload_frontier"]}
    assert list(found) == points.split(",")
    plain = found["bf16-none"]
    assert "error" not in plain and entry(plain["registry"], H3).spec.memory is None
    assert "fused_lora" not in entry(plain["registry"], H3).adapter_options
    assert found["fp8-none-0.001"]["error"].startswith("not run: the weights alone hold")
    # every group point is run, FP8 as BF16, whatever its budget: the worker's own
    # refusal on this CPU, nothing of the benchmark's
    for label in ("bf16-group-40", "fp8-group-24", "fp8-group-0.001"):
        group = found[label]
        assert (group["offload"], group["compile"]) == ("group", "off")
        assert "not a CUDA GPU" in group["error"] and "do not combine" not in group["error"]
    assert found["fp8-group-24"]["quantization"] == "fp8"
    assert found["fp8-group-24"]["budget_gib"] == 24.0


def test_a_frontier_point_of_another_form_is_a_usage_error() -> None:
    done = _module("h3_frontier", "--dry-run", "--points", "fp16-none")
    assert done.returncode == 2
    assert "point 'fp16-none': write {bf16|fp8}-{none|model|group}[-BUDGET_GIB]" in done.stderr


# --- cuDNN attention (``--attention cudnn``) ------------------------------------------


def test_the_world_entries_carry_cudnn_attention_to_both_parts() -> None:
    both = ("--attention", "cudnn", "--quantization", "fp8")
    texts = json.loads(bench("world", "--tiny", *both, "--print-registry"))
    for part in ("stack", "takeover"):
        model = entry(texts[part], HELIOS)
        assert model.attention == "cudnn" and model.spec.attention == {"blocks": "cudnn"}
        assert model.spec.memory == MemoryPlan(quantization="fp8")  # the two combine
    plain = json.loads(bench("world", "--tiny", "--print-registry"))
    assert entry(plain["stack"], HELIOS).attention is None


def test_the_h3_entry_carries_cudnn_attention() -> None:
    model = entry(bench("h3_stack", "--attention", "cudnn", "--print-registry"), H3)
    assert model.attention == "cudnn"
    assert model.spec.attention == {"blocks": "cudnn", "token_refiner": "cudnn"}
    assert model.spec.memory is None and model.vsa_topk is None
    plain = entry(bench("h3_stack", "--print-registry"), H3)
    assert plain.spec.attention == {"blocks": "sdpa", "token_refiner": "sdpa"}


def _run(module: str, out: Path, *args: str) -> dict[str, Any]:
    """``module`` run as the GPU host runs it, with ``$OUT`` set: the JSON it wrote."""
    done = _module(module, *args, env={"OUT": str(out)})
    assert done.returncode == 0, done.stderr[-2000:]
    (written,) = out.glob("*.json")
    return {"file": written.name, **json.loads(written.read_text())}


CUDNN_OFF_GPU = "attention = 'cudnn' runs cuDNN's fused attention on a CUDA GPU, and device cpu"


def test_cudnn_runs_are_refused_on_the_cpu_and_record_the_backend(tmp_path: Path) -> None:
    """Both benchmarks reach the worker's own check before building or starting anything,
    and the evidence JSON, named after the mode, records ``attention``."""
    (tmp_path / "h3").mkdir()
    h3 = _run("h3_stack", tmp_path / "h3", "--toy", "--attention", "cudnn")
    assert h3["file"] == "gpu_h3_stack_cudnn.json" and h3["attention"] == "cudnn"
    assert h3["error"] == f"refused before up: model '{H3}': {CUDNN_OFF_GPU} is not one"
    (tmp_path / "world").mkdir()
    world = _run("world", tmp_path / "world", "--tiny", "--part", "raw", "--attention", "cudnn")
    assert world["file"] == "gpu_world_cudnn.json" and world["attention"] == "cudnn"
    assert world["world_raw_fps"] is None
    assert world["raw_refused"] == f"model 'helios-raw': {CUDNN_OFF_GPU} is not one"


# --- FP8 modulation (``--fp8-modulation``) --------------------------------------------

FP8_OFF_GPU = "quantization = 'fp8' needs a CUDA GPU of compute capability 8.9 or more"


def test_the_h3_entry_carries_fp8_modulation_and_its_run_is_named_after_it(
    tmp_path: Path,
) -> None:
    both = ("--quantization", "fp8", "--fp8-modulation")
    model = entry(bench("h3_stack", *both, "--print-registry"), H3)
    assert model.spec.memory == MemoryPlan(quantization="fp8", fp8_modulation=True)
    assert refused(model) is None
    h3 = _run("h3_stack", tmp_path, "--toy", *both)
    assert h3["file"] == "gpu_h3_stack_fp8_modulation.json" and h3["fp8_modulation"] is True
    assert h3["error"].startswith(f"refused before up: model '{H3}': {FP8_OFF_GPU}")
    alone = _module("h3_stack", "--fp8-modulation", "--print-registry")
    assert alone.returncode == 2 and "--fp8-modulation needs --quantization fp8" in alone.stderr


def test_the_quality_harness_carries_fp8_modulation_to_its_fp8_sides(tmp_path: Path) -> None:
    args = ("--random", "--only", "h3", "--combos", "--print-sides")
    sides = json.loads(bench("fp8_quality", *args, "--fp8-modulation"))["h3"]
    opted = {label for label, side in sides.items() if (side["memory"] or {}).get("fp8_modulation")}
    fp8 = {
        label
        for label, side in sides.items()
        if (side["memory"] or {}).get("quantization") == "fp8"
    }
    assert opted == fp8 == {"fp8", "fp8_compiled", "fp8_cancel", "fp8_offload_model"}
    assert sides["bf16"]["memory"] is None  # the baseline as loaded, modulation and all
    plain = json.loads(bench("fp8_quality", *args))["h3"]
    assert not any((side["memory"] or {}).get("fp8_modulation") for side in plain.values())
    run = _run("fp8_quality", tmp_path, "--tiny", "--only", "h3", "--fp8-modulation")
    assert run["file"] == "gpu_fp8_quality_modulation.json" and run["fp8_modulation"] is True
    h3 = run["models"]["h3"]
    assert h3["fp8_modulation"] is True
    assert h3["sides"]["bf16"]["transformer_gib"] > 0  # the tiny transformer's, on the CPU
    assert h3["sides"]["fp8"]["refused"] == f"model 'h3': {FP8_OFF_GPU} (FP8 matmuls), and " + (
        "device cpu is not a CUDA GPU"
    )


def test_fp8_components_write_the_per_component_form_to_both_h3_benchmarks() -> None:
    """``--fp8-components transformer,vae``: the entry's ``quantization`` table, which the
    registry reads as a plan on both components, in the stack's entry and in every FP8 side
    of the quality harness; refused without ``--quantization fp8``."""
    both = {"transformer": "fp8", "vae": "fp8"}
    args = ("--quantization", "fp8", "--fp8-components", "transformer,vae", "--print-registry")
    model = entry(bench("h3_stack", *args), H3)
    assert model.spec.memory == MemoryPlan(quantization=both)
    assert refused(model) is None
    sides = json.loads(
        bench("fp8_quality", "--random", "--only", "h3", "--print-sides", "--fp8-components",
              "transformer,vae")
    )["h3"]  # fmt: skip
    assert sides["fp8"]["memory"]["quantization"] == both and sides["bf16"]["memory"] is None
    alone = _module("h3_stack", "--fp8-components", "vae", "--print-registry")
    assert alone.returncode == 2 and "--fp8-components needs --quantization fp8" in alone.stderr


# --- channels-last VAE decoder (``--vae-channels-last``) ------------------------------


def test_the_world_entries_carry_vae_channels_last_to_both_parts() -> None:
    """The adapter option in both parts' entries, beside FP8 and cuDNN attention; none in
    a plain run's."""
    both = ("--vae-channels-last", "--attention", "cudnn", "--quantization", "fp8")
    texts = json.loads(bench("world", "--tiny", *both, "--print-registry"))
    for part in ("stack", "takeover"):
        model = entry(texts[part], HELIOS)
        assert model.adapter_options["vae_channels_last"] is True
        assert model.attention == "cudnn" and model.spec.memory == MemoryPlan(quantization="fp8")
    plain = json.loads(bench("world", "--tiny", "--print-registry"))
    assert "vae_channels_last" not in entry(plain["stack"], HELIOS).adapter_options


def test_a_channels_last_raw_run_times_that_layout_and_is_named_after_it(tmp_path: Path) -> None:
    """The raw part on the CPU sets the worker's layout on the pipeline it times (its
    decoder's weights read back channels-last), the JSON says so and is ``_cl``'s; a later
    part run without the option refuses the state, as it refuses another attention."""
    state = tmp_path / "state.json"
    (tmp_path / "raw").mkdir()
    raw = _run(
        "world", tmp_path / "raw", "--tiny", "--part", "raw", "--vae-channels-last",
        "--raw-chunks", "1", "--repeat", "1", "--state", str(state),
    )  # fmt: skip
    assert raw["file"] == "gpu_world_cl.json" and raw["vae_channels_last"] is True
    assert raw["raw_vae_decoder_channels_last"] is True and raw["world_raw_fps"] > 0
    stack = ("--tiny", "--part", "stack", "--state", str(state))
    done = _module("world", *stack)
    assert done.returncode != 0
    assert "vae_channels_last True, not False: pass the same --vae-channels-last" in done.stderr
