"""A registry entry's memory plan (``quantization``, ``offload``, ``offload_budget_gib``,
``offload_blocks``; models/memory_plan.py, workers/pipelines/diffusers/shared/memory.py):
parsed into the spec, refused at load where it does not combine with the rest of the
entry (both features named, before the device is looked at), refused on a device that
cannot run it (the model, the field and the device named), and listed by ``/v1/models``.

Every refusal goes through the real registry load path (``PipelineRegistry.load_each``,
as a worker loads its models) on the CPU: that is how a worker reports a model it cannot
load, and ``/v1/models`` and ``/ready`` list it unavailable with that reason
(tests/integration/test_model_unavailable.py runs it through a worker and the API). What
needs a GPU (the FP8 matmuls, the offload hooks) is the GPU harness's:
benchmarks/gpu/fp8_quality.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from api.model_list import model_object
from models.memory_plan import MemoryPlan, MemoryReport, refused_combination
from models.registry import CatalogError, parse_registry
from storage.settings import LimitSettings
from tests.unit.diffusers_fixtures import tiny_ltx_pipeline, tiny_wan_entry, tiny_wan_pipeline
from workers.pipelines.diffusers.shared import fp8
from workers.pipelines.diffusers.shared.entry import DiffusersEntry
from workers.pipelines.diffusers.shared.memory import MemoryLayout
from workers.pipelines.diffusers.shared.offload import resolve_paths
from workers.pipelines.registry import PipelineRegistry


def one(text: str, name: str = "m") -> Any:
    return parse_registry(f'[[model]]\nname = "{name}"\n{text}')[name]


def wan(tmp_path: Path, top: str, spec: str = "") -> str:
    """A tiny Wan entry (saved once under ``tmp_path``) with ``top`` keys and a spec."""
    entry = tiny_wan_entry("acme/wan", tmp_path / "wan", top)
    return entry + (f"[model.spec]\n{spec}" if spec else "")


def reasons(text: str, device: str = "cpu", **registry: Any) -> dict[str, str]:
    """Each model of the registry ``text`` that cannot load on ``device``, with why."""
    failed = PipelineRegistry(parse_registry(text), device, **registry).load_each()
    return {name: f.reason for name, f in failed.items()}


# --- the registry ------------------------------------------------------------------


def test_the_fields_become_the_spec_s_plan() -> None:
    plain = one('adapter = "diffusers.wan"\npath = "/w"\n')
    assert plain.spec.memory is None  # nothing planned: loads as before
    short = one('adapter = "diffusers.wan"\npath = "/w"\nquantization = "fp8"\n')
    assert short.spec.memory == MemoryPlan(quantization="fp8")
    assert short.spec.memory.fp8_on("transformer") and short.spec.memory.fp8_on("transformer_2")
    assert not short.spec.memory.fp8_on("text_encoder")
    each = one(
        'adapter = "diffusers.wan"\npath = "/w"\n'
        'quantization = {transformer = "fp8", text_encoder = "none", vae = "none"}\n'
        'offload = "model"\noffload_budget_gib = 24\n'
    )
    plan = each.spec.memory
    assert plan.quantization == {"transformer": "fp8", "text_encoder": "none", "vae": "none"}
    assert (plan.offload, plan.offload_budget_gib) == ("model", 24)
    assert plan.fp8_on("transformer") and not plan.fp8_on("transformer_2")
    assert plan.describe() == (
        'quantization = {transformer = "fp8", text_encoder = "none", vae = "none"}, '
        "offload = 'model', offload_budget_gib = 24"
    )
    none = one('adapter = "diffusers.wan"\npath = "/w"\nquantization = "none"\n')
    assert none.spec.memory is None


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ('quantization = "fp16"', "quantization"),
        ('quantization = {transformer = "int8"}', "quantization"),
        ("quantization = {}", "name at least one component"),
        ('offload = "disk"', "offload"),
        ("offload_budget_gib = 0", "offload_budget_gib"),
        ('offload_blocks = ["text_encoder.encoder.block"]', "needs offload = 'group'"),
        ('offload = "group"\noffload_blocks = ["text_encoder"]', "component.path"),
    ],
)
def test_a_wrong_value_is_refused_when_the_registry_is_read(keys: str, words: str) -> None:
    with pytest.raises(CatalogError, match="model\\[0\\] \\(m\\)") as raised:
        one(f'adapter = "diffusers.wan"\npath = "/w"\n{keys}\n')
    assert words in str(raised.value)


# --- refused combinations: at load, both features named, before the device -----------


def test_fp8_and_per_request_lora_are_refused_naming_both(tmp_path: Path) -> None:
    text = wan(tmp_path, 'quantization = "fp8"\n', 'parameters = ["lora"]\n')
    (why,) = reasons(text).values()
    assert why.startswith("model 'acme/wan': quantization = 'fp8' and per-request LoRA")
    # FP8 on the text encoder only leaves the LoRA slot's transformer alone: the device
    # is what refuses it here
    text = wan(tmp_path, 'quantization = {text_encoder = "fp8"}\n', 'parameters = ["lora"]\n')
    assert "needs a CUDA GPU" in reasons(text)["acme/wan"]


@pytest.mark.parametrize(
    ("top", "spec", "both"),
    [
        ('offload = "model"\n', 'parameters = ["lora"]\n', ("offload = 'model'", "LoRA")),
        ('offload = "group"\ncompile = "blocks"\n', "", ("offload = 'group'", "compile")),
    ],
)
def test_each_refused_pair_names_both_features(
    tmp_path: Path, top: str, spec: str, both: tuple[str, str]
) -> None:
    (why,) = reasons(wan(tmp_path, top, spec)).values()
    assert "do not combine" in why and all(word in why for word in both), why
    assert "CUDA" not in why  # the pair, not the device


def test_offload_and_realtime_sessions_are_refused(tmp_path: Path) -> None:
    text = (
        f'[[model]]\nname = "acme/helios"\nadapter = "diffusers.helios"\npath = "{tmp_path}"\n'
        'offload = "group"\n'
    )
    assert reasons(text) == {
        "acme/helios": "model 'acme/helios': offload = 'group' and realtime sessions do not "
        "combine: a realtime worker steps one pipeline from several session threads, and "
        "offloading moves its weights per call"
    }


def test_a_worker_group_and_an_adapter_without_plans_refuse_one(tmp_path: Path) -> None:
    text = wan(tmp_path, 'devices = 2\nparallel = "cfg"\nquantization = "fp8"\n')
    assert "a worker group (devices = 2) do not combine" in reasons(text)["acme/wan"]
    text = '[[model]]\nname = "r"\nadapter = "reference.video"\noffload = "model"\n'
    assert reasons(text) == {
        "r": "model 'r': offload = 'model': its adapter 'reference.video' applies no memory "
        "plan (the diffusers adapters do)"
    }


def test_the_refusals_are_the_plan_s_alone() -> None:
    """What combines: FP8 with compiled blocks, a fused LoRA, cache tiers (nothing of the
    entry names them); model offload with compiled blocks; group offload with the default
    compile (off with it), and with FP8 (bit-equal to the resident FP8 model on an H100:
    docs/evidence/fp8_group_probe_h100_2026-12-06.json)."""
    fp8_plan = MemoryPlan(quantization="fp8")
    kw: dict[str, Any] = {"lora": False, "streaming": False, "devices": 1}
    assert refused_combination(fp8_plan, compile="blocks", **kw) is None
    assert refused_combination(MemoryPlan(offload="model"), compile="blocks", **kw) is None
    assert refused_combination(MemoryPlan(offload="group"), compile=None, **kw) is None
    fp8_group = MemoryPlan(quantization="fp8", offload="group", offload_budget_gib=24)
    assert refused_combination(fp8_group, compile=None, **kw) is None
    assert refused_combination(fp8_plan, compile=None, **{**kw, "streaming": True}) is None


def test_group_offload_leaves_the_blocks_eager_unless_told() -> None:
    cuda = torch.device("cuda")

    def entry(**options: Any) -> DiffusersEntry:
        return DiffusersEntry.of("A", "/w", options)  # type: ignore[arg-type]

    assert entry().compiles_blocks(cuda)
    assert entry(memory=MemoryPlan(offload="model")).compiles_blocks(cuda)
    assert not entry(memory=MemoryPlan(offload="group")).compiles_blocks(cuda)
    assert not entry(memory=MemoryPlan(quantization="fp8")).compiles_blocks(torch.device("cpu"))


# --- the device --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("top", "why"),
    [
        (
            'quantization = "fp8"\n',
            "quantization = 'fp8' needs a CUDA GPU of compute capability 8.9 or more (FP8 "
            "matmuls), and device cpu is not a CUDA GPU",
        ),
        (
            'offload = "model"\n',
            "offload = 'model' moves weights between the CPU and a GPU, and device cpu is "
            "not a CUDA GPU",
        ),
        (
            'offload = "group"\noffload_blocks = ["text_encoder.encoder.block"]\n',
            "offload = 'group' moves weights between the CPU and a GPU, and device cpu is "
            "not a CUDA GPU",
        ),
        (
            "offload_budget_gib = 8\n",
            "offload_budget_gib caps a CUDA GPU's memory, and device cpu is not one",
        ),
    ],
)
def test_the_cpu_is_refused_and_the_model_listed_unavailable(
    tmp_path: Path, top: str, why: str
) -> None:
    text = wan(tmp_path, top)
    assert reasons(text) == {"acme/wan": f"model 'acme/wan': {why}"}
    spec = parse_registry(text)["acme/wan"].spec
    listed = model_object(spec, LimitSettings(), None, reasons(text)["acme/wan"])
    assert (listed.available, listed.unavailable_reason) == (False, f"model 'acme/wan': {why}")
    assert listed.memory is not None and listed.memory.fp8_modules is None  # none loaded it


def test_a_gpu_older_than_ada_has_no_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    assert fp8.fp8_unsupported(torch.device("cuda:0")) == (
        "device cuda:0 (NVIDIA A100) has compute capability 8.0"
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8.fp8_unsupported(torch.device("cuda:0")) is None


def test_model_offload_on_a_modular_pipeline_is_refused_before_the_device(
    tmp_path: Path,
) -> None:
    text = (
        '[[model]]\nname = "h3"\nadapter = "diffusers.minimax_h3"\nweights = "random"\n'
        'offload = "model"\n'
    )
    assert reasons(text, random_weights=True) == {
        "h3": "model 'h3': offload = 'model' needs a pipeline with enable_model_cpu_offload, "
        "and MiniMaxH3ModularPipeline has none; use offload = 'group'"
    }


# --- a plan that loads (the FP8 step faked: torchao refuses the CPU) ------------------


def test_a_loaded_plan_is_reported_and_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny LTX (32 wide) through the registry with ``quantization = "fp8"``, the
    device check passed and torchao's quantization recorded instead of run: the rule's
    layers are handed to it, and the worker's report is what ``/v1/models`` lists."""
    quantized: list[tuple[str, dict[str, fp8.Fp8Kind], torch.device]] = []
    monkeypatch.setattr(fp8, "fp8_unsupported", lambda device: None)
    monkeypatch.setattr(fp8, "library_missing", lambda: None)

    def record(model: torch.nn.Module, kinds: dict[str, fp8.Fp8Kind], device: torch.device) -> None:
        quantized.append((type(model).__name__, kinds, device))

    monkeypatch.setattr(fp8, "quantize", record)
    path = tmp_path / "ltx"
    tiny_ltx_pipeline().save_pretrained(path)
    text = (
        f'[[model]]\nname = "acme/ltx"\nadapter = "diffusers.ltx"\npath = "{path}"\n'
        'dtype = "float32"\nquantization = "fp8"\n'
    )
    registry = PipelineRegistry(parse_registry(text), "cpu")
    assert registry.load_each() == {}
    ((cls, names, device),) = quantized
    assert cls == "LTXVideoTransformer3DModel" and device == torch.device("cpu")
    transformer = registry.job("acme/ltx").pipe.transformer  # type: ignore[attr-defined]
    assert list(names) == fp8.fp8_modules(transformer) and len(names) == 10
    assert set(names.values()) == {"dynamic"}  # no fp8_modulation: the rule's config alone
    report = registry.memory["acme/ltx"]
    assert report == MemoryReport(
        fp8_modules={"transformer": 10},
        bytes_saved=fp8.bytes_saved(transformer, list(names)),
        offload="none",
    )
    spec = parse_registry(text)["acme/ltx"].spec
    listed = model_object(spec, LimitSettings(), None, None, report).model_dump(mode="json")
    assert listed["memory"] == {
        "quantization": "fp8",
        "offload": "none",
        "offload_budget_gib": None,
        "offload_blocks": [],
        "fp8_modulation": False,
        "fp8_modules": 10,
        "fp8_components": {"transformer": 10},
        "fp8_weight_only_modules": 0,
        "fp8_weight_only_components": {},
        "bytes_saved": report.bytes_saved,
        "offload_host": None,
        "offload_host_bytes": None,
    }
    assert listed["available"] is True


