"""Split a fragmented MP4's first chunk into its init segment (``ftyp`` + ``moov``) and the
fragment after it (``moof`` + ``mdat``): a resumed world session's socket gets the init
segment alone, then only the fragments it missed."""

from __future__ import annotations

import struct


class NotFragmented(ValueError):
    """The bytes do not start with an init segment followed by a ``moof`` box."""


def split_init(data: bytes) -> tuple[bytes, bytes]:
    """``(init segment, rest)``: ``rest`` starts at the first ``moof`` box."""
    pos = 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if size == 1 and pos + 16 <= len(data):
            size = struct.unpack(">Q", data[pos + 8 : pos + 16])[0]
        if kind == b"moof" and pos > 0:
            return data[:pos], data[pos:]
        if size < 8:
            break
        pos += size
    raise NotFragmented("no init segment followed by a moof box")
