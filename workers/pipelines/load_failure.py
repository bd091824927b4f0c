"""Why a registry entry cannot load, in one line an operator can act on: the path, and
what is missing there.

:func:`missing_weights` looks before a model loads (no import of its adapter, so a worker
with a mistyped path says so in microseconds): the path does not exist, or a component
folder its ``model_index.json`` lists is not there. :func:`load_failure` reads the
exception a load raised: the file diffusers or transformers did not find, a Python module
that is not installed, the device's memory; anything else is its exception's class, never
its text (the traceback goes to the worker's log). A :class:`LoadFailure` also says
whether a restart could help (``config``: no, the files or the install must change).

Each reason leaves out the model's name: every place that shows one names the model
(``/v1/models`` entries, ``/ready``'s ``unavailable_models``, the 503 and the job error:
``models.errors.model_unavailable_message``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from models.registry import CatalogError, ServedModel

# diffusers: "Error no file named model_index.json found in directory /w/wan."
_NO_FILE_IN = re.compile(r"no file named (\S+) found in directory (.+?)\.?$")
# transformers: "/w/wan/tokenizer does not appear to have a file named config.json."
_NO_FILE_NAMED = re.compile(r"^(\S+) does not appear to have a file named (\S+?)\.?$")
_NOT_A_PATH = "is neither a valid local path nor a valid repo id"


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """Why one model did not load (one line, without the model's name), and whether it
    is its configuration (files, install, registry) that a restart cannot change."""

    reason: str
    config: bool = True


def missing_weights(model: ServedModel) -> LoadFailure | None:
    """What is missing at ``model.path`` before anything loads, or None when nothing is
    seen missing (the load may still fail; :func:`load_failure` then says why)."""
    if model.weights != "checkpoint" or model.path is None:
        return None
    path = Path(model.path)
    if not path.exists():
        return LoadFailure(f"path {model.path} does not exist")
    index = path / "model_index.json"
    if not index.is_file():
        return None  # a single file, a modular pipeline: the adapter knows its layout
    try:
        listed = json.loads(index.read_text())
    except (OSError, ValueError):
        return LoadFailure(f"path {model.path}: model_index.json is not readable JSON")
    if not isinstance(listed, dict):
        return LoadFailure(f"path {model.path}: model_index.json is not a JSON object")
    for name, entry in listed.items():
        # a component is ``[library, class]``; ``[null, null]`` is an optional one left out
        component = isinstance(entry, list) and len(entry) == 2 and None not in entry
        if not name.startswith("_") and component and not (path / name).is_dir():
            return LoadFailure(
                f"path {model.path}: no {name}/ folder, which its model_index.json lists"
            )
    return None


def load_failure(model: ServedModel, exc: BaseException) -> LoadFailure:
    """The one-line reason ``exc`` (raised by building or loading ``model``'s adapter)
    stands for."""
    where = f"path {model.path}" if model.path else f"adapter {model.adapter}"
    if isinstance(exc, CatalogError):  # ours: the entry does not fit its adapter
        return LoadFailure(str(exc))
    if isinstance(exc, ModuleNotFoundError):
        return LoadFailure(f"{where}: the Python module {exc.name!r} is not installed")
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, (OSError, ValueError)):
        if _NOT_A_PATH in message:
            return LoadFailure(f"path {model.path} does not exist")
        if found := _NO_FILE_IN.search(message):
            return LoadFailure(f"{where}: no {_under(model, found[2], found[1])}")
        if found := _NO_FILE_NAMED.search(message):
            return LoadFailure(f"{where}: no {_under(model, found[1], found[2])}")
        if isinstance(exc, FileNotFoundError) and exc.filename:
            return LoadFailure(f"{where}: no {_under(model, str(exc.filename), '')}")
    name = type(exc).__name__
    if name == "OutOfMemoryError" or isinstance(exc, MemoryError):
        return LoadFailure(f"{where}: out of memory while loading", config=False)
    return LoadFailure(
        f"{where}: {name} while loading (the worker's log has the traceback)", config=False
    )


def _under(model: ServedModel, directory: str, file: str) -> str:
    """``directory/file``, relative to the model's path when it is inside it."""
    full = os.path.join(directory, file) if file else directory
    if model.path:
        root = os.path.normpath(model.path)
        normal = os.path.normpath(full)
        if normal.startswith(root + os.sep):
            return os.path.relpath(normal, root)
    return full
