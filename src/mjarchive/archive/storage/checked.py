"""A store wrapper that bounds every metadata document and chunk before zarr decodes it.

`CheckedStore` wraps any store (local, memory, fsspec) and inspects bytes before zarr decodes
them, from the metadata that passed through it (each `zarr.json`, checked against
MAX_JSON_BYTES / MAX_JSON_DEPTH before zarr parses it):

- a compressed chunk must declare its decoded size (blosc header, zstd frame content size) and
  that size must be the chunk's, so numcodecs never allocates what a hostile header claims;
  gzip is inflated here with a bound first;
- a shard index must hold sane (offset, nbytes) pairs, and an inner chunk range must lie inside
  the shard object;
- a chunk, shard or inner chunk of committed frames (the commit record's `n_frames`) that is missing or
  marked empty is damage (the writer writes every chunk), not fill values.

Over an object store (`remote`, see remote.py) every operation of the wrapped store is also bounded in
time, and a transport failure left after the retries is a StorageError naming the object.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import google_crc32c
import numpy as np
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import WrapperStore

from ..._errors import FormatError
from .chunk_layout import ZARR_V2_METADATA, ArrayInfo, cached_array_info, check_chunk
from .prefixed import PrefixStore
from .remote import Remote
from ..format import (COMMIT_ATTR, COMMIT_GROUP, COMMIT_KEY, MAX_COMMIT_BYTES, RESET_COUNT,
                     MAX_JSON_BYTES, MAX_JSON_DEPTH, ROOT_ATTR, json_depth, parse_json_bytes,
                     version_at_least)

__all__ = ["CheckedStore", "check_json_bytes"]

_MAX_U64 = 2**64 - 1
# Shards read_region_now fetches and decodes at once: decoding releases the GIL; an object store's
# latency is hidden by requests in flight (each worker holds one shard's bytes at most).
_LOCAL_WORKERS, _REMOTE_WORKERS = min(4, os.cpu_count() or 1), 16
_MAX_FAST_INNER = 1 << 16  # inner chunks per shard it decodes (one list entry each); zarr reads the rest
_THREADED_INNER_BYTES = 16 << 10  # local reads of smaller inner chunks decode on one thread
_GROUP_BYTES = 256 << 10  # decoded inner chunks reordered in one copy (while in cache; see _unpack_shard)
_WRITES_AT_ONCE = 10  # _set_many's uploads in flight: s3fs's connection pool (botocore's 10) keeps no more busy


# -- bounded metadata ------------------------------------------------------------------------------

def check_json_bytes(data: bytes, what: str) -> None:
    """Refuse a JSON document above MAX_JSON_BYTES or nested deeper than MAX_JSON_DEPTH, unparsed."""
    if len(data) > MAX_JSON_BYTES:
        raise FormatError(f"{what} is {len(data)} bytes, above the limit of {MAX_JSON_BYTES} for a metadata document")
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH and json_depth(data) > MAX_JSON_DEPTH:
        # (a document with fewer brackets than the limit cannot nest deeper: two scans in C)
        raise FormatError(f"{what} nests JSON more than {MAX_JSON_DEPTH} levels deep; refusing to parse it")


def _count(n: Any) -> int:
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0


class _State:
    """What a CheckedStore learned from the metadata that passed through it (shared by its copies)."""

    def __init__(self) -> None:
        self.arrays: dict[str, ArrayInfo] = {}
        self.n_frames = 0
        self.n_events: dict[str, int] = {}
        self.reads_commit = False
        self.index_chunk_frames = 0  # format 1.3: rows of the episode index count whole chunks of this many frames

    def record(self, key: str, data: Any) -> dict | None:
        """Learn from metadata document `key` (checked for size and depth first); returns it parsed,
        None if it is not a JSON object."""
        data = bytes(data) if not isinstance(data, bytes) else data
        if key == COMMIT_KEY and len(data) > MAX_COMMIT_BYTES:
            raise FormatError(f"the commit document {key!r} is {len(data)} bytes, above the limit of {MAX_COMMIT_BYTES} "
                              "(it holds a few counts); refusing to parse it")
        check_json_bytes(data, f"metadata document {key!r}")
        try:
            meta = parse_json_bytes(data, f"metadata document {key!r}")
        except FormatError:
            raise
        except (ValueError, RecursionError):
            return None  # zarr reports unparsable metadata itself
        if not isinstance(meta, dict):
            return None
        path = key[: -len("zarr.json")].rstrip("/")
        if meta.get("node_type") == "array":
            try:
                self.arrays[path] = cached_array_info(path, data, meta)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                # Known and refused, never forgotten: a chunk of an unknown array is refused too.
                self.arrays[path] = ArrayInfo(path, (), (), "/", False, error=f"malformed array metadata ({exc!r})")
            return meta
        if meta.get("consolidated_metadata") is not None:
            # zarr would serve the children's metadata from this copy, never reading (or checking)
            # their own documents; mjarchive writes none, and the spec refuses it (even an empty
            # one). null, which zarr-python 3.0 writes for every group, means absent.
            raise FormatError(f"group {path or '/'!r} carries consolidated_metadata, which the mjarchive format "
                              "does not use; refusing to read metadata that bypasses the arrays' own documents")
        attrs = meta.get("attributes")
        if path == "":
            root = attrs.get(ROOT_ATTR) if isinstance(attrs, dict) else None
            root = root if isinstance(root, dict) else {}
            # Counts only grow: zarr reading the root again (to open the model bundle) must not
            # lower what the commit document raised.
            self.n_frames = max(self.n_frames, _count(root.get("n_frames")))
            variants = root.get("variants")
            for name, entry in (variants.items() if isinstance(variants, dict) else ()):
                n = _count(entry.get("n_events") if isinstance(entry, dict) else None)
                if isinstance(name, str):
                    self.n_events[name] = max(self.n_events.get(name, 0), n)
            storage = root.get("storage")
            cf = _count(storage.get("chunk_frames")) if isinstance(storage, dict) else 0
            self.index_chunk_frames = cf if version_at_least(root.get("format_version"), (1, 3)) else 0
            # The root is read before the commit document; a finalized (or 1.0) root is the record.
            self.reads_commit = (root.get("status") == "live"
                                 and version_at_least(root.get("format_version"), (1, 1)))
        elif path == COMMIT_GROUP and self.reads_commit:
            # Counts only ever grow: the larger of root and commit document is what chunks must back
            # (a commit document below the root is refused by the reader anyway).
            record = attrs.get(COMMIT_ATTR) if isinstance(attrs, dict) else None
            record = record if isinstance(record, dict) else {}
            self.n_frames = max(self.n_frames, _count(record.get("n_frames")))
            events = record.get("n_events")
            for name, n in (events.items() if isinstance(events, dict) else ()):
                if name in self.n_events:
                    self.n_events[name] = max(self.n_events[name], _count(n))
        return meta

    def locate(self, key: str) -> tuple[ArrayInfo | None, tuple[int, ...] | None]:
        """The known array `key` lies in (the longest known path it is under) and its chunk coordinates;
        (None, None) outside every known array, (info, None) for a key that is no chunk key of it."""
        i = key.find("/")
        while i > 0:  # arrays do not nest: the first (shortest) known prefix is the array
            info = self.arrays.get(key[:i])
            if info is not None:
                break
            i = key.find("/", i + 1)
        else:
            return None, None
        rest = key[len(info.path) + 1:]
        if rest == "c":
            coords: tuple[int, ...] = ()
        elif rest.startswith("c" + info.sep):
            try:
                coords = tuple(map(int, rest[2:].split(info.sep)))
            except ValueError:
                return info, None
        else:
            return info, None
        return (info, coords) if len(coords) == len(info.shape) else (info, None)


def _items(info: ArrayInfo) -> str:
    return "events" if (info.frame_axis or "").startswith("events/") else "frames"


def _committed(state: _State, info: ArrayInfo, coords: tuple[int, ...]) -> bool:
    if any(c * s >= n for c, s, n in zip(coords, info.chunks, info.shape)):
        return False
    if info.frame_axis is None:
        return True
    n = state.n_frames if info.frame_axis == "frames" else state.n_events.get(info.frame_axis[7:], 0)
    if info.path == RESET_COUNT and state.index_chunk_frames:  # its rows: the whole chunks of committed frames
        n = state.n_frames // state.index_chunk_frames
    return coords[0] * info.chunks[0] < n


def _check_index(state: _State, info: ArrayInfo, key: str, coords: tuple[int, ...], raw: Any,
                 shard_size: int | None) -> np.ndarray:
    if len(raw) != info.index_size:
        raise FormatError(f"shard {key!r} is truncated: its index has {len(raw)} of {info.index_size} bytes")
    n_inner = (info.index_size - 4 * info.index_crc) // 16
    table = np.frombuffer(raw, "<u8", count=2 * n_inner).reshape(n_inner, 2)
    top = table.max(axis=0)
    if top[0] < 2**62 and top[1] <= info.chain.max_stored and shard_size is None and not info.index_start:
        return table  # the common case (no empty entry, sizes sane), in one reduction
    off, nbytes = table[:, 0], table[:, 1]
    empty = off == _MAX_U64
    if (empty != (nbytes == _MAX_U64)).any():
        raise FormatError(f"shard {key!r} has a malformed index entry (half marked empty)")
    if empty.any():
        if _committed(state, info, coords):
            inside = _inside_mask(info, coords)
            hole = np.nonzero(empty & inside)[0]
            if hole.size:
                raise FormatError(
                    f"array {info.path!r}: shard {key!r} marks inner chunk {int(hole[0])} as missing, but it holds "
                    "committed frames (the writer writes every chunk); the archive is damaged"
                )
        off, nbytes = off[~empty], nbytes[~empty]
    if nbytes.size:
        if int(nbytes.max()) > info.chain.max_stored:
            raise FormatError(f"shard {key!r} index declares an inner chunk of {int(nbytes.max())} bytes, too large")
        lo = info.index_size if info.index_start else 0
        hi = (shard_size - (0 if info.index_start else info.index_size)) if shard_size is not None else 2**62
        # (offsets first: off + nbytes would wrap around in uint64 for an offset near 2**64)
        if int(off.min()) < lo or int(off.max()) > hi or int((off + nbytes).max()) > hi:
            raise FormatError(f"shard {key!r} index points outside the shard object")
    return table


def _inside_mask(info: ArrayInfo, coords: tuple[int, ...]) -> np.ndarray:
    """Which inner chunks of shard `coords` start inside the array (C order, as the index lists them)."""
    edge = tuple(c if (c + 1) * s > n else -1 for c, s, n in zip(coords, info.chunks, info.shape))
    mask = info.edge_masks.get(edge)
    if mask is None:
        axes = [np.arange(c * p, (c + 1) * p) * i < n for c, p, i, n in zip(coords, info.per_shard, info.inner,
                                                                            info.shape)]
        mask = np.ones(info.per_shard, bool)
        for d, ax in enumerate(axes):
            mask &= ax.reshape([-1 if k == d else 1 for k in range(len(axes))])
        mask = mask.reshape(-1)
        if len(info.edge_masks) < 64:
            info.edge_masks[edge] = mask
    return mask


def _check_index_crc(key: str, raw: bytes) -> None:
    if google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        raise FormatError(f"shard {key!r} index fails its crc32c checksum; the archive is damaged")


def _unpack(info: ArrayInfo, data: Any) -> np.ndarray:
    """One stored (inner) chunk decoded with the array's fast layout, in array order (the transpose
    codec's order undone)."""
    dtype, shape, decoder, order = info.fast
    stored = np.frombuffer(data if decoder is None else decoder.decode(data), dtype).reshape([shape[i] for i in order])
    return stored.transpose(np.argsort(order)) if order != tuple(range(len(order))) else stored