# --- every path a plan names, resolved on the loaded pipeline -------------------------


def test_offload_blocks_resolve_to_block_lists_of_the_pipeline() -> None:
    pipe = tiny_wan_pipeline()
    plan = MemoryPlan(
        offload="group", offload_blocks=["text_encoder.encoder.block", "transformer.blocks"]
    )
    # diffusers' group offloading recurses into the named children, by name
    assert resolve_paths(pipe, plan, "m") == {"text_encoder": ["encoder"], "transformer": []}


@pytest.mark.parametrize(
    ("plan", "words"),
    [
        (
            MemoryPlan(quantization={"transformer": "fp8", "text_encodr": "none"}),
            "quantization names component 'text_encodr', which WanPipeline does not have "
            "(its modules: text_encoder, transformer, vae)",
        ),
        (
            MemoryPlan(offload="group", offload_blocks=["unet.blocks"]),
            "offload_blocks path 'unet.blocks': no component 'unet'",
        ),
        (
            MemoryPlan(offload="group", offload_blocks=["transformer.block"]),
            "offload_blocks path 'transformer.block': transformer has no module 'block'",
        ),
        (
            MemoryPlan(offload="group", offload_blocks=["transformer.condition_embedder"]),
            "offload_blocks path 'transformer.condition_embedder' is a "
            "WanTimeTextImageEmbedding, not a block list",
        ),
    ],
)
def test_a_wrong_path_is_named_never_skipped(plan: MemoryPlan, words: str) -> None:
    with pytest.raises(CatalogError) as raised:
        resolve_paths(tiny_wan_pipeline(), plan, "acme/wan")
    assert str(raised.value).startswith("model 'acme/wan': ") and words in str(raised.value)


