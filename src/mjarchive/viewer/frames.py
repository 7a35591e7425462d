"""World poses of an archive's geoms and bodies at any committed frame, for a viewer's playhead.

`PoseWindow` reads the selected worlds' qpos (and mocap) one stored chunk at a time, keeps at most
`2 * window_chunks + 1` chunks, reads the chunks around and ahead of the playhead in a background
thread, and runs `mj_kinematics` on the host for each frame asked for. Its memory is bounded
whatever the archive's length, and it follows a live archive through `refresh()`.

Format 1.1: each world's kinematic variant values in force (`POSE_FIELDS`) are set in the model
before its kinematics, so a world's poses follow its own body and geom placements; `variant()`
gives a world's values in force for drawing, `variant_segments()` says when they change. The
chunks also hold the archive's overlay tracks for those frames (`overlays()`).

Its parts: `chunks` (reading one chunk, which to hold), `kinematics` (poses from qpos) and
`variant_values` (each world's values in force).

    with PoseWindow(archive, model, [0, 3], [m.geom for m in geom_meshes(model)]) as window:
        window.set_playhead(120)
        p = window.poses(120)       # p.geom_pos (2, G, 3), p.geom_quat (2, G, 4) wxyz, metres
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from .._errors import ClosedError, SelectionError
from ..archive.overlays import OverlayRows
from .chunks import Chunk, chunks_around, read_chunk, track_bytes
from .kinematics import POSE_FIELDS, FramePoses, PoseSolver
from .variant_values import VARIANT_CACHE_PER_WORLD, VariantValues

__all__ = ["FramePoses", "MAX_EPISODE_STARTS", "MAX_VIEW_WORLDS", "MAX_WINDOW_BYTES", "POSE_CACHE_FRAMES",
           "POSE_FIELDS", "VARIANT_CACHE_PER_WORLD", "PoseWindow"]

#: The most worlds one window (one browser page) shows at once.
MAX_VIEW_WORLDS = 64
#: Bytes of stored chunks one window holds at most (`max_memory_bytes` less poses and variant values).
MAX_WINDOW_BYTES = 1 << 30
#: Episode starts kept per world (the page lists the first 12); more are counted, and found when asked
#: for through the archive's episode index (`PoseWindow.episode_start_near`, `episode_marks`).
MAX_EPISODE_STARTS = 16
#: Frames whose computed poses are kept (scrubbing back and forth, several clients on one frame).
POSE_CACHE_FRAMES = 8

_log = logging.getLogger(__name__)


class PoseWindow:
    """Poses of selected worlds at any committed frame, read lazily: a window of stored chunks
    around the playhead, prefetched in a background thread, memory bounded whatever the archive's length.

    `archive`: an open `mjarchive.Archive` (any store, live or finalized); `model`: its compiled
    model (`archive.model()`); `world_ids`: 1..MAX_VIEW_WORLDS distinct original world IDs;
    `geoms`: the geom ids whose poses `poses()` returns (e.g. those of `geom_meshes(model)`).
    At most `2 * window_chunks + 1` stored chunks are held. Thread-safe: `poses()` may be called
    from any number of threads. The window uses `archive` for reads and refreshes; close the
    archive after the window.
    """

    def __init__(self, archive: Any, model: mujoco.MjModel, world_ids: Sequence[int], geoms: Sequence[int], *,
                 window_chunks: int = 3, prefetch: bool = True):
        archive.manifest.layout.check_compatible(model)
        self.world_ids: tuple[int, ...] = _parse_worlds(archive, world_ids)
        self._geoms = _parse_geoms(model, geoms)
        if isinstance(window_chunks, bool) or not isinstance(window_chunks, (int, np.integer)) or window_chunks < 0:
            raise SelectionError(f"window_chunks must be an integer >= 0, got {window_chunks!r}")
        self._archive = archive
        self._model = model
        self._window_chunks = int(window_chunks)
        self._capacity = 2 * self._window_chunks + 1
        self._cf = int(archive.manifest.chunk_frames)
        self._mocap = archive.nmocap > 0
        self._variant_fields = tuple(archive.variant_fields)
        self._pose_fields = tuple(f for f in POSE_FIELDS if f in self._variant_fields)
        self._variant_row_bytes = sum(np.asarray(getattr(model, f)).nbytes for f in self._variant_fields)
        self._overlay_specs = dict(archive.overlays)
        # Bounded before anything is read: the chunks held must fit MAX_WINDOW_BYTES (fewer are held around
        # the playhead if need be), and a single chunk that does not is refused.
        one = self.chunk_bytes
        if one > MAX_WINDOW_BYTES:
            fit = max(1, len(self.world_ids) * MAX_WINDOW_BYTES // one)
            raise SelectionError(f"one stored chunk of these {len(self.world_ids)} worlds takes {one:,} bytes in "
                                 f"memory ({self._cf} frames with their overlays), more than a view holds "
                                 f"({MAX_WINDOW_BYTES:,}, MAX_WINDOW_BYTES); show fewer worlds at once (about {fit})")
        if self._capacity * one > MAX_WINDOW_BYTES:
            self._window_chunks = (MAX_WINDOW_BYTES // one - 1) // 2
            self._capacity = 2 * self._window_chunks + 1
        # Archive I/O (reads and refresh) goes through one lock: a refresh replaces the reader's arrays,
        # and the store wrappers are not documented as thread-safe. The prefetcher holds it for one chunk.
        self._io_lock = threading.Lock()
        self._cond = threading.Condition()  # guards everything below
        self._n_frames = int(archive.frames_of(list(self.world_ids)))  # (a multi-part archive: these worlds' parts)
        self._chunks: collections.OrderedDict[int, Chunk] = collections.OrderedDict()  # LRU order
        self._loading: dict[int, threading.Event] = {}
        self._poses: collections.OrderedDict[int, FramePoses] = collections.OrderedDict()
        self._episodes: dict[int, tuple[int, list[int], int]] = {}  # world -> (frames read, starts, count)
        self._marks: tuple[int, int, list[int]] | None = None  # (frames, limit, starts of any world)
        self._variants = VariantValues(archive, self.world_ids, self._io_lock, self._cond)
        self._playhead: int | None = None
        self._wanted_gen = 0  # bumped by set_playhead() and refresh(); the prefetcher works until it catches up
        self._done_gen = 0
        self._closed = False
        self._solver = PoseSolver(model, self._geoms, len(self.world_ids), self._pose_fields)
        self._thread: threading.Thread | None = None
        if prefetch:
            self._thread = threading.Thread(target=self._prefetch_loop, name="mjarchive-view-prefetch", daemon=True)
            self._thread.start()

    # -- public API ------------------------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        """Committed frames known to this window (as of opening or the last `refresh()`)."""
        return self._n_frames

    @property
    def chunk_frames(self) -> int:
        return self._cf

    @property
    def geoms(self) -> tuple[int, ...]:
        return tuple(int(g) for g in self._geoms)

    @property
    def max_chunks(self) -> int:
        """The most stored chunks the window holds: 2 * window_chunks + 1, fewer where MAX_WINDOW_BYTES
        holds fewer."""
        return self._capacity

    @property
    def cached_chunks(self) -> tuple[int, ...]:
        """Indices of the stored chunks held now (chunk c holds frames [c * chunk_frames, ...))."""
        with self._cond:
            return tuple(sorted(self._chunks))

    @property
    def chunk_bytes(self) -> int:
        """Bytes one full chunk of the selected worlds takes in memory at most: qpos, mocap, time, and
        of overlay tracks the counts and the primitives drawn (`chunks.TrackRows`)."""
        lay = self._archive.manifest.layout
        item = np.dtype(self._archive.manifest.dtype).itemsize
        W = len(self.world_ids)
        per_world = (lay.nq + 7 * lay.nmocap) * item
        per_frame = 8 + sum(track_bytes(o, W) for o in self._overlay_specs.values())  # time, overlay tracks
        return self._cf * (W * per_world + per_frame)

    @property
    def memory_bytes(self) -> int:
        """Bytes the window holds now: its chunks, its cached poses and variant values."""
        with self._cond:
            return (sum(c.nbytes for c in self._chunks.values()) + sum(p.nbytes for p in self._poses.values())
                    + self._variants.held * self._variant_row_bytes)

    @property
    def max_memory_bytes(self) -> int:
        """The bound on `memory_bytes`: max_chunks full chunks, POSE_CACHE_FRAMES frames of poses and
        VARIANT_CACHE_PER_WORLD sets of variant values per world."""
        W, G, nbody = len(self.world_ids), len(self._geoms), self._model.nbody
        return (self._capacity * self.chunk_bytes + POSE_CACHE_FRAMES * W * (G + nbody) * 7 * 8
                + VARIANT_CACHE_PER_WORLD * W * self._variant_row_bytes)

    def refresh(self) -> int:
        """See frames committed since opening or the last refresh (a live archive); returns n_frames.

        A last chunk that was read while partial is dropped, so its new frames are read again.
        """
        self._check_open()
        with self._io_lock:
            self._archive.refresh()
            n = int(self._archive.frames_of(list(self.world_ids)))
            with self._cond:
                if n < self._n_frames:  # never for a valid archive; start over rather than serve stale data
                    self._chunks.clear()
                    self._poses.clear()
                    self._episodes.clear()
                    self._marks = None
                else:
                    for c in [c for c, ch in self._chunks.items() if ch.stop - ch.start < self._cf and ch.stop < n]:
                        del self._chunks[c]
                self._n_frames = n
                self._variants.forget_changes()
                self._wanted_gen += 1
                self._cond.notify_all()
        return n

    def poses(self, frame: int) -> FramePoses:
        """Poses of every selected world at `frame` (0 <= frame < n_frames). Raises SelectionError."""
        self._check_open()
        frame = self._check_frame(frame)
        with self._cond:
            hit = self._poses.get(frame)
            if hit is not None:
                self._poses.move_to_end(frame)
                return hit
        chunk = self._get_chunk(frame // self._cf, need=frame + 1)
        values = [self._variants.at(w, frame) for w in range(len(self.world_ids))] if self._pose_fields else None
        out = self._solver.poses(chunk, frame, values)
        with self._cond:
            self._poses[frame] = out
            self._poses.move_to_end(frame)
            while len(self._poses) > POSE_CACHE_FRAMES:
                self._poses.popitem(last=False)
        return out

    def variant_segments(self, frame: int) -> tuple[int, ...]:
        """Per world (in `world_ids` order): how many of its variant changes lie at or before `frame`.
        Two frames with equal tuples are drawn with the same values in force; () without variants."""
        if not self._variant_fields:
            return ()
        frame = self._check_frame(frame)
        return self._variants.segments(frame)

    def variant(self, world_id: int, frame: int) -> dict[str, np.ndarray]:
        """The world's variant values in force at `frame` (`Archive.variant`), read once per stretch
        between its changes and kept (read-only arrays); {} for an archive without variants."""
        self._check_open()
        if not self._variant_fields:
            return {}
        try:
            w = self.world_ids.index(int(world_id))
        except (TypeError, ValueError):
            raise SelectionError(f"world {world_id!r} is not shown in this window; it shows "
                                 f"{list(self.world_ids)}") from None
        return self._variants.at(w, self._check_frame(frame))

    def overlays(self, frame: int) -> dict[str, OverlayRows]:
        """The archive's overlay tracks at `frame`: name -> its primitives over the window's worlds
        (`row_primitives` draws them), the first chunks.MAX_LABELS labels or
        chunks.VIEW_PRIMITIVES_PER_TRACK points or arrows in world order (`hidden_primitives`
        counts the others); {} without overlays."""
        self._check_open()
        frame = self._check_frame(frame)
        if not self._overlay_specs:
            return {}
        chunk = self._get_chunk(frame // self._cf, need=frame + 1)
        return {name: t.rows[frame - chunk.start] for name, t in chunk.overlays.items()}

    def hidden_primitives(self, frame: int) -> dict[str, int]:
        """Per overlay track: primitives stored at `frame` that the viewer does not draw (past
        chunks.MAX_LABELS or chunks.VIEW_PRIMITIVES_PER_TRACK); from the counts, nothing else read.
        {} without overlays."""
        self._check_open()
        frame = self._check_frame(frame)
        if not self._overlay_specs:
            return {}
        chunk = self._get_chunk(frame // self._cf, need=frame + 1)
        return {name: t.hidden(frame - chunk.start) for name, t in chunk.overlays.items()}

    def episode_starts(self, world_id: int) -> list[int]:
        """Frames where the world's episodes start (frame 0 and each reset): the first
        MAX_EPISODE_STARTS of them (`episode_count` counts all), from the archive's episode index;
        a `refresh()` looks at the new frames only."""
        return list(self._episode_state(world_id)[1])

    def episode_marks(self, limit: int) -> list[int] | None:
        """Frames after frame 0 where an episode of any of the window's worlds starts, ascending, if
        there are at most `limit` of them, else None (too many to mark). From the episode index: a
        world with more resets than that decides it from one row; otherwise only chunks holding one are read."""
        self._check_open()
        with self._io_lock:
            with self._cond:
                n, cached = self._n_frames, self._marks
            if cached is None or cached[:2] != (n, limit):
                ids = list(self.world_ids)
                marks = None
                # (the counts are over the archive's frames: of a multi-part one, over each world's part)
                whole = not self._archive.parts and self._archive.n_frames == n
                if n and not (whole and int(self._archive.episode_counts(ids).max()) - 1 > limit):
                    marks = self._archive.episode_starts(ids, 1, n, limit=limit + 1)
                    marks = marks if len(marks) <= limit else None
                cached = (n, limit, [] if not n else marks)
                with self._cond:
                    if n == self._n_frames:
                        self._marks = cached
        return None if cached[2] is None else list(cached[2])

    def episode_count(self, world_id: int) -> int:
        """Episodes of the world in the committed frames (1 + its resets after frame 0)."""
        return self._episode_state(world_id)[2]

    def episode_start_near(self, frame: int, direction: int) -> int | None:
        """The nearest episode start after frame 0 of any of the window's worlds after `frame`
        (direction > 0) or before it (direction < 0); None where there is none.

        The kept starts (`episode_starts`) answer wherever they reach; past the first
        MAX_EPISODE_STARTS of a world, the archive's episode index finds the nearest chunk of frames
        holding one, and only that chunk's reset markers are read.
        """
        self._check_open()
        if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)):
            raise SelectionError(f"frame must be an integer, got {frame!r}")
        k, forward = int(frame), direction > 0
        states = {w: self._episode_state(w) for w in self.world_ids}
        n = min((s[0] for s in states.values()), default=0)
        best: int | None = None
        scan: list[int] = []  # worlds whose next (previous) start may lie past the kept ones
        floor = k  # backward: the lowest frame that may hold a start not kept
        for w, (_, starts, total) in states.items():
            kept = [s for s in starts if s > 0 and (s > k if forward else s < k)]
            if kept:
                mine = kept[0] if forward else kept[-1]
                best = mine if best is None else min(best, mine) if forward else max(best, mine)
            complete = len(starts) == total
            if forward and not complete and not kept:
                scan.append(w)  # every start up to starts[-1] is kept, and starts[-1] <= k
            elif not forward and not complete and starts[-1] + 1 < k:
                scan.append(w)
                floor = min(floor, starts[-1] + 1)
        if not scan:
            return best
        if forward:
            stop = min(n, best if best is not None else n)
            lo, hi = max(k + 1, 1), stop
        else:
            lo, hi = max(floor, 1, best + 1 if best is not None else 1), min(k, n)
        with self._io_lock:  # the nearest of any of those worlds; the episode index skips chunks without one
            found = self._archive.episode_starts(scan, lo, hi, limit=1, reverse=not forward) if lo < hi else []
        return found[0] if found else best

    def _episode_state(self, world_id: int) -> tuple[int, list[int], int]:
        """(frames read, the first starts, how many starts) of one world, read up to n_frames."""
        self._check_open()
        if isinstance(world_id, bool) or not isinstance(world_id, (int, np.integer)):
            raise SelectionError(f"world IDs must be integers, got {world_id!r}")
        wid = int(world_id)
        self._archive.world_index(wid)  # SelectionError naming the recorded IDs
        with self._io_lock:
            with self._cond:
                n = self._n_frames
                read, starts, total = self._episodes.get(wid, (0, [], 0))
            starts = list(starts)
            if read < n:  # only frames committed since the last read; counts from the episode index
                if len(starts) < MAX_EPISODE_STARTS:
                    starts += self._archive.episode_starts(wid, read, n, limit=MAX_EPISODE_STARTS - len(starts))
                total = int(self._archive.episode_numbers(wid, [n - 1])[0]) + 1
            with self._cond:
                if n == self._n_frames:
                    self._episodes[wid] = (n, starts, total)
        return n, starts, total

    def set_playhead(self, frame: int) -> None:
        """Hint: the chunks around `frame` (window_chunks each side) are read in the background."""
        self._check_open()
        if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)):
            raise SelectionError(f"the playhead must be an integer frame, got {frame!r}")
        with self._cond:
            self._playhead = int(frame)
            self._wanted_gen += 1
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the prefetcher and drop what the window holds; the archive stays open."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._cond:
            self._chunks.clear()
            self._poses.clear()
            self._episodes.clear()
            self._marks = None
            self._variants.clear()

    def __enter__(self) -> PoseWindow:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<PoseWindow worlds={list(self.world_ids)[:8]} frames={self._n_frames} "
                f"chunks={len(self._chunks)}/{self._capacity}{' closed' if self._closed else ''}>")

    # -- internals -----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this PoseWindow is closed; make a new one")

    def _check_frame(self, frame: Any) -> int:
        if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)):
            raise SelectionError(f"frame must be an integer, got {frame!r}")
        n = self._n_frames
        if not 0 <= frame < n:
            if not n:
                raise SelectionError(f"frame {int(frame)} is out of range: the archive has no committed frames yet")
            raise SelectionError(f"frame {int(frame)} is out of range: the window knows {n} committed frames "
                                 f"(0..{n - 1}); call refresh() to see frames committed since")
        return int(frame)

    def _get_chunk(self, c: int, need: int) -> Chunk:
        """Chunk c holding at least frames up to `need` (exclusive): from the cache, from another
        thread's read in flight, or read now."""
        while True:
            with self._cond:
                self._check_open()
                ch = self._chunks.get(c)
                if ch is not None and ch.stop >= need:
                    self._chunks.move_to_end(c)
                    return ch
                event = self._loading.get(c)
                if event is None:
                    event = self._loading[c] = threading.Event()
                    break
            event.wait()  # someone else reads it; then look again (their read may have failed or be short)
        try:
            ch = self._read_chunk(c)
            with self._cond:
                self._insert(ch)
        finally:
            with self._cond:
                self._loading.pop(c, None)
            event.set()
        if ch.stop < need:  # a refresh shrank the archive under us: never for a valid archive
            raise SelectionError(f"frame {need - 1} is no longer committed")
        return ch

    def _read_chunk(self, c: int) -> Chunk:
        with self._io_lock:
            with self._cond:
                n = self._n_frames
            return read_chunk(self._archive, self.world_ids, c, self._cf, n, mocap=self._mocap,
                              overlays=self._overlay_specs)

    def _insert(self, ch: Chunk) -> None:
        """Add a chunk (caller holds _cond), evicting first chunks outside the playhead's window, then
        the least recently used."""
        old = self._chunks.get(ch.index)
        if old is not None and old.stop >= ch.stop:
            return
        self._chunks[ch.index] = ch
        self._chunks.move_to_end(ch.index)
        if len(self._chunks) <= self._capacity:
            return
        wanted = (set(chunks_around(self._playhead, self._n_frames, self._cf, self._window_chunks))
                  if self._playhead is not None else set())
        while len(self._chunks) > self._capacity:
            victim = next((c for c in self._chunks if c not in wanted and c != ch.index),
                          next(c for c in self._chunks if c != ch.index))
            del self._chunks[victim]

    def _prefetch_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._done_gen == self._wanted_gen or self._playhead is None):
                    self._cond.wait()
                if self._closed:
                    return
                gen = self._wanted_gen
                plan = chunks_around(self._playhead, self._n_frames, self._cf, self._window_chunks)
            for c in plan:
                with self._cond:
                    if self._closed or gen != self._wanted_gen:
                        break
                    n = self._n_frames
                need = min((c + 1) * self._cf, n)
                try:
                    self._get_chunk(c, need)
                except ClosedError:
                    return
                except Exception as exc:  # the foreground read of the same chunk raises it to the caller
                    _log.debug("prefetching chunk %d failed: %r", c, exc)
            else:
                with self._cond:
                    if gen == self._wanted_gen:
                        self._done_gen = gen


