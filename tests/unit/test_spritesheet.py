"""The ``spritesheet`` variant (OpenAI's shape: one JPEG of thumbnails in a grid) as the
worker's encode step makes it, from the decoded frames and read back from the MP4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from workers.media.mp4 import decode_streamed, encode_video, finish_video
from workers.media.spritesheet import SPRITE_COLUMNS, sprite_indices, spritesheet
from workers.pipelines.base import DecodeStream, Media

# 12 frames of 48x32, frame k a flat grey of level 20 * k: each tile tells its frame.
FRAMES = np.stack([np.full((32, 48, 3), 20 * k, np.uint8) for k in range(12)])


def _tiles(path: Path, count: int) -> list[float]:
    """The mean level of each of ``count`` 48x32 tiles of a sheet, row by row."""
    with Image.open(path) as img:
        assert img.format == "JPEG"
        sheet = np.asarray(img.convert("L"), dtype=np.float64)
    columns = min(SPRITE_COLUMNS, count)
    assert sheet.shape == (32 * -(-count // columns), 48 * columns)
    return [
        sheet[(k // columns) * 32 : (k // columns + 1) * 32, (k % columns) * 48 :][:, :48].mean()
        for k in range(count)
    ]


def test_sprite_indices_step_evenly_through_the_clip() -> None:
    assert sprite_indices(12) == [0, 1, 3, 4, 5, 6, 7, 9, 10, 11]
    assert sprite_indices(100) == [5, 15, 25, 35, 45, 55, 65, 75, 85, 95]
    assert sprite_indices(3) == [0, 1, 2]
    assert sprite_indices(1) == [0]


def test_the_sheet_is_a_grid_of_the_picked_frames(tmp_path: Path) -> None:
    variant, path, ctype = spritesheet(tmp_path, FRAMES)
    assert (variant, path, ctype) == ("spritesheet", tmp_path / "spritesheet.jpg", "image/jpeg")
    picked = sprite_indices(12)
    assert len(picked) == 10
    levels = _tiles(path, 10)
    assert np.allclose(levels, [20 * k for k in picked], atol=3)  # JPEG's rounding


def test_the_encode_step_lists_it_and_the_mp4_gives_the_same_sheet(tmp_path: Path) -> None:
    """encode_video's files end with the spritesheet; made again from the MP4 (as after a
    streamed decode), its tiles are those frames as x264 kept them."""
    files = encode_video(Media(frames=FRAMES, fps=8.0), tmp_path)
    assert [variant for variant, _, _ in files] == ["video", "thumbnail", "spritesheet"]
    from_frames = _tiles(tmp_path / "spritesheet.jpg", 10)
    again = tmp_path / "again"
    again.mkdir()
    (again / "video.mp4").write_bytes((tmp_path / "video.mp4").read_bytes())
    spritesheet(again)
    assert np.allclose(_tiles(again / "spritesheet.jpg", 10), from_frames, atol=4)


def test_a_short_clip_shows_every_frame(tmp_path: Path) -> None:
    _, path, _ = spritesheet(tmp_path, FRAMES[:3])
    assert np.allclose(_tiles(path, 3), [0, 20, 40], atol=3)


class _Streaming:
    """A stand-in adapter whose decode streams FRAMES in two chunks, the second a torch
    tensor (as a chunk left on the decoding device is)."""

    def decode_stream(self, state: object) -> DecodeStream:
        return DecodeStream(chunks=iter([FRAMES[:5], torch.from_numpy(FRAMES[5:].copy())]))


def test_a_streamed_decode_keeps_the_sheet_s_frames(tmp_path: Path) -> None:
    """After a streamed decode the executor has no frames: decode_streamed picks the
    sheet's from its chunks, so the MP4 is not decoded back."""
    streamed = decode_streamed(_Streaming(), None, 8.0, tmp_path)  # type: ignore[arg-type]
    assert streamed is not None and streamed.sprites is not None
    assert np.array_equal(streamed.middle, FRAMES[6])
    assert np.array_equal(streamed.sprites, FRAMES[sprite_indices(12)])
    files = finish_video(streamed.middle, tmp_path, streamed.sprites)
    assert [variant for variant, _, _ in files] == ["video", "thumbnail", "spritesheet"]
    assert np.allclose(
        _tiles(tmp_path / "spritesheet.jpg", 10), [20 * k for k in sprite_indices(12)], atol=3
    )