def test_fp8_on_a_pipeline_without_a_transformer_or_on_nothing_is_refused() -> None:
    vae_only = SimpleNamespace(components={"vae": tiny_wan_pipeline().vae})
    with pytest.raises(CatalogError, match="quantizes the transformer\\* components"):
        resolve_paths(vae_only, MemoryPlan(quantization="fp8"), "m")
    # the tiny Wan's blocks are 24 wide: nothing of it qualifies, which is said, not skipped
    layout = MemoryLayout("acme/wan", MemoryPlan(quantization="fp8"))
    with pytest.raises(CatalogError, match="on transformer makes nothing FP8: none of its 26"):
        layout.place(tiny_wan_pipeline(), "cpu")


# --- the budget of weights built on the device, the cache handed back ------------------


def _placing(monkeypatch: pytest.MonkeyPatch, built_there: bool) -> list[Any]:
    """``MemoryLayout.place`` on a CUDA device stood in for: what it does, in order."""
    from workers.pipelines.diffusers.shared import memory

    calls: list[Any] = []

    def budget(plan: MemoryPlan, device: torch.device, held: int = 0) -> int:
        calls.append(("budget", held))
        return 1

    monkeypatch.setattr(memory, "weights_on_device", lambda pipe, device: built_there)
    monkeypatch.setattr(memory, "offload", lambda *args: calls.append("offload"))
    monkeypatch.setattr(memory, "set_budget", budget)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 5 << 30)
    plan = MemoryPlan(offload="group", offload_budget_gib=24)
    MemoryLayout("acme/wan", plan).place(tiny_wan_pipeline(), "cuda")
    return calls


