"""The crash-safe appending writer: chunks first, then one atomic commit of the frame count."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import math
import mmap
import threading
from collections import deque
from concurrent import futures
from typing import Any

import mujoco
import numpy as np
import zarr
from zarr.core.sync import sync

from .bundle.model_bundle import ModelBundle
from .._errors import (AppendError, ArchiveExistsError, ArchiveNotFoundError, ClosedError, FormatError,
                       FormatVersionError, MjArchiveError, StorageError, WriterLockedError)
from .creation import as_bundle, build_archive, plan_archive, write_root
from .episode_index import IndexWriter, has_index
from .format import (
    COMMIT_KEY,
    FORMAT_VERSION,
    MAX_UNCOMMITTED_CHUNKS,
    RESET_COUNT,
    ROOT_ATTR,
    check_array,
    quantize,
)
from .events import VariantEvents
from .manifest import Manifest, commit_document, read_commit, uses_commit_document
from .overlays import pack_frames
from .storage.chunk_writer import ChunkWriter
from .storage.shard_writer import ShardWriter
from .storage.shard_writer import enabled as enabled_fast_shards
from .storage.lease import DEFAULT_LEASE_TTL, WriterLease, acquire_lease, check_ttl
from .storage.locations import local_path, make_store, new_store, open_root, remove_partial_files
from .joining import check_joining, join_parts_root, open_parts_root, refuse_replacing_parts
from .parts import check_part_name, is_parts_root, list_parts, part_prefix

__all__ = ["ArchiveWriter", "create", "DEFAULT_CHUNK_FRAMES", "DEFAULT_SHARD_WORLDS"]

#: Chosen by benchmarks/bench_format.py: see benchmarks/README.md.
DEFAULT_CHUNK_FRAMES = 512
DEFAULT_SHARD_WORLDS = 256
DEFAULT_MAX_PENDING_BYTES = 128 * 2**20


_MADV_POPULATE_WRITE = 23  # Linux 5.14+ (the asm-generic value)
_POPULATE_PIECE = 2 << 20


def _libc_madvise() -> Any:
    """libc's madvise through ctypes, which releases the GIL during the call (Python's mmap.madvise
    holds it: populating a chunk buffer, ~25 ms, would stall every other thread), or None."""
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes, madvise.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return madvise


_madvise = _libc_madvise() if hasattr(mmap, "MADV_NOHUGEPAGE") else None


def _small_page_array(shape: tuple[int, ...], dtype: np.dtype, populate: bool = False) -> np.ndarray:
    """An uninitialized array in private 4 KiB pages (shared anonymous pages fault 2x slower here), with
    them in place already if `populate`. numpy asks for transparent huge pages above 4 MiB, and in VMs
    that hand free memory back to the host (balloon free-page reporting) a huge page's first touch
    costs 4x more than its small pages' (0.4 vs 1.8 GB/s): the first chunks of every writer."""
    nbytes = max(1, math.prod(shape)) * dtype.itemsize
    if nbytes < 4 << 20 or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.empty(shape, dtype)
    try:
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as exc:  # ENOMEM
        raise MemoryError(str(exc)) from None
    array = np.frombuffer(pages, dtype, count=math.prod(shape)).reshape(shape)
    _advise(array, mmap.MADV_NOHUGEPAGE)
    if populate:
        _advise(array, _MADV_POPULATE_WRITE)
    return array


def _advise(array: np.ndarray, advice: int) -> None:
    """madvise the mapping that `array` (from `_small_page_array`, at least 4 MiB) fills; nothing for
    other arrays. A kernel without transparent huge pages or without populating refuses: it is only slower.
    Populating goes a piece at a time: the kernel holds the process's memory map lock through each call,
    and every other thread's mmap (numpy's large temporaries) and page faults wait for it meanwhile (the
    whole of a 60 MB chunk buffer at once stalled them ~20 ms, a 2 MiB piece < 1 ms)."""
    pages = _mapping_of(array)
    if pages is None or array.nbytes != len(pages):  # a view of part of it would be advised past its end
        return
    address, size = array.__array_interface__["data"][0], len(pages)
    piece = _POPULATE_PIECE if advice == _MADV_POPULATE_WRITE else size
    for start in range(0, size, piece):
        length = min(piece, size - start)
        if _madvise is not None:
            if _madvise(address + start, length, advice):
                return
        else:
            try:
                pages.madvise(advice, start, length)
            except OSError:
                return


