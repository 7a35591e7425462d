"""The lazy reader: trusts only the committed frame count, reads only the chunks a selection needs."""

from __future__ import annotations

import collections
import functools
import re
from typing import Any

import mujoco
import numpy as np
import zarr

from .bundle.model_bundle import ModelBundle
from .documents import ArrayDocuments, open_array, parse_root
from .bundle.sandbox import compile_untrusted
from .._errors import ClosedError, FormatError, MjArchiveError, SelectionError
from .episode_index import EpisodeIndex, check_episode_range, check_index_array, has_index
from .format import (
    BUNDLE_GROUP,
    MAX_READ_CHUNKS,
    RESET_COUNT,
    check_array,
)
from .manifest import commit_record
from .overlays import Overlay, OverlayFrames, OverlayRows, check_counts, read_rows
from .variant_window import VariantWindow, variant_window
from .variants import apply_variant, check_model_shapes, check_values, default_values
from .parts import is_parts_root
from .storage.locations import open_root_document
from .verify import VerifyReport, verify_archive

__all__ = ["Archive", "Selection", "VerifyReport", "parse_selection"]

_EVENT_CACHE_BYTES = 64 * 2**20  # decoded variant value chunks an Archive keeps
_DIRECT_CHUNKS = 256  # (chunk, world) pieces up to which a read skips zarr

