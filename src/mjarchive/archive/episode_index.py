"""The episode index (format 1.3, spec "Episode index"): per world, how many reset markers lie in the
frames up to the end of each chunk of frames. The writer keeps it; readers count and find episodes
reading O(request) instead of every `reset` chunk of a days-long run.

`reset_count[k, w]` is the number of frames f with 1 <= f < (k + 1) * C where `reset[f, w]` is set. Only
the rows of whole chunks (k < n_frames // C) are trusted: a partial last chunk's row is counted from
`reset` itself (it is rewritten as the chunk fills, and may be ahead of the commit after a crash).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

from .._errors import FormatError, MjArchiveError, SelectionError
from .format import MAX_UNCOMMITTED_CHUNKS, RESET_COUNT, check_array, codec_names, version_at_least
from .storage.chunk_writer import ChunkWriter
from .storage.shard_writer import enabled as enabled_fast_writes

__all__ = ["INDEX_ROWS", "EpisodeIndex", "IndexWriter", "check_episode_range", "check_index_array", "checked_rows", "index_array_spec",
           "has_index"]

INDEX_ROWS = 64  # rows (chunks of frames) per stored chunk of the index
_SCAN_FRAMES = 1 << 20  # without an index (format <= 1.2): reset markers are read in blocks of this many frames
_INDEX_BLOCK = 64 * INDEX_ROWS  # index rows read at once when looking for episode starts
_DIRECT_PIECES = 256  # (chunk, world) pieces of reset markers read at once (the reader's direct path)


def has_index(manifest: Any) -> bool:
    """Whether archives of this manifest's format version carry (and must carry) `reset_count`."""
    return version_at_least(manifest.format_version, (1, 3))


def index_array_spec(n_worlds: int, shard_worlds: int) -> dict[str, Any]:
    """`create_array`'s arguments for the episode index of `n_worlds` worlds."""
    return dict(shape=(0, n_worlds), chunks=(INDEX_ROWS, shard_worlds), dtype="int64", dimension_names=("chunk", "world"),
                compressors=zarr.codecs.ZstdCodec(level=3), fill_value=0)


