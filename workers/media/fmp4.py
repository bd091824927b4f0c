"""Streaming fragmented MP4 (H.264, ``yuv420p``) with PyAV, one fragment per chunk.

:class:`FragmentedMP4Writer` turns chunks of frames into bytes as soon as each chunk is
written: the first call returns the init segment (``ftyp`` + ``moov``) followed by the
chunk's ``moof`` + ``mdat``; every later call returns only its own ``moof`` + ``mdat``.
The concatenation of everything returned is a playable fragmented MP4, and every chunk
starts with an IDR frame, so the init segment followed by any single chunk also decodes
(a viewer may join late).

How the bytes come out at the chunk boundary, with no ffmpeg CLI:

* One libx264 encoder lives for the whole stream, tuned ``zerolatency`` (no B-frames, no
  lookahead), so every frame handed to it comes back as a packet at once; the first frame
  of each chunk is forced to be an IDR frame (``pict_type = I`` with ``forced-idr``).
  Without a global header x264 repeats SPS/PPS before every IDR frame.
* The mov muxer writes a fragment only when it is told to flush (``frag_custom``: PyAV 18
  exposes no ``av_write_frame(ctx, NULL)``) or when the *next* packet arrives
  (``frag_keyframe``, ``frag_every_frame``: the last chunk would be held back until the
  next one starts). So each chunk is muxed by a short-lived mp4 muxer (``empty_moov`` +
  ``default_base_moof`` + ``frag_custom``) whose ``close`` flushes the fragment.
  ``frag_discont`` makes it keep the chunk's real decode time in ``tfdt``,
  ``fragment_index`` continues the ``mfhd`` sequence numbers, and ``skip_trailer`` leaves
  out the ``mfra`` index. Each such muxer writes the same ``ftyp`` + ``moov`` (checked);
  only the first one is sent.

A stream another writer began (a world session taken over by another worker) goes on
with :meth:`FragmentedMP4Writer.continuing`: a new encoder and muxer from the first frame
and fragment number after the other writer's, its init segment checked against the one
the client already has and not sent again. The chunk begins with an IDR frame anyway,
so the client's decoder and MSE buffer go on across the seam.
"""

from __future__ import annotations

from fractions import Fraction
from types import TracebackType
from typing import Any

import av
import numpy as np
from av.packet import Packet
from av.video.codeccontext import VideoCodecContext
from av.video.frame import PictureType

_MOVFLAGS = "empty_moov+default_base_moof+frag_custom+frag_discont+skip_trailer"
_INIT_BOXES = (b"ftyp", b"moov")


