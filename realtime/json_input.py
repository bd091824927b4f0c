"""Client JSON of the realtime WebSockets, parsed so that no input can raise past the
protocol: too deep for the parser, 5000-digit integers, ``NaN``, and values the rest of
the system cannot carry (lone UTF-16 surrogates such as ``"\\ud800"``, which cannot be
encoded as UTF-8, and nesting deeper than ``MAX_DEPTH``) all become a ``JsonInputError``
naming, where it can, the offending ``param``. Pure: no I/O."""

from __future__ import annotations

import json
from typing import Any

from models.errors import JsonInputError

MAX_DEPTH = 32  # no client event of either protocol nests half as deep


def parse(text: str | bytes) -> Any:
    """``text`` as JSON, checked by :func:`check`; raises :class:`JsonInputError`."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise JsonInputError("the message is nested too deeply") from None
    except ValueError as exc:  # also 5000-digit integers (int_max_str_digits)
        detail = "the message is not valid JSON"
        if "digits" in str(exc):
            detail += ": integers are limited to 4300 digits"
        raise JsonInputError(detail) from None
    # A lone surrogate can only come from a \\u escape (the frame itself is UTF-8), and
    # deep nesting needs as many brackets: most events (audio appends) need no walk.
    if isinstance(text, str):
        escaped, brackets = "\\u" in text, text.count("[") + text.count("{")
    else:
        escaped, brackets = b"\\u" in text, text.count(b"[") + text.count(b"{")
    if escaped or brackets > MAX_DEPTH:
        check(value, strings=escaped)
    return value


def check(value: Any, *, strings: bool = True) -> None:
    """Raise :class:`JsonInputError` for nesting deeper than ``MAX_DEPTH`` or (when
    ``strings``) a string or key that is not valid Unicode. Iterative: no recursion."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise JsonInputError(f"the message nests deeper than {MAX_DEPTH} levels", _param(path))
        if isinstance(item, dict):
            for key in item:
                if strings and not _encodable(key):
                    message = "a key is not valid Unicode (lone surrogate)"
                    raise JsonInputError(message, _param(path))
            # pushed in reverse, so the first offending value in document order is named
            stack.extend((item[key], (*path, key)) for key in reversed(item))
        elif isinstance(item, list):
            stack.extend((item[i], (*path, str(i))) for i in reversed(range(len(item))))
        elif strings and isinstance(item, str) and not _encodable(item):
            raise JsonInputError(
                f"{_param(path) or 'the message'} is not valid Unicode (lone surrogate)",
                _param(path),
            )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _param(path: tuple[str, ...]) -> str | None:
    if len(path) > 4:
        path = (*path[:4], "…")
    return ".".join(path) or None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