class Archive:
    """A read-only view of an archive. Open with `mjarchive.open(path_or_url)`.

    Every property reflects the committed state as of opening or the last `refresh()`.
    """

    _bundle_owner: Any = None  # a part of a multi-part archive reads the archive's shared bundle
    _check_arrays_at_open = True  # a part's arrays are checked when first read (opening 64 parts stays cheap)
    _parted: type = None  # parted_reader.PartedArchive, registered by that module (it imports this one)

    def __init__(self, location: Any, *, storage_options: dict | None = None):
        self.location = location
        self._storage_options = storage_options
        self._closed = False
        found = open_root_document(location, storage_options=storage_options)
        if type(self) is Archive and is_parts_root(found[2].get("attributes")):
            self.__class__ = Archive._parted  # many writers, one archive: read as one (parted_reader.py)
        self._load(found)

    def _load(self, found: tuple | None = None) -> None:
        # One read and one parse of the root document (and, while live, of the commit document),
        # then of each array's document, checked against them (checks remembered by content).
        store, raw, doc = found or open_root_document(self.location, storage_options=self._storage_options)
        if type(self) is Archive and is_parts_root(doc.get("attributes")):  # replaced since it was opened
            raise FormatError(f"{self.location!s} is now a multi-part archive; open it again with mjarchive.open()")
        (manifest, n_frames, status, n_events), self._commit_source = commit_record(parse_root(raw, doc), store)
        self._store, self._root_attrs = store, doc["attributes"]
        self.__dict__.pop("_root", None)
        self.manifest, self._status, self._n_frames, self._n_events = manifest, status, n_frames, n_events
        self._root_raw = raw
        self._arrays = ArrayDocuments(self, [*manifest.per_frame_arrays(), "time"])
        self._index_docs = ArrayDocuments(self, [RESET_COUNT]) if has_index(manifest) else None  # read when asked
        if self._check_arrays_at_open:  # a damaged array's metadata is refused at open
            for name in (*self._arrays, "world_id"):
                self._arrays[name]
        events = {}
        for field in manifest.variants:
            found = {key: open_array(store, key) for key in manifest.event_arrays(field)}
            manifest.check_event_arrays(field, found, n_events[field])
            events.update(found)
        self._event_arrays = events
        self._event_index: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._by_world: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # field -> (events by world, world bounds)
        self._event_chunks: collections.OrderedDict = collections.OrderedDict()
        self._world_index = {w: i for i, w in enumerate(manifest.world_ids)}

    @functools.cached_property
    def _root(self) -> zarr.Group:
        """The root group, for what is read through zarr (the model bundle)."""
        return zarr.open_group(store=self._store, mode="r", use_consolidated=False, zarr_format=3)

    @property
    def _wid_array(self) -> Any:
        return self._arrays["world_id"]

    def _check_array(self, name: str, arr: Any) -> None:
        """The spec's checks of one array's metadata against the manifest, before any chunk is read."""
        manifest, W = self.manifest, len(self.manifest.world_ids)
        if name == RESET_COUNT and has_index(manifest):  # in a 1.2 archive, a track may be named so
            return check_index_array(arr, manifest, self._n_frames)
        if name == "world_id":
            check_array(arr, name, dtypes={"int64"}, ndim=1)
            if arr.shape != (W,):
                raise FormatError(f"world_id has shape {arr.shape}, but the manifest lists {W} worlds")
        elif name == "time":
            check_array(arr, name, dtypes={"float64"}, ndim=1)
        else:
            tail, dtype = manifest.per_frame_arrays()[name]
            check_array(arr, name, dtypes={dtype}, ndim=2 + len(tail))
            if tuple(arr.shape[1:]) != (W, *tail):
                raise FormatError(f"array {name!r} has shape {arr.shape}; expected (frames, {W}, {', '.join(map(str, tail))})")
        manifest.check_chunking(name, arr)
        if name != "world_id" and arr.shape[0] < self._n_frames:
            raise FormatError(
                f"committed frame count n_frames={self._n_frames} exceeds array {name!r} length {arr.shape[0]}; "
                "the archive's commit record is corrupt"
            )

    # -- metadata ------------------------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        """Committed frames: the only frames a reader may use."""
        return self._n_frames

    @property
    def world_ids(self) -> tuple[int, ...]:
        return self.manifest.world_ids

    @property
    def n_worlds(self) -> int:
        return len(self.manifest.world_ids)

    @property
    def nq(self) -> int:
        return self.manifest.layout.nq

    @property
    def nmocap(self) -> int:
        return self.manifest.layout.nmocap

    @property
    def output_fps(self) -> float | None:
        return self.manifest.output_fps

    @property
    def playback_speed(self) -> float:
        return self.manifest.playback_speed

    @property
    def timestep(self) -> float:
        return self.manifest.timestep

    @property
    def cameras(self) -> tuple[str, ...]:
        return self.manifest.cameras

    @property
    def tracks(self) -> dict[str, Any]:
        return dict(self.manifest.tracks)

    @property
    def status(self) -> str:
        """'live' while a writer may still append, 'finalized' after its close()."""
        return self._status

    @property
    def format_version(self) -> str:
        return self.manifest.format_version

    @property
    def variant_fields(self) -> tuple[str, ...]:
        """Model fields that may differ per world in this archive (format 1.1 `variants`)."""
        return tuple(self.manifest.variants)

    @property
    def variant_event_counts(self) -> dict[str, int]:
        """Committed variant events per field."""
        return dict(self._n_events)

    @property
    def overlays(self) -> dict[str, Overlay]:
        """The archive's overlay tracks by name (format 1.1 `overlays`)."""
        return dict(self.manifest.overlays)

    @functools.cached_property
    def bundle(self) -> ModelBundle:
        """The embedded model bundle, verified against its hashes and the manifest."""
        owner = self._bundle_owner
        bundle = owner.bundle if owner is not None else ModelBundle.from_zarr(self._root, BUNDLE_GROUP)
        if bundle.sha256 != self.manifest.model_sha256:
            raise FormatError("the embedded model bundle's hash differs from the manifest's model.sha256")
        return bundle

    def model(self, world: int | None = None, frame: int | None = None) -> mujoco.MjModel:
        """Compile the embedded model (layout-checked against the manifest); with `world` (an
        original ID) and `frame`, with that world's variant values in force at that frame applied.

        The bundle is untrusted: it is checked, then compiled in a child process under time and
        memory limits (once per bundle content and process; see `archive/sandbox.py`). Its arena
        (`<size memory>`) is sized for posing and rendering, not simulating: to simulate a model you
        trust, compile `archive.bundle.compile()`.
        """
        self._check_open()
        model = compile_untrusted(self.bundle)
        self.manifest.layout.check_compatible(model)
        check_model_shapes(model, self.manifest.variants)
        if world is not None or frame is not None:
            if world is None or frame is None:
                raise SelectionError("pass both world= and frame= (or neither, for the model as recorded)")
            apply_variant(model, self._variant_values(model, world, frame))
        return model

    @functools.cached_property
    def _base_model(self) -> mujoco.MjModel:
        return self.model()

    # -- variants -------------------------------------------------------------------------------------
    def variant(self, world_id: int, frame: int) -> dict[str, np.ndarray]:
        """The values of every variant field in force for `world_id` at `frame` (the model's own
        where no event set one yet): field name → array of the field's per-world shape."""
        self._check_open()
        return self._variant_values(self._base_model, world_id, frame)

    def variant_events(self, field: str) -> dict[str, np.ndarray]:
        """The committed events of one variant field as stored: `frame` (E,) int64, `world` (E,)
        world positions (int32), `value` (E, *shape); validated (order, worlds, value rules)."""
        self._check_open()
        if field not in self.manifest.variants:
            raise SelectionError(f"no variant field {field!r}; this archive has {list(self.manifest.variants)}")
        frames, worlds = self._events(field)
        model = self._base_model  # checks the declared shapes against the model before any value is read
        value = self._read_event_column(f"variants/{field}/value", self._n_events[field])
        check_values(field, value, model)
        return {"frame": frames, "world": worlds.astype(np.int32), "value": value}

    def variant_changes(self, world_id: int) -> np.ndarray:
        """Sorted distinct frames > 0 at which some variant value of `world_id` changes (events at
        frame 0 set the values the world starts with)."""
        w = self.world_index(world_id)
        frames = [self._events(field)[0][self._world_events(field, w)] for field in self.manifest.variants]
        out = np.unique(np.concatenate(frames)) if frames else np.zeros(0, np.int64)
        return out[out > 0]

    def variant_window(self, worlds: Any, frames: Any) -> VariantWindow:
        """The variant values of `worlds` (original IDs) at `frames` (committed frame indices) only,
        for a replay of that selection (`variant_window.variant_window`; replay and viewer plumbing,
        outside `mjarchive.__all__` and the README). Values are checked as they are read."""
        return variant_window(self, worlds, frames)

    def _variant_values(self, model: mujoco.MjModel, world_id: int, frame: int) -> dict[str, np.ndarray]:
        w = self.world_index(world_id)
        if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)):
            raise SelectionError(f"frame must be an integer, got {frame!r}")
        f = int(self._frame_index(int(frame))[0])
        check_model_shapes(model, self.manifest.variants)
        values = default_values(model, self.manifest.variants)
        for field in self.manifest.variants:
            frames, _ = self._events(field)
            mine = self._world_events(field, w)
            k = int(np.searchsorted(frames[mine], f, side="right"))
            if k:
                row = self._read_event(field, int(mine[k - 1]))
                check_values(field, row[None], model, what=f" (event {int(mine[k - 1])})")
                values[field] = row
        return values

    def _events(self, field: str) -> tuple[np.ndarray, np.ndarray]:
        """(frame, world position) of each committed event of a field, validated once per load."""
        if field not in self._event_index:
            n = self._n_events[field]
            frames = self._read_event_column(f"variants/{field}/frame", n).astype(np.int64)
            worlds = self._read_event_column(f"variants/{field}/world", n).astype(np.int64)
            # Compared, not subtracted: np.diff wraps around on hostile int64 extremes.
            if n and (frames[0] < 0 or frames[-1] >= self._n_frames or (frames[1:] < frames[:-1]).any()):
                raise FormatError(f"variant events of {field!r} must start at committed frames in nondecreasing order; "
                                  "the archive is corrupt")
            if n and (worlds.min() < 0 or worlds.max() >= self.n_worlds):
                raise FormatError(f"a variant event of {field!r} names a world position outside [0, {self.n_worlds})")
            self._event_index[field] = (frames, worlds)
        return self._event_index[field]

    def _world_events(self, field: str, w: int) -> np.ndarray:
        """Indices of world position w's committed events of a field, in event order. One sort per
        field, not one scan of every event per world (2**24 events × 2**20 worlds)."""
        if field not in self._by_world:
            worlds = self._events(field)[1]
            order = np.argsort(worlds, kind="stable")
            self._by_world[field] = (order, np.searchsorted(worlds[order], np.arange(self.n_worlds + 1)))
        order, bounds = self._by_world[field]
        return order[bounds[w]:bounds[w + 1]]

    def _read_event_column(self, key: str, n: int) -> np.ndarray:
        """Rows [0, n) of an event array, MAX_READ_CHUNKS chunks at a time, the last block first: a
        hostile n_events (2**24 events in chunks of 1) fails at its first missing chunk, before the
        output is allocated or zarr lists per-chunk work of that length."""
        arr = self._event_arrays[key]
        block = MAX_READ_CHUNKS * arr.chunks[0]
        try:
            if n <= block:
                return np.asarray(arr[:n])
            starts = range(0, n, block)
            last = np.asarray(arr[starts[-1]:n])
            out = np.empty((n, *last.shape[1:]), last.dtype)
            out[starts[-1]:] = last
            for lo in starts[:-1]:
                out[lo:lo + block] = arr[lo:lo + block]
            return out
        except MjArchiveError:
            raise
        except MemoryError:
            raise SelectionError(f"reading {n} events of {key!r} needs more memory than this process can "
                                 "allocate") from None
        except Exception as exc:
            raise FormatError(f"reading {key!r} failed; the archive may be corrupt: {exc!r}") from exc

    def _read_event(self, field: str, i: int) -> np.ndarray:
        """Row i of a field's committed values, decoded a chunk at a time (a few chunks are kept)."""
        ce = self.manifest.variants[field].chunk_events
        key = (field, i // ce)
        block = self._event_chunks.get(key)
        if block is None:
            lo = key[1] * ce
            try:
                block = np.asarray(self._event_arrays[f"variants/{field}/value"][lo:min(self._n_events[field], lo + ce)])
            except MjArchiveError:
                raise
            except Exception as exc:
                raise FormatError(f"reading variant events {lo}.. of {field!r} failed; the archive may be corrupt: "
                                  f"{exc!r}") from exc
            self._event_chunks[key] = block
            while sum(b.nbytes for b in self._event_chunks.values()) > _EVENT_CACHE_BYTES and len(self._event_chunks) > 1:
                self._event_chunks.popitem(last=False)
        else:
            self._event_chunks.move_to_end(key)
        return block[i - key[1] * ce].copy()

    @property
    def time(self) -> np.ndarray:
        """Simulation time of each committed frame, shape (n_frames,)."""
        return self._read("time", slice(0, self._n_frames), None)

    def refresh(self) -> int:
        """Re-read the commit record to see frames committed since opening; returns new n_frames."""
        self._check_open()
        if self._bundle_owner is not None:
            raise MjArchiveError(f"{self.location!s} is one part of a multi-part archive: refresh the archive "
                                 "(archive.refresh()), then ask it for the part again")
        sha = self.manifest.model_sha256
        before = dict(self.__dict__)
        self.__dict__.pop("bundle", None)
        try:
            self._load()
        except BaseException:  # all or nothing: a refused record leaves the last accepted one in force
            self.__dict__.clear()
            self.__dict__.update(before)
            raise
        if self.manifest.model_sha256 != sha:  # the same verified content keeps its compiled model
            self.__dict__.pop("_base_model", None)
        return self._n_frames

    # -- selection --------------------------------------------------------------------------------------
    def select(self, worlds: Any = None, frames: Any = None, *, time: Any = None) -> Selection:
        """A lazy selection. `worlds`: original IDs (int, list, or slice over IDs); `frames`: an
        int, slice or index array over committed frames, or `time=(t0, t1)`: the frames recorded at
        t0 <= time < t1 (simulation seconds). Nothing is read until an attribute is used (a time range
        reads the archive's `time`)."""
        self._check_open()
        if time is not None:
            if frames is not None:
                raise SelectionError("pass frames= or time=, not both")
            frames = self._time_frames(time)
        return Selection(self, self._world_positions(worlds), self._frame_index(frames))

    def _time_frames(self, time: Any) -> slice:
        """The committed frames recorded at t0 <= time < t1 of `time` = (t0, t1) or slice(t0, t1)."""
        if isinstance(time, slice) and time.step is None:
            t0, t1 = time.start, time.stop
        elif isinstance(time, tuple) and len(time) == 2:
            t0, t1 = time
        else:
            raise SelectionError(f"time must be (t0, t1) in seconds (either may be None), got {time!r:.80}")
        try:
            lo = -np.inf if t0 is None else float(t0)
            hi = np.inf if t1 is None else float(t1)
        except (TypeError, ValueError):
            raise SelectionError(f"time must be (t0, t1) in seconds (either may be None), got {time!r:.80}") from None
        if not lo <= hi:
            raise SelectionError(f"time range {time!r:.80} ends before it starts")
        return slice(self._time_index(lo), self._time_index(hi))

    def _time_index(self, t: float) -> int:
        """The first committed frame recorded at or after `t` (`time` strictly increases): a bisection over
        the chunks' first times, then one chunk, so O(log chunks) reads however long the archive."""
        n, cf = self._n_frames, self.manifest.chunk_frames
        lo, hi = 0, -(-n // cf)  # the first chunk whose first time is >= t
        while lo < hi:
            mid = (lo + hi) // 2
            if self._read("time", np.array([mid * cf]), None)[0] < t:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return 0
        start = (lo - 1) * cf
        return start + int(np.searchsorted(self._read("time", slice(start, min(n, lo * cf)), None), t, "left"))

    # -- parts (a single archive has none; see parted_reader.PartedArchive) ------------------------------
    @property
    def parts(self) -> tuple[str, ...]:
        """Names of a multi-part archive's parts (written by separate writers); () for a single archive."""
        return ()

    def part(self, name: str) -> Archive:
        raise SelectionError(f"{self.location!s} is a single archive: it has no part {name!r:.80}")

    def part_of(self, world_id: int) -> str | None:
        """The part holding `world_id` (None in a single archive)."""
        self.world_index(world_id)
        return None

    def frames_of(self, world_ids: Any) -> int:
        """Committed frames of a world (its part's, in a multi-part archive); of several, those all of
        them have (the shortest of their parts')."""
        self._world_positions(world_ids)
        return self._n_frames

    def world_index(self, world_id: int) -> int:
        """Position of an original world ID in the stored world axis."""
        try:
            return self._world_index[int(world_id)]
        except (KeyError, TypeError, ValueError):
            raise SelectionError(
                f"world {world_id!r} is not in this archive; recorded world IDs: {_short(self.world_ids)}"
            ) from None

    def _world_positions(self, worlds: Any) -> np.ndarray:
        if worlds is None:
            return np.arange(self.n_worlds)
        if isinstance(worlds, slice):
            ids = sorted(self.world_ids)
            lo = -np.inf if worlds.start is None else worlds.start
            hi = np.inf if worlds.stop is None else worlds.stop
            chosen = [w for w in ids if lo <= w < hi][:: worlds.step or 1]
            if not chosen:
                raise SelectionError(f"no recorded world ID in {worlds}; recorded: {_short(self.world_ids)}")
            return np.array([self._world_index[w] for w in chosen])
        ids = np.atleast_1d(np.asarray(worlds))
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise SelectionError(f"worlds must be an int, a list of ints or a slice, got {worlds!r}")
        return np.array([self.world_index(w) for w in ids.tolist()], dtype=np.int64)

    def _frame_index(self, frames: Any, n: int | None = None) -> slice | np.ndarray:
        n = self._n_frames if n is None else n
        if frames is None:
            return slice(0, n)
        if isinstance(frames, slice):
            start, stop, step = frames.indices(n)
            if step <= 0:
                raise SelectionError("frame slices must have a positive step")
            if frames.start is not None and not -n <= frames.start <= n:
                raise SelectionError(f"frame range {frames} starts outside the {n} committed frames")
            if frames.stop is not None and frames.stop > n:
                raise SelectionError(f"frame range {frames} ends past the {n} committed frames")
            return slice(start, stop, step) if step != 1 else slice(start, stop)
        idx = np.atleast_1d(np.asarray(frames))
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise SelectionError(f"frames must be an int, a slice or an array of ints, got {frames!r}")
        idx = idx.astype(np.int64)
        bad = idx[(idx < -n) | (idx >= n)]
        if bad.size:
            raise SelectionError(f"frame {int(bad[0])} is out of range: the archive has {n} committed frames")
        return np.where(idx < 0, idx + n, idx)

    def _read(self, name: str, frames: slice | np.ndarray, worlds: np.ndarray | None) -> np.ndarray:
        self._check_open()
        arr = self._arrays[name]
        w_sel: Any = None
        if worlds is not None:
            w_sel = worlds
            if worlds.size and np.array_equal(worlds, np.arange(worlds[0], worlds[0] + worlds.size)):
                w_sel = slice(int(worlds[0]), int(worlds[0]) + worlds.size)
        try:
            direct = self._read_direct(name, arr, frames, worlds)
            if direct is not None:
                return direct
            if isinstance(frames, slice):
                frames = range(frames.start, frames.stop, frames.step or 1)
            block = MAX_READ_CHUNKS * self.manifest.chunk_frames
            if len(frames) <= block:
                return _read_frames(arr, frames, w_sel)
            # Block by block, the last first: a frame count that no stored chunk backs fails at a missing
            # chunk before the output is allocated or zarr lists per-chunk work of that length.
            starts = range(0, len(frames), block)
            last = _read_frames(arr, frames[starts[-1]:], w_sel)
            try:
                out = np.empty((len(frames), *last.shape[1:]), last.dtype)
            except MemoryError:
                raise SelectionError(
                    f"reading {len(frames)} frames of {name!r} needs {len(frames) * last[:1].nbytes} bytes, more "
                    "than this process can allocate; select fewer frames or worlds"
                ) from None
            out[starts[-1]:] = last
            for lo in starts[:-1]:
                out[lo:lo + block] = _read_frames(arr, frames[lo:lo + block], w_sel)
            return out
        except MjArchiveError:
            raise
        except Exception as exc:
            raise FormatError(f"reading {name!r} failed; the archive may be corrupt: {exc!r}") from exc

    def _read_direct(self, name: str, arr: Any, frames: slice | np.ndarray, worlds: np.ndarray | None) -> np.ndarray | None:
        """A small read of a local archive decoded chunk by chunk without zarr (whose sharding codec
        costs milliseconds per call), each object checked by the CheckedStore as zarr's reads are;
        None where that path does not apply (the caller reads through zarr)."""
        C = arr.chunks[0]
        positions = (None,) if arr.ndim == 1 else range(arr.shape[1]) if worlds is None else worlds.tolist()
        contiguous = isinstance(frames, slice) and (frames.step or 1) == 1
        if (contiguous and arr.shards is not None and len(positions) >= arr.shards[1]
                and 0 <= frames.start < frames.stop <= frames.start + MAX_READ_CHUNKS * C):
            # Many chunks of a shard's worth of worlds or more: each shard read and decoded in one go
            # (zarr's sharding codec costs ~0.3 ms per inner chunk); bounded as _read's blocks are.
            lo, hi = (0, arr.shape[1]) if worlds is None else (int(worlds[0]), int(worlds[-1]) + 1)
            pieces = (-(-frames.stop // C) - frames.start // C) * (hi - lo)
            if pieces > _DIRECT_CHUNKS and (worlds is None or np.array_equal(worlds, np.arange(lo, hi))):
                got = self._store.read_region_now(name, ((frames.start, frames.stop), (lo, hi)), arr.fill_value)
                if got is not None:
                    return got
        if isinstance(frames, slice):
            if not frames.start < frames.stop or (frames.stop - frames.start) > _DIRECT_CHUNKS * C:
                return None  # bounded before anything of the selection's length is allocated
            frames = np.arange(frames.start, frames.stop, frames.step or 1)
        idx = frames
        # (not np.unique: its first call imports numpy.ma, ~20 ms of a first open)
        blocks = sorted(set((idx // C).tolist())) if idx.size <= _DIRECT_CHUNKS * C else ()
        if not len(blocks) or len(blocks) * len(positions) > _DIRECT_CHUNKS or not self._store.reads_directly(name):
            return None
        sharded = arr.ndim > 1
        S = arr.shards[1] if sharded else 1
        tail = tuple(arr.shape[2:]) if sharded else ()
        out = np.empty((len(idx), *(() if not sharded else (len(positions),)), *tail), arr.dtype)
        zeros = (0,) * len(tail)
        for t in blocks:
            if contiguous:  # slices: a strided gather by index arrays costs far more
                lo, hi = max(int(idx[0]), t * C), min(int(idx[-1]) + 1, (t + 1) * C)
                rows, within = slice(lo - int(idx[0]), hi - int(idx[0])), slice(lo - t * C, hi - t * C)
            else:
                rows = np.nonzero(idx // C == t)[0]
                within = idx[rows] - t * C
            for j, w in enumerate(positions):
                coords, inner = ((t, w // S, *zeros), w % S) if sharded else ((t,), None)
                chunk = self._store.read_chunk_now(name, coords, inner)
                if chunk is None:  # absent and not committed (committed ones are refused): fill values
                    chunk = np.full(arr.chunks, arr.fill_value, arr.dtype)
                if sharded:
                    out[rows, j] = chunk[within, 0]
                else:
                    out[rows] = chunk[within]
        return out

    # -- episodes and verification ------------------------------------------------------------------
    # Frame 0 starts an episode of every world, and each reset marker after it another. From format 1.3
    # the writer keeps an episode index: these read O(what they return), whatever the archive's length.
    def episodes(self, world_id: int) -> list[range]:
        """Frame ranges of the episodes of one world, split at its reset markers (frame 0 starts one)."""
        starts = self.episode_starts(world_id)
        return [range(s, e) for s, e in zip(starts, starts[1:] + [self._n_frames])]

    def episode_counts(self, worlds: Any = None) -> np.ndarray:
        """Episodes of each selected world (original IDs or a slice over them, as `select` takes them;
        default every world) in the committed frames."""
        self._check_open()
        return self._episode_index.counts(self._world_positions(worlds))

    def episode_starts(self, worlds: Any, start: int = 0, stop: int | None = None, *,
                       limit: int | None = None, reverse: bool = False) -> list[int]:
        """Frames in [start, stop) where an episode of a world (one ID, or any of several) starts,
        ascending (`reverse`: descending from stop), at most `limit` of them."""
        self._check_open()
        check_episode_range(start, stop, limit)
        stop = self._n_frames if stop is None else min(int(stop), self._n_frames)
        return self._episode_index.starts(self._world_positions(worlds), int(start), stop, limit, reverse)

    def episode_numbers(self, world_id: int, frames: Any) -> np.ndarray:
        """The episode number of one world at each of `frames` (0 from frame 0, +1 at every reset)."""
        self._check_open()
        position = self.world_index(world_id)
        idx = self._frame_index(frames)
        if isinstance(idx, slice):
            idx = np.arange(idx.start, idx.stop, idx.step or 1)
        return self._episode_index.numbers(position, idx)

    @property
    def _episode_index(self) -> EpisodeIndex:
        return EpisodeIndex(self, self._index_docs[RESET_COUNT] if self._index_docs is not None else None)

    def verify(self, progress: Any = None) -> VerifyReport:
        """Check metadata, bundle hashes, every committed chunk, finiteness, time order and the episode
        index, a chunk of frames at a time; `progress(done, total)` is called after each one."""
        return verify_archive(self, progress)

    # -- lifecycle ------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this Archive is closed; open it again with mjarchive.open()")

    def close(self) -> None:
        if self._bundle_owner is None:  # a part of a multi-part archive is closed with its archive
            self._closed = True

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<mjarchive.Archive {self.location!s} format={self.format_version} worlds={self.n_worlds} "
                f"frames={self.n_frames} nq={self.nq} {self.status}>")


class Selection:
    """A lazy (frames × worlds) window of an archive; each attribute reads only what it needs.

    Arrays come back in (frame, world, ...) order, worlds in the order they were selected.
    """

    def __init__(self, archive: Archive, worlds: np.ndarray, frames: slice | np.ndarray):
        self.archive = archive
        self._worlds = worlds
        self._frames = frames

    @property
    def world_ids(self) -> tuple[int, ...]:
        return tuple(self.archive.world_ids[i] for i in self._worlds)

    @property
    def frame_indices(self) -> np.ndarray:
        if isinstance(self._frames, slice):
            return np.arange(self._frames.start, self._frames.stop, self._frames.step or 1)
        return self._frames

    @property
    def shape(self) -> tuple[int, int]:
        frames = self._frames
        n = len(range(frames.start, frames.stop, frames.step or 1)) if isinstance(frames, slice) else len(frames)
        return (n, len(self._worlds))

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_") or name not in self.archive._arrays:
            raise AttributeError(name)
        if name == "time":
            return self.archive._read("time", self._frames, None)
        return self.archive._read(name, self._frames, self._worlds)

    def track(self, name: str) -> np.ndarray:
        if name not in self.archive.tracks:
            raise SelectionError(f"no track {name!r}; this archive has {sorted(self.archive.tracks)}")
        return self.archive._read(name, self._frames, self._worlds)

    def overlay(self, name: str) -> OverlayFrames:
        """One overlay track over this selection, read now and validated (see `OverlayFrames`)."""
        spec = self._overlay_spec(name)
        read = {key.rsplit("/", 1)[1]: self.archive._read(key, self._frames, self._worlds)
                for key in spec.arrays(name)}
        return OverlayFrames.decode(spec, name, read["count"], read["data"], read.get("text"))

    def overlay_counts(self, name: str) -> np.ndarray:
        """Primitives stored per frame and world of one overlay track, (F, Wsel) int64, checked
        against its max_count (read before any primitive, to bound what `overlay_rows` reads).
        Replay and viewer plumbing, outside `mjarchive.__all__` and the README."""
        return check_counts(self._overlay_spec(name), name, self._overlay_array(name, "count"))

    def overlay_rows(self, name: str, take: np.ndarray) -> list[OverlayRows]:
        """The first `take[f, w]` primitives (F, Wsel) of each frame and world of one overlay track,
        one `OverlayRows` per frame: only what is taken is read (one stored chunk of one world at a
        time), kept and checked (`overlays.read_rows`)."""
        frames = self.frame_indices
        take = np.asarray(take)
        if take.shape != (len(frames), len(self._worlds)):
            raise SelectionError(f"overlay {name!r}: take must have the selection's shape "
                                 f"({len(frames)}, {len(self._worlds)}), got {take.shape}")
        return read_rows(self._overlay_spec(name), name, take, frames, self.archive.manifest.chunk_frames,
                         lambda key, rows, w: self.archive._read(key, frames[rows], self._worlds[w:w + 1]))

    def _overlay_spec(self, name: str) -> Overlay:
        overlays = self.archive.manifest.overlays
        if name not in overlays:
            raise SelectionError(f"no overlay {name!r}; this archive has {sorted(overlays)}")
        return overlays[name]

    def _overlay_array(self, name: str, part: str) -> np.ndarray:
        """One stored array of an overlay track over this selection, as stored and NOT checked:
        `part` 'count' (F, Wsel) int32, 'data' (F, Wsel, max_count, 3|6) float32 or, for text,
        'text' (F, Wsel, max_count, max_bytes) uint8. For `overlay_counts`, which checks it."""
        key = f"overlays/{name}/{part}"
        if key not in self._overlay_spec(name).arrays(name):
            raise SelectionError(f"overlay {name!r} has no {part!r} array")
        return self.archive._read(key, self._frames, self._worlds)

    def __repr__(self) -> str:
        return f"<Selection frames={self.shape[0]} worlds={list(self.world_ids)[:8]}>"


def _read_frames(arr: Any, frames: range | np.ndarray, w_sel: Any) -> np.ndarray:
    if isinstance(frames, range):
        f_sel: Any = slice(frames.start, frames.stop, frames.step if frames.step != 1 else None)
        if w_sel is None:
            return np.asarray(arr[f_sel])
    else:
        f_sel = frames
        if w_sel is None:
            return np.asarray(arr.oindex[f_sel])
    return np.asarray(arr.oindex[f_sel, w_sel])


def _short(ids: Any) -> str:
    ids = list(ids)
    return str(ids) if len(ids) <= 12 else f"[{', '.join(map(str, ids[:6]))}, …, {', '.join(map(str, ids[-3:]))}] ({len(ids)} worlds)"


_INT = r"[+-]?[0-9]+"
_SLICE_RE = re.compile(rf"^\s*({_INT})?\s*:\s*({_INT})?\s*(?::\s*({_INT})?\s*)?$")


def parse_selection(text: str, example: str = "7, 7,42, 100:500 or ::10",
                    list_name: str = "range") -> int | slice | list[int]:
    """A selection written like Python, as `select` takes it: `7`, `7,42`, `100:500`, `::10`, `-100:`.

    Returns an int, a list of ints, or a slice. Raises SelectionError naming the text
    (`bad {list_name} ...` for a malformed list) with `example` otherwise.
    """
    s = str(text).strip()
    if not s:
        raise SelectionError(f"empty range; write e.g. {example}")
    if len(s) > 10_000:
        raise SelectionError(f"that selection is too long; write a slice such as {example.split(' or ')[-1]}")
    if ":" in s:
        m = _SLICE_RE.match(s)
        if not m:
            raise SelectionError(f"bad range {text!r}; use Python slice syntax START:STOP[:STEP], e.g. {example}")
        start, stop, step = (None if g is None else int(g) for g in m.groups())
        if step is not None and step <= 0:
            raise SelectionError(f"bad range {text!r}: the step must be a positive integer")
        return slice(start, stop, step)
    parts = [p.strip() for p in s.split(",")]
    if not all(re.fullmatch(_INT, p) for p in parts):
        raise SelectionError(f"bad {list_name} {text!r}; use an integer, a list or a slice, e.g. {example}")
    values = [int(p) for p in parts]
    return values[0] if len(values) == 1 and "," not in s else values
