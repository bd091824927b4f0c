"""Media encoding with PyAV (no ffmpeg CLI): final MP4 artifacts and JPEG thumbnails.

``encode_mp4`` writes H.264 (libx264, ``yuv420p``) video at an exact frame rate, frame
count and size, plus AAC stereo audio when the media has sound, with the ``moov`` atom
moved to the front (``+faststart``) so players can start before the download ends.
Audio is padded or trimmed to the video duration; the AAC encoder pads its last
1024-sample frame, so the audio track ends within one AAC frame of the video.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import av
import numpy as np
from av.audio.stream import AudioStream
from av.container import OutputContainer
from PIL import Image

from workers.media.frames import Media, SupportsDecodeStream
from workers.media.spritesheet import sprite_indices, spritesheet

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

AAC_FRAME_SIZE = 1024
DEFAULT_SAMPLE_RATE = 48_000


@dataclass(frozen=True)
class EncodedInfo:
    """What :func:`encode_mp4` wrote."""

    path: Path
    bytes: int
    width: int
    height: int
    num_frames: int
    fps: float
    duration_s: float
    has_audio: bool


def encode_mp4(
    media: Media, path: str | Path, *, crf: int = 23, preset: str = "veryfast"
) -> EncodedInfo:
    """Encode ``media`` to an H.264/AAC MP4 at ``path`` (width and height must be even)."""
    frames = _check_frames(media.frames)
    num_frames, height, width = frames.shape[:3]
    if media.fps <= 0:
        raise ValueError(f"fps must be positive, got {media.fps}")
    rate = Fraction(media.fps).limit_denominator(1001)
    sample_rate = media.sample_rate or DEFAULT_SAMPLE_RATE
    audio = None
    if media.audio is not None:
        n_samples = round(num_frames / rate * sample_rate)
        audio = _fit_audio(_check_audio(media.audio), n_samples)
    out = Path(path)
    with _Muxer(out, rate, (height, width), audio, sample_rate, crf, preset) as mp4:
        mp4.add(frames)
        mp4.finish()
    return _info(out, rate, (height, width), num_frames, audio is not None)


def _info(
    path: Path, rate: Fraction, size: tuple[int, int], frames: int, audio: bool
) -> EncodedInfo:
    height, width = size
    return EncodedInfo(
        path=path,
        bytes=path.stat().st_size,
        width=width,
        height=height,
        num_frames=frames,
        fps=float(rate),
        duration_s=float(frames / rate),
        has_audio=audio,
    )


def _open_mp4(path: Path) -> OutputContainer:
    return av.open(str(path), mode="w", format="mp4", container_options={"movflags": "+faststart"})


def _video_stream(
    container: OutputContainer,
    width: int,
    height: int,
    rate: Fraction,
    crf: int,
    preset: str,
    threads: int = 0,
) -> Any:
    video = container.add_stream("libx264", rate=rate)
    video.width = width
    video.height = height
    video.pix_fmt = "yuv420p"
    video.time_base = 1 / rate
    video.options = {"crf": str(crf), "preset": preset}
    # x264's frame threads (as many as it picks for the machine's cores) rather than
    # PyAV's default of slices: a whole file has no latency to keep, and on 2 cores a
    # 448x256 clip of 243 frames encoded in 1.04 s instead of 1.38 s (0.26 s instead of
    # 0.32 s for smooth content). The fragmented live stream (fmp4.py) keeps slices.
    video.thread_type = "FRAME"
    video.thread_count = threads
    return video


def streaming_threads() -> int:
    """x264's threads while a GPU decode runs beside it (:func:`decode_streamed`): half
    the cores, at most 8. As many as x264 picks (all cores and more) starve the thread
    that launches the decoder's kernels: on an H200 host with 16 cores, H3's decode with
    the encode beside it took 2.12 s with x264's own count, 1.65 s with 8 (1.12 s alone)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class _Muxer:
    """An MP4 being written: H.264 frames as they come, and the AAC soundtrack (float32
    stereo) interleaved up to the end of each frame; :meth:`finish` pads or trims the
    soundtrack to the video's duration (the AAC encoder pads its last 1024-sample frame)."""

    def __init__(
        self,
        path: Path,
        rate: Fraction,
        size: tuple[int, int],
        audio: np.ndarray | None,
        sample_rate: int,
        crf: int,
        preset: str,
        threads: int = 0,
    ) -> None:
        self.rate = rate
        self.container = _open_mp4(path)
        height, width = size
        self.audio = audio
        self.sound: Any = None
        try:
            self.video = _video_stream(self.container, width, height, rate, crf, preset, threads)
            if audio is not None:
                self.sound = self.container.add_stream("aac", rate=sample_rate)
                self.sound.layout = "stereo"
                self.sound.time_base = Fraction(1, sample_rate)
        except BaseException:
            self.container.close()
            raise
        self.sample_rate = sample_rate
        self.frames = 0
        self.fed = 0  # audio samples handed to the encoder so far

    def __enter__(self) -> _Muxer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.container.close()

    def add(self, frames: np.ndarray, pixel_format: str = "rgb24") -> None:
        """Encode ``frames``: uint8 T×H×W×3 (``rgb24``, converted by swscale) or
        T×(H·3/2)×W planes (``yuv420p``, x264's own format: no conversion)."""
        for frame in frames:
            picture = av.VideoFrame.from_ndarray(frame, format=pixel_format)
            picture.pts = self.frames
            self.frames += 1
            self.container.mux(self.video.encode(picture))
            if self.audio is not None:  # interleave: audio up to the end of this frame
                until = min(self.audio.shape[1], round(self.frames / self.rate * self.sample_rate))
                self.fed = _feed_audio(self.container, self.sound, self.audio, self.fed, until)

    def finish(self) -> None:
        self.container.mux(self.video.encode(None))
        if self.audio is not None:
            n_samples = round(self.frames / self.rate * self.sample_rate)
            audio = _fit_audio(self.audio, n_samples)
            self.fed = _feed_audio(self.container, self.sound, audio, self.fed, n_samples)
            self.container.mux(self.sound.encode(None))  # flushes the resampler and encoder


