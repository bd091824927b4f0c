"""benchmarks/ is packages by subject, run as ``python -m benchmarks.<subject>.<script>``
from the repository root (issue 33): no script patches ``sys.path``, no benchmark module
imports one that imports it back, no module is over 500 lines, no test imports a
benchmark, and what the device scripts run exists. Read as source (AST and text): this
test imports no benchmark either."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
MAX_LINES = 500


def modules() -> dict[str, Path]:
    """Every benchmark module by its dotted name."""
    out = {}
    for path in sorted(BENCHMARKS.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(tree: ast.AST, package: str) -> Iterator[str]:
    """The modules a tree imports, at any depth (a function's imports too), with relative
    imports resolved against ``package``; ``from a import b`` yields ``a`` and ``a.b``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    """Benchmark module → the benchmark modules it imports."""
    mods = modules()
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        edges[name] = {m for m in imported(tree, package) if m in mods and m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


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