def _mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The anonymous mapping `_small_page_array` made for `array`, or None (numpy's own memory)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    base = array.base.obj if isinstance(array.base, memoryview) else array.base
    return base if isinstance(base, mmap.mmap) else None


def _frame_shapes_of(manifest: Manifest) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each appended array's shape and stored dtype per frame, by name."""
    W = len(manifest.world_ids)
    return {"time": ((), np.dtype("float64")),
            **{name: ((W, *tail), np.dtype(dtype)) for name, (tail, dtype) in manifest.per_frame_arrays().items()}}


def _chunk_buffer(manifest: Manifest, populate: bool = False) -> dict[str, np.ndarray]:
    """An uninitialized buffer of one chunk of frames of every appended array."""
    cf = manifest.chunk_frames
    try:
        return {n: _small_page_array((cf, *s), d, populate) for n, (s, d) in _frame_shapes_of(manifest).items()}
    except MemoryError:
        raise MjArchiveError(f"a chunk buffer of {cf} frames × {len(manifest.world_ids)} worlds does not fit in "
                             "memory; pass a smaller chunk_frames") from None


def _populate_meanwhile(buffer: dict[str, np.ndarray]) -> None:
    """Put `buffer`'s pages in place on a short-lived thread while create() builds the archive (its thread
    mostly waits for zarr's): the first chunk's appends then copy into pages already there, about six times
    faster than first touches (benchmarks/README.md). Populating never changes a page the caller wrote."""
    big = [array for array in buffer.values() if _mapping_of(array) is not None]

    def populate() -> None:
        for array in big:
            _advise(array, _MADV_POPULATE_WRITE)

    if big:  # without a thread, the appends fault the pages in
        _on_a_thread(populate, "mjarchive-populate", or_here=False)


def _release_meanwhile(buffers: list[dict[str, np.ndarray]]) -> None:
    """Let go of chunk buffers on a short-lived thread: unmapping their pages (~4 ms for a 60 MB buffer)
    need not delay close(). The list is emptied there, and the pages are unmapped there unless something
    else still refers to a buffer (then when that lets go)."""
    if buffers:
        _on_a_thread(buffers.clear, "mjarchive-release", or_here=True)


def _on_a_thread(work: Any, name: str, *, or_here: bool) -> None:
    """Run `work` on a short-lived daemon thread; where no thread is to be had (a process limit), run it
    on this one if `or_here`, else not at all."""
    try:
        threading.Thread(target=work, name=name, daemon=True).start()
    except RuntimeError:
        if or_here:
            work()


class _Arrays:
    """The Zarr arrays of one archive and the per-frame shape of each."""

    def __init__(self, root: zarr.Group, manifest: Manifest, created: dict[str, zarr.Array]):
        self.root = root
        self.names = ["time", *manifest.per_frame_arrays()]
        # Write every chunk, even one equal to the fill value, so that a missing chunk always means
        # damage (verify() checks for them) rather than "all zeros / no resets".
        self.arrays = {name: (created[name] if name in created else root[name]).with_config({"write_empty_chunks": True})
                       for name in self.names}
        # Whole-chunk writes bypass zarr-python's per-inner-chunk cost for sharded arrays and its
        # per-write cost for the others (the same bytes).
        self.shard_writers: dict[str, ShardWriter] = {}
        self.chunk_writers: dict[str, ChunkWriter] = {}
        if enabled_fast_shards():
            for name, array in self.arrays.items():
                writer = ShardWriter.for_array(array)
                if writer is not None:
                    self.shard_writers[name] = writer
                elif (plain := ChunkWriter.for_array(array)) is not None:
                    self.chunk_writers[name] = plain
        self.opened_frames = max(a.shape[0] for a in self.arrays.values())


    def capacity(self) -> int:
        return min(a.shape[0] for a in self.arrays.values())

    def resize(self, n: int) -> None:
        """Every array to `n` frames, in one trip to zarr's event loop (one after another, with zarr deleting
        every chunk key beyond `n` when trimming, that took 4 ms per array). Chunks are deleted only within the
        frames the arrays declared when opened, where a previous writer may have left some: this writer stores
        only frames it commits and trims to all it committed. (A writer whose lease was taken over may finish
        one more write cycle beyond its declared frames: its chunks, never read, are overwritten later.)
        Every resize has ended when this returns, also when one failed: nothing writes after close()."""
        changing = [a.async_array for a in self.arrays.values() if a.shape[0] != n]
        delete = n < self.opened_frames

        async def resize_all() -> None:
            done = await asyncio.gather(*(a.resize((n, *a.shape[1:]), delete_outside_chunks=delete) for a in changing),
                                        return_exceptions=True)
            for result in done:
                if isinstance(result, BaseException):
                    raise result

        if changing:
            sync(resize_all())


def _check_resumed_arrays(arrays: _Arrays, frame_shapes: dict, manifest: Manifest, n_frames: int) -> None:
    """Validate arrays reopened for appending as the reader does, before any chunk is read."""
    cf = manifest.chunk_frames
    limit = -(-n_frames // cf) * cf + MAX_UNCOMMITTED_CHUNKS * cf
    for name, arr in arrays.arrays.items():
        shape, dtype = frame_shapes[name]
        check_array(arr, name, dtypes={str(dtype)}, ndim=1 + len(shape))
        if tuple(arr.shape[1:]) != tuple(shape):
            raise FormatError(f"array {name!r} has shape {arr.shape}; the manifest declares "
                              f"(frames, {', '.join(map(str, shape))})")
        manifest.check_chunking(name, arr)
        if arr.shape[0] > limit:
            # Trimming it at close() would enumerate every declared chunk.
            raise FormatError(f"array {name!r} declares {arr.shape[0]} frames, far beyond the {n_frames} committed "
                              f"(at most {limit}); the archive is corrupt")


class ArchiveWriter:
    """Appends frames to an archive from one thread; compression and I/O run on a background thread.

    Use as a context manager, or call `close()`. Frames become visible to readers (and survive a
    crash) when committed: each time a chunk of `chunk_frames` frames fills up (once it is stored,
    while the next chunk fills), on `flush()` and on `close()`. It holds the archive's writer lease until `close()` (one writer per archive); if
    another writer takes the lease over, it finishes at most the write cycle under way (see the spec,
    "Writer lease"), then writes nothing more and raises WriterLockedError.

    `append()` copies frames straight into a chunk buffer (chunk_frames × worlds × a frame's bytes)
    and returns; full buffers are compressed and stored in the background and then reused. The
    writer keeps at most max(2, max_pending_bytes // buffer size) buffers: when all are full,
    `append()` waits for one (back-pressure). Shards of 1 MiB or more are written with O_DIRECT
    where the file system takes it (`MJARCHIVE_DIRECT_IO=0` turns that off).
    """

    def __init__(self, root: zarr.Group, manifest: Manifest, n_frames: int, *, location: Any,
                 check_finite: bool = True, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 n_events: dict[str, int] | None = None, model: mujoco.MjModel | None = None,
                 root_status: str = "live", lease: WriterLease | None = None,
                 created: dict[str, zarr.Array] | None = None, first_buffer: dict[str, np.ndarray] | None = None):
        created = created or {}  # the arrays create() just made, by name: not opened again
        self.location = location
        self.part: str | None = None  # the part of a multi-part archive this writer appends to
        self._lease = lease  # held until close(): renewed before each write cycle, checked before each commit
        self.manifest = manifest
        self.check_finite = check_finite
        self._root = root
        self._store = root.store_path.store  # a CheckedStore (store.make_store)
        self._uses_commit_document = uses_commit_document(manifest)
        self._root_status = root_status
        self._model = model  # for checking variant ids against the model (compiled on demand after resume)
        try:
            self._arrays = _Arrays(root, manifest, created)
        except MjArchiveError:
            raise
        except KeyError as exc:
            raise FormatError(f"the archive is missing its array {exc}") from None
        except Exception as exc:
            raise FormatError(f"the archive's array metadata is unreadable: {exc!r}") from exc
        if self._arrays.capacity() < n_frames:
            raise FormatError(f"committed frame count {n_frames} exceeds the stored arrays ({self._arrays.capacity()})")
        self._n_appended = n_frames
        self._n_committed = n_frames
        self._last_time = -math.inf
        self._closed = False
        self._error: BaseException | None = None
        self._work: deque = deque()  # for the background thread: (start, buffer, rows, flush ticket or None)
        self._cond = threading.Condition()
        self._flush_requested = 0
        self._flush_done = 0
        self._frame_shapes = _frame_shapes_of(manifest)
        # The chunk being filled: committed frames of a partial last chunk are reloaded on resume.
        cf = manifest.chunk_frames
        _check_resumed_arrays(self._arrays, self._frame_shapes, manifest, n_frames)
        try:
            self._variants = VariantEvents(root, manifest, n_events or {}, self.variant_model)
        except MjArchiveError:
            raise
        except KeyError as exc:
            raise FormatError(f"the archive is missing its array {exc}") from None
        except Exception as exc:  # zarr refuses malformed metadata with its own exceptions
            raise FormatError(f"the archive's variant event arrays have unreadable metadata: {exc!r}") from exc
        self._variants.check_resumed()
        self._index = IndexWriter(root, manifest, n_frames, created.get(RESET_COUNT)) if has_index(manifest) else None
        # Chunk buffers: the caller copies frames straight into the one it fills; a full one goes to the
        # background thread and comes back once stored. Reusing them keeps appends off fresh memory.
        chunk_bytes = cf * sum(max(1, math.prod(s)) * d.itemsize for s, d in self._frame_shapes.values())
        self._max_buffers = max(2, max_pending_bytes // chunk_bytes)  # one filling, one compressed and stored
        self._free_buffers: list[dict[str, np.ndarray]] = []
        self._buffer: dict[str, np.ndarray] | None = first_buffer if first_buffer is not None else self._new_buffer()
        self._n_buffers = 1
        self._spare_pending = self._spare_failed = self._spare_due = False
        self._in_flight: tuple[int, list, dict | None] | None = None  # (frames to commit, store writes, buffer)
        self._buffer_start = (n_frames // cf) * cf
        self._buffer_fill = n_frames - self._buffer_start
        if n_frames:
            sel = slice(self._buffer_start, n_frames)
            try:
                for name in self._buffer:
                    self._buffer[name][: n_frames - self._buffer_start] = self._arrays.arrays[name][sel]
                self._last_time = float(self._arrays.arrays["time"][n_frames - 1])
            except MjArchiveError:
                raise
            except Exception as exc:  # a corrupt chunk fails inside zarr or numcodecs
                raise FormatError(f"reading the last committed chunk to resume appending failed; the archive "
                                  f"may be corrupt: {exc!r}") from exc
        self._thread = threading.Thread(target=self._run, name="mjarchive-writer", daemon=True)
        self._thread.start()

    # -- public API ------------------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        """Frames appended so far (committed or still in flight)."""
        return self._n_appended

    @property
    def n_committed(self) -> int:
        """Frames durably committed and visible to readers."""
        return self._n_committed

    @property
    def world_ids(self) -> tuple[int, ...]:
        return self.manifest.world_ids

    def append(self, time: Any, qpos: Any, *, mocap_pos: Any = None, mocap_quat: Any = None,
               reset: Any = None, overlays: dict[str, Any] | None = None, **tracks: Any) -> None:
        """Append one frame (`qpos` of shape (W, nq), scalar `time`) or a block ((k, W, nq), (k,)).

        `reset` is a (W,) or (k, W) boolean mask of worlds whose episode starts at that frame.
        Extra keyword arguments are the tracks declared at creation. `overlays` maps overlay names
        declared at creation to this frame's primitives (see `mjarchive.Overlay`; for a block, a
        sequence of k such values); an overlay not given draws nothing at that frame. Raises
        AppendError with the offending frame and world on bad input; set `check_finite=False` at
        creation to allow NaN.
        """
        self._check_usable()
        qpos = np.asarray(qpos)
        single = qpos.ndim == 2
        times = np.array(time, dtype=np.float64, ndmin=1)  # a copy: the block is queued, the caller may reuse its buffer
        k = 1 if single else (qpos.shape[0] if qpos.ndim == 3 else -1)
        if k < 0 or times.shape != (k,):
            raise AppendError(
                f"qpos must be (W, nq) with a scalar time or (k, W, nq) with k times; got qpos "
                f"{qpos.shape} and time {np.shape(time)}"
            )
        block: dict[str, np.ndarray] = {"time": times}
        given = {"qpos": qpos, "mocap_pos": mocap_pos, "mocap_quat": mocap_quat, "reset": reset, **tracks}
        for name in given:
            if name not in self._frame_shapes and (given[name] is not None):
                raise AppendError(
                    f"unknown track {name!r}; declare it when creating the archive: "
                    f"mjarchive.create(..., tracks={{{name!r}: shape}}) (declared: {sorted(self.manifest.tracks)})"
                )
        block.update(pack_frames(self.manifest.overlays, overlays, len(self.manifest.world_ids), k, single,
                                 self._n_appended))
        for name, (shape, dtype) in self._frame_shapes.items():
            if name == "time" or name.startswith("overlays/"):
                continue
            value = given.get(name)
            if value is None:
                if name in ("qpos",) or name in self.manifest.tracks or name.startswith("mocap"):
                    raise AppendError(f"append() needs {name!r} for every frame (shape {shape})")
                value = np.broadcast_to(np.False_, (k, *shape))
            elif single:
                value = np.asarray(value)[None]
            value = np.asarray(value)
            if value.shape != (k, *shape):
                raise AppendError(f"{name} has shape {value.shape[1:] if single else value.shape}, "
                                  f"expected {shape if single else (k, *shape)}")
            if dtype.kind == "f" and value.dtype.kind not in "fiu":
                raise AppendError(f"{name} must be numeric, got dtype {value.dtype}")
            block[name] = self._quantized(name, value, dtype)
        self._check_times(times)
        self._stage(block, k)
        self._last_time = float(times[-1]) if k else self._last_time

    def set_variant(self, world_ids: Any, frame: int | None = None, **fields: Any) -> None:
        """Record new values of model fields declared in `variant_fields` for some worlds, in force
        from `frame` (default: the next appended frame) until their next change. Changes come in
        frame order: `frame` is never before the frame of an earlier call.

        `world_ids`: an original world ID or a sequence of them. Each field's value has the field's
        per-world shape (e.g. (ngeom, 4) for geom_rgba; the same for every listed world) or
        (len(world_ids), *shape). Stored as one event row per world and field, committed with the
        frame it starts at. Raises AppendError naming the field, world and rule on bad input.
        """
        self._check_usable()
        positions, values = self._variants.prepare(world_ids, fields)
        with self._cond:
            self._variants.queue(frame, self._n_appended, positions, values)

    def variant_model(self) -> mujoco.MjModel:
        """The archive's model, for checking variant values against it (compiled once, sandboxed after a resume)."""
        if self._model is None:
            from .bundle.sandbox import compile_untrusted

            self._model = compile_untrusted(ModelBundle.from_zarr(self._root))
        return self._model

    def set_backend(self, backend: str) -> None:
        """Name the simulation backend in the manifest (`producer.backend`) before the first frame."""
        self._check_usable()
        with self._cond:
            if self._n_appended:
                raise AppendError("the producer backend can only be set before the first frame is appended")
            self.manifest = dataclasses.replace(self.manifest, producer={**self.manifest.producer, "backend": backend})
            self._write_root(0, "live")  # the manifest changed: the root attributes hold it

    def flush(self) -> None:
        """Block until every appended frame is written and committed."""
        self._check_usable()
        with self._cond:
            self._flush_requested += 1
            ticket = self._flush_requested
            # The rows of the chunk being filled are stored too; the buffer stays this thread's.
            self._work.append((self._buffer_start, self._buffer, self._buffer_fill, ticket))
            self._cond.notify_all()
            while self._flush_done < ticket and not self._error:
                self._cond.wait()
            self._raise_background_error()

    def close(self) -> None:
        """Commit everything, trim arrays to the committed length and mark the archive finalized."""
        if self._closed:
            return
        try:
            try:
                if not self._error:
                    self.flush()
            finally:
                self._closed = True
                with self._cond:
                    self._cond.notify_all()
                self._thread.join()
                self._settle_cycle()
                with self._cond:  # the buffers' memory goes back now (unmapped on a thread), not at collection
                    buffers = [b for b in (self._buffer, *self._free_buffers) if b is not None]
                    self._buffer, self._free_buffers = None, []
                _release_meanwhile(buffers)
            if self._error is not None:
                self._raise_background_error()
            if self._lease is not None:
                self._lease.renew()  # trimming rewrites array metadata: only while the lease is ours
            self._arrays.resize(self._n_committed)
            if self._index is not None:
                self._index.trim(self._n_committed)
            self._variants.trim()
            self._commit(self._n_committed, "finalized")
        finally:
            if self._lease is not None:
                self._lease.release()  # also when failing: this writer is done

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        part = "" if self.part is None else f" part={self.part}"
        return f"<ArchiveWriter {self.location!s}{part} worlds={len(self.world_ids)} frames={self._n_appended} {state}>"

    # -- caller-side helpers -----------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("this ArchiveWriter is closed; reopen with mjarchive.open(path, mode='a')")
        with self._cond:
            self._raise_background_error()

    def _raise_background_error(self) -> None:
        if isinstance(self._error, WriterLockedError):  # fenced: another writer took the archive over
            raise WriterLockedError(str(self._error)) from self._error
        if isinstance(self._error, StorageError):  # nothing past the last commit was committed
            raise StorageError(f"{self._error} (frames committed: {self._n_committed}; append the rest again "
                               "after reopening with mode='a')") from self._error
        if self._error is not None:
            raise MjArchiveError(f"the archive writer failed in the background: {self._error!r}") from self._error

    def _check_times(self, times: np.ndarray) -> None:
        """Raise AppendError unless `times` are finite and continue to increase (nothing changes)."""
        if not times.size:  # an empty block (a rollout in which no frame was due) appends nothing
            return
        if not np.isfinite(times).all():
            raise AppendError(f"time must be finite, got {times}")
        previous = np.concatenate([[self._last_time], times])
        bad = np.nonzero(np.diff(previous) <= 0)[0]
        if bad.size:
            i = int(bad[0])
            raise AppendError(
                f"time must strictly increase: frame {self._n_appended + i} has time {times[i]!r} after "
                f"{previous[i]!r}"
            )

    def _quantized(self, name: str, value: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """`value` as stored: rounded to the archive's precision (qpos and mocap, when it has one) in
        `dtype`, or else as given (it is cast while it is copied into the chunk buffer)."""
        abs_error = self.manifest.abs_error
        if abs_error is not None and name in ("qpos", "mocap_pos", "mocap_quat"):
            rounded, bound = quantize(value.astype(np.float64), abs_error)
            stored = rounded.astype(dtype)
            if np.abs(stored - value).max(initial=0.0) > abs_error:
                raise AppendError(
                    f"{name} values too large for precision abs_error={abs_error} in {dtype}; use a larger "
                    "precision or dtype='float64'"
                )
            return stored
        return value

    def _stage(self, block: dict[str, np.ndarray], k: int) -> None:
        """Copy a checked block of `k` frames into the chunk buffer (the next one too, if it fills this
        one), check what was stored is finite, and only then count the frames as appended."""
        if not self._spare_due:
            with self._cond:  # the second buffer gets made while the first block is copied
                self._spare_due = True
                self._cond.notify_all()
        cf = self.manifest.chunk_frames
        if self._buffer_fill + k > 2 * cf:
            # It would hold more than one further buffer, which may not exist before these are stored:
            # checked whole as stored first, then staged a chunk at a time (pieces that cannot fail).
            stored = {}
            for name, value in block.items():
                stored[name] = np.empty(value.shape, self._frame_shapes[name][1])
                self._store_rows(name, stored[name], value, self._n_appended)
            for lo in range(0, k, cf):
                self._stage({name: value[lo:lo + cf] for name, value in stored.items()}, min(cf, k - lo))
                self._last_time = float(stored["time"][min(lo + cf, k) - 1])  # for a block cut short here
            return
        buffer, fill, done = self._filling_buffer(), self._buffer_fill, 0
        full, taken = [], []  # buffers this block fills; buffers taken for it
        try:
            while done < k:
                take = min(k - done, cf - fill)
                for name, value in block.items():
                    self._store_rows(name, buffer[name][fill:fill + take], value[done:done + take],
                                     self._n_appended + done)
                done, fill = done + take, fill + take
                if fill == cf and done < k:
                    full.append(buffer)
                    buffer, fill = self._take_buffer(), 0
                    taken.append(buffer)
        except BaseException:
            with self._cond:  # the block is refused: buffers taken for it go back unused
                self._free_buffers.extend(taken)
            raise
        start = self._buffer_start
        with self._cond:
            for whole in full + ([buffer] if fill == cf else []):
                self._work.append((start, whole, cf, None))
                start += cf
            self._n_appended += k
            self._cond.notify_all()
        self._buffer = None if fill == cf else buffer
        self._buffer_start, self._buffer_fill = start, fill % cf

    def _store_rows(self, name: str, rows: np.ndarray, value: np.ndarray, first_frame: int) -> None:
        """`rows[...] = value` in the stored dtype; AppendError if that is not finite where it must be
        (time is checked by _check_times, overlays by their own rules: they may hold NaN)."""
        try:
            with np.errstate(over="ignore"):  # overflow to inf is reported by the finiteness check
                np.copyto(rows, value, casting="unsafe")
        except (TypeError, ValueError) as exc:
            raise AppendError(f"{name} cannot be stored as {rows.dtype}: {exc}") from None
        # Checked after the cast: a float64 value beyond float32's range becomes inf only there.
        if (self.check_finite and rows.dtype.kind == "f" and name != "time" and not name.startswith("overlays/")
                and not np.isfinite(rows).all()):
            f, w = np.argwhere(~np.isfinite(rows.reshape(len(rows), rows.shape[1], -1)))[0][:2]
            raise AppendError(
                f"{name} is not finite at frame {first_frame + int(f)}, world {self.manifest.world_ids[int(w)]} "
                f"(as stored in {rows.dtype}); pass check_finite=False to mjarchive.create() to allow it"
            )

    def _filling_buffer(self) -> dict[str, np.ndarray]:
        if self._buffer is None:
            self._buffer = self._take_buffer()
        return self._buffer

    def _take_buffer(self) -> dict[str, np.ndarray]:
        """A free chunk buffer: one the background thread gave back, a new one while fewer than
        `_max_buffers` exist, or else the next one it gives back (the caller waits: back-pressure)."""
        with self._cond:
            # The second buffer, being made on the background thread, is waited for rather than made twice.
            while (not self._free_buffers and (self._n_buffers >= self._max_buffers or self._spare_pending)
                   and not self._error):
                self._cond.wait()
            self._raise_background_error()
            if self._free_buffers:
                return self._free_buffers.pop()
            self._n_buffers += 1
        return self._new_buffer()

    # -- background thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    # The next chunk's compression is queued as soon as it is full, even while the one
                    # before is still compressing: the cores never wait for a commit between chunks.
                    while not (self._work or self._closed or self._cycle_stored() or self._spare_wanted()):
                        self._cond.wait()
                    job = self._work.popleft() if self._work else None
                    spare = job is None and self._spare_wanted()
                    if spare:
                        self._n_buffers += 1
                        self._spare_pending = True
                if spare:  # on its own thread: a chunk filled meanwhile is not kept waiting for its pages
                    _on_a_thread(self._add_spare_buffer, "mjarchive-spare", or_here=True)
                    continue
                if job is None:  # commit what is stored before waiting for more frames
                    self._finish_cycle()
                    with self._cond:
                        if self._closed and not self._work:
                            return
                    continue
                start, buffer, n, flush_ticket = job
                if flush_ticket is None:
                    # Compressing from now on, stored once the previous chunk's writes are done (so the
                    # cores do not idle meanwhile), and committed while the next chunk is compressed.
                    for name, fast in self._arrays.shard_writers.items():
                        fast.encode_async(start, buffer[name])
                    self._write_buffer(start, buffer, n, wait=False)
                else:  # a flush: the caller waits, and keeps its partly filled buffer
                    if n:
                        self._write_buffer(start, buffer, n)
                    self._finish_cycle()
                    with self._cond:
                        self._flush_done = flush_ticket
                        self._cond.notify_all()
        except BaseException as exc:  # surfaced on the caller's next call
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _write_buffer(self, start: int, buffer: dict[str, np.ndarray], n: int, wait: bool = True) -> None:
        """Write `buffer` rows [0, n) at frame `start`, then commit. With `wait=False` (a whole chunk),
        shards are stored in the background, committed by the next `_finish_cycle`, and the buffer is
        given back to the caller then (it must not change until that)."""
        self._finish_cycle()  # one write cycle at a time: the lease renewal covers one
        stop = start + n
        if self._lease is not None:  # a writer that lost its lease writes nothing, not even chunks
            self._lease.renew()
        if self._arrays.capacity() < stop:
            grow = self.manifest.chunk_frames * 16
            self._arrays.resize(((stop + grow - 1) // grow) * grow)
        puts = []
        for name, arr in self._arrays.arrays.items():
            fast = self._arrays.shard_writers.get(name)
            stored = fast.write_async(start, buffer[name][:n]) if fast is not None else None
            if stored is not None:
                puts += stored
                continue
            plain = self._arrays.chunk_writers.get(name)
            if plain is None or not plain.write(start, buffer[name][:n]):
                arr[start:stop] = buffer[name][:n]
        if self._index is not None:  # stored before the commit, like the chunk it counts
            self._index.write(start, buffer["reset"][:n])
        self._in_flight = (stop, puts, None if wait else buffer)
        if wait:
            self._finish_cycle()
        elif puts:
            remaining = [len(puts)]

            def stored(_: Any) -> None:  # the last store write of this cycle wakes the background thread
                with self._cond:
                    remaining[0] -= 1
                    if not remaining[0]:
                        self._cond.notify_all()

            for put in puts:
                put.add_done_callback(stored)

    def _spare_wanted(self) -> bool:
        """Whether to make the second buffer now: frames are being appended into the first (from the
        moment the first block is being copied). Made ahead, on a thread of its own and with its pages in
        place, it is usually ready when that one is full, and the caller does not wait for its pages; the
        background thread meanwhile goes on handing full chunks to the pool. (Any further buffer is made
        only when the caller finds none free: compression lags behind.)"""
        return self._n_buffers == 1 and self._spare_due and not (self._spare_failed or self._closed)

    def _add_spare_buffer(self) -> None:
        try:
            buffer = self._new_buffer(populate=True)
        except BaseException:  # any failure: the caller makes its own, and reports the error if that fails too
            buffer = None
        with self._cond:
            if self._closed:  # made after close(): not kept
                buffer = None
            if buffer is None:
                self._n_buffers -= 1
                self._spare_failed = True
            else:
                self._free_buffers.append(buffer)
            self._spare_pending = False
            self._cond.notify_all()

    def _cycle_stored(self) -> bool:
        """Whether the write cycle under way has all its chunks stored (and waits to be committed)."""
        return self._in_flight is not None and all(put.done() for put in self._in_flight[1])

    def _finish_cycle(self) -> None:
        """Wait until the chunks of the write cycle under way are stored, then commit them and give
        their buffer back."""
        if self._in_flight is None:
            return
        stop, puts, buffer = self._in_flight
        self._in_flight = None
        futures.wait(puts)  # all of them, even after a failed one: nothing writes after close() returns
        for put in puts:
            put.result()
        if stop > self._n_committed:
            self._variants.write(stop, self._cond)
            self._commit(stop, "live")
        if buffer is not None:
            with self._cond:
                self._free_buffers.append(buffer)
                self._cond.notify_all()

    def _settle_cycle(self) -> None:
        """After the background thread ended: let the store writes of a cycle it left (it failed
        mid-cycle) finish, uncommitted, so that nothing writes into the archive once `close()` returns."""
        if self._in_flight is not None:
            for put in self._in_flight[1]:
                try:
                    put.result()
                except Exception:  # the thread's own error is the one reported
                    pass
            self._in_flight = None

    def _new_buffer(self, populate: bool = False) -> dict[str, np.ndarray]:
        return _chunk_buffer(self.manifest, populate)

    def _commit(self, n_frames: int, status: str) -> None:
        """The commit record: one atomic write that readers trust. A live commit of a format 1.1 archive
        writes only the small commit document; finalizing writes the root attributes and leaves the
        commit document (it holds the same counts, and removing it would let a reader that read the
        live root just before find neither record)."""
        counts = self._variants.counts
        if self._lease is not None:
            self._lease.check()
        if status == "live" and self._uses_commit_document:
            self._store.write_now(COMMIT_KEY, commit_document(n_frames, counts))
            if self._root_status != "live":  # resuming a finalized archive: its root must say live again
                self._write_root(n_frames, "live")
        else:
            self._write_root(n_frames, status)
        self._n_committed = n_frames

    def _write_root(self, n_frames: int, status: str) -> None:
        if self._lease is not None:
            self._lease.check()
        attrs = self.manifest.to_dict(n_frames, status, self._variants.counts)
        write_root(self._store, self._root.metadata.to_dict(), attrs)
        self._root_status = status


def create(location: Any, model: Any, *, world_ids: Any = None, n_worlds: int | None = None,
           timestep: float | None = None, output_fps: float | None = 30.0, playback_speed: float = 1.0,
           dtype: str = "float32", precision: float | None = None, tracks: dict | None = None,
           chunk_frames: int = DEFAULT_CHUNK_FRAMES, shard_worlds: int = DEFAULT_SHARD_WORLDS,
           overwrite: bool = False, check_finite: bool = True, backend: str = "unknown",
           storage_options: dict | None = None, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
           variant_fields: Any = (), overlays: dict[str, Any] | None = None,
           lease_ttl: float = DEFAULT_LEASE_TTL, part: str | None = None) -> ArchiveWriter:
    """Create a new archive and return its writer.

    `model` is a ModelBundle, an MJCF path or an MjSpec. `world_ids` are the original IDs of the
    recorded worlds (default `range(n_worlds)`). `dtype` is the stored float type of qpos and mocap
    ("float32" or "float64" for exact replay); `precision` (absolute error, opt-in) quantizes them
    for better compression. `tracks` declares optional per-(frame, world) arrays, e.g.
    `{"qvel": (nv,), "reward": (), "ctrl": ((nu,), "float32")}`.

    Format 1.1 features (used only when asked for; listed in required_features):
    `variant_fields` names model fields that may differ per world and change at resets (domain
    randomization: "geom_rgba", "geom_size", "body_pos", ...; see `writer.set_variant`), and
    `overlays` declares debug overlay tracks, `{"target": mjarchive.Overlay.points(radius=0.03)}`,
    filled per frame with `append(..., overlays={...})`.

    The writer holds the archive's writer lease until `close()` (one writer per archive; see
    `mjarchive.open`); `lease_ttl` is its lifetime in seconds on object storage between renewals.
    `overwrite=True` refuses to replace an archive that another writer holds.

    `part` (format 1.2 "parts"): many writers, one archive. Each process writes its own part, named
    like "rank3" (lowercase letters, digits, '_', '-'), of the worlds whose global IDs it passes as
    `world_ids`; the first writer creates the archive and its model bundle, the others join it
    (same model, timestep and cadence; no world in two parts). Readers see one archive whose worlds
    are all parts' worlds. Resume a part with `mjarchive.open(location, mode="a", part=...)`;
    `overwrite=True` replaces that part only.
    """
    ttl = check_ttl(lease_ttl)
    if part is not None:
        check_part_name(part)
    bundle = as_bundle(model)
    manifest, mj_model = plan_archive(
        bundle, world_ids=world_ids, n_worlds=n_worlds, timestep=timestep, output_fps=output_fps,
        playback_speed=playback_speed, dtype=dtype, precision=precision, tracks=tracks, chunk_frames=chunk_frames,
        shard_worlds=shard_worlds, backend=backend, variant_fields=variant_fields, overlays=overlays)
    if part is None:
        store = new_store(location, overwrite=overwrite, storage_options=storage_options)  # ArchiveExistsError
        if overwrite:
            refuse_replacing_parts(location, store)
    else:
        path = local_path(location)
        if path is not None and (path.is_symlink() or path.exists()) and not path.is_dir():
            raise ArchiveExistsError(f"{_where(location)} is a file, not an archive's folder; choose another location")
        root_store = make_store(location, read_only=False, storage_options=storage_options)
        join_parts_root(location, root_store, bundle, manifest, part)
        check_joining(location, root_store, part, manifest)  # before the lease: a refusal leaves nothing
        store = root_store.sub(part_prefix(part))
    where = _where(location, part)
    # The lease first, held through building: a writer that opens the old archive meanwhile is refused,
    # and overwriting keeps the lease's own folder (and its lock) while it deletes everything else.
    lease = acquire_lease(store, where=where, ttl=ttl, creating=True)
    try:
        first_buffer = _chunk_buffer(manifest)
        _populate_meanwhile(first_buffer)
        if part is None:
            if overwrite:  # again, under the lease: parts may have begun since
                refuse_replacing_parts(location, store)
            root, created = build_archive(location, store, bundle, manifest, overwrite=overwrite)
        else:
            # (asked of another view of the folder: this store must not learn the old part's frame count)
            if root_store.sub(part_prefix(part)).read_json_now("zarr.json") is not None and not overwrite:
                raise ArchiveExistsError(f"{where} exists; append to it with mjarchive.open(location, mode='a', "
                                         f"part={part!r}), or pass overwrite=True to replace that part")
            # The lease is ours and the part has no document, or is to be replaced: what is there is ours.
            root, created = build_archive(location, store, None, manifest, overwrite=True)
        writer = ArchiveWriter(root, manifest, 0, location=location, check_finite=check_finite,
                               max_pending_bytes=max_pending_bytes, model=mj_model, lease=lease, created=created,
                               first_buffer=first_buffer)
        writer.part = part
        return writer
    except BaseException:
        lease.release()
        raise


def _where(location: Any, part: str | None = None) -> str:
    where = repr(location if isinstance(location, str) else str(location))
    return where if part is None else f"part {part!r} of {where}"


def open_writer(location: Any, *, storage_options: dict | None = None, check_finite: bool = True,
                max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES, take_over: bool = False,
                lease_ttl: float = DEFAULT_LEASE_TTL, part: str | None = None) -> ArchiveWriter:
    """Reopen an archive (or, with `part`, one part of a multi-part archive) to append after its last
    committed frame (used by `open(mode="a")`), once its writer lease is ours (WriterLockedError names
    the writer holding it)."""
    ttl = check_ttl(lease_ttl)
    if not isinstance(take_over, bool):
        raise MjArchiveError(f"take_over must be True or False, got {take_over!r:.40}")
    root = open_root(location, mode="a", storage_options=storage_options)  # an archive is there
    bundle_root = None
    parted = is_parts_root(root.attrs.asdict())
    if part is not None and not parted:
        raise MjArchiveError(f"{_where(location)} is a single archive, without parts: append to it without part=")
    if parted:
        if part is None:
            names = list_parts(root.store_path.store)
            raise MjArchiveError(f"{_where(location)} is a multi-part archive: pass part= to append to one of its "
                                 f"parts ({', '.join(map(repr, names[:8]))}{', …' if len(names) > 8 else ''})")
        open_parts_root(location, root.store_path.store)  # refuses a single archive
        store = root.store_path.store.sub(part_prefix(check_part_name(part)))
        if store.read_json_now("zarr.json") is None:
            raise ArchiveNotFoundError(f"{_where(location)} has no part {part!r}; create it with "
                                       "mjarchive.create(location, model, part=..., world_ids=...)")
        bundle_root, root = root, zarr.open_group(store=store, mode="r+", use_consolidated=False, zarr_format=3)
    lease = acquire_lease(root.store_path.store, where=_where(location, part), take_over=take_over, ttl=ttl)
    try:
        writer = _resume(location, storage_options, check_finite, max_pending_bytes, lease,
                         part=part, bundle_root=bundle_root)
        writer.part = part
        return writer
    except BaseException:
        lease.release()
        raise


def _resume(location: Any, storage_options: dict | None, check_finite: bool, max_pending_bytes: int,
            lease: WriterLease, *, part: str | None = None, bundle_root: Any = None) -> ArchiveWriter:
    """The archive as committed once the lease is ours: its last writer may have committed since it was
    first opened, and its temporary files are now stray."""
    if part is None:
        remove_partial_files(location)
        root = open_root(location, mode="a", storage_options=storage_options)
    else:
        remove_partial_files(location, part_prefix(part))
        store = bundle_root.store_path.store.sub(part_prefix(part))
        root = zarr.open_group(store=store, mode="r+", use_consolidated=False, zarr_format=3)
    manifest, n_frames, _status, n_events = read_commit(root)
    root_status = root.attrs[ROOT_ATTR]["status"]  # a finalized root stays the record until the first commit
    if tuple(int(p) for p in manifest.format_version.split(".")) > tuple(int(p) for p in FORMAT_VERSION.split(".")):
        # Rewriting the root attributes would drop keys a newer minor version added.
        raise FormatVersionError(
            f"this archive is format {manifest.format_version}; this mjarchive writes {FORMAT_VERSION} and "
            "cannot append to it without losing metadata; upgrade mjarchive to append"
        )
    if part is not None:  # still a part the archive's readers accept: its root and the other parts agree
        root_store = bundle_root.store_path.store
        parts_root = open_parts_root(location, root_store)
        parts_root.check_part(part, manifest)
        check_joining(location, root_store, part, manifest)
    # New frames must not be committed on top of a missing, damaged or swapped model.
    if ModelBundle.from_zarr(root if bundle_root is None else bundle_root).sha256 != manifest.model_sha256:
        raise FormatError("the embedded model bundle's hash differs from the manifest's model.sha256; "
                          "refusing to append to a damaged archive (mjarchive verify says more)")
    return ArchiveWriter(root, manifest, n_frames, location=location, check_finite=check_finite,
                         max_pending_bytes=max_pending_bytes, n_events=n_events, root_status=root_status,
                         lease=lease)