class Mp4Writer:
    """An MP4 written chunk by chunk as the frames are decoded, on a thread of its own:
    the frames go into a queue and x264 encodes them while the caller decodes the next
    chunk (on the GPU). A soundtrack given up front is interleaved with the frames and
    fitted to their duration at the end. Same stream settings as :func:`encode_mp4`::

        with Mp4Writer(path, fps, audio=stereo, sample_rate=32000) as mp4:
            for chunk in chunks:        # uint8 T×H×W×3
                mp4.write(chunk)
        info = mp4.info                 # after the with block: the file is complete
    """

    def __init__(
        self,
        path: str | Path,
        fps: float,
        *,
        audio: np.ndarray | None = None,
        sample_rate: int | None = None,
        crf: int = 23,
        preset: str = "veryfast",
        threads: int = 0,
    ) -> None:
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.threads = threads  # x264's (0: as many as it picks)
        self.path = Path(path)
        self.rate = Fraction(fps).limit_denominator(1001)
        self.audio = _check_audio(audio) if audio is not None else None
        self.sample_rate = sample_rate or DEFAULT_SAMPLE_RATE
        self._crf, self._preset = crf, preset
        self._queue: queue.Queue[tuple[np.ndarray, str] | None] = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mp4-writer", daemon=True)
        self._size: tuple[int, int] | None = None
        self.frames = 0
        self.info: EncodedInfo | None = None

    def __enter__(self) -> Mp4Writer:
        self._thread.start()
        return self

    def write(self, chunk: np.ndarray) -> None:
        """Queue uint8 T×H×W×3 RGB frames."""
        frames = _check_frames(chunk)
        self._put(frames, (int(frames.shape[1]), int(frames.shape[2])), "rgb24")

    def write_planes(self, chunk: np.ndarray) -> None:
        """Queue frames already in ``yuv420p``: uint8 T×(H·3/2)×W, each frame's Y, Cb and
        Cr planes back to back (``workers.media.pixels.yuv420p``), which x264 takes as they are."""
        if chunk.dtype != np.uint8 or chunk.ndim != 3 or chunk.shape[1] % 3 or chunk.shape[2] % 2:
            raise ValueError(
                f"yuv420p frames must be uint8 T×(H·3/2)×W, even H and W; got "
                f"{chunk.dtype} {chunk.shape}"
            )
        if len(chunk) < 1:
            raise ValueError("cannot encode zero frames")
        size = (int(chunk.shape[1]) * 2 // 3, int(chunk.shape[2]))
        self._put(np.ascontiguousarray(chunk), size, "yuv420p")

    def _put(self, frames: np.ndarray, size: tuple[int, int], pixel_format: str) -> None:
        if self._size is None:
            self._size = size
        elif size != self._size:
            raise ValueError(f"frame size changed from {self._size} to {size}")
        if self._error is not None:
            raise self._error
        self.frames += len(frames)
        self._queue.put((frames, pixel_format))

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._queue.put(None)
        self._thread.join()
        if exc_type is None and self._error is not None:
            raise self._error
        if exc_type is None and self._size is not None:
            audio = self.audio is not None
            self.info = _info(self.path, self.rate, self._size, self.frames, audio)

    def _run(self) -> None:
        mp4: _Muxer | None = None
        ended = False  # the caller's end mark (None) was taken
        try:
            while (item := self._queue.get()) is not None:
                frames, pixel_format = item
                if mp4 is None:
                    assert self._size is not None  # set by the write that queued these
                    mp4 = _Muxer(
                        self.path,
                        self.rate,
                        self._size,
                        self.audio,
                        self.sample_rate,
                        self._crf,
                        self._preset,
                        self.threads,
                    )
                mp4.add(frames, pixel_format)
            ended = True
            if mp4 is not None:
                mp4.finish()
        except BaseException as exc:  # the caller sees it at its next write or at exit
            self._error = exc
            while not ended and self._queue.get() is not None:  # the caller never blocks
                pass
        finally:
            if mp4 is not None:
                mp4.container.close()


def encode_thumbnail(
    frame: np.ndarray, path: str | Path, *, max_side: int = 512, quality: int = 85
) -> int:
    """Write ``frame`` (uint8 H×W×3) as a JPEG whose longer side is ≤ ``max_side``."""
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"thumbnail frame must be uint8 H×W×3, got {frame.dtype} {frame.shape}")
    if max_side < 1:
        raise ValueError("max_side must be >= 1")
    image = Image.fromarray(frame)
    image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    out = Path(path)
    image.save(out, format="JPEG", quality=quality, optimize=True)
    return out.stat().st_size


