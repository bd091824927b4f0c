"""A request's ``lora`` → the :class:`~models.job_specs.LoraSpec` a worker runs, and the
catalog of adapters the server offers by name.

Adapters come only from the allow-listed roots of ``OMNIQ_LORA__ROOTS``: directories, and
``s3://bucket/prefix`` roots. The wire shape is vLLM-Omni's (its ComfyUI node sends it,
as JSON text in multipart forms), :class:`~models.videos.LoraRequest`, which has checked
the types and the keys by the time it gets here::

    {"name": "style", "local_path": "/loras/style.safetensors", "scale": 0.8, "int_id": null}

Rules (each refusal an :class:`InvalidRequest` naming its parameter, raised before
anything is stored):

* ``local_path``: an absolute path; symlinks and ``..`` are resolved before the
  containment check, so a link out of a root is refused. A ``*.safetensors`` file, or an
  adapter directory holding ``pytorch_lora_weights.safetensors`` (what diffusers'
  ``save_lora_weights`` writes) or exactly one ``*.safetensors``. ``s3://bucket/key`` is
  taken only under a declared S3 root, and must exist (a HEAD with the API's S3 client).
  Any other URL (``http(s)://``, ``file://`` ...) is refused.
* ``name`` alone: an adapter of the catalog (every ``*.safetensors`` file and adapter
  directory directly under a directory root, named by its stem; the first root wins).
  With ``local_path``, ``name`` is only a label.
* ``scale``: a finite number, within ``[-max_scale, max_scale]``; default 1.
* ``int_id``: 0 or null only (vLLM's "not set"). In vLLM it is the adapter's key in
  the engine's LoRA cache; here an adapter is known by its path and its content (the S3
  ETag, or the file's size and mtime: the worker's cache key), so an id could neither
  select nor pin one, and any other value is refused rather than recorded unused.

Blocking (stat, S3): the API calls :func:`resolve_lora` on a thread.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from models.errors import InvalidRequest, ServiceUnavailable, must_be_within
from models.job_specs import LoraSpec
from models.videos import LoraRequest
from storage.settings import LoraSettings

WEIGHTS_NAME = "pytorch_lora_weights.safetensors"  # diffusers' save_lora_weights
_SUFFIX = ".safetensors"
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True)
class LoraEntry:
    """One adapter of the catalog: its name and where its weights are."""

    name: str
    path: str


def catalog(settings: LoraSettings) -> list[LoraEntry]:
    """The adapters offered by name: every ``*.safetensors`` file and adapter directory
    directly under each directory root (S3 roots are not listed), sorted by name; a name
    found under two roots is the first root's."""
    seen: dict[str, LoraEntry] = {}
    for root in settings.roots:
        if root.startswith("s3://"):
            continue
        try:
            children = sorted(Path(root).iterdir())
        except OSError:
            continue
        for child in children:
            weights = _weights_file(child)
            if weights is None:
                continue
            name = child.name.removesuffix(_SUFFIX) if child.is_file() else child.name
            seen.setdefault(name, LoraEntry(name, str(weights)))
    return sorted(seen.values(), key=lambda e: e.name)


def resolve_lora(lora: LoraRequest, settings: LoraSettings, s3_client: Any = None) -> LoraSpec:
    """Resolve where a request's adapter is and check its scale (see the module
    docstring); ``s3_client`` checks that an ``s3://`` adapter exists."""
    name, local_path = (lora.name or "").strip(), (lora.local_path or "").strip()
    if lora.int_id:
        raise InvalidRequest(
            "lora.int_id cannot act here: an adapter is known by its name or local_path and "
            "its content, not by a cache id; leave it out (or 0 / null)",
            param="lora.int_id",
        )
    scale = _scale(lora.scale, settings)
    if not settings.roots:
        param = "lora.local_path" if local_path else "lora.name"
        raise InvalidRequest("this server takes no LoRA adapters (no lora roots)", param=param)

    version: str | None = None
    if local_path:
        if local_path.startswith("s3://"):
            path, version = _s3_path(local_path, settings, s3_client)
        else:
            path = _local_path(local_path, settings)
        label = name or _stem(path)
    elif name:
        entry = next((e for e in catalog(settings) if e.name == name), None)
        if entry is None:
            raise InvalidRequest(
                f"lora.name {name!r} is not an adapter of this server "
                "(GET /v1/models lists them), and no lora.local_path was given",
                param="lora.name",
            )
        path, label = entry.path, name
    else:
        raise InvalidRequest("lora needs a name or a local_path", param="lora.name")
    return LoraSpec(name=label, path=path, scale=scale, version=version)


