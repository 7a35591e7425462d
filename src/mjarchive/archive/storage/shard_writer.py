"""Writing whole shards of a sharded Zarr v3 array without zarr-python's per-inner-chunk overhead.

zarr-python 3.1 spends ~0.5-1 ms of Python per inner chunk in the sharding codec, which caps
appends at a few tens of MB/s for one-world inner chunks. For a write that covers whole shards,
`ShardWriter` builds the very same object zarr would: each inner chunk's C-order bytes through the
array's own `bytes` + `blosc` codec configuration (read from the array metadata), concatenated in
the sharding codec's chunk order, then the index of little-endian uint64 (offset, nbytes) pairs in
C order of the inner-chunk grid and its crc32c, at the end; one `set` per shard object at the key
the array's chunk key encoding gives. A `transpose` codec first is applied to each inner chunk
before its bytes (the default layout puts frames innermost); numcodecs' pcodec may stand
in for `bytes` + `blosc` (benchmarks only: the spec does not allow it). Inner chunks are
compressed in parallel (Blosc releases the GIL), by numcodecs' c-blosc called through ctypes where
that gives numcodecs' bytes (`_DirectBlosc`: one call per batch of inner chunks where each is one blosc
block; small unshuffled zstd ones, like `reset`'s, by zstd itself with a context kept per thread,
`_KeptZstd`), from `encode_async` on if asked before their store writes may begin; mjarchive's store
writes a shard's pieces without joining them. Inner chunks of an
edge shard that lie wholly outside the array are left out (index entry 2**64-1 twice), as
zarr-python leaves them out.

Anything else (other codecs, index at the start, a region that is not whole shards, a shard grid
whose chunk order could differ from C order) is declined, and the caller writes through zarr.
`tests/archive/test_shards.py` and `test_codecs.py` check the objects are byte-identical to zarr-python's.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import google_crc32c
import numcodecs
import numcodecs.blosc
import numpy as np
import zarr
from numcodecs.blosc import compress as _blosc_compress
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

__all__ = ["ShardWriter", "enabled", "store_object", "stored_dtype"]

_EMPTY = np.uint64(2**64 - 1)
_HEADER = 16  # a blosc 1 chunk's header: versions, flags, type size, then int32 length, block size, chunk length
_MEMCPYED = 0x2  # header flag: the chunk is stored as it is
_MAX_STREAMS = 16  # blosc 1 splits a block into at most this many streams, each after its int32 length
# Rows up to this size and blosc level go to zstd with a kept context, the GIL held meanwhile: calls of a few
# microseconds (a 512-byte row at zstd level 3: 3 us); higher levels take milliseconds. Small rows also keep zstd
# 1.5's row match finder, whose hash salt changes between context resets, off (it starts above a 16 KiB window).
_KEPT_CONTEXT_MAX_BYTES = 4096
_KEPT_CONTEXT_MAX_CLEVEL = 3
_END_SLACK = 64  # codecs fail a few bytes short of their output limit (zstd ~8, blosclz 2): a margin for them
PCODEC = "numcodecs.pcodec"  # zarr-python's name for numcodecs' pcodec serializer (not in tensorstore)
_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
_WORKERS = os.cpu_count() or 1
_NUMCODECS_TYPESIZE = tuple(int(p) for p in numcodecs.__version__.split(".")[:2] if p.isdigit()) >= (0, 16)
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_io_pool: ThreadPoolExecutor | None = None


def _blosc_compress_ctx() -> Any:
    """c-blosc 1's `blosc_compress_ctx` from the copy numcodecs links into its extension, through ctypes
    (which releases the GIL for the call); None where that symbol cannot be reached, numcodecs' blosc
    is not c-blosc 1 (whose signature this is), or MJARCHIVE_DIRECT_BLOSC=0."""
    if os.environ.get("MJARCHIVE_DIRECT_BLOSC", "") in ("0", "false", "no"):
        return None
    if not str(getattr(numcodecs.blosc, "VERSION_STRING", "")).startswith("1."):
        return None
    try:
        fn = ctypes.CDLL(numcodecs.blosc.__file__).blosc_compress_ctx
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = ctypes.c_int
    # clevel, doshuffle, typesize, nbytes, src, dest, destsize, compressor, blocksize, numinternalthreads
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int)
    return fn


_blosc_ctx = _blosc_compress_ctx()


class _KeptZstd:
    """zstd from the copy numcodecs' c-blosc links in, through ctypes, with one compression context kept per
    thread. c-blosc 1 makes and frees a zstd context for every block it compresses (its allocation, table
    clearing and CPU feature probe: ~3/4 of the time for a block of 512 bytes, an inner chunk of `reset`);
    called with the GIL held, as such short calls are cheaper without the hand-off. `load` returns None
    where those symbols cannot be reached."""

    def __init__(self, lib: Any):
        self.compress = lib.ZSTD_compressCCtx  # (cctx, dst, dstCapacity, src, srcSize, level) -> size or error
        self.compress.restype = ctypes.c_size_t
        self.compress.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                  ctypes.c_size_t, ctypes.c_int)
        self._create, self._free = lib.ZSTD_createCCtx, lib.ZSTD_freeCCtx
        self._create.restype, self._create.argtypes = ctypes.c_void_p, ()
        self._free.restype, self._free.argtypes = ctypes.c_size_t, (ctypes.c_void_p,)
        self.max_level = int(lib.ZSTD_maxCLevel())
        self._local = threading.local()

    @classmethod
    def load(cls) -> _KeptZstd | None:
        if _blosc_ctx is None:  # the same switch and the same c-blosc 1 as the batched calls
            return None
        try:
            return cls(ctypes.PyDLL(numcodecs.blosc.__file__))  # PyDLL: the GIL stays held during calls
        except (OSError, AttributeError, TypeError):
            return None

    def context(self) -> int:
        """This thread's compression context (freed when the thread ends)."""
        kept = getattr(self._local, "kept", None)
        if kept is None:
            address = self._create()
            if not address:
                raise MemoryError("ZSTD_createCCtx failed")
            kept = self._local.kept = _Freed(address, self._free)
        return kept.address


