"""``FragmentedMP4Writer``: init segment, one self-contained fragment per chunk, no lag."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest

from workers.media.fmp4 import FragmentedMP4Writer

W, H, FPS = 64, 48, 16
CHUNKS = (9, 12, 12)


def _frames(count: int, start: int = 0) -> np.ndarray:
    """Smooth moving gradients (compress well, so decoded frames stay close)."""
    yy, xx = np.mgrid[0:H, 0:W].astype(float)
    out = [
        np.stack([xx * 3 + 4 * i, yy * 4 + 2 * i, (xx + yy) * 2 + 6 * i], axis=-1) % 256
        for i in range(start, start + count)
    ]
    return np.stack(out).astype(np.uint8)


def _boxes(data: bytes) -> list[str]:
    """Types of the top-level boxes of ``data`` (which must consist of whole boxes)."""
    names, offset = [], 0
    while offset < len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        assert size >= 8, f"bad box size at {offset}"
        names.append(data[offset + 4 : offset + 8].decode("latin-1"))
        offset += size
    assert offset == len(data), "the bytes end inside a box"
    return names


def _decode(data: bytes) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data), mode="r") as container:
        return list(container.decode(video=0))


def _write_all(writer: FragmentedMP4Writer) -> list[bytes]:
    parts, start = [], 0
    for count in CHUNKS:
        parts.append(writer.write_chunk(_frames(count, start)))
        start += count
    return parts


def test_concatenation_decodes_to_every_frame_at_the_right_size_and_time() -> None:
    writer = FragmentedMP4Writer(W, H, FPS)
    parts = _write_all(writer)
    parts.append(writer.close())
    frames = _decode(b"".join(parts))
    assert len(frames) == sum(CHUNKS) == writer.frames_written
    assert {(f.width, f.height) for f in frames} == {(W, H)}
    assert [f.time for f in frames] == pytest.approx([i / FPS for i in range(sum(CHUNKS))])
    decoded = np.stack([f.to_ndarray(format="rgb24") for f in frames]).astype(float)
    assert np.abs(decoded - _frames(sum(CHUNKS))).mean() < 4.0  # the content survives


def test_box_layout_init_segment_then_one_fragment_per_chunk() -> None:
    writer = FragmentedMP4Writer(W, H, FPS)
    parts = _write_all(writer)
    assert writer.close() == b""  # every chunk was complete when write_chunk returned
    first = _boxes(parts[0])
    assert first[0] == "ftyp"
    assert first.index("moov") < first.index("moof")
    assert first[-2:] == ["moof", "mdat"]
    for part in parts[1:]:
        boxes = _boxes(part)
        assert boxes[0] in ("moof", "styp")
        assert "moov" not in boxes and "ftyp" not in boxes
        assert boxes[-1] == "mdat"
    assert writer.init_segment is not None and parts[0].startswith(writer.init_segment)


def test_each_chunk_is_available_without_waiting_for_the_next() -> None:
    writer = FragmentedMP4Writer(W, H, FPS)
    sent, start = b"", 0
    for count in CHUNKS:
        sent += writer.write_chunk(_frames(count, start))
        start += count
        assert len(_decode(sent)) == start  # no frame held back for a later call
    writer.close()


def test_a_later_chunk_decodes_alone_after_the_init_segment() -> None:
    writer = FragmentedMP4Writer(W, H, FPS)
    parts = _write_all(writer)
    writer.close()
    assert writer.init_segment is not None
    for part, count in zip(parts[1:], CHUNKS[1:], strict=True):
        frames = _decode(writer.init_segment + part)  # a viewer joining late
        assert len(frames) == count
        assert frames[0].key_frame


def test_fractional_frame_rate() -> None:
    writer = FragmentedMP4Writer(W, H, 30000 / 1001)
    data = writer.write_chunk(_frames(9)) + writer.write_chunk(_frames(12, 9)) + writer.close()
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert stream.average_rate == Fraction(30000, 1001)
    assert len(frames) == 21
    assert frames[-1].time == pytest.approx(20 * 1001 / 30000)


def test_misuse_raises() -> None:
    with pytest.raises(ValueError, match="even"):
        FragmentedMP4Writer(63, 48, FPS)
    with pytest.raises(ValueError, match="fps"):
        FragmentedMP4Writer(W, H, 0)
    writer = FragmentedMP4Writer(W, H, FPS)
    with pytest.raises(ValueError, match="uint8"):
        writer.write_chunk(_frames(3).astype(np.float32))
    with pytest.raises(ValueError, match="uint8"):
        writer.write_chunk(np.zeros((3, H, W + 2, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="at least one frame"):
        writer.write_chunk(np.zeros((0, H, W, 3), dtype=np.uint8))
    assert writer.close() == b""
    assert writer.close() == b""  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        writer.write_chunk(_frames(1))


def test_a_continuing_writer_goes_on_with_another_writer_s_stream() -> None:
    """A session taken over by another worker: a new writer, told where the first one
    stood, makes the next chunk without an init segment, numbered and timed after the
    first writer's; the client's bytes decode to every frame at its time."""
    first = FragmentedMP4Writer(W, H, FPS)
    parts = [first.write_chunk(_frames(CHUNKS[0])), first.write_chunk(_frames(CHUNKS[1], 9))]
    assert (first.frames_written, first.fragments_written) == (21, 2)
    assert first.init_segment is not None
    taker = FragmentedMP4Writer.continuing(
        W, H, FPS, init_segment=first.init_segment, frames=21, fragments=2
    )
    tail = taker.write_chunk(_frames(CHUNKS[2], 21))
    assert _boxes(tail)[0] in ("moof", "styp") and "moov" not in _boxes(tail)
    assert (taker.frames_written, taker.fragments_written) == (33, 3)
    assert taker.init_segment == first.init_segment
    frames = _decode(b"".join([*parts, tail, taker.close()]))
    assert [f.time for f in frames] == pytest.approx([i / FPS for i in range(sum(CHUNKS))])
    decoded = np.stack([f.to_ndarray(format="rgb24") for f in frames]).astype(float)
    assert np.abs(decoded - _frames(sum(CHUNKS))).mean() < 4.0
    # the fragment sequence numbers (mfhd) go on: 1, 2, then the taker's 3
    assert [_sequence_number(p) for p in (parts[1], tail)] == [2, 3]


def test_a_continuing_writer_refuses_another_init_segment() -> None:
    first = FragmentedMP4Writer(W, H, FPS)
    first.write_chunk(_frames(CHUNKS[0]))
    assert first.init_segment is not None
    other = FragmentedMP4Writer.continuing(
        W + 2, H, FPS, init_segment=first.init_segment, frames=9, fragments=1
    )
    with pytest.raises(RuntimeError, match="different init segment"):
        other.write_chunk(np.zeros((12, H, W + 2, 3), np.uint8))


def _sequence_number(fragment: bytes) -> int:
    """The ``mfhd`` sequence number of the first ``moof`` of ``fragment``."""
    at = fragment.index(b"mfhd")
    return int.from_bytes(fragment[at + 8 : at + 12], "big")


def test_a_chunk_fed_piece_by_piece_is_the_chunk_written_whole() -> None:
    """Pieces as a Wan VAE decodes them (1 frame, then 4 at a time), on noise, x264's
    hardest input: the same bytes, chunk for chunk, as ``write_chunk`` of each whole."""
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 256, (9, H, W, 3), dtype=np.uint8) for _ in range(3)]
    whole = FragmentedMP4Writer(W, H, FPS)
    expected = [whole.write_chunk(frames) for frames in chunks]
    pieces = FragmentedMP4Writer(W, H, FPS)
    got: list[bytes] = []
    for frames in chunks:
        for start, stop in ((0, 1), (1, 5), (5, 9)):
            pieces.add_frames(frames[start:stop])
        assert pieces.frames_written == len(got) * 9  # counted once the chunk ends
        got.append(pieces.end_chunk())
    assert got == expected
    assert pieces.frames_written == whole.frames_written == 27
    assert pieces.fragments_written == 3
    with pytest.raises(ValueError, match="at least one frame"):
        pieces.end_chunk()