def _scale(value: float | None, settings: LoraSettings) -> float:
    if value is None:
        return 1.0
    top = settings.max_scale
    if not -top <= value <= top:  # finite: LoraRequest refused NaN and infinities
        raise InvalidRequest(must_be_within("lora.scale", -top, top), param="lora.scale")
    return value


def _refuse(message: str) -> InvalidRequest:
    return InvalidRequest(message, param="lora.local_path")


def _local_path(text: str, settings: LoraSettings) -> str:
    """``text`` with symlinks and ``..`` resolved, inside a directory root, naming an
    adapter file (a directory: its weights file)."""
    if _URL_RE.match(text):
        raise _refuse("lora.local_path must be a path on the server or an s3:// URL")
    if "\x00" in text or not os.path.isabs(text):
        raise _refuse("lora.local_path must be an absolute path")
    try:
        real = Path(text).resolve(strict=True)
    except (OSError, RuntimeError):
        real = None
    roots = [Path(r).resolve() for r in settings.roots if not r.startswith("s3://")]
    inside = real is not None and any(real == r or real.is_relative_to(r) for r in roots)
    if not inside:
        # The same answer for "outside" and "missing": probing the file system through
        # this parameter tells nothing about what lies outside the roots.
        raise _refuse("lora.local_path is not an adapter under this server's lora roots")
    assert real is not None
    weights = _weights_file(real)
    if weights is None:
        raise _refuse(
            "lora.local_path must be a .safetensors file or a directory holding "
            f"{WEIGHTS_NAME} (or exactly one .safetensors file)"
        )
    return str(weights)


def _weights_file(path: Path) -> Path | None:
    """The adapter weights ``path`` names: itself (a ``*.safetensors`` file), or within a
    directory its ``pytorch_lora_weights.safetensors`` or only ``*.safetensors``."""
    try:
        if path.is_file():
            return path if path.name.endswith(_SUFFIX) else None
        if not path.is_dir():
            return None
        if (path / WEIGHTS_NAME).is_file():
            return (path / WEIGHTS_NAME).resolve()
        files = [p for p in path.iterdir() if p.name.endswith(_SUFFIX) and p.is_file()]
    except OSError:
        return None
    return files[0].resolve() if len(files) == 1 else None


def _stem(path: str) -> str:
    p = Path(path.removeprefix("s3://"))
    if p.name == WEIGHTS_NAME:
        return p.parent.name
    return p.name.removesuffix(_SUFFIX)


def _s3_path(uri: str, settings: LoraSettings, client: Any) -> tuple[str, str | None]:
    """``s3://bucket/key`` under a declared S3 root, existing: the URI and its ETag."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    parts = key.split("/")
    if not bucket or not key or any(p in ("", ".", "..") for p in parts):
        raise _refuse("lora.local_path must look like s3://bucket/path/adapter.safetensors")
    if not key.endswith(_SUFFIX):
        raise _refuse("an s3:// lora.local_path must name a .safetensors object")
    under = False
    for root in settings.roots:
        if not root.startswith("s3://"):
            continue
        rbucket, _, rprefix = root.removeprefix("s3://").partition("/")
        rprefix = rprefix.strip("/")
        if rbucket == bucket and (not rprefix or key.startswith(rprefix + "/")):
            under = True
    if not under:
        raise _refuse("lora.local_path is not an adapter under this server's lora roots")
    if client is None:
        raise _refuse("this server cannot read s3:// adapters")
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        raise _refuse("lora.local_path is not an adapter under this server's lora roots") from exc
    except BotoCoreError as exc:  # transient: the client may retry
        raise ServiceUnavailable("object storage failed", code="storage_error") from exc
    etag = head.get("ETag")
    return f"s3://{bucket}/{key}", str(etag).strip('"') if etag else None