def test_weights_loaded_on_the_host_are_placed_under_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _placing(monkeypatch, built_there=False) == [("budget", 0), "offload", "empty_cache"]


def test_weights_built_on_the_device_take_the_budget_once_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``weights = "random"`` builds them on the GPU in their loaded dtype: a budget set
    first would count them at that size, so it is set once they are placed (offloaded,
    FP8) and the cached blocks handed back, against what they then hold."""
    assert _placing(monkeypatch, built_there=True) == [
        "offload",
        "empty_cache",
        ("budget", 5 << 30),
    ]


def test_a_budget_under_what_the_placed_weights_hold_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._utils import _get_device_index

    from workers.pipelines.diffusers.shared.offload import set_budget, weights_on_device

    fractions: list[float] = []
    props = SimpleNamespace(total_memory=80 << 30)

    def set_fraction(fraction: float, device: Any = None) -> None:
        # torch's own check of the device argument: an index-less "cuda" is refused
        # (ValueError), as a worker on device "cuda" met it on a GPU
        assert _get_device_index(device) == 0
        fractions.append(fraction)

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    plan = MemoryPlan(offload="group", offload_budget_gib=24)
    cuda = torch.device("cuda")  # a worker's device as written: no index
    with pytest.raises(CatalogError, match=r"hold 30\.0 GiB, over the budget"):
        set_budget(plan, cuda, held=30 << 30)
    assert fractions == []
    assert set_budget(plan, cuda, held=20 << 30) == 24 << 30 and fractions == [0.3]
    # a pipeline on the host is not built on the device; nothing is on a CPU "device"
    assert not weights_on_device(tiny_wan_pipeline(), cuda)
    assert not weights_on_device(tiny_wan_pipeline(), torch.device("cpu"))
