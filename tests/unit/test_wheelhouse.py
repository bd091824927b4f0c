"""The device wheelhouse's trim of diffusers (benchmarks/device/wheelhouse.py's
DIFFUSERS_PIPELINES) keeps every pipeline package that the code run on the GPU host imports:
the adapters (workers/pipelines/diffusers/) and the GPU benchmarks (benchmarks/gpu/), by
``from diffusers.pipelines.<name>…``, by a name of diffusers' (``from diffusers import
WanPipeline``, ``diffusers.WanPipeline``, ``getattr(diffusers, "WanPipeline")``), and the
pipeline packages those import in turn. longcat.sh died at load on ``No module named
'diffusers.pipelines.longcat_audio_dit'`` while the list lacked it.

Read as source (ast), never imported: not the adapters, not the wheelhouse script (no test
imports a benchmark), not diffusers (whose installed files are only read, to map a name like
``WanPipeline`` to its package ``wan`` through ``diffusers/pipelines/__init__.py``'s
``_import_structure``)."""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / "benchmarks" / "device" / "wheelhouse.py"
USERS = [ROOT / "workers" / "pipelines" / "diffusers", ROOT / "benchmarks" / "gpu"]


def kept() -> set[str]:
    """DIFFUSERS_PIPELINES as wheelhouse.py writes it (a literal set)."""
    for node in ast.parse(WHEELHOUSE.read_text(), str(WHEELHOUSE)).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "DIFFUSERS_PIPELINES"
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, set)
            return value
    raise AssertionError("no DIFFUSERS_PIPELINES in wheelhouse.py")


def unkept(packages: set[str]) -> set[str]:
    """Those of ``packages`` the wheelhouse would drop."""
    return packages - kept()


def diffusers_dir() -> Path:
    """The installed diffusers package's folder, found without importing it."""
    spec = importlib.util.find_spec("diffusers")
    assert spec is not None and spec.origin is not None, "diffusers: pip install -e '.[dev]'"
    return Path(spec.origin).parent


def subpackages(root: Path) -> set[str]:
    """diffusers/pipelines/<name>/: the packages the wheelhouse keeps or drops."""
    return {p.parent.name for p in (root / "pipelines").glob("*/__init__.py")}


def pipeline_names(root: Path) -> dict[str, str]:
    """Each name of diffusers/pipelines/__init__.py's ``_import_structure`` → its package
    (``WanPipeline`` → ``wan``): the literal dict, ``[key] = [...]`` and
    ``[key].extend([...])`` / ``.append(...)``. Keys that are modules, not packages
    (``pipeline_utils``), are left out: the wheelhouse keeps every module of pipelines/."""
    packages = subpackages(root)
    out: dict[str, str] = {}

    def add(key: object, names: object) -> None:
        if isinstance(key, str) and key.split(".")[0] in packages:
            for name in names if isinstance(names, list) else [names]:
                if isinstance(name, str):
                    out.setdefault(name, key.split(".")[0])

    def literal(node: ast.expr) -> object:
        try:
            return ast.literal_eval(node)
        except ValueError:
            return None

    def structure_key(node: ast.expr) -> object:
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "_import_structure"
        ):
            return literal(node.slice)
        return None

    source = root / "pipelines" / "__init__.py"
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == "_import_structure":
                value = literal(node.value)
                for key, names in (value if isinstance(value, dict) else {}).items():
                    add(key, names)
            else:
                add(structure_key(target), literal(node.value))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("extend", "append")
            and node.args
        ):
            add(structure_key(node.func.value), literal(node.args[0]))
    return out


def referenced(tree: ast.AST, package: str = "") -> Iterator[tuple[str, str | None]]:
    """(module, name) for each diffusers module or name the tree reaches: ``from M import
    N`` gives (M, N), ``import M`` (M, None), ``diffusers.N`` and ``getattr(diffusers,
    "N")`` ("diffusers", N). Relative imports are resolved against ``package`` (the dotted
    package of the file, for files inside diffusers)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                module = ".".join([*anchor, module] if module else anchor)
            for alias in node.names:
                yield module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "diffusers"
        ):
            yield "diffusers", node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "diffusers"
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            yield "diffusers", node.args[1].value


def pipelines_of(
    pairs: Iterator[tuple[str, str | None]], names: dict[str, str], packages: set[str]
) -> set[str]:
    """The pipeline packages that ``referenced()``'s pairs need."""
    found: set[str] = set()
    for module, name in pairs:
        parts = module.split(".")
        if parts[:2] == ["diffusers", "pipelines"] and len(parts) > 2:
            found.add(parts[2])
        elif parts == ["diffusers", "pipelines"] and name in packages:
            found.add(name)
        elif parts in (["diffusers"], ["diffusers", "pipelines"]) and name in names:
            found.add(names[name])
    return found & packages


def used_by_source(source: str, names: dict[str, str], packages: set[str]) -> set[str]:
    """The pipeline packages one file of ours needs."""
    return pipelines_of(referenced(ast.parse(source)), names, packages)


def imported_by_pipeline(root: Path, package: str, packages: set[str]) -> set[str]:
    """The other pipeline packages diffusers' pipelines/<package>/ imports (any file, any
    depth: a function's imports too)."""
    found: set[str] = set()
    for path in (root / "pipelines" / package).rglob("*.py"):
        # the file's package: its folder (for an __init__.py, the package itself)
        dotted = ".".join(["diffusers", *path.relative_to(root).parent.parts])
        pairs = referenced(ast.parse(path.read_text(), str(path)), dotted)
        found |= pipelines_of(pairs, {}, packages)
    return found - {package}


