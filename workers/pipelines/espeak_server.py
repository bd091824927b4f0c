"""The eSpeak NG helper process of :mod:`workers.pipelines.espeak` (standard library only;
run as a script: ``python -I espeak_server.py LIBRARY DATA``).

It loads libespeak-ng and initialises it once, then answers requests on stdin, one JSON
line each (``text``, ``voice``, ``rate``, ``pitch``, ``range``): for each it forks, the
child speaks from the library's state as it was after initialisation and sends the
samples back through a pipe, and exits. libespeak-ng keeps synthesis state in C statics
(the pitch flutter's phase, noise generators) that nothing resets, and leaks a little on
every initialisation; a child per request makes every answer depend on its request alone
and gives all memory back.

Answer on stdout: ``<status int32><length int32>`` then ``length`` bytes: int16 samples at
22.05 kHz (status 0), or a UTF-8 error message (status 1). EOF on stdin ends the helper.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import sys
from typing import Any

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_RATE, _PITCH, _RANGE = 1, 3, 4
_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


def load(library: str, data: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(library)
    lib.espeak_Initialize.restype = ctypes.c_int
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_Synth.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
        ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data.encode(), 0)
    if rate != 22_050:
        raise RuntimeError(f"libespeak-ng did not initialise (it answered {rate})")
    return lib


def speak(lib: ctypes.CDLL, req: dict[str, Any]) -> bytes:
    """The request's samples, int16 little-endian."""
    parts: list[bytes] = []

    def on_samples(wav: Any, count: int, _events: Any) -> int:
        if wav and count > 0:
            parts.append(ctypes.string_at(wav, 2 * count))
        return 0

    _seed(lib)
    callback = _CALLBACK(on_samples)  # alive until espeak_Synth returns
    lib.espeak_SetSynthCallback(callback)
    if lib.espeak_SetVoiceByName(str(req["voice"]).encode()) != 0:
        raise ValueError(f"espeak has no voice {req['voice']!r}")
    lib.espeak_SetParameter(_RATE, int(req["rate"]), 0)
    lib.espeak_SetParameter(_PITCH, int(req["pitch"]), 0)
    lib.espeak_SetParameter(_RANGE, int(req["range"]), 0)
    raw = str(req["text"]).encode() + b"\0"
    err = lib.espeak_Synth(raw, len(raw), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
    if err != 0:
        raise RuntimeError(f"espeak_Synth failed with {err}")
    return b"".join(parts)


def _seed(lib: ctypes.CDLL) -> None:
    """A fixed seed for the noise: espeak_Initialize seeds libc's rand() with the time
    (``srand(time(NULL))``), so helpers started in different seconds spoke differently."""
    ctypes.CDLL(None).srand(0)
    lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
    lib.espeak_ng_SetRandSeed(0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _answer(lib: ctypes.CDLL, line: bytes) -> bytes:
    """Fork; the child speaks into a pipe; the framed answer."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: speak from the state after initialisation, then leave
        os.close(read_end)
        try:
            body, status = speak(lib, json.loads(line)), 0
        except Exception as exc:  # reported to the caller, who raises it
            body, status = f"{type(exc).__name__}: {exc}".encode(), 1
        _write_all(write_end, struct.pack("<ii", status, len(body)) + body)
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 1 << 16):
        chunks.append(chunk)
    os.close(read_end)
    _, code = os.waitpid(pid, 0)
    out = b"".join(chunks)
    if code != 0 or len(out) < 8 or len(out) != 8 + struct.unpack("<ii", out[:8])[1]:
        message = f"the speaking process ended with status {code}".encode()
        return struct.pack("<ii", 1, len(message)) + message
    return out


def main(argv: list[str]) -> int:
    # A Ctrl-C reaches the whole process group; the helper ends when its caller does (EOF).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lib = load(argv[1], argv[2])
    stdin = sys.stdin.buffer
    while line := stdin.readline():
        _write_all(1, _answer(lib, line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
