"""Stored chunks of a `PoseWindow`'s worlds: one chunk's arrays as read from the archive, and which
chunks the window holds around its playhead (frames.py keeps, evicts and prefetches them)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..archive.overlays import OverlayFrames

__all__ = ["Chunk", "chunks_around", "read_chunk"]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One stored chunk of the window's worlds, as read (`read_chunk`)."""

    index: int
    start: int
    stop: int  # frames [start, stop) are held; stop < start + chunk_frames for a last, partial chunk
    qpos: np.ndarray  # (n, W, nq) as stored
    mocap_pos: np.ndarray | None  # (n, W, nmocap, 3)
    mocap_quat: np.ndarray | None
    time: np.ndarray  # (n,)
    overlays: dict[str, OverlayFrames]  # the archive's overlay tracks over these frames and worlds

    @property
    def nbytes(self) -> int:
        arrays = [self.qpos, self.mocap_pos, self.mocap_quat, self.time]
        for o in self.overlays.values():
            arrays += [o.count, o.data, o.text_bytes]
        return sum(a.nbytes for a in arrays if a is not None)


def read_chunk(archive: Any, world_ids: tuple[int, ...], c: int, chunk_frames: int, n_frames: int, *,
               mocap: bool, overlay_names: Iterable[str]) -> Chunk:
    """Chunk c of the worlds, as far as the `n_frames` committed (the caller holds the archive's I/O lock)."""
    start, stop = c * chunk_frames, min((c + 1) * chunk_frames, n_frames)
    sel = archive.select(worlds=list(world_ids), frames=slice(start, stop))
    qpos = sel.qpos
    mpos = sel.mocap_pos if mocap else None
    mquat = sel.mocap_quat if mocap else None
    time = sel.time
    overlays = {name: sel.overlay(name) for name in overlay_names}
    return Chunk(c, start, stop, qpos, mpos, mquat, time, overlays)


def chunks_around(playhead: int, n_frames: int, chunk_frames: int, window_chunks: int) -> list[int]:
    """Chunks to hold for this playhead, most wanted first: its own, those ahead, those behind."""
    last = math.ceil(n_frames / chunk_frames) - 1
    if last < 0:
        return []
    c = min(max(playhead // chunk_frames, 0), last)
    k = window_chunks
    return ([c] + [c + i for i in range(1, k + 1) if c + i <= last]
            + [c - i for i in range(1, k + 1) if c - i >= 0])