def _unpack_shard(info: ArrayInfo, key: str, data: Any, table: list, box: list, out: np.ndarray,
                  origin: list) -> bool:
    """The inner chunks of a shard (`table`: their (offset, nbytes); its first item at array position
    `origin`) that `box` reaches, checked, decoded and copied into `out` (which holds `box`), a group at a
    time: each group decoded into one buffer of about `_GROUP_BYTES` and reordered in one copy while it is
    in cache (reshaping and placing each inner chunk costs more than decoding a small one). False, and
    nothing done, where an inner chunk is missing or one step of the walk holds more than both
    `_GROUP_BYTES` and one inner chunk (the caller then goes inner chunk by inner chunk)."""
    dtype, shape, decoder, order = info.fast
    rank, grid = len(shape), info.per_shard
    axis = max(range(rank), key=grid.__getitem__)  # the grid axis walked in groups, the others whole
    across = len(table) // grid[axis]  # inner chunks per step along it
    if across > 1 and across * info.chain.decoded > _GROUP_BYTES or any(off == _MAX_U64 for off, _ in table):
        return False
    step = max(1, _GROUP_BYTES // (across * info.chain.decoded))
    (lo, hi), at, size = box[axis], origin[axis], shape[axis]
    first, last = max(0, (lo - at) // size), min(grid[axis], -(-(hi - at) // size))  # the steps box reaches
    buffer = np.empty((min(step, last - first) * across, info.chain.decoded), np.uint8)
    numbers = np.arange(len(table)).reshape(grid)
    inverse = [rank + int(j) for j in np.argsort(order)]
    pairs = [a for d in range(rank) for a in (d, inverse[d])]  # (grid d, chunk d): axis d of the group's items
    for a in range(first, last, step):
        group = numbers[(slice(None),) * axis + (slice(a, min(a + step, last)),)]
        for row, i in enumerate(group.ravel().tolist()):
            off, nbytes = table[i]
            piece = data[off:off + nbytes]
            check_chunk(info, f"{key} (inner chunk {i})", piece, info.chain)
            try:
                if decoder is None:
                    buffer[row] = np.frombuffer(piece, np.uint8)
                else:
                    decoder.decode(piece, out=buffer[row])
            except Exception as exc:  # a corrupt stream fails inside numcodecs
                raise FormatError(f"inner chunk {i} of shard {key!r} does not decode; the archive is damaged: "
                                  f"{exc!r}") from None
        stored = buffer[:group.size].view(dtype).reshape(*group.shape, *(shape[j] for j in order))
        items = stored.transpose(pairs).reshape([g * c for g, c in zip(group.shape, shape)])
        _place(out, box, items, [*origin[:axis], at + a * size, *origin[axis + 1:]])
    return True


def _place(out: np.ndarray, box: list, chunk: np.ndarray, at: list) -> None:
    """Copy what of `chunk` (its first item at array position `at`) lies in `box` into `out` (holding `box`)."""
    dst, src = [], []
    for (lo, hi), a, m in zip(box, at, chunk.shape):
        start, stop = max(lo, a), min(hi, a + m)
        if start >= stop:
            return
        dst.append(slice(start - lo, stop - lo))
        src.append(slice(start - a, stop - a))
    out[tuple(dst)] = chunk[tuple(src)]


class CheckedStore(WrapperStore):
    """Wraps a store so that every metadata document and chunk is bounded before zarr decodes it."""

    def __init__(self, store: Any, remote: Remote | None = None, state: _State | None = None) -> None:
        super().__init__(store)
        self._state = state or _State()
        self._remote = remote

    def _with_store(self, store: Any) -> CheckedStore:
        return type(self)(store, self._remote, self._state)

    def fresh(self) -> CheckedStore:
        """This store with nothing learned yet: for a look at an archive about to be replaced, whose
        frame counts must not bound the new one's chunks."""
        return type(self)(self._store, self._remote)

    def sub(self, prefix: str) -> CheckedStore:
        """The folder `prefix` ('parts/a/') of this store as a store of its own, checked on its own
        (its own commit record bounds its chunks), bounded in time as this one is."""
        return type(self)(PrefixStore(self._store, prefix), self._remote)

    def _io(self, op: str, key: str, awaitable: Any) -> Any:
        """`awaitable`, one operation of the wrapped store, bounded in time over an object store."""
        return awaitable if self._remote is None else self._remote.call(op, key, awaitable)

    def _raw_get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        return self._io("reading", key, self._store.get(key, prototype, byte_range))

    def __repr__(self) -> str:
        return f"CheckedStore({self._store!r})"

    async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
        buf = await self._raw_get(key, prototype or default_buffer_prototype(), byte_range)
        return self._checked(key, byte_range, buf)

    def _checked(self, key: str, byte_range: Any, buf: Any) -> Any:
        """`buf`, read from `key` at `byte_range`, once it passed the checks (else FormatError)."""
        state = self._state
        if key == "zarr.json" or key.endswith("/zarr.json"):
            if buf is not None and byte_range is None:
                state.record(key, buf.to_bytes())
            return buf
        info, coords = state.locate(key)
        if info is None:
            if buf is None or key.rpartition("/")[2] in ZARR_V2_METADATA:
                return buf  # zarr probing for a key that is not there, or v2 metadata it then refuses
            raise FormatError(f"{key!r} belongs to no array whose metadata this reader has checked; an "
                              "mjarchive archive holds no such objects")
        if info.error is not None:
            raise FormatError(f"array {info.path!r} cannot be read safely: {info.error}")
        if coords is None:
            if buf is None:
                return None
            raise FormatError(f"{key!r} is not a chunk key of array {info.path!r}")
        if buf is None:
            if _committed(state, info, coords):
                raise FormatError(
                    f"array {info.path!r}: chunk {key!r} of committed {_items(info)} is missing from the store "
                    "(the writer writes every chunk); the archive is damaged"
                )
            return None
        data = buf.as_buffer_like() if hasattr(buf, "as_buffer_like") else buf.to_bytes()
        if not info.per_shard:
            if byte_range is None:
                check_chunk(info, key, data, info.chain)
            return buf
        # A shard: its index (suffix or prefix of index_size), one inner chunk (a range) or all of it.
        if byte_range is None:
            n = len(data)
            index = data[:info.index_size] if info.index_start else data[n - info.index_size:] if n >= info.index_size else data
            table = _check_index(state, info, key, coords, index, n)
            for off, nb in table:
                if off != _MAX_U64:
                    check_chunk(info, key, data[int(off):int(off + nb)], info.chain)
        elif isinstance(byte_range, SuffixByteRequest) or (
                isinstance(byte_range, RangeByteRequest) and byte_range.start == 0 and info.index_start
                and byte_range.end == info.index_size):
            _check_index(state, info, key, coords, data, None)
        elif isinstance(byte_range, RangeByteRequest):
            if len(data) != byte_range.end - byte_range.start:
                raise FormatError(f"shard {key!r} index points past the end of the shard object")
            check_chunk(info, key, data, info.chain)
        return buf

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list:
        return list(await asyncio.gather(*(self.get(key, prototype, byte_range) for key, byte_range in key_ranges)))

    # zarr 3.4 reads through more methods than get(); WrapperStore would hand them straight to the
    # wrapped store, past every check. Each goes through get() here, and synchronous IO is declined
    # (zarr then takes its async paths), so no zarr version can read around the checks.
    _supports_sync_io = False

    async def get_ranges(self, key: str, byte_ranges: Any, *, prototype: Any = None, **coalescing: Any) -> Any:
        """The wrapped store's (coalesced) reads, each range's bytes checked as get() checks them."""
        byte_ranges = list(byte_ranges)
        prototype = prototype or default_buffer_prototype()
        if not hasattr(self._store, "get_ranges"):  # zarr < 3.4 stores
            yield list(enumerate(await asyncio.gather(*(self.get(key, prototype, r) for r in byte_ranges))))
            return
        try:
            groups = self._store.get_ranges(key, byte_ranges, prototype=prototype, **coalescing)
            async for group in (groups if self._remote is None else self._remote.iterate("reading", key, groups)):
                yield [(i, self._checked(key, byte_ranges[i], buf)) for i, buf in group]
        except* FileNotFoundError:  # zarr reads that as "shard gone": fill values, unless it is damage
            self._checked(key, byte_ranges[0] if byte_ranges else None, None)
            raise

    async def _get_many(self, requests: Any) -> Any:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
        return sync(self.get(key, prototype, byte_range))

    def get_ranges_sync(self, key: str, byte_ranges: Any, *, prototype: Any = None, **_coalescing: Any) -> list:
        return [(i, self.get_sync(key, prototype=prototype, byte_range=r)) for i, r in enumerate(byte_ranges)]

    async def set(self, key: str, value: Any) -> None:
        await self._io("writing", key, self._store.set(key, value))
        if key == "zarr.json" or key.endswith("/zarr.json"):
            self._state.record(key, value.to_bytes())

    # The wrapped store's other operations, bounded the same way (WrapperStore would call them bare).
    async def _set_many(self, values: Any) -> None:
        """`set` of each (key, Buffer), at most `_WRITES_AT_ONCE` at a time, each timed from its start. Every
        write has ended when this returns or raises (the first failure): none lands after a caller gave up."""
        slots = asyncio.Semaphore(_WRITES_AT_ONCE)

        async def write(key: str, value: Any) -> None:
            async with slots:
                await self.set(key, value)

        for result in await asyncio.gather(*(write(k, v) for k, v in values), return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        await self._io("writing", key, self._store.set_if_not_exists(key, value))

    async def exists(self, key: str) -> bool:
        return await self._io("looking for", key, self._store.exists(key))

    async def delete(self, key: str) -> None:
        await self._io("deleting", key, self._store.delete(key))

    async def delete_dir(self, prefix: str) -> None:
        await self._io("deleting", prefix, self._store.delete_dir(prefix))

    async def is_empty(self, prefix: str) -> bool:
        return await self._io("listing", prefix, self._store.is_empty(prefix))

    def list(self) -> Any:
        return self._listing("", self._store.list())

    def list_prefix(self, prefix: str) -> Any:
        return self._listing(prefix, self._store.list_prefix(prefix))

    def list_dir(self, prefix: str) -> Any:
        return self._listing(prefix, self._store.list_dir(prefix))

    def _listing(self, prefix: str, iterator: Any) -> Any:
        return iterator if self._remote is None else self._remote.iterate("listing", prefix, iterator)

    # Whole-object reads and writes from the calling thread, checked the same way: a local store does
    # them without a round trip through zarr's event loop thread (what dominates opening an archive).
    def read_now(self, key: str, byte_range: Any = None) -> Any:
        """`key`'s bytes (or a range of them) as a zarr Buffer once checked, None if absent."""
        get_sync = self._sync("get_sync")
        if get_sync is not None:
            buf = get_sync(key, prototype=default_buffer_prototype(), byte_range=byte_range)
        else:
            buf = sync(self._raw_get(key, default_buffer_prototype(), byte_range))
        return self._checked(key, byte_range, buf)

    def read_json_now(self, key: str, before_parsing: Any = None) -> tuple[bytes, dict] | None:
        """Metadata document `key`, its bytes and parsed (once), after the size and depth checks (and
        `before_parsing(n_bytes)`, which may refuse it); None if absent."""
        get_sync = self._sync("get_sync")
        if get_sync is not None:
            buf = get_sync(key, prototype=default_buffer_prototype())
        else:
            buf = sync(self._raw_get(key, default_buffer_prototype()))
        if buf is None:
            return None
        raw = buf.to_bytes()
        if before_parsing is not None:
            before_parsing(len(raw))
        meta = self._state.record(key, raw)
        if meta is None:
            raise FormatError(f"metadata document {key!r} is not a JSON object")
        return raw, meta

    def _sync(self, method: str) -> Any:
        """The wrapped store's synchronous `method` where it reads and writes files itself; None for a
        wrapper (a caller's counting, caching or logging store must see every access, through zarr's
        async methods)."""
        if isinstance(self._store, PrefixStore):
            return self._store.sync_method(method)
        return None if isinstance(self._store, WrapperStore) else getattr(self._store, method, None)

    def metadata_error(self, path: str) -> str | None:
        """Why array `path`'s metadata (as read through this store) cannot be read safely, or None."""
        info = self._state.arrays.get(path)
        return None if info is None else info.error

    def reads_directly(self, path: str) -> bool:
        """Whether read_chunk_now serves array `path` (a local store, codecs it decodes)."""
        info = self._state.arrays.get(path)
        return (info is not None and info.error is None and info.fast is not None
                and self._sync("get_sync") is not None)

    def read_chunk_now(self, path: str, coords: tuple[int, ...], n_inner: int | None) -> np.ndarray | None:
        """Decode one chunk of array `path` (for a sharded array: inner chunk `n_inner` of shard
        `coords`) without zarr, checked as `get` checks it; None where the layout is not the one
        this fast path knows (the caller reads through zarr). Local stores only."""
        info = self._state.arrays.get(path)
        get_sync = self._sync("get_sync")
        if info is None or info.error is not None or info.fast is None or get_sync is None:
            return None
        key = f"{path}/c{info.sep}{info.sep.join(map(str, coords))}"
        prototype = default_buffer_prototype()
        if not info.per_shard:
            buf = self._checked(key, None, get_sync(key, prototype=prototype))
        else:
            index = info.index_cache.get(coords)
            if index is None:
                request = SuffixByteRequest(info.index_size)
                raw = self._checked(key, request, get_sync(key, prototype=prototype, byte_range=request))
                if raw is None:
                    return None  # no shard: fill values (damage was refused by _checked)
                raw = raw.to_bytes()
                _check_index_crc(key, raw)
                index = np.frombuffer(raw, "<u8", count=2 * (len(raw) // 16)).reshape(-1, 2)
                # Only a shard whose frames are all committed is never written again (a partly
                # filled one is replaced by later flushes, with other offsets).
                if (coords[0] + 1) * info.chunks[0] <= self._state.n_frames:
                    if len(info.index_cache) > 256:
                        info.index_cache.clear()
                    info.index_cache[coords] = index
            off, nbytes = (int(v) for v in index[n_inner])
            if off == _MAX_U64:
                return None
            request = RangeByteRequest(off, off + nbytes)
            buf = self._checked(key, request, get_sync(key, prototype=prototype, byte_range=request))
        if buf is None:
            return None
        return _unpack(info, buf.to_bytes() if info.fast[2] is None else buf.as_buffer_like())

    def read_region_now(self, path: str, region: tuple[tuple[int, int], ...], fill: Any) -> np.ndarray | None:
        """Items [lo, hi) of the leading axes of sharded array `path` (all of the others), as zarr reads
        them: each shard read whole in one request, its size bounded first, checked as `get` checks a
        shard (and its index crc32c), its inner chunks decoded without zarr, a few shards at a time;
        None where the layout is not the one this path knows (the caller reads through zarr)."""
        info = self._state.arrays.get(path)
        if (info is None or info.error is not None or info.fast is None or not info.per_shard
                or math.prod(info.per_shard) > _MAX_FAST_INNER or any(lo >= hi for lo, hi in region)):
            return None
        box = [*region, *((0, n) for n in info.shape[len(region):])]
        shards = list(itertools.product(*(range(lo // c, -(-hi // c)) for (lo, hi), c in zip(box, info.chunks))))
        out = np.empty([hi - lo for lo, hi in box], info.fast[0])
        if not shards:  # an axis of length 0 (qpos of a model without joints): nothing stored to read
            return out
        if self._remote is not None:
            workers = _REMOTE_WORKERS
        else:  # small inner chunks decode in less time than threads lose taking turns at the GIL
            workers = _LOCAL_WORKERS if info.chain.decoded >= _THREADED_INNER_BYTES else 1
        if workers == 1 or len(shards) == 1:
            for coords in shards:
                self._decode_shard(info, coords, box, out, fill)
            return out
        with ThreadPoolExecutor(min(len(shards), workers)) as pool:
            for _ in pool.map(lambda coords: self._decode_shard(info, coords, box, out, fill), shards):
                pass
        return out

    def _decode_shard(self, info: ArrayInfo, coords: tuple[int, ...], box: list, out: np.ndarray, fill: Any) -> None:
        """Shard `coords` of `info`'s array, read, checked and decoded into `out` (which holds `box`)."""
        key = f"{info.path}/c{info.sep}{info.sep.join(map(str, coords))}"
        n_inner = math.prod(info.per_shard)
        bound = info.index_size + n_inner * info.chain.max_stored
        request = RangeByteRequest(0, bound + 1)  # a larger object is damage, refused without reading all of it
        get_sync = self._sync("get_sync")
        if get_sync is not None:
            buf = get_sync(key, prototype=default_buffer_prototype(), byte_range=request)
        else:
            buf = sync(self._raw_get(key, default_buffer_prototype(), request))
        dtype, shape = info.fast[:2]
        origin = [c * s for c, s in zip(coords, info.chunks)]
        if buf is None:
            self._checked(key, None, None)  # damage where it holds committed items; else fill values
            _place(out, box, np.broadcast_to(np.asarray(fill, dtype), info.chunks), origin)
            return
        data = buf.as_buffer_like()
        n = len(data)
        if n > bound:
            raise FormatError(f"shard {key!r} is more than {bound} bytes, more than {n_inner} inner chunks can take; "
                              "the archive is damaged")
        if n < info.index_size:
            raise FormatError(f"shard {key!r} is truncated: {n} bytes, less than its index of {info.index_size}")
        raw = bytes(data[n - info.index_size:])
        _check_index_crc(key, raw)
        table = _check_index(self._state, info, key, coords, raw, n).tolist()
        if _unpack_shard(info, key, data, table, box, out, origin):
            return
        at = (np.stack(np.unravel_index(np.arange(n_inner), info.per_shard), 1) * shape + origin).tolist()
        for i, (off, nbytes) in enumerate(table):
            if off == _MAX_U64:
                _place(out, box, np.broadcast_to(np.asarray(fill, dtype), shape), at[i])
                continue
            piece = data[off:off + nbytes]
            check_chunk(info, f"{key} (inner chunk {i})", piece, info.chain)
            try:
                chunk = _unpack(info, piece)
            except Exception as exc:  # a corrupt stream fails inside numcodecs
                raise FormatError(f"inner chunk {i} of shard {key!r} does not decode; the archive is damaged: "
                                  f"{exc!r}") from None
            _place(out, box, chunk, at[i])

    def write_all_now(self, items: Any) -> None:
        """`write_now` of each (key, bytes-like) of the iterable `items`: into a local folder one after
        another, in order, from this thread; to object storage in one trip to zarr's event loop
        (`_set_many`: in no particular order, all ended when this returns or raises)."""
        if self._sync("set_sync") is not None:
            for key, data in items:
                self.write_now(key, data)
            return
        prototype = default_buffer_prototype()
        values = [(key, prototype.buffer.from_bytes(data)) for key, data in items]
        if values:
            sync(self._set_many(values))

    def write_now(self, key: str, data: bytes | list) -> None:
        """Replace `key` with `data` (bytes, or a list of bytes-like pieces, one after another) in one
        atomic store write."""
        if isinstance(data, list):
            set_parts = None if key.endswith("zarr.json") else self._sync("set_parts_sync")
            if set_parts is not None:  # a local file: the pieces are written as they are (no joined copy)
                set_parts(key, data)
                return
            data = b"".join(data)
        value = default_buffer_prototype().buffer.from_bytes(data)
        set_sync = self._sync("set_sync")
        if set_sync is not None:
            set_sync(key, value)
            if key == "zarr.json" or key.endswith("/zarr.json"):
                self._state.record(key, data)
        else:
            sync(self.set(key, value))
