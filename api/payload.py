"""What a create request may carry: strict JSON decoding and the checks every decoded
value passes before validation, so that no odd input reaches the database as a 500.

``loads`` never raises anything but :class:`InvalidRequest`: a number with too many
digits (Python refuses to parse more than 4300), JSON nested deeper than the parser's
stack, ``NaN``/``Infinity`` literals, numbers that overflow a float (``1e999``) and
malformed text all become a 400 naming the parameter. ``check_values`` walks the decoded
fields iteratively and refuses strings PostgreSQL cannot store (NUL, lone surrogates) and
nesting deeper than ``MAX_DEPTH``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from models.errors import InvalidRequest

# No request field nests deeper (``extra_params.key``, ``lora.weights``, ...).
MAX_DEPTH = 32
# More digits than any int64 or float needs; longer numbers are refused, not parsed.
MAX_DIGITS = 40
# A string with NUL or a lone UTF-16 surrogate (JSON ``"\ud800"``).
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
# Strings and brackets of JSON text: finds the top-level key of a too-deep value.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"\s*:?|[\[\]{}]')


class _Refused:
    """A JSON number or constant that ``loads`` will not turn into a value."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _parse_int(text: str) -> int | _Refused:
    if len(text.lstrip("-")) > MAX_DIGITS:
        return _Refused(f"has more than {MAX_DIGITS} digits")
    return int(text)


def _parse_float(text: str) -> float | _Refused:
    if len(text) > MAX_DIGITS * 2:
        return _Refused(f"has more than {MAX_DIGITS * 2} characters")
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON columns cannot store it either
        return _Refused("must be a finite number")
    return value


def _parse_constant(text: str) -> _Refused:
    return _Refused(f"must be a finite number, not {text}")


def loads(text: str | bytes, param: str | None = None) -> Any:
    """Decode JSON text; ``param`` names the field it came from (None: the request body).
    Values are checked with :func:`check_values` under that name."""
    try:
        value = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except RecursionError as exc:
        where = param or _deep_key(text)
        raise InvalidRequest(
            f"{where or 'the JSON body'} is nested too deeply", param=where, code="invalid_body"
        ) from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        what = f"{param} must be valid JSON" if param else "the body must be valid JSON"
        raise InvalidRequest(what, param=param, code="invalid_body") from exc
    check_values(value, param)
    return value


def check_values(value: Any, root: str | None = None) -> None:
    """Refuse (400 naming the path) refused numbers, NUL and lone surrogates in any key or
    string, and containers nested deeper than :data:`MAX_DEPTH`."""
    stack: list[tuple[str | None, Any, int]] = [(root, value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, _Refused):
            raise InvalidRequest(f"{path or 'a number in the body'} {item.reason}", param=path)
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise InvalidRequest(
                    f"{path or 'the JSON body'} is nested more than {MAX_DEPTH} levels deep",
                    param=path,
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    key_path = _join(path, str(key))
                    _check_text(str(key), key_path)
                    stack.append((key_path, child, depth + 1))
            else:
                stack.extend((path, child, depth + 1) for child in item)


def storable(text: str) -> bool:
    """Whether every database can store and compare ``text`` (no NUL, no lone surrogate)."""
    return _BAD_TEXT.search(text) is None


def _check_text(text: str, path: str | None) -> None:
    m = _BAD_TEXT.search(text)
    if m is None:
        return
    what = "a NUL character" if m.group() == "\x00" else "a lone UTF-16 surrogate"
    raise InvalidRequest(f"{path or 'the body'} must not contain {what}", param=path)


def _join(path: str | None, key: str) -> str:
    return f"{path}.{key}" if path else key


def _deep_key(text: str | bytes) -> str | None:
    """The top-level key whose value holds the too-deep nesting (None: the body itself)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = 0
    key: str | None = None
    for m in _TOKENS.finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return key
        elif token in "]}":
            depth -= 1
        elif depth == 1 and token.endswith(":"):
            try:
                key = json.loads(token.rstrip(" \t\r\n:"))
            except ValueError:
                key = None
    return None