# -- validation ------------------------------------------------------------------------------------

def _parse_worlds(archive: Any, world_ids: Sequence[int]) -> tuple[int, ...]:
    if isinstance(world_ids, (int, np.integer)) and not isinstance(world_ids, bool):
        world_ids = [world_ids]
    try:
        ids = list(world_ids)
    except TypeError:
        raise SelectionError(f"world_ids must be a list of original world IDs, got {world_ids!r}") from None
    if not 1 <= len(ids) <= MAX_VIEW_WORLDS:
        raise SelectionError(f"a view shows 1 to {MAX_VIEW_WORLDS} worlds (MAX_VIEW_WORLDS), got {len(ids)}; "
                             "pick fewer worlds")
    for w in ids:
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)):
            raise SelectionError(f"world IDs must be integers, got {w!r}")
        archive.world_index(w)  # SelectionError naming the recorded IDs
    ids = [int(w) for w in ids]
    dupes = sorted({w for w in ids if ids.count(w) > 1})
    if dupes:
        raise SelectionError(f"world IDs must be distinct; repeated: {dupes}")
    return tuple(ids)


def _parse_geoms(model: mujoco.MjModel, geoms: Sequence[int]) -> np.ndarray:
    try:
        g = np.asarray(list(geoms))
    except TypeError:
        raise SelectionError(f"geoms must be a list of geom ids, got {geoms!r}") from None
    if g.size == 0:
        return np.zeros(0, np.int64)
    if g.ndim != 1 or g.dtype.kind not in "iu":
        raise SelectionError(f"geoms must be a list of integer geom ids, got {geoms!r}")
    bad = g[(g < 0) | (g >= model.ngeom)]
    if bad.size:
        raise SelectionError(f"geom id {int(bad[0])} is out of range: the model has {model.ngeom} geoms")
    return g.astype(np.int64)