def needed(direct: set[str], root: Path, packages: set[str]) -> set[str]:
    """``direct`` and, transitively, the pipeline packages they import."""
    todo, done = sorted(direct), set()
    while todo:
        package = todo.pop()
        if package not in done:
            done.add(package)
            todo += sorted(imported_by_pipeline(root, package, packages) - done)
    return done


def ours() -> Iterator[Path]:
    for folder in USERS:
        yield from sorted(folder.rglob("*.py"))


def test_the_list_is_read_from_wheelhouse_py() -> None:
    assert {"wan", "ltx", "longcat_audio_dit"} <= kept()


def test_a_pipeline_the_list_lacks_is_found() -> None:
    """A synthetic adapter: each way of reaching a pipeline names its package, and an
    adapter that starts using one the list lacks (``flux``) is reported."""
    names = {"WanPipeline": "wan", "FluxPipeline": "flux", "LTXPipeline": "ltx"}
    packages = {"wan", "flux", "ltx", "helios", "cogvideo", "mochi", "sana"}
    source = """
import diffusers
from diffusers import AutoencoderKLWan, WanPipeline
from diffusers.pipelines.helios import pipeline_helios
from diffusers.pipelines import cogvideo
from diffusers.utils.torch_utils import randn_tensor


def load():
    from diffusers.pipelines.mochi.pipeline_mochi import MochiPipeline
    return diffusers.FluxPipeline, getattr(diffusers, "LTXPipeline"), diffusers.__version__
"""
    used = used_by_source(source, names, packages)
    assert used == {"wan", "helios", "cogvideo", "mochi", "flux", "ltx"}
    assert unkept(used) == {"mochi", "flux"}
    assert unkept(used_by_source("from diffusers import WanPipeline\n", names, packages)) == set()
    flux = "from diffusers import FluxPipeline, WanPipeline\n"
    assert unkept(used_by_source(flux, names, packages)) == {"flux"}
    plain = "import torch\nfrom diffusers.utils import x\n"
    assert used_by_source(plain, names, packages) == set()


def test_names_map_to_their_pipeline_package() -> None:
    root = diffusers_dir()
    names = pipeline_names(root)
    assert names["WanPipeline"] == "wan"
    assert names["CogVideoXPipeline"] == "cogvideo"
    assert names["LongCatAudioDiTPipeline"] == "longcat_audio_dit"
    assert "DiffusionPipeline" not in names  # pipeline_utils: a module, always kept


def test_pipeline_imports_are_followed(tmp_path: Path) -> None:
    """A kept package's own imports of another pipeline package count too (relative ones
    resolved): here ``a`` needs ``b`` needs ``c``; ``d`` is left alone."""
    for name, body in {
        "a": "from ..b.pipeline_b import x\n",
        "b": "def f():\n    from ...pipelines.c import y\n",
        "c": "from ..pipeline_utils import DiffusionPipeline\n",
        "d": "",
    }.items():
        folder = tmp_path / "pipelines" / name
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
        (folder / f"pipeline_{name}.py").write_text(body)
    packages = subpackages(tmp_path)
    assert packages == {"a", "b", "c", "d"}
    assert needed({"a"}, tmp_path, packages) == {"a", "b", "c"}


def test_the_wheelhouse_keeps_every_pipeline_the_adapters_import() -> None:
    root = diffusers_dir()
    names, packages = pipeline_names(root), subpackages(root)
    direct: dict[str, set[str]] = {}
    for path in ours():
        for package in used_by_source(path.read_text(), names, packages):
            direct.setdefault(package, set()).add(str(path.relative_to(ROOT)))
    assert {"wan", "ltx", "ltx2", "cogvideo", "stable_audio", "helios", "longcat_audio_dit"} <= set(
        direct
    ), "the adapters' imports were not all read"
    missing = unkept(needed(set(direct), root, packages))
    assert not missing, {
        package: sorted(direct.get(package, {"(imported by a kept pipeline)"}))
        for package in sorted(missing)
    }


def test_every_kept_package_exists() -> None:
    """A misspelt name keeps nothing (wheelhouse.py's build refuses one too)."""
    assert kept() <= subpackages(diffusers_dir())


def literal_of(name: str) -> object:
    """A literal assignment of wheelhouse.py (``PINS``, ``_IMAGE_PINS``), read as source."""
    for node in ast.parse(WHEELHOUSE.read_text(), str(WHEELHOUSE)).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no {name} in wheelhouse.py")


def test_the_wheelhouse_carries_torchao_which_fp8_weights_import() -> None:
    """An FP8 entry (``quantization = "fp8"``) imports torchao in the adapters (lazily:
    shared/fp8.py), and benchmarks/gpu/fp8_quality.py reports its version; the GPU image
    has none, so the wheelhouse carries the release the fp8 extra asks for."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    importers = sorted(
        str(path.relative_to(ROOT))
        for path in ours()
        if any(
            module.split(".")[0] == "torchao"
            for module, _ in referenced(ast.parse(path.read_text()))
        )
    )
    assert "workers/pipelines/diffusers/shared/fp8.py" in importers
    image = literal_of("_IMAGE_PINS")
    assert isinstance(image, str) and "torchao==" not in image
    pins = literal_of("PINS")
    assert isinstance(pins, list)
    (pin,) = [p for p in pins if p.startswith("torchao==")]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (wanted,) = [
        Requirement(r)
        for r in project["optional-dependencies"]["fp8"]
        if Requirement(r).name == "torchao"
    ]
    assert wanted.specifier.contains(Version(pin.split("==")[1]))
