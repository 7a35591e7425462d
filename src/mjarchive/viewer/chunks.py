"""Stored chunks of a `PoseWindow`'s worlds: one chunk's arrays as read from the archive, and which
chunks the window holds around its playhead (frames.py keeps, evicts and prefetches them).

Overlay tracks are read only as far as the viewer draws them (`TrackRows`): per frame the first
MAX_LABELS labels of a text track, or VIEW_PRIMITIVES_PER_TRACK points or arrows, in the window's world
order; the counts say how many others there are, whose values are never read, kept or decoded.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..archive.overlays import Overlay, OverlayRows
from ..replay.views.overlay_draw import drawn_counts

__all__ = ["Chunk", "MAX_LABELS", "TrackRows", "VIEW_PRIMITIVES_PER_TRACK", "chunks_around", "read_chunk",
           "track_bytes"]

#: Labels one text track shows at once (each is a page element); the rest are counted in the status line.
MAX_LABELS = 128
#: Points or arrows one track draws at once (instances of one batched mesh); the rest are counted.
VIEW_PRIMITIVES_PER_TRACK = 1 << 16


def shown_at_most(overlay: Overlay) -> int:
    """Primitives of one track the viewer draws per frame: MAX_LABELS or VIEW_PRIMITIVES_PER_TRACK."""
    return MAX_LABELS if overlay.kind == "text" else VIEW_PRIMITIVES_PER_TRACK


@dataclasses.dataclass(frozen=True)
class TrackRows:
    """An overlay track over a chunk's frames, cut to what the viewer draws (`read_track`).

    `count` (n, W): primitives stored per frame and world (checked against max_count); `rows`: per
    frame, those drawn (the first `shown_at_most` in world order), checked and, for text, decoded
    (`archive.overlays.OverlayRows`); the others are counted, never read.
    """

    count: np.ndarray
    rows: list[OverlayRows]

    @property
    def nbytes(self) -> int:
        """Counts, values, and labels' text (Python keeps up to 4 bytes a character, and ~56 per string)."""
        return self.count.nbytes + sum(r.data.nbytes + r.world.nbytes + sum(4 * len(s) + 56 for s in r.labels)
                                       for r in self.rows)

    def hidden(self, i: int) -> int:
        """Primitives of row i not drawn (past `shown_at_most`)."""
        return int(self.count[i].sum()) - len(self.rows[i].world)


def track_bytes(overlay: Overlay, n_worlds: int) -> int:
    """The most bytes a `TrackRows` holds per frame: counts, and the primitives drawn."""
    each = 8 * overlay.width + 8 + (4 * overlay.max_bytes + 56 if overlay.kind == "text" else 0)
    return 8 * n_worlds + min(shown_at_most(overlay), n_worlds * overlay.max_count) * each


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
    overlays: dict[str, TrackRows]  # the archive's overlay tracks over these frames and worlds, as far as drawn

    @property
    def nbytes(self) -> int:
        arrays = [self.qpos, self.mocap_pos, self.mocap_quat, self.time]
        return sum(a.nbytes for a in arrays if a is not None) + sum(t.nbytes for t in self.overlays.values())


def read_chunk(archive: Any, world_ids: tuple[int, ...], c: int, chunk_frames: int, n_frames: int, *,
               mocap: bool, overlays: dict[str, Overlay]) -> Chunk:
    """Chunk c of the worlds, as far as the `n_frames` committed (the caller holds the archive's I/O lock)."""
    start, stop = c * chunk_frames, min((c + 1) * chunk_frames, n_frames)
    sel = archive.select(worlds=list(world_ids), frames=slice(start, stop))
    qpos = sel.qpos
    mpos = sel.mocap_pos if mocap else None
    mquat = sel.mocap_quat if mocap else None
    time = sel.time
    tracks = {name: read_track(sel, name, shown_at_most(overlay)) for name, overlay in overlays.items()}
    return Chunk(c, start, stop, qpos, mpos, mquat, time, tracks)


def read_track(sel: Any, name: str, at_most: int) -> TrackRows:
    """An overlay track over a selection, cut to what is drawn: every world's counts are read, then
    only the first `at_most` primitives of each frame in world order (`Selection.overlay_rows`: one
    stored chunk of one world decoded at a time; only what is kept is checked and decoded)."""
    count = sel.overlay_counts(name)  # (n, W) int64, checked against max_count
    (shown,) = drawn_counts([count], at_most)  # the render's rule, for one track
    return TrackRows(count, sel.overlay_rows(name, shown))


def chunks_around(playhead: int, n_frames: int, chunk_frames: int, window_chunks: int) -> list[int]:
    """Chunks to hold for this playhead, most wanted first: its own, those ahead, those behind."""
    last = math.ceil(n_frames / chunk_frames) - 1
    if last < 0:
        return []
    c = min(max(playhead // chunk_frames, 0), last)
    k = window_chunks
    return ([c] + [c + i for i in range(1, k + 1) if c + i <= last]
            + [c - i for i in range(1, k + 1) if c - i >= 0])