def _check_frames(frames: np.ndarray) -> np.ndarray:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError(f"frames must be uint8 T×H×W×3, got {frames.dtype} {frames.shape}")
    num_frames, height, width = frames.shape[:3]
    if num_frames < 1:
        raise ValueError("cannot encode zero frames")
    if width % 2 or height % 2:
        raise ValueError(f"yuv420p needs even width and height, got {width}x{height}")
    return np.ascontiguousarray(frames)


def _check_audio(audio: np.ndarray) -> np.ndarray:
    """Return float32 (2, n) audio; mono is duplicated to both channels."""
    if audio.ndim != 2 or audio.shape[0] not in (1, 2):
        raise ValueError(f"audio must be (channels, samples) with 1 or 2 channels: {audio.shape}")
    if audio.shape[0] == 1:
        audio = np.repeat(audio, 2, axis=0)
    return np.clip(audio.astype(np.float32, copy=False), -1.0, 1.0)


def _fit_audio(audio: np.ndarray, n_samples: int) -> np.ndarray:
    """Pad with silence or trim ``audio`` to exactly ``n_samples``."""
    if audio.shape[1] >= n_samples:
        return np.ascontiguousarray(audio[:, :n_samples])
    pad = np.zeros((2, n_samples - audio.shape[1]), dtype=np.float32)
    return np.concatenate([audio, pad], axis=1)


def _feed_audio(
    container: OutputContainer,
    stream: AudioStream,
    audio: np.ndarray,
    start: int,
    stop: int,
) -> int:
    """Encode ``audio[:, start:stop]`` in AAC-sized frames; return the new offset."""
    sample_rate = stream.codec_context.sample_rate
    for offset in range(start, stop, AAC_FRAME_SIZE):
        chunk = np.ascontiguousarray(audio[:, offset : min(offset + AAC_FRAME_SIZE, stop)])
        frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
        frame.sample_rate = sample_rate
        frame.pts = offset
        frame.time_base = Fraction(1, sample_rate)
        container.mux(stream.encode(frame))
    return max(start, stop)


def remux_faststart(src: str | Path, dst: str | Path) -> int:
    """Copy the video packets of ``src`` (e.g. a fragmented MP4 of a streamed session)
    into a progressive MP4 with the ``moov`` atom first; no re-encode. Returns the bytes
    written."""
    with (
        av.open(str(src)) as inp,
        av.open(str(dst), "w", format="mp4", options={"movflags": "+faststart"}) as out,
    ):
        source = inp.streams.video[0]
        target = out.add_stream_from_template(source)
        for packet in inp.demux(source):
            if packet.dts is None:  # the demuxer's flush packet
                continue
            packet.stream = target
            out.mux(packet)
    return Path(dst).stat().st_size


# ---- a job's video files ------------------------------------------------------------

VideoFiles = list[tuple[str, Path, str]]  # (variant, path, content type)


