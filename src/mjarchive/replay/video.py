"""Streaming mp4 output: frames go to ffmpeg as they arrive, so memory is flat in video length."""

from __future__ import annotations

import math
import os
from pathlib import Path
import numpy as np

from .._errors import BackendError, ClosedError
from .._fs import check_name
from .views.camera import camera_label

__all__ = ["VideoWriter", "GridComposer", "video_name", "grid_shape"]

def video_name(world_id: int | None, camera: str, episode: int | None = None, head: str = "grid") -> str:
    """`world-0042_cam-back.mp4`, `world-0042_cam-back_ep-003.mp4`, `grid_cam-back.mp4` or
    (head='scene') `scene_cam-auto.mp4`; `camera` is a `camera_label`. Always a flat file name
    (MjArchiveError otherwise)."""
    head = head if world_id is None else f"world-{int(world_id):04d}"
    tail = "" if episode is None else f"_ep-{int(episode):03d}"
    if camera:
        camera = camera_label(camera, 0)  # already a label: unchanged
    return check_name(f"{head}_cam-{camera}{tail}.mp4")


class VideoWriter:
    """An H.264 mp4 (yuv420p) written frame by frame through imageio-ffmpeg.

    Frames are (H, W, 3) uint8; odd H or W are padded by one edge row/column, since yuv420p
    needs even dimensions. Use as a context manager; `write` after `close` raises ClosedError.
    """

    def __init__(self, path: str | Path, size: tuple[int, int], fps: float, *, crf: int = 23):
        try:
            import imageio_ffmpeg
        except ImportError as exc:
            raise BackendError(f"writing mp4 needs imageio-ffmpeg ({exc}); install `mjarchive[video]`") from None
        self.path = Path(path)
        self.size = (int(size[0]), int(size[1]))
        self.fps = float(fps)
        self.n_frames = 0
        h, w = self.size
        self._pad = (h % 2, w % 2)
        # ffmpeg opens the path itself: hand it an absolute `file:` URL, so no folder name is read
        # as an option (`-x/...`) or a protocol (`concat:...`); the container is named, not guessed.
        self._gen = imageio_ffmpeg.write_frames(
            "file:" + os.path.abspath(self.path), (w + self._pad[1], h + self._pad[0]), fps=self.fps,
            codec="libx264", pix_fmt_in="rgb24", pix_fmt_out="yuv420p", quality=None, macro_block_size=1,
            ffmpeg_log_level="error", output_params=["-crf", str(int(crf)), "-f", "mp4"],
        )
        self._gen.send(None)
        self._closed = False

    def write(self, frame: np.ndarray) -> None:
        """Append one (H, W, 3) uint8 frame."""
        if self._closed:
            raise ClosedError(f"video {self.path.name} is closed")
        if frame.shape != (*self.size, 3) or frame.dtype != np.uint8:
            raise BackendError(f"frame has shape {frame.shape} {frame.dtype}; expected {(*self.size, 3)} uint8")
        if any(self._pad):
            frame = np.pad(frame, ((0, self._pad[0]), (0, self._pad[1]), (0, 0)), mode="edge")
        self._gen.send(np.ascontiguousarray(frame))
        self.n_frames += 1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._gen.close()

    def abort(self) -> None:
        """Stop ffmpeg without finishing the file (its content is then invalid: discard it)."""
        if not self._closed:
            self._closed = True
            try:
                self._gen.throw(_Abort())  # imageio-ffmpeg kills ffmpeg on a BaseException
            except (_Abort, StopIteration):
                pass

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:  # an error upstream: no "No frames have been written" noise, no waiting for ffmpeg
            self.abort()


class _Abort(BaseException):
    """Thrown into imageio-ffmpeg's writer to stop ffmpeg at once."""


def grid_shape(n: int) -> tuple[int, int]:
    """(rows, cols) of a near-square grid holding n tiles."""
    cols = max(1, math.ceil(math.sqrt(n)))
    return math.ceil(n / cols), cols


class GridComposer:
    """Tiles the frames of several worlds into one image per frame (row-major, in world order)."""

    def __init__(self, world_ids: list[int], size: tuple[int, int]):
        self.world_ids = list(world_ids)
        self.size = (int(size[0]), int(size[1]))
        self.rows, self.cols = grid_shape(len(self.world_ids))
        self.out_size = (self.rows * self.size[0], self.cols * self.size[1])
        self._index = {w: i for i, w in enumerate(self.world_ids)}

    def canvas(self, n_frames: int) -> np.ndarray:
        return np.zeros((n_frames, *self.out_size, 3), np.uint8)

    def paste(self, canvas: np.ndarray, world_id: int, frames: np.ndarray, start: int = 0) -> None:
        """Put `frames` (k, H, W, 3) of `world_id` into canvas rows start..start+k."""
        r, c = divmod(self._index[world_id], self.cols)
        h, w = self.size
        canvas[start:start + len(frames), r * h:(r + 1) * h, c * w:(c + 1) * w] = frames
