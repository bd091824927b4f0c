"""OpenAI's ``spritesheet`` variant of a video (``GET /v1/videos/{id}/content?variant=
spritesheet``): one JPEG of thumbnails in a grid, made by the worker beside the
thumbnail (:func:`workers.media.mp4.finish_video`) and uploaded with it.

Up to :data:`SPRITE_FRAMES` frames at even steps through the clip (the middle of each
step), :data:`SPRITE_COLUMNS` a row, each scaled so that its longer side is at most
:data:`SPRITE_SIDE` pixels. The frames come from the decoded clip when the encode step
has it, else from the written MP4, decoded back in one pass (a streamed decode keeps
none).
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from PIL import Image

SPRITE_FRAMES = 10
SPRITE_COLUMNS = 5
SPRITE_SIDE = 160


def sprite_indices(num_frames: int, count: int = SPRITE_FRAMES) -> list[int]:
    """The frames a spritesheet shows: the middle of ``count`` equal steps (every frame
    of a shorter clip)."""
    taken = min(count, num_frames)
    return [int((i + 0.5) * num_frames / taken) for i in range(taken)]


def spritesheet(tmp: Path, frames: np.ndarray | None = None) -> tuple[str, Path, str]:
    """Write ``tmp/spritesheet.jpg`` of the clip (``frames``: its uint8 T×H×W×3 frames;
    None: those of ``tmp/video.mp4``) and return its (variant, path, content type) entry,
    as the encode step lists its files."""
    if frames is None:
        picked = _mp4_frames(tmp / "video.mp4")
    else:
        picked = [np.asarray(frames[i]) for i in sprite_indices(len(frames))]
    if not picked:
        raise RuntimeError("a video without frames has no spritesheet")
    tiles = [Image.fromarray(frame) for frame in picked]
    for tile in tiles:
        tile.thumbnail((SPRITE_SIDE, SPRITE_SIDE), Image.Resampling.LANCZOS)
    width, height = tiles[0].size
    columns = min(SPRITE_COLUMNS, len(tiles))
    rows = -(-len(tiles) // columns)
    sheet = Image.new("RGB", (columns * width, rows * height))
    for k, tile in enumerate(tiles):
        sheet.paste(tile, ((k % columns) * width, (k // columns) * height))
    path = tmp / "spritesheet.jpg"
    sheet.save(path, format="JPEG", quality=85, optimize=True)
    return ("spritesheet", path, "image/jpeg")


def _mp4_frames(mp4: Path) -> list[np.ndarray]:
    """The frames :func:`sprite_indices` picks of a written MP4, decoded in one pass (a
    second one counts them if the container does not say how many it has)."""
    with av.open(str(mp4)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        count = stream.frames
        if not count:
            count = sum(1 for _ in container.decode(stream))
            container.seek(0)
        wanted = set(sprite_indices(count))
        return [
            frame.to_ndarray(format="rgb24")
            for k, frame in enumerate(container.decode(stream))
            if k in wanted
        ]
