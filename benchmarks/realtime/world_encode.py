"""What a world chunk's encode adds after its decode, serial against streamed (issue 43,
``world_first_chunk_s``), on the CPU: the session's own fMP4 writer and delivery lane.

    python -m benchmarks.realtime.world_encode [--decode-ms 538] [--runs 7]

A Helios chunk's VAE decode runs on the GPU, one latent frame after the other (1 frame,
then 4 each: 33); here each latent frame's decode is a sleep of ``--decode-ms`` / 9, since
on a GPU host the device's thread waits for the device and leaves the CPU to the encoder.
Its frames are uniform noise at the session's size (random weights make noise, x264's
worst case). Per run, from the decode's start to the chunk's fMP4 bytes:

* ``serial``: the whole chunk decoded, then encoded (the lane before ``SupportsChunkStream``);
* ``streamed``: each latent frame's frames handed to the lane as they "decode", encoded
  there while the next decodes (``DeliveryLane.stream``); ``streamed_after_decode`` is
  what of it follows the decode: the last piece's encode and the mux.

The two give the same bytes (checked). Times mean something for the encoder's part only:
the decode is a stand-in. Prints one JSON object (also ``--out``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import command_line, emit, machine, parser
from workers.media.fmp4 import FragmentedMP4Writer
from workers.sessions.delivery import DeliveryLane

PIECES = [1] + [4] * 8  # a Helios chunk's frames per latent frame


def _decode(pieces: list[np.ndarray], each_s: float) -> Iterator[np.ndarray]:
    for piece in pieces:
        time.sleep(each_s)
        yield piece


def _serial(pieces: list[np.ndarray], each_s: float, size: tuple[int, int]) -> tuple[float, bytes]:
    writer = FragmentedMP4Writer(*size, 24.0)
    began = time.perf_counter()
    data = writer.write_chunk(np.concatenate(list(_decode(pieces, each_s))))
    return time.perf_counter() - began, data


def _streamed(
    pieces: list[np.ndarray], each_s: float, size: tuple[int, int]
) -> tuple[float, float, bytes]:
    writer = FragmentedMP4Writer(*size, 24.0)
    out: dict[str, Any] = {}

    def end() -> None:
        out["data"], out["at"] = writer.end_chunk(), time.perf_counter()

    with DeliveryLane("bench") as lane:
        began = time.perf_counter()
        stream = lane.stream(writer.add_frames)
        for piece in _decode(pieces, each_s):
            stream.put(piece)
        decoded = time.perf_counter()
        stream.end(end)
        lane.drain()
    return out["at"] - began, out["at"] - decoded, out["data"]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--decode-ms", type=float, default=538.0, help="a chunk's VAE decode")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=384)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    shape = (args.height, args.width, 3)
    pieces = [rng.integers(0, 256, (n, *shape), dtype=np.uint8) for n in PIECES]
    each_s, size = args.decode_ms / 1000 / len(PIECES), (args.width, args.height)
    serial, streamed, after = [], [], []
    for _ in range(args.runs):
        serial_s, expected = _serial(pieces, each_s, size)
        streamed_s, after_s, data = _streamed(pieces, each_s, size)
        if data != expected:
            raise RuntimeError("the streamed chunk's bytes differ from the serial chunk's")
        serial.append(serial_s * 1000)
        streamed.append(streamed_s * 1000)
        after.append(after_s * 1000)
    emit(
        {
            "benchmark": "benchmarks.realtime.world_encode",
            "command": command_line(),
            "machine": machine(),
            "mode": "CPU; the decode is a sleep: times mean something for the encode only",
            "decode_ms": args.decode_ms,
            "frames": sum(PIECES),
            "size": f"{args.width}x{args.height}",
            "runs": args.runs,
            "serial_ms": round(statistics.median(serial), 1),
            "serial_encode_after_decode_ms": round(statistics.median(serial) - args.decode_ms, 1),
            "streamed_ms": round(statistics.median(streamed), 1),
            "streamed_after_decode_ms": round(statistics.median(after), 1),
            "same_bytes": True,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