class _Sink:
    """A write-only, non-seekable file object that keeps what the muxer writes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)


class FragmentedMP4Writer:
    """H.264 fragmented MP4 for a stream of frame chunks; each call returns its bytes.

    ``write_chunk(frames)`` (uint8 T×H×W×3 RGB) encodes the chunk and returns its bytes
    right away: the first call's bytes start with the init segment (``ftyp`` + ``moov``),
    followed by the chunk's ``moof`` + ``mdat``; later calls return only their fragment.
    A chunk may also be fed as its frames come (``add_frames`` as often as needed, then
    ``end_chunk`` for its bytes), the same bytes as ``write_chunk`` of its frames whole.
    ``close()`` ends the stream; it returns any trailing bytes (normally ``b""``: every
    chunk is complete when ``write_chunk`` returns). Width and height must be even.
    """

    def __init__(
        self, width: int, height: int, fps: float, *, crf: int = 23, preset: str = "veryfast"
    ) -> None:
        if width < 2 or height < 2 or width % 2 or height % 2:
            raise ValueError(f"yuv420p needs even width and height >= 2, got {width}x{height}")
        if not fps > 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.width, self.height = width, height
        self.rate = Fraction(fps).limit_denominator(1001)
        encoder = av.CodecContext.create("libx264", "w")
        assert isinstance(encoder, VideoCodecContext)
        encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
        encoder.time_base = 1 / self.rate
        encoder.framerate = self.rate
        encoder.options = {
            "crf": str(crf),
            "preset": preset,
            "tune": "zerolatency",
            "forced-idr": "1",
        }
        encoder.open()
        self._encoder = encoder
        self._init: bytes | None = None
        self._frames = 0  # in chunks ended
        self._packets: list[Packet] = []  # the chunk under way's
        self._fragments = 0
        self._closed = False

    @classmethod
    def continuing(
        cls,
        width: int,
        height: int,
        fps: float,
        *,
        init_segment: bytes,
        frames: int,
        fragments: int,
        **options: Any,
    ) -> FragmentedMP4Writer:
        """A writer that goes on with a stream whose first ``fragments`` fragments (holding
        ``frames`` frames, after ``init_segment``) another writer of the same size, rate
        and ``options`` made: its chunks are numbered and timed after theirs, and its
        first chunk is returned without an init segment. Raises ``RuntimeError`` at that
        chunk when this build would write another init segment (an ffmpeg or x264 of
        another version)."""
        writer = cls(width, height, fps, **options)
        writer._init, writer._frames, writer._fragments = init_segment, frames, fragments
        return writer

    @property
    def fragments_written(self) -> int:
        return self._fragments

    @property
    def init_segment(self) -> bytes | None:
        """``ftyp`` + ``moov`` (for a viewer joining late), or None before the first chunk."""
        return self._init

    @property
    def frames_written(self) -> int:
        return self._frames

    def write_chunk(self, frames: np.ndarray) -> bytes:
        """Encode one chunk (starting with an IDR frame) and return its bytes."""
        self.add_frames(frames)
        return self.end_chunk()

    def add_frames(self, frames: np.ndarray) -> None:
        """Encode ``frames`` (uint8 T×H×W×3 RGB) as the next frames of the chunk under way,
        the first of a chunk an IDR frame; :meth:`end_chunk` returns the chunk's bytes.
        A chunk fed piece by piece is the chunk written whole, byte for byte: x264 with
        ``zerolatency`` hands each frame's packet back as the frame goes in, so the
        pieces' frames meet the same encoder state in the same order."""
        if self._closed:
            raise RuntimeError("the writer is closed")
        shape = (self.height, self.width, 3)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != shape:
            raise ValueError(
                f"frames must be uint8 T×{shape[0]}×{shape[1]}×3, got {frames.dtype} {frames.shape}"
            )
        packets = self._packets
        for pixels in np.ascontiguousarray(frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = self._frames + len(packets)
            frame.time_base = self._encoder.time_base
            if not packets:
                frame.pict_type = PictureType.I  # with forced-idr: an IDR frame
            encoded = self._encoder.encode(frame)
            if len(encoded) != 1 or (not packets and not encoded[0].is_keyframe):
                raise RuntimeError("the encoder held frames back or did not start with a keyframe")
            packets.extend(encoded)

    def end_chunk(self) -> bytes:
        """The bytes of the chunk :meth:`add_frames` encoded (one fragment, after the init
        segment the first time); the next frames begin a chunk."""
        if not self._packets:
            raise ValueError("a chunk needs at least one frame")
        packets, self._packets = self._packets, []
        self._frames += len(packets)
        return self._mux(packets)

    def close(self) -> bytes:
        """Flush the encoder and end the stream; returns trailing bytes (usually empty)."""
        if self._closed:
            return b""
        self._closed = True
        packets = list(self._encoder.encode(None))
        return self._mux(packets) if packets else b""

    def __enter__(self) -> FragmentedMP4Writer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _mux(self, packets: list[Packet]) -> bytes:
        """Mux ``packets`` as one fragment; return the init segment (first time) + it."""
        sink = _Sink()
        options = {
            "movflags": _MOVFLAGS,
            "fragment_index": str(self._fragments + 1),
            "use_editlist": "0",
            "avoid_negative_ts": "disabled",
        }
        with av.open(sink, mode="w", format="mp4", container_options=options) as container:
            stream = container.add_mux_stream(
                "h264", rate=self.rate, width=self.width, height=self.height
            )
            stream.time_base = self._encoder.time_base
            for packet in packets:
                if not packet.duration:
                    packet.duration = 1  # one frame, in the encoder's time base
                packet.stream = stream
                container.mux(packet)
        self._fragments += 1
        data = bytes(sink.data)
        split = _init_length(data)
        init, fragment = data[:split], data[split:]
        if self._init is None:
            self._init = init
            return data
        if init != self._init:
            raise RuntimeError("the muxer wrote a different init segment for a later chunk")
        return fragment


def _init_length(data: bytes) -> int:
    """Length of the leading ``ftyp`` + ``moov`` boxes of ``data``."""
    offset = 0
    while offset + 8 <= len(data) and data[offset + 4 : offset + 8] in _INIT_BOXES:
        size = int.from_bytes(data[offset : offset + 4], "big")
        if size == 1:  # 64-bit largesize follows the type
            size = int.from_bytes(data[offset + 8 : offset + 16], "big")
        if size < 8:
            raise RuntimeError(f"malformed MP4 box at offset {offset}")
        offset += size
    return offset
