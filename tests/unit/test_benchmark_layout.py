"""benchmarks/ is packages by subject, run as ``python -m benchmarks.<subject>.<script>``
from the repository root (issue 33): no script patches ``sys.path``, no benchmark module
imports one that imports it back, no module is over 500 lines, no test imports a
benchmark, and what the device scripts run exists. Read as source (AST and text): this
test imports no benchmark either."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import import_graph
from tests.import_graph import cycles, imported

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
MAX_LINES = 500


def modules() -> dict[str, Path]:
    """Every benchmark module by its dotted name."""
    return import_graph.modules(ROOT, ["benchmarks"])


def graph() -> dict[str, set[str]]:
    """Benchmark module → the benchmark modules it imports."""
    return import_graph.graph(modules())


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("from . import x\nfrom .y import z\ndef f():\n    import benchmarks.q\n")
    assert set(imported(tree, "benchmarks.gpu")) >= {
        "benchmarks.gpu.x",
        "benchmarks.gpu.y",
        "benchmarks.gpu.y.z",
        "benchmarks.q",
    }


def test_no_import_cycle_in_benchmarks() -> None:
    assert cycles(graph()) == []


def test_every_benchmark_directory_is_a_package() -> None:
    dirs = {p.parent for p in BENCHMARKS.rglob("*.py")}
    assert [d for d in sorted(dirs) if not (d / "__init__.py").exists()] == []


def test_no_sys_path_patch() -> None:
    patched = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                patched.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    for path in BENCHMARKS.rglob("*.sh"):  # their inline Python too
        lines = enumerate(path.read_text().splitlines(), 1)
        patched += [f"{path.relative_to(ROOT)}:{n}" for n, line in lines if "sys.path" in line]
    assert patched == []


def test_no_benchmark_module_over_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_test_imports_a_benchmark() -> None:
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        package = ".".join(path.relative_to(ROOT).parent.parts)
        names = set(imported(tree, package))
        # importlib by name or by file, as tests/unit/test_device_wheelhouse.py once did
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("import_module", "spec_from_file_location")
            ):
                names |= {ast.unparse(a) for a in node.args if "benchmarks" in ast.unparse(a)}
        if any(n == "benchmarks" or n.startswith("benchmarks") for n in names):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_what_the_device_scripts_run_exists() -> None:
    """``python -m benchmarks.X``, ``run_bench X`` (bench.sh) and ``source benchmarks/…``
    in the device scripts each name a file that is there."""
    missing = []
    for path in sorted(BENCHMARKS.rglob("*.sh")):
        text = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
        wanted = [m.replace(".", "/") + ".py" for m in re.findall(r"-m (benchmarks\.[\w.]+)", text)]
        wanted += [
            f"benchmarks/{m.replace('.', '/')}.py" for m in re.findall(r"run_bench ([\w.]+)", text)
        ]
        wanted += re.findall(r"^\s*source (benchmarks/\S+)", text, flags=re.M)
        wanted += re.findall(r"--workload (benchmarks/\S+)", text)
        missing += [f"{path.name}: {w}" for w in wanted if not (ROOT / w).exists()]
    assert missing == []
