"""RGB → yuv420p on the decoding device (workers/media/pixels.py) and the MP4 writer fed with
those planes: the arithmetic against swscale's and against the BT.601 definition, and the
MP4 it makes decoded back with PyAV."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch

from workers.media.mp4 import Mp4Writer
from workers.media.pixels import yuv420p


def _gradient(n: int, h: int, w: int) -> np.ndarray:
    t, y, x = np.mgrid[0:n, 0:h, 0:w]
    rgb = [(x * 255 // w + t) % 256, y * 255 // h, (x + y) * 255 // (h + w)]
    return np.stack(rgb, axis=-1).astype(np.uint8)


def _swscale(frame: np.ndarray) -> np.ndarray:
    picture = av.VideoFrame.from_ndarray(frame, format="rgb24")
    return picture.reformat(format="yuv420p").to_ndarray()


@pytest.mark.parametrize(("h", "w"), [(256, 448), (254, 446), (48, 64)])
def test_planes_match_swscale_within_one_step_on_smooth_pictures(h: int, w: int) -> None:
    """Laid out as PyAV's yuv420p array (Y, then Cb, then Cr, back to back, whatever the
    height), every sample within 1 of swscale's on a gradient, H not a multiple of 4
    included."""
    frames = _gradient(2, h, w)
    planes = yuv420p(torch.from_numpy(frames)).numpy()
    assert planes.shape == (2, h * 3 // 2, w) and planes.dtype == np.uint8
    for frame, mine in zip(frames, planes, strict=True):
        diff = np.abs(_swscale(frame).astype(int) - mine.astype(int))
        assert diff.max() <= 1, diff.max()


@pytest.mark.parametrize(
    ("rgb", "ycbcr"),
    [
        ((0, 0, 0), (16, 128, 128)),
        ((255, 255, 255), (235, 128, 128)),
        ((255, 0, 0), (81, 90, 240)),
        ((0, 255, 0), (145, 54, 34)),
        ((0, 0, 255), (41, 240, 110)),
    ],
)
def test_flat_colours_are_bt601_limited_range(
    rgb: tuple[int, int, int], ycbcr: tuple[int, int, int]
) -> None:
    frame = torch.tensor(rgb, dtype=torch.uint8).expand(1, 4, 6, 3).contiguous()
    flat = yuv420p(frame).reshape(-1)
    y, cb, cr = flat[:24], flat[24:30], flat[30:]
    assert set(y.tolist()) == {ycbcr[0]}
    assert set(cb.tolist()) == {ycbcr[1]} and set(cr.tolist()) == {ycbcr[2]}


def test_chroma_is_the_mean_of_each_two_by_two_block() -> None:
    frame = torch.zeros(1, 2, 2, 3, dtype=torch.uint8)
    frame[0, 0, 0] = torch.tensor([255, 0, 0])  # one red pixel of four: a quarter of red's Cr
    flat = yuv420p(frame).reshape(-1)
    assert flat[5].item() == round(128 + (240 - 128) / 4)


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        (torch.zeros(1, 4, 6, 3, dtype=torch.float32), "uint8"),
        (torch.zeros(1, 4, 6, dtype=torch.uint8), "T×H×W×3"),
        (torch.zeros(1, 5, 6, 3, dtype=torch.uint8), "even width and height"),
        (torch.zeros(1, 4, 7, 3, dtype=torch.uint8), "even width and height"),
    ],
)
def test_bad_frames_are_refused(frames: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        yuv420p(frames)


def test_the_writer_encodes_planes_as_they_are(tmp_path: Path) -> None:
    """Planes written chunk by chunk make an MP4 of the right size and length whose
    pictures are those the RGB frames make through swscale (up to H.264 at crf 23 and
    the chroma filter), and the writer refuses planes of another size or of a shape that
    is not yuv420p."""
    frames = _gradient(12, 48, 64)
    planes = yuv420p(torch.from_numpy(frames)).numpy()
    with Mp4Writer(tmp_path / "p.mp4", 24) as mp4:
        mp4.write_planes(planes[:5])
        mp4.write_planes(planes[5:])
        with pytest.raises(ValueError, match="frame size changed"):
            mp4.write_planes(planes[:, :48])
        with pytest.raises(ValueError, match="yuv420p frames must be"):
            mp4.write_planes(planes[:, :, :63])
    assert mp4.info is not None
    assert (mp4.info.num_frames, mp4.info.height, mp4.info.width) == (12, 48, 64)
    with Mp4Writer(tmp_path / "rgb.mp4", 24) as rgb:
        rgb.write(frames)

    def pictures(path: Path) -> np.ndarray:
        with av.open(str(path)) as container:
            return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])

    mine, theirs = pictures(tmp_path / "p.mp4"), pictures(tmp_path / "rgb.mp4")
    assert mine.shape == theirs.shape == frames.shape
    assert np.abs(mine.astype(int) - theirs.astype(int)).mean() < 2
