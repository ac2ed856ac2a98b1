"""Camera streams as MP4 (H.264 through PyAV): encode frame arrays, decode them back.

Defaults favour small robot-camera frames: full-resolution chroma (``yuv444p``; 4:2:0 would
smear the colour of a 5-pixel object) and ``crf=0`` (lossless in YUV, at 64x64 about 1.4 KB a
frame; only the RGB<->YUV rounding remains, at most 2/255). Encoding is single-threaded, which
makes the bytes deterministic: the same frames always give the same file and content hash.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

from robo_pipe.errors import RoboPipeError

CODEC = "h264"
PIX_FMT = "yuv444p"
GOP = 2
"""Keyframe every 2 frames, as LeRobot does: random access decodes at most one extra frame."""


class VideoError(RoboPipeError, ValueError):
    """A video file is missing, unreadable or does not hold what its metadata says."""


def encode_video(frames: np.ndarray, path: Path, fps: float, crf: int = 0) -> None:
    """Write ``frames`` (uint8, ``(T, H, W, 3)`` RGB, H and W even) as an MP4 at ``fps``."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise VideoError(
            f"{path}: frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}"
        )
    height, width = frames.shape[1:3]
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream(
            "libx264", rate=round(fps), options={"crf": str(crf), "g": str(GOP), "threads": "1"}
        )
        stream.width, stream.height, stream.pix_fmt = width, height, PIX_FMT
        stream.codec_context.thread_count = 1
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def decode_video(path: Path) -> np.ndarray:
    """All frames of ``path`` as uint8 ``(T, H, W, 3)`` RGB.

    Raises:
        VideoError: the file is missing or cannot be decoded (truncated, not a video).
    """
    if not path.is_file():
        raise VideoError(f"{path}: video file missing")
    try:
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    except (av.error.FFmpegError, IndexError, ValueError) as err:
        raise VideoError(f"{path}: cannot decode video: {err}") from err
    if not frames:
        raise VideoError(f"{path}: video holds no frames")
    return np.stack(frames)


def count_frames(path: Path) -> int:
    """Number of frames in ``path`` by demuxing packets (no decoding)."""
    try:
        with av.open(str(path)) as container:
            return sum(1 for p in container.demux(video=0) if p.size > 0)
    except (av.error.FFmpegError, IndexError, ValueError) as err:
        raise VideoError(f"{path}: cannot read video: {err}") from err