def check_index_array(arr: Any, manifest: Any, n_frames: int) -> None:
    """The spec's checks of `reset_count`'s metadata, before any chunk of it is read."""
    check_array(arr, RESET_COUNT, dtypes={"int64"}, ndim=2)
    meta = arr.metadata.to_dict()
    codecs = codec_names(meta.get("codecs"))
    if codecs != ["bytes", "zstd"] or tuple(meta.get("dimension_names") or ()) != ("chunk", "world"):
        raise FormatError(f"array {RESET_COUNT!r} has codecs {codecs} and dimension names "
                          f"{meta.get('dimension_names')}; the spec requires ['bytes', 'zstd'] and ['chunk', 'world']")
    W, cf = len(manifest.world_ids), manifest.chunk_frames
    if arr.shape[1] != W:
        raise FormatError(f"array {RESET_COUNT!r} has shape {arr.shape}; expected (chunks, {W})")
    expected = (INDEX_ROWS, manifest.shard_worlds)
    if tuple(arr.chunks) != expected or getattr(arr, "shards", None) is not None:
        raise FormatError(f"array {RESET_COUNT!r} is chunked {tuple(arr.chunks)} in shards "
                          f"{getattr(arr, 'shards', None)}; the spec requires unsharded chunks {expected}")
    whole = n_frames // cf
    if arr.shape[0] < whole:
        raise FormatError(f"array {RESET_COUNT!r} has {arr.shape[0]} rows, but the {n_frames} committed frames "
                          f"fill {whole} chunks; the archive's commit record or episode index is corrupt")
    limit = -(-n_frames // cf) + MAX_UNCOMMITTED_CHUNKS + INDEX_ROWS
    if arr.shape[0] > limit:
        raise FormatError(f"array {RESET_COUNT!r} declares {arr.shape[0]} rows, far beyond the "
                          f"{-(-n_frames // cf)} chunks of committed frames; the archive is corrupt")


class IndexWriter:
    """The writer's side: one row per chunk of frames, written with that chunk (before its commit)."""

    def __init__(self, root: zarr.Group, manifest: Any, n_frames: int, created: zarr.Array | None = None):
        try:
            arr = root[RESET_COUNT] if created is None else created
            check_index_array(arr, manifest, n_frames)
        except MjArchiveError:
            raise
        except KeyError:
            raise FormatError(f"the archive is format {manifest.format_version} but has no {RESET_COUNT!r} "
                              "array (its episode index); it is damaged") from None
        except Exception as exc:  # zarr refuses malformed metadata with its own exceptions
            raise FormatError(f"the metadata of array {RESET_COUNT!r} is unreadable: {exc!r}") from None
        self._array = arr.with_config({"write_empty_chunks": True})
        self._chunks = ChunkWriter.for_array(self._array) if enabled_fast_writes() else None
        self._cf = manifest.chunk_frames
        W = len(manifest.world_ids)
        whole = n_frames // self._cf
        self._block_start = (whole // INDEX_ROWS) * INDEX_ROWS
        self._block = np.zeros((INDEX_ROWS, W), np.int64)
        if whole > self._block_start:  # the whole chunks already in this block are kept as they are
            self._block[: whole - self._block_start] = checked_rows(arr, self._block_start, whole, None, self._cf)
        self._before = self._block[whole - self._block_start - 1].copy() if whole else np.zeros(W, np.int64)

    def write(self, start: int, reset: np.ndarray) -> None:
        """The row of the chunk of frames starting at `start`, whose first len(reset) frames are given."""
        k = start // self._cf
        counted = reset[1:] if start == 0 else reset  # frame 0 starts an episode whatever its marker
        row = self._before + np.count_nonzero(counted, axis=0)
        block_start = (k // INDEX_ROWS) * INDEX_ROWS
        if block_start != self._block_start:
            self._block[:] = 0
            self._block_start = block_start
        self._block[k - block_start] = row
        stop = block_start + INDEX_ROWS
        if self._array.shape[0] < stop:
            self._array.resize((stop, self._block.shape[1]))
        if self._chunks is None or not self._chunks.write(block_start, self._block):
            self._array[block_start:stop] = self._block  # whole stored chunks: nothing is read back
        if len(reset) == self._cf:
            self._before = row

    def trim(self, n_frames: int) -> None:
        rows = -(-n_frames // self._cf)
        if self._array.shape[0] != rows:
            self._array.resize((rows, self._block.shape[1]))


# -- reading ---------------------------------------------------------------------------------------------------

def check_episode_range(start: Any, stop: Any, limit: Any) -> None:
    for name, v in (("start", start), ("stop", stop), ("limit", limit)):
        if (v is not None or name == "start") and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
            raise SelectionError(f"{name} must be a non-negative integer, got {v!r}")


def checked_rows(arr: Any, lo: int, hi: int, positions: Any, cf: int) -> np.ndarray:
    """Rows [lo, hi) of `reset_count` (all worlds, or `positions`), checked: counts never fall and never
    exceed the frames they count."""
    try:
        rows = np.asarray(arr[lo:hi] if positions is None else arr[lo:hi, positions], dtype=np.int64)
    except MjArchiveError:
        raise
    except Exception as exc:  # a corrupt chunk fails inside zarr or numcodecs
        raise FormatError(f"reading {RESET_COUNT!r} rows {lo}..{hi} failed; the archive may be corrupt: "
                          f"{exc!r}") from None
    limit = (np.arange(lo, hi, dtype=np.int64) + 1) * cf - 1
    if rows.size and ((rows < 0).any() or (rows > limit[:, None]).any()
                      or (rows.shape[0] > 1 and (np.diff(rows, axis=0) < 0).any())):
        raise FormatError(f"{RESET_COUNT!r} rows {lo}..{hi} hold counts that fall or exceed the frames they count; "
                          "the archive's episode index is corrupt (mjarchive verify says more)")
    return rows


class EpisodeIndex:
    """The reader's side, over one (single or part) `Archive`: counts and episode starts of worlds,
    from `reset_count` where the archive has it, else from `reset` read in blocks."""

    def __init__(self, archive: Any, array: Any | None):
        self._archive, self._array = archive, array
        self._cf = archive.manifest.chunk_frames

    def _through(self, k: int, positions: np.ndarray) -> np.ndarray:
        """Reset markers (frames >= 1) of each world in frames [0, (k + 1) * C), for a whole chunk k (-1: none)."""
        if k < 0:
            return np.zeros(len(positions), np.int64)
        return checked_rows(self._array, k, k + 1, positions, self._cf)[0]

    def _resets(self, positions: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """reset[lo:hi] of these world positions, frame 0's marker dropped."""
        block = self._archive._read("reset", slice(lo, hi), positions)
        if lo == 0 and hi > 0:
            block = block.copy()
            block[0] = False
        return block

    def counts(self, positions: np.ndarray) -> np.ndarray:
        """Episodes of each world in the committed frames: 1 + its reset markers after frame 0 (0 without frames)."""
        n = self._archive.n_frames
        if not n:
            return np.zeros(len(positions), np.int64)
        if self._array is None:
            total = np.ones(len(positions), np.int64)
            step = max(1, _SCAN_FRAMES // max(1, len(positions)))
            for lo in range(0, n, step):
                total += np.count_nonzero(self._resets(positions, lo, min(n, lo + step)), axis=0)
            return total
        whole = n // self._cf
        tail = self._resets(positions, whole * self._cf, n) if n % self._cf else np.zeros((0, len(positions)), bool)
        return 1 + self._through(whole - 1, positions) + np.count_nonzero(tail, axis=0)

    def numbers(self, position: int, frames: np.ndarray) -> np.ndarray:
        """The episode number (0 from frame 0, +1 at every reset) of one world at each of `frames`."""
        frames = np.asarray(frames, np.int64)
        out = np.zeros(frames.shape, np.int64)
        if not frames.size:
            return out
        if self._array is None:  # without an index: every marker up to the last frame asked
            marks = np.cumsum(self._resets(np.array([position]), 0, int(frames.max()) + 1)[:, 0])
            return marks[frames].astype(np.int64)
        pos = np.array([position])
        chunks = sorted(set((frames // self._cf).tolist()))
        r0, r1 = max(0, chunks[0] - 1), chunks[-1]  # the rows before each chunk, in one read when near
        rows = checked_rows(self._array, r0, r1, pos, self._cf)[:, 0] if 0 < r1 - r0 <= _INDEX_BLOCK else None
        for k in chunks:
            at = frames // self._cf == k
            lo = k * self._cf
            marks = np.cumsum(self._resets(pos, lo, int(frames[at].max()) + 1)[:, 0])
            before = 0 if k == 0 else rows[k - 1 - r0] if rows is not None else self._through(k - 1, pos)[0]
            out[at] = before + marks[frames[at] - lo]
        return out

    def starts(self, positions: np.ndarray, lo: int, hi: int, limit: int | None, reverse: bool) -> list[int]:
        """Frames f in [lo, hi) where an episode of any of these worlds starts (frame 0, and each reset
        marker), in order (reverse: from hi down), at most `limit`. With the index, only chunks whose
        count grows are read, several at once."""
        n = self._archive.n_frames
        lo, hi = max(0, lo), min(hi, n)
        found: list[int] = []
        if lo >= hi or limit == 0 or not len(positions):
            return found
        first, last = lo // self._cf, (hi - 1) // self._cf
        if self._array is None:
            batches = _spans(first, last, max(1, _SCAN_FRAMES // (self._cf * len(positions))), reverse)
        else:
            batches = self._chunks_with_starts(positions, first, last, reverse)
        for chunks in batches:
            frames = np.concatenate([np.arange(max(lo, k * self._cf), min(hi, (k + 1) * self._cf)) for k in chunks])
            marks = self._archive._read("reset", frames, positions).any(axis=1)
            marks[frames == 0] = True  # frame 0 starts an episode whatever its marker
            got = frames[marks][::-1] if reverse else frames[marks]
            found += got[: None if limit is None else limit - len(found)].tolist()
            if limit is not None and len(found) >= limit:
                break
        return found

    def _chunks_with_starts(self, positions: np.ndarray, first: int, last: int, reverse: bool):
        """Batches of the chunks in [first, last] that may hold an episode start of these worlds, in order:
        chunk 0, each whole chunk whose count grows, the partial last chunk. Index rows are read in
        growing windows, reset markers of up to _DIRECT_PIECES (chunk, world) pieces at a time."""
        whole = self._archive.n_frames // self._cf
        per_batch = max(1, _DIRECT_PIECES // len(positions))
        for k0, k1 in _windows(first, last, reverse):
            r0, r1 = max(0, k0 - 1), min(k1, whole)  # with the row before: growth within the block
            rows = checked_rows(self._array, r0, r1, positions, self._cf) if r1 > r0 else np.zeros((0, len(positions)))
            if k0 == 0:
                rows = np.vstack([np.zeros((1, len(positions)), np.int64), rows])
            grows = np.flatnonzero((np.diff(rows, axis=0) > 0).any(axis=1)) + k0
            ks = sorted({*grows.tolist(), *(k for k in (0, whole) if k0 <= k < k1)})
            ks = ks[::-1] if reverse else ks
            for i in range(0, len(ks), per_batch):
                yield sorted(ks[i:i + per_batch])


def _windows(first: int, last: int, reverse: bool):
    """[k0, k1) windows over chunks first..last, from the near end: a stored chunk of index rows first,
    then twice as many each time up to _INDEX_BLOCK (a search that ends early reads little)."""
    size, k = INDEX_ROWS, (last + 1 if reverse else first)
    while first < k if reverse else k <= last:
        lo, hi = (max(first, k - size), k) if reverse else (k, min(last + 1, k + size))
        yield lo, hi
        k, size = (lo if reverse else hi), min(2 * size, _INDEX_BLOCK)


def _spans(first: int, last: int, step: int, reverse: bool):
    """Without an index: every chunk, `step` chunks at a time."""
    spans = [list(range(k, min(last + 1, k + step))) for k in range(first, last + 1, step)]
    return reversed(spans) if reverse else spans