def encode_video(media: Media, tmp: Path, digest: Any = None) -> VideoFiles:
    """A video job's files in ``tmp``: the MP4, its thumbnail (the middle frame) and its
    spritesheet. ``digest`` (a ``hashlib`` object), when given, is fed the raw uint8
    frames."""
    if digest is not None:
        digest.update(np.ascontiguousarray(media.frames).data)
    encode_mp4(media, tmp / "video.mp4")
    frames = np.asarray(media.frames)
    return finish_video(frames[len(frames) // 2], tmp, frames)


def finish_video(middle: np.ndarray, tmp: Path, frames: np.ndarray | None = None) -> VideoFiles:
    """The files of a video whose MP4 is written: add the thumbnail and the spritesheet
    (of ``frames``: the clip's uint8 frames, or the ones a streamed decode picked for it,
    ``Streamed.sprites``; None: read back from the MP4)."""
    thumb_path = tmp / "thumbnail.jpg"
    encode_thumbnail(middle, thumb_path)
    return [
        ("video", tmp / "video.mp4", "video/mp4"),
        ("thumbnail", thumb_path, "image/jpeg"),
        spritesheet(tmp, frames),
    ]


@dataclass(frozen=True)
class Streamed:
    """A video written while it decoded: its middle frame (the thumbnail's), the frames
    of its spritesheet (``workers.media.spritesheet.sprite_indices``) and whether the MP4
    carries a soundtrack."""

    middle: np.ndarray
    has_audio: bool
    sprites: np.ndarray | None = None


def decode_streamed(
    pipe: SupportsDecodeStream, state: Any, fps: float, tmp: Path, digest: Any = None
) -> Streamed | None:
    """Decode and encode at once where the adapter streams its decode
    (``SupportsDecodeStream.decode_stream``): x264 encodes each chunk on the writer's thread while
    the next one decodes, with the soundtrack interleaved. A chunk still on the GPU (a torch
    tensor) is converted to ``yuv420p`` there (``workers.media.pixels``), so the writer hands it
    to x264 as it is. Returns once ``tmp/video.mp4`` is complete; None: no stream, the
    caller decodes whole. ``digest`` (a ``hashlib`` object), when given, is fed the raw
    uint8 RGB frames in order."""
    started, full_collections = time.monotonic(), gc.get_stats()[2]["collections"]
    stream = pipe.decode_stream(state)
    if stream is None:
        return None
    from workers.media.pixels import yuv420p  # torch, for chunks left on the device

    marks = {"soundtrack": time.monotonic() - started}  # decode_stream decodes it up front
    kept: list[np.ndarray | torch.Tensor] = []  # the chunks, for the middle frame (the thumbnail)
    mp4 = Mp4Writer(
        tmp / "video.mp4",
        fps,
        audio=stream.audio,
        sample_rate=stream.sample_rate,
        threads=streaming_threads(),
    )
    with mp4:
        for chunk in stream.chunks:
            if isinstance(chunk, np.ndarray):
                mp4.write(chunk)
            else:
                mp4.write_planes(yuv420p(chunk).cpu().numpy())
            kept.append(chunk)
            if digest is not None:
                digest.update(_host(chunk).data)
            marks.setdefault("first frames", time.monotonic() - started)
        marks["last frames"] = time.monotonic() - started
    marks["mp4 complete"] = time.monotonic() - started
    log.info(
        "streamed decode of %d frames in %d chunks: %s; %d full garbage collections",
        mp4.frames,
        len(kept),
        ", ".join(f"{name} {seconds:.3f} s" for name, seconds in marks.items()),
        gc.get_stats()[2]["collections"] - full_collections,
    )
    picked = [_frame(kept, k) for k in (mp4.frames // 2, *sprite_indices(mp4.frames))]
    sprites = np.stack(picked[1:])
    return Streamed(picked[0], has_audio=stream.audio is not None, sprites=sprites)


def _frame(chunks: list[np.ndarray | torch.Tensor], index: int) -> np.ndarray:
    """Frame ``index`` of a clip kept as its decoded chunks, on the host."""
    for chunk in chunks:
        if index < len(chunk):
            return _host(chunk[index])
        index -= len(chunk)
    raise RuntimeError("the decode stream made no such frame")


def _host(frames: np.ndarray | torch.Tensor) -> np.ndarray:
    """``frames`` (a numpy array or a torch tensor on any device) as a contiguous array."""
    if not isinstance(frames, np.ndarray):
        frames = frames.cpu().numpy()
    return np.ascontiguousarray(frames)


@dataclass(frozen=True)
class Jpeg:
    data: bytes
    width: int
    height: int


def preview_jpeg(image: np.ndarray, max_side: int) -> Jpeg:
    """A small JPEG of a uint8 H×W×3 (or H×W) preview, longer side ≤ ``max_side``."""
    img = Image.fromarray(np.asarray(image, dtype=np.uint8))
    img.thumbnail((max_side, max_side), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=70)
    return Jpeg(buf.getvalue(), img.width, img.height)