class _Freed:
    def __init__(self, address: int, free: Any):
        self.address, self._free = address, free

    def __del__(self) -> None:
        self._free(self.address)


_kept_zstd = _KeptZstd.load()


class _DirectBlosc:
    """Blosc compression of a run of inner chunks into one output buffer, by numcodecs' own c-blosc with
    the arguments `numcodecs.blosc.compress` passes it off the main thread (its own context, 1 internal
    thread). That wrapper holds the GIL per chunk for its argument handling and for copying the output
    into a fresh bytes object, and the threads compressing other chunks wait for the GIL meanwhile.
    `for_config` returns None unless probes compress to the same bytes both ways."""

    def __init__(self, cname: bytes, clevel: int, shuffle: int, blocksize: int, typesize: int):
        self.args = (cname, clevel, shuffle, blocksize, typesize)

    @classmethod
    @functools.lru_cache(maxsize=64)
    def for_config(cls, cname: bytes, clevel: int, shuffle: int, blocksize: int, typesize: int,
                   numcodecs_args: tuple) -> _DirectBlosc | None:
        if _blosc_ctx is None:
            return None
        direct = cls(cname, clevel, shuffle, blocksize, typesize)
        rng = np.random.default_rng(0)  # rows that compress, and rows that blosc stores as they are
        rows = np.concatenate([np.repeat(rng.integers(0, 256, 2048, dtype=np.uint8), 8).reshape(2, -1),
                               rng.integers(0, 256, (2, 8192), dtype=np.uint8)])
        try:
            got, lengths = direct.encode_rows(rows)
            expected = [_blosc_compress(row, *numcodecs_args) for row in rows]
        except Exception:  # whatever refuses these arguments: numcodecs' compress stays
            return None
        same = b"".join(got) == b"".join(expected) and lengths == [len(b) for b in expected]
        return direct if same else None

    def encode_rows(self, rows: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
        """Each row of the C-contiguous uint8 matrix `rows` compressed, one after another in pieces (byte
        arrays, to be stored in order: never joined, the store copies them once), and their lengths."""
        if rows.dtype != np.uint8 or rows.ndim != 2 or not rows.flags.c_contiguous:
            raise ValueError("encode_rows takes a C-contiguous uint8 matrix")  # its memory is read by address
        header = self._kept_context_header(rows.shape[1])
        if header is not None:
            out, lengths = self._encode_with_kept_context(rows, header)
        elif len(rows) > 1 and self._one_block(rows.shape[1]):
            return self._encode_together(rows)
        else:
            out, lengths = self._encode_each(rows)
        return [out], lengths

    @functools.lru_cache(maxsize=64)
    def _kept_context_header(self, nbytes: int) -> np.ndarray | None:
        """The first 4 header bytes (format versions, flags, type size) of rows of `nbytes` if they go to
        zstd directly (`_encode_with_kept_context`), else None: small rows of this zstd configuration that
        blosc leaves unshuffled and compresses as one block of one stream, where probes (rows that
        compress, and rows blosc stores as they are) come out the same both ways."""
        cname, clevel, shuffle, _, typesize = self.args
        if (_kept_zstd is None or cname != b"zstd" or nbytes > _KEPT_CONTEXT_MAX_BYTES or clevel > _KEPT_CONTEXT_MAX_CLEVEL
                or (shuffle and typesize > 1)):
            return None
        alone, _ = self._encode_each(np.zeros((1, nbytes), np.uint8))
        if alone[2] & _MEMCPYED or len(alone) <= _HEADER + 8:
            return None
        fields = alone[4:24].view("<i4").tolist()  # row length, block size, chunk length, block offset, stream length
        if fields != [nbytes, nbytes, len(alone), _HEADER + 4, len(alone) - _HEADER - 8]:
            return None
        header = alone[:4].copy()
        rng = np.random.default_rng(nbytes)
        probes = np.concatenate([np.zeros((1, nbytes), np.uint8), rng.random((2, nbytes)) < 0.05,
                                 rng.integers(0, 256, (2, nbytes), dtype=np.uint8)]).view(np.uint8)
        got, lengths = self._encode_with_kept_context(probes, header)
        expected, expected_lengths = self._encode_each(probes)
        return header if lengths == expected_lengths and np.array_equal(got, expected) else None

    def _encode_with_kept_context(self, rows: np.ndarray, header: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Each row as c-blosc compresses it alone, its one zstd stream compressed with this thread's kept
        context into the room c-blosc gives it (the rest of numcodecs' output size after the header, block
        offset and stream length), and the blosc header written around it. A row that does not fit there
        is compressed by c-blosc itself, which then stores it as it is."""
        clevel = self.args[1]
        n_rows, nbytes = rows.shape
        level = clevel * 2 - 1 if clevel < 9 else _kept_zstd.max_level  # c-blosc's zstd levels
        room = nbytes + numcodecs.blosc.MAX_OVERHEAD - _HEADER - 8
        capacity = nbytes + numcodecs.blosc.MAX_OVERHEAD
        out = np.empty(n_rows * capacity, np.uint8)
        src, dest = rows.__array_interface__["data"][0], out.__array_interface__["data"][0]
        compress, context = _kept_zstd.compress, _kept_zstd.context()
        streams = []
        pos = 0
        for i in range(n_rows):
            n = compress(context, dest + pos + _HEADER + 8, room, src + i * nbytes, nbytes, level)
            if n > room:  # an error code (a huge size_t): it did not fit, and blosc stores it as it is
                own, _ = self._encode_each(rows[i:i + 1])
                out[pos:pos + len(own)] = own
                streams.append(-len(own))
                pos += len(own)
            else:
                streams.append(n)
                pos += n + _HEADER + 8
        streams = np.array(streams, np.int64)
        compressed = streams >= 0
        lengths = np.where(compressed, streams + _HEADER + 8, -streams)
        starts = (np.cumsum(lengths) - lengths)[compressed]
        headers = _one_block_headers(header, nbytes, lengths[compressed], streams[compressed])
        out[starts[:, None] + np.arange(_HEADER + 8)] = headers
        out.resize(pos, refcheck=False)  # shrinks in place: nothing else refers to `out` yet
        return out, lengths.tolist()

    def _encode_each(self, rows: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """One blosc call per row, each straight into the output buffer."""
        cname, clevel, shuffle, blocksize, typesize = self.args
        n_rows, nbytes = rows.shape
        capacity = nbytes + numcodecs.blosc.MAX_OVERHEAD  # what blosc may need for one row
        out = np.empty(n_rows * capacity, np.uint8)
        src, dest = rows.__array_interface__["data"][0], out.__array_interface__["data"][0]
        lengths, pos = [], 0
        for i in range(n_rows):
            n = _blosc_ctx(clevel, shuffle, typesize, nbytes, src + i * nbytes, dest + pos, capacity, cname, blocksize, 1)
            if n <= 0:
                raise RuntimeError(f"error during blosc compression: {n}")
            lengths.append(n)
            pos += n
        out.resize(pos, refcheck=False)  # shrinks in place: nothing else refers to `out` yet
        return out, lengths

    @functools.lru_cache(maxsize=64)
    def _one_block(self, nbytes: int) -> bool:
        """Whether a row of `nbytes` is one blosc block alone (blosc picks the block size from the length
        and the configuration, not from the bytes) and blosc takes that length as the block size of a
        batch (it enlarges the size asked where it splits blocks): then `_encode_together` applies."""
        alone, _ = self._encode_each(np.zeros((1, nbytes), np.uint8))
        if not _blocks_of(alone, nbytes, nbytes):
            return False
        return self._compress_together(np.zeros((2, nbytes), np.uint8)) is not None

    def _compress_together(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
        """All rows in one blosc call with the block size set to a row's length: (its output, where each
        row's block starts in it, the room the call had), or None unless that is one block per row, in
        order. The output is cut to its length: pieces of it are kept until their shard is stored."""
        cname, clevel, shuffle, _, typesize = self.args
        n_rows, nbytes = rows.shape
        capacity = _HEADER + n_rows * (4 + nbytes + 4 * _MAX_STREAMS)  # every block stored as it is
        together = np.empty(capacity, np.uint8)
        n = _blosc_ctx(clevel, shuffle, typesize, rows.nbytes, rows.__array_interface__["data"][0],
                       together.__array_interface__["data"][0], capacity, cname, nbytes, 1)
        if n <= 0 or not _blocks_of(together, rows.nbytes, nbytes):
            return None
        starts = together[_HEADER:_HEADER + 4 * n_rows].view("<i4").astype(np.int64)
        if starts[0] != _HEADER + 4 * n_rows or (np.diff(np.append(starts, n)) <= 4).any():
            return None
        together.resize(n, refcheck=False)  # in place: nothing refers to `together` yet
        return together, starts, capacity

    def _encode_together(self, rows: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
        """All rows in one blosc call (one GIL hand-off instead of one per row), then cut into each row's
        own blosc chunk: blosc compresses every block on its own, so a row's block is the block its own
        call writes, given the same room; each row gets the header and block offset that call writes
        (`_HEADER` + 4 bytes). A row whose block either call may have had to squeeze is compressed on its
        own: its own call leaves a codec at most `nbytes` + MAX_OVERHEAD minus what precedes it, and
        codecs fail a few bytes short of their limit (zstd, blosclz); that call then stores the row as
        it is."""
        got = self._compress_together(rows)
        if got is None:
            out, lengths = self._encode_each(rows)
            return [out], lengths
        together, starts, capacity = got
        n_rows, nbytes = rows.shape
        ends = np.append(starts[1:], len(together))
        lengths = _HEADER + 4 + ends - starts
        # The room each block had in the batch (newer c-blosc lets a call write at most its input and
        # header): enough for the block stored as it is, or the row goes alone.
        room = min(capacity, rows.nbytes + _HEADER) - starts
        alone = (lengths > nbytes + numcodecs.blosc.MAX_OVERHEAD - _END_SLACK) | (room < nbytes + 4 * _MAX_STREAMS)
        headers = _one_block_headers(together[:4], nbytes, lengths)
        pieces = []
        for k in range(n_rows):
            if alone[k]:
                own, (lengths[k],) = self._encode_each(rows[k:k + 1])
                pieces.append(own)
            else:
                pieces += (headers[k], together[starts[k]:ends[k]])
        return pieces, lengths.tolist()


def _one_block_headers(first: np.ndarray, nbytes: int, chunk_lengths: np.ndarray,
                       stream_lengths: np.ndarray | None = None) -> np.ndarray:
    """One row each: the blosc header of a chunk of `nbytes` compressed as one block (its first 4 bytes,
    format versions, flags and type size, as `first`; then int32 length, block size, chunk length) and the
    block's offset, followed by its one stream's length where `stream_lengths` are given."""
    fields = np.empty((len(chunk_lengths), 4 if stream_lengths is None else 5), "<i4")
    fields[:] = (nbytes, nbytes, 0, _HEADER + 4, 0)[:fields.shape[1]]
    fields[:, 2] = chunk_lengths
    if stream_lengths is not None:
        fields[:, 4] = stream_lengths
    headers = np.empty((len(fields), 4 + fields.itemsize * fields.shape[1]), np.uint8)
    headers[:, :4] = first
    headers[:, 4:] = fields.view(np.uint8)
    return headers


def _blocks_of(chunk: np.ndarray, nbytes: int, blocksize: int) -> bool:
    """Whether the blosc chunk `chunk` is compressed (not stored as it is) from `nbytes` in blocks of `blocksize`."""
    return not chunk[2] & _MEMCPYED and chunk[4:12].view("<i4").tolist() == [nbytes, blocksize]


def enabled() -> bool:
    """False when MJARCHIVE_ZARR_WRITES=1: every write goes through zarr-python (for comparison)."""
    return os.environ.get("MJARCHIVE_ZARR_WRITES", "") not in ("1", "true", "yes")


def _forget_pool_in_child() -> None:
    # A forked child inherits the pool objects (and maybe a held lock) but none of their threads.
    global _pool, _io_pool, _pool_lock
    _pool, _io_pool, _pool_lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def _io_executor() -> ThreadPoolExecutor:
    global _io_pool
    with _pool_lock:
        if _io_pool is None:
            # Threads that only wait for store writes (zarr's event loop does the I/O).
            _io_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mjarchive-store")
        return _io_pool


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # One pool per process, shared by all writers: they compete for the same cores anyway.
            _pool = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="mjarchive-shard")
        return _pool


def _pcodec(config: dict) -> Any:
    """numcodecs' PCodec for an opt-in `numcodecs.pcodec` serializer, None if pcodec is missing."""
    try:
        from numcodecs.pcodec import PCodec
        return PCodec.from_config(dict(config))
    except (ImportError, TypeError, ValueError):
        return None


def _endian(codec: dict) -> str | None:
    return (codec.get("configuration") or {}).get("endian")


def stored_dtype(dtype: np.dtype, bytes_codec: dict) -> np.dtype | None:
    """`dtype` in the byte order the `bytes` codec writes, None unless that is little-endian (or moot)."""
    if dtype.itemsize == 1:
        return dtype
    return dtype.newbyteorder("<") if _endian(bytes_codec) == "little" else None


def store_object(path: Any, data: bytes | list) -> None:
    """One store write of `data` (bytes, or a list of bytes-like pieces, one after another) at `path`."""
    write_now = getattr(path.store, "write_now", None)
    if write_now is not None:  # mjarchive's CheckedStore writes a local file in this thread, no hops
        write_now(path.path, data)  # (a list: written as is, without joining, where the store can)
    else:
        joined = b"".join(data) if isinstance(data, list) else data
        sync(path.set(default_buffer_prototype().buffer.from_bytes(joined)))


def _regular_chunk_shape(meta: Any) -> tuple[int, ...] | None:
    """The shard shape of a regular chunk grid, None for any other grid. Read from the metadata's
    JSON form, which is the same in every zarr version (zarr 3.4 renamed the grid classes)."""
    grid = meta.chunk_grid.to_dict()
    if grid.get("name") != "regular":
        return None
    return tuple(int(n) for n in grid["configuration"]["chunk_shape"])


class ShardWriter:
    """Encodes and stores whole shards of one sharded array; `for_array` returns None if unsupported."""

    def __init__(self, array: zarr.Array, split_axis: int, compressor: Any, dtype: np.dtype,
                 order: tuple[int, ...] | None = None, serializer: bool = False, encode_row: Any = None,
                 direct: _DirectBlosc | None = None):
        self.array = array
        meta = array.metadata
        self.shard_shape: tuple[int, ...] = _regular_chunk_shape(meta)
        self.chunk_shape: tuple[int, ...] = tuple(int(n) for n in meta.codecs[0].to_dict()["configuration"]["chunk_shape"])
        self.chunks_per_shard = tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape))
        self.split_axis = split_axis
        self.compressor = compressor
        self.dtype = dtype  # with the byte order the bytes codec writes
        self.fill_value = np.asarray(array.fill_value, dtype=array.dtype)
        self.order = order  # the transpose codec's, applied before serializing
        self.serializer = serializer  # the compressor is the array-to-bytes codec (pcodec), fed arrays
        self._started: tuple | None = None  # ((start, data's address and shape), its encode jobs): see `encode_async`
        # One inner chunk's C-order bytes (a uint8 row) -> its encoded bytes.
        self._encode_row = encode_row or ((lambda row: row.tobytes()) if compressor is None else compressor.encode)
        self._direct = direct  # or, where it gives the same bytes: rows of inner chunks -> one buffer, lengths

    @classmethod
    def for_array(cls, array: zarr.Array) -> ShardWriter | None:
        """A writer for `array` if its layout is one this module reproduces exactly, else None.

        The layout is judged from the metadata's JSON form (`to_dict()`), which is the format itself
        and so the same in every zarr version; zarr's codec classes and enums change between them."""
        meta = array.metadata
        if getattr(meta, "zarr_format", None) != 3 or _regular_chunk_shape(meta) is None:
            return None
        codecs = [c.to_dict() for c in meta.codecs]
        if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed" or not array.config.write_empty_chunks:
            return None
        sharding = codecs[0].get("configuration", {})
        if sharding.get("index_location", "end") != "end":
            return None
        index_codecs = sharding.get("index_codecs", [])
        if ([c.get("name") for c in index_codecs] != ["bytes", "crc32c"]
                or _endian(index_codecs[0]) != "little"):
            return None
        dtype = np.dtype(array.dtype)
        if dtype.kind not in "biuf" or not dtype.isnative:
            return None
        inner = list(sharding.get("codecs", []))
        order = None
        if inner and inner[0].get("name") == "transpose":
            order = tuple(int(i) for i in inner.pop(0).get("configuration", {}).get("order", ()))
            if sorted(order) != list(range(len(meta.shape))):
                return None
        if inner and inner[0].get("name") == PCODEC and len(inner) == 1:
            # zarr-python 3.1 hands a transposed chunk to numcodecs serializers as an F-order view,
            # which they flatten in memory order: those objects would not be C order (and do not
            # read back), so a transpose before pcodec is declined.
            codec = _pcodec(inner[0].get("configuration") or {})
            if codec is None or order is not None or dtype.kind not in "iuf" or dtype.itemsize < 2:
                return None
            return cls._checked(array, meta, sharding, codec, dtype, order, serializer=True)
        if not inner or inner[0].get("name") != "bytes" or len(inner) > 2:
            return None
        dtype = stored_dtype(dtype, inner[0])
        if dtype is None:
            return None
        compressor = None
        if len(inner) == 2:
            if inner[1].get("name") != "blosc":
                return None
            blosc = inner[1].get("configuration", {})
            if blosc.get("shuffle") not in _SHUFFLE:
                return None
            config = {"cname": blosc["cname"], "clevel": blosc["clevel"], "shuffle": _SHUFFLE[blosc["shuffle"]],
                      "blocksize": blosc.get("blocksize", 0)}
            # As zarr-python builds it: numcodecs < 0.16 takes no typesize (then the byte view's 1 is used).
            if _NUMCODECS_TYPESIZE:
                config["typesize"] = blosc.get("typesize", dtype.itemsize)
            compressor = numcodecs.Blosc.from_config(config)
            # What Blosc.encode calls after its (Python) argument checks: half the interpreter time per
            # inner chunk, which the threads compressing the others wait for (they share the GIL).
            args = (compressor.cname.encode("ascii"), compressor.clevel, compressor.shuffle, compressor.blocksize,
                    *([config["typesize"]] if "typesize" in config else []))
            direct = _DirectBlosc.for_config(*args[:4], config.get("typesize", 1), args)
            return cls._checked(array, meta, sharding, compressor, dtype, order,
                                encode_row=lambda row: _blosc_compress(row, *args), direct=direct)
        return cls._checked(array, meta, sharding, compressor, dtype, order)

    @classmethod
    def _checked(cls, array: zarr.Array, meta: Any, sharding: dict, compressor: Any, dtype: np.dtype,
                 order: tuple[int, ...] | None, serializer: bool = False, encode_row: Any = None,
                 direct: _DirectBlosc | None = None) -> ShardWriter | None:
        shard_shape, chunk_shape = _regular_chunk_shape(meta), tuple(int(n) for n in sharding["chunk_shape"])
        if len(shard_shape) != len(chunk_shape) or any(s % c for s, c in zip(shard_shape, chunk_shape)):
            return None
        per_shard = [s // c for s, c in zip(shard_shape, chunk_shape)]
        split = [i for i, n in enumerate(per_shard) if n > 1]
        # zarr orders the chunks of a shard along a Morton curve; with at most one axis of more than
        # one chunk that is C order, the only order this module writes.
        if len(split) > 1:
            return None
        return cls(array, split[0] if split else 0, compressor, dtype, order, serializer, encode_row, direct)

    def write(self, start: int, data: np.ndarray) -> bool:
        """Store `data` at `array[start:start + len(data)]` if that region is whole shards along axis 0
        and covers the other axes completely; returns False (nothing written) otherwise."""
        puts = self.write_async(start, data)
        for put in puts or ():
            put.result()
        return puts is not None

    def encode_async(self, start: int, data: np.ndarray) -> None:
        """Start compressing the shards of a later `write_async(start, data)` (same region, same
        memory, unchanged until then) now: they compress while earlier writes are still being stored.
        Nothing is stored; a `write_async` with other arguments drops them."""
        shape = tuple(self.array.shape)
        S = self.shard_shape
        self._started = None
        if data.shape[1:] == shape[1:] and not start % S[0] and not len(data) % S[0]:
            self._started = (self._key(start, data), self._encode_all(start, data))

    def write_async(self, start: int, data: np.ndarray) -> list[Future] | None:
        """`write` without waiting: the futures of the shards' store writes, or None (nothing written).
        `data` must stay unchanged until they are all done."""
        shape = tuple(self.array.shape)
        S = self.shard_shape
        started, self._started = self._started, None
        if data.shape[1:] != shape[1:] or start % S[0] or len(data) % S[0] or start + len(data) > shape[0]:
            return None
        jobs = started[1] if started is not None and started[0] == self._key(start, data) else None
        if jobs is None:
            jobs = self._encode_all(start, data)
        # Each shard is stored as soon as it is encoded, while later shards are still compressing.
        store_path, meta = self.array.store_path, self.array.metadata
        return [_io_executor().submit(self._store, store_path / meta.encode_chunk_key(coords), *parts)
                for coords, parts in jobs]

    @staticmethod
    def _key(start: int, data: np.ndarray) -> tuple:
        return start, data.__array_interface__["data"][0], data.shape, data.strides

    def _encode_all(self, start: int, data: np.ndarray) -> list[tuple]:
        """(shard coordinates, what _encode_async returned) for each shard of `data` at `start`."""
        shape = tuple(self.array.shape)
        S = self.shard_shape
        grid = [math.ceil(n / s) for n, s in zip(shape, S)]
        jobs = []
        pool = _executor()
        for t in range(len(data) // S[0]):
            for rest in np.ndindex(*grid[1:]):
                coords = (start // S[0] + t, *rest)
                lo = [c * s for c, s in zip(coords, S)]
                region = data[(slice(t * S[0], (t + 1) * S[0]),
                               *(slice(l, min(l + s, n)) for l, s, n in zip(lo[1:], S[1:], shape[1:])))]
                jobs.append((coords, self._encode_async(region, pool)))
        return jobs

    def _store(self, path: Any, n_present: int, parts: list) -> None:
        store_object(path, self._assemble(n_present, parts))

    def _encode_async(self, region: np.ndarray, pool: ThreadPoolExecutor) -> tuple[int, list]:
        """Start compressing the inner chunks of one shard whose in-bounds part is `region`."""
        a = self.split_axis
        c = self.chunk_shape[a]
        n_present = math.ceil(region.shape[a] / c)  # inner chunks at least partly inside the array
        if region.shape != self.shard_shape:
            full = np.empty(self.shard_shape, self.dtype)
            full[...] = self.fill_value
            full[tuple(slice(0, n) for n in region.shape)] = region
            region = full
        # split[(:,) * a + (i,)] is inner chunk i (a view); chunks from n_present on lie outside the array.
        split = region.reshape(region.shape[:a] + (self.chunks_per_shard[a], c) + region.shape[a + 1:])
        # Rows of chunks (chunk axis a) -> chunks first, then the transpose codec's order within a chunk.
        to_chunks = (a, *(i for i in range(split.ndim) if i != a))
        if self.order is not None:
            to_chunks = (to_chunks[0], *(to_chunks[1 + i] for i in self.order))
        chunk_shape = tuple(split.shape[i] for i in to_chunks[1:])  # as its codecs take an inner chunk
        dtype, encode_row, direct, lead = self.dtype, self._encode_row, self._direct, (slice(None),) * a

        def encode(lo: int, hi: int) -> tuple[list, list[int]]:
            """(the encoded chunks lo..hi-1 in pieces, one after another, and each chunk's length)"""
            # The copy to the chunks' contiguous C-order (transposed) layout runs in the pool too, in two
            # steps per 8 chunks: their rows, in region order (long runs), then the transpose, in cache:
            # 3x cheaper than one strided copy of a batch.
            if direct is not None:  # all of them side by side, for one blosc call
                together = np.empty((hi - lo, *chunk_shape), dtype)
                for k in range(lo, hi, 8):
                    j = min(k + 8, hi)
                    rows = np.ascontiguousarray(split[(*lead, slice(k, j))], dtype=dtype)
                    together[k - lo:j - lo] = rows.transpose(to_chunks)
                return direct.encode_rows(together.reshape(hi - lo, -1).view(np.uint8))
            encoded = []
            for k in range(lo, hi, 8):
                j = min(k + 8, hi)
                rows = np.ascontiguousarray(split[(*lead, slice(k, j))], dtype=dtype)
                block = np.ascontiguousarray(rows.transpose(to_chunks))
                if self.serializer:
                    encoded += [self.compressor.encode(chunk) for chunk in block]
                else:
                    encoded += map(encode_row, block.reshape(j - k, -1).view(np.uint8))
            return encoded, [len(b) for b in encoded]

        if self.compressor is None:
            return n_present, [encode(0, n_present)]
        # Two tasks per compressing thread and shard: each task is a wake-up, a future and (direct) a blosc
        # call, whose GIL hand-offs cost more than the load is evened out by smaller tasks.
        batch = max(1, math.ceil(n_present / (2 * _WORKERS)))
        return n_present, [pool.submit(encode, lo, min(lo + batch, n_present)) for lo in range(0, n_present, batch)]

    def _assemble(self, n_present: int, parts: list) -> list:
        """The shard object's bytes, in pieces: the inner chunks, the index, its crc32c."""
        pieces: list = []
        chunk_lengths: list[int] = []
        for p in parts:
            got, got_lengths = p.result() if isinstance(p, Future) else p
            pieces += got
            chunk_lengths += got_lengths
        n_total = self.chunks_per_shard[self.split_axis]
        index = np.full((n_total, 2), _EMPTY, dtype="<u8")
        lengths = np.array(chunk_lengths, dtype=np.uint64)
        index[:n_present, 1] = lengths
        index[:n_present, 0] = np.cumsum(lengths) - lengths
        index_bytes = index.tobytes()
        crc = np.uint32(google_crc32c.value(index_bytes)).astype("<u4").tobytes()
        return [*pieces, index_bytes, crc]
