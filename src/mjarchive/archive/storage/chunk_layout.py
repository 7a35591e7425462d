"""What an array's metadata allows each stored chunk (or shard) of it to be, derived once from the
document, and the check of one stored chunk against it before any decompressor sees it: the
compressor must declare the decoded size, and that size must be the chunk's."""

from __future__ import annotations

import ctypes
import struct
import threading
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numcodecs
import numpy as np

from ..._errors import FormatError
from ..format import (ALLOWED_CODECS, BLOSC_COMPRESSOR_CODES, MAX_CHUNK_BYTES, MAX_DECODED_CHUNK_BYTES,
                      check_codec_settings)

__all__ = ["ArrayInfo", "ZARR_V2_METADATA", "cached_array_info", "check_chunk"]

_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
             "uint64": 8, "float16": 2, "float32": 4, "float64": 8}
_COMPRESSORS = ("blosc", "zstd", "gzip")
_ZSTD_MAGIC = 0xFD2FB528
ZARR_V2_METADATA = frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata"})


@dataclass
class _Chain:
    """The bytes-to-bytes codecs of a chunk: which compressor, how many crc32c around it."""

    decoded: int  # bytes the compressor must declare (chunk bytes plus inner checksums)
    compressor: str | None
    outer_crc: int  # checksums applied after compression: stripped before looking at its header
    max_stored: int


@dataclass
class ArrayInfo:
    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]  # the chunk grid (shards, when sharded)
    sep: str
    frame_axis: str | None  # "frames", or "events/<field>": chunks of committed items must exist
    error: str | None = None
    chain: _Chain | None = None
    # sharded arrays
    inner: tuple[int, ...] = ()
    per_shard: tuple[int, ...] = ()
    index_size: int = 0
    index_start: bool = False
    index_crc: bool = False
    edge_masks: dict = field(default_factory=dict)
    # read_chunk_now: (little-endian dtype, chunk shape, decompressor or None, transpose order), when
    # the codecs are exactly [transpose,] bytes [, blosc | zstd], in shards with a crc32c index at the end
    fast: tuple | None = None
    index_cache: dict = field(default_factory=dict)


def _chain(codecs: list, decoded: int) -> _Chain:
    names = []
    for c in codecs:
        name = c if isinstance(c, str) else c.get("name") if isinstance(c, dict) else None
        names.append(name)
    try:
        pos = names.index("bytes")
    except ValueError:
        raise FormatError("no 'bytes' codec") from None
    if any(n != "transpose" for n in names[:pos]):
        raise FormatError(f"codecs {names[:pos]} before 'bytes'")
    b2b = names[pos + 1:]
    bad = [n for n in b2b if n not in _COMPRESSORS and n != "crc32c"]
    if bad:
        raise FormatError(f"bytes codecs {bad} are not allowed here")
    comps = [i for i, n in enumerate(b2b) if n in _COMPRESSORS]
    if len(comps) > 1:
        raise FormatError(f"{len(comps)} compressors in one chain; the archive reader accepts at most one")
    if not comps:
        return _Chain(decoded, None, len(b2b), decoded + 4 * len(b2b))
    i = comps[0]
    inner_crc = i
    outer_crc = len(b2b) - i - 1
    n = decoded + 4 * inner_crc
    return _Chain(n, b2b[i], outer_crc, n + n // 16 + 4096 + 4 * outer_crc)


_INFO_CACHE: dict[tuple[str, bytes], ArrayInfo] = {}
_INFO_CACHE_ENTRIES, _INFO_CACHE_DOC_BYTES = 64, 1 << 16
_INFO_CACHE_LOCK = threading.Lock()


def cached_array_info(path: str, data: bytes, meta: dict) -> ArrayInfo:
    """`_array_info`, remembered by the document's exact bytes: reopening an archive then costs a
    read per document, not a re-derivation. Each store gets its own copy (its shard index cache
    belongs to one archive)."""
    if len(data) > _INFO_CACHE_DOC_BYTES:
        return _array_info(path, meta)
    with _INFO_CACHE_LOCK:
        info = _INFO_CACHE.get((path, data))
    if info is None:
        info = _array_info(path, meta)
        with _INFO_CACHE_LOCK:
            while len(_INFO_CACHE) >= _INFO_CACHE_ENTRIES:
                _INFO_CACHE.pop(next(iter(_INFO_CACHE)))
            _INFO_CACHE[(path, data)] = info
    return replace(info, index_cache={})


def _array_info(path: str, meta: dict) -> ArrayInfo:
    shape = tuple(int(s) for s in meta["shape"])
    grid = meta["chunk_grid"]
    chunks = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
    info = ArrayInfo(path, shape, chunks, "/", _committed_axis(path, shape))
    try:
        check_codec_settings(meta, path)  # also for arrays zarr opens itself (the bundle's members)
        if grid.get("name") != "regular" or len(chunks) != len(shape) or min(chunks, default=1) < 1:
            raise FormatError("the chunk grid is not a regular grid of the array's rank")
        enc = meta.get("chunk_key_encoding") or {}
        if enc.get("name") != "default":
            raise FormatError(f"chunk_key_encoding {enc.get('name')!r} is not 'default'")
        info.sep = (enc.get("configuration") or {}).get("separator", "/")
        if info.sep not in ("/", "."):
            raise FormatError(f"chunk key separator {info.sep!r}")
        itemsize = _ITEMSIZE.get(meta.get("data_type")) if isinstance(meta.get("data_type"), str) else None
        if itemsize is None:
            raise FormatError(f"data type {meta.get('data_type')!r} is not one mjarchive stores")
        codecs = meta.get("codecs") or []
        names = [c if isinstance(c, str) else c.get("name") for c in codecs]
        bad = [n for n in names if n not in ALLOWED_CODECS]
        if bad:
            raise FormatError(f"codec(s) {bad} are not allowed by the mjarchive spec")
        if "sharding_indexed" in names:
            if names != ["sharding_indexed"]:
                raise FormatError("the sharding codec must be the array's only codec")
            conf = codecs[0]["configuration"]
            info.inner = tuple(int(c) for c in conf["chunk_shape"])
            if len(info.inner) != len(chunks) or any(c < 1 or s % c for s, c in zip(chunks, info.inner)):
                raise FormatError("the shard shape is not a multiple of the inner chunk shape")
            info.per_shard = tuple(s // c for s, c in zip(chunks, info.inner))
            inner_names = [c if isinstance(c, str) else c.get("name") for c in conf.get("codecs") or []]
            if "sharding_indexed" in inner_names:
                raise FormatError("nested sharding is not allowed")
            inner_bytes = int(np.prod(info.inner, dtype=object)) * itemsize
            if inner_bytes > MAX_DECODED_CHUNK_BYTES:
                raise FormatError(f"inner chunks of {inner_bytes} bytes exceed {MAX_DECODED_CHUNK_BYTES}")
            info.chain = _chain(conf.get("codecs") or [], inner_bytes)
            index_names = [c if isinstance(c, str) else c.get("name") for c in conf.get("index_codecs") or []]
            if index_names not in (["bytes"], ["bytes", "crc32c"]):
                raise FormatError(f"shard index codecs {index_names} (expected bytes, crc32c)")
            idx_conf = conf["index_codecs"][0]
            if isinstance(idx_conf, dict) and (idx_conf.get("configuration") or {}).get("endian", "little") != "little":
                raise FormatError("a big-endian shard index")
            n_inner = int(np.prod(info.per_shard, dtype=object))
            if n_inner > MAX_CHUNK_BYTES // 16:
                raise FormatError(f"{n_inner} inner chunks per shard")
            info.index_crc = len(index_names) == 2
            info.index_size = 16 * n_inner + 4 * info.index_crc
            info.index_start = conf.get("index_location", "end") == "start"
        else:
            chunk_bytes = int(np.prod(chunks, dtype=object)) * itemsize
            if chunk_bytes > MAX_DECODED_CHUNK_BYTES:
                raise FormatError(f"chunks of {chunk_bytes} bytes exceed {MAX_DECODED_CHUNK_BYTES}")
            info.chain = _chain(codecs, chunk_bytes)
        info.fast = _fast_layout(meta, info)
    except FormatError as exc:
        info.error = str(exc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        info.error = f"malformed codec metadata ({exc!r})"
    return info


_NUMPY_DTYPES = {"bool": "|b1", "int8": "|i1", "uint8": "|u1", "int16": "<i2", "uint16": "<u2", "int32": "<i4",
                 "uint32": "<u4", "int64": "<i8", "uint64": "<u8", "float32": "<f4", "float64": "<f8"}


def _fast_layout(meta: dict, info: ArrayInfo) -> tuple | None:
    """What read_chunk_now needs for this array, or None if its codecs are any others."""
    codecs = meta["codecs"]
    if info.per_shard:
        conf = codecs[0]["configuration"]
        if info.index_start or not info.index_crc:
            return None
        codecs, shape = conf.get("codecs") or [], info.inner
    else:
        shape = info.chunks
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs]
    order = tuple(range(len(shape)))
    if names[:1] == ["transpose"]:
        order = tuple((codecs[0].get("configuration") or {}).get("order") or ())
        if sorted(order) != list(range(len(shape))) or not all(type(i) is int for i in order):
            return None
        codecs, names = codecs[1:], names[1:]
    if names not in (["bytes"], ["bytes", "blosc"], ["bytes", "zstd"]):
        return None
    dtype = _NUMPY_DTYPES.get(meta["data_type"])
    endian = (codecs[0].get("configuration") or {}).get("endian", "little") if isinstance(codecs[0], dict) else "little"
    if dtype is None or endian != "little":
        return None
    decoder = None if len(names) == 1 else numcodecs.Blosc() if names[1] == "blosc" else numcodecs.Zstd()
    return np.dtype(dtype), shape, decoder, order


def check_chunk(info: ArrayInfo, key: str, data: Any, chain: _Chain) -> None:
    """Refuse stored chunk bytes whose declared decoded size is not the chunk's (before decoding)."""
    n = len(data)
    if n > chain.max_stored:
        raise FormatError(f"{chain.compressor or 'uncompressed'} chunk {key!r} is {n} bytes, more than a chunk of "
                          f"{chain.decoded} bytes can take; refusing to decode it")
    end = n - 4 * chain.outer_crc
    if end < 0:
        raise FormatError(f"chunk {key!r} is truncated ({n} bytes)")
    comp = chain.compressor
    if comp is None:
        if end != chain.decoded:
            raise FormatError(f"chunk {key!r} holds {end} bytes, expected {chain.decoded}; it is truncated or corrupt")
    elif comp == "blosc":
        if end < 16:
            raise FormatError(f"blosc chunk {key!r} is truncated ({end} bytes)")
        _version, _lz, flags, _typesize, nbytes, blocksize, cbytes = struct.unpack_from("<BBBBIII", data, 0)
        if flags >> 5 not in BLOSC_COMPRESSOR_CODES:  # set even when the block is stored uncompressed
            raise FormatError(f"blosc chunk {key!r} names compressor code {flags >> 5}; the spec allows blosclz, "
                              "lz4, lz4hc, zlib and zstd (codes 0, 1, 3, 4)")
        if nbytes != chain.decoded or cbytes != end:
            raise FormatError(
                f"blosc chunk {key!r} declares {nbytes} decoded / {cbytes} stored bytes; the chunk holds "
                f"{chain.decoded} / {end}; refusing to decompress it"
            )
        if not flags & 0x02:  # not memcpyed: a table of block starts follows the header
            if not 0 < blocksize <= nbytes or 16 + 4 * (-(-nbytes // blocksize)) > cbytes:
                raise FormatError(f"blosc chunk {key!r} has an inconsistent header (blocksize {blocksize})")
        elif cbytes != nbytes + 16:
            raise FormatError(f"blosc chunk {key!r} has an inconsistent header (uncompressed, {cbytes} bytes)")
    elif comp == "zstd":
        size, length = _zstd_frame(data, end)
        if size != chain.decoded:
            raise FormatError(
                f"zstd chunk {key!r} declares {'no' if size is None else size} decoded bytes; the chunk holds "
                f"{chain.decoded}; refusing to decompress it"
            )
        if length is None:
            raise FormatError(f"zstd chunk {key!r} is truncated or malformed (its frame's blocks do not end within "
                              f"its {end} bytes); refusing to decompress it")
        if length != end:  # more after the frame: a second one could inflate without the first's bound
            raise FormatError(f"zstd chunk {key!r} is {end} bytes, but its zstd frame ends after {length}: a chunk "
                              "is one frame; refusing to decompress it")
    else:  # gzip: inflate here with a bound; numcodecs would inflate without one
        d = zlib.decompressobj(31)
        try:
            out = d.decompress(bytes(memoryview(data)[:end]) if not isinstance(data, bytes) else data[:end],
                               chain.decoded + 1)
        except zlib.error as exc:
            raise FormatError(f"gzip chunk {key!r} is corrupt: {exc}") from None
        if len(out) != chain.decoded or not d.eof or d.unused_data or d.unconsumed_tail:
            raise FormatError(f"gzip chunk {key!r} does not inflate to exactly {chain.decoded} bytes; refusing it")


_ZSTD_CONTENTSIZE_ERROR = 2**64 - 2  # and 2**64 - 1, ZSTD_CONTENTSIZE_UNKNOWN: no declared size


class _ZstdFunctions:
    """zstd's own reading of a frame, by the copy numcodecs' Zstd codec decodes with (through ctypes): the
    content size it declares and where it ends. `load` returns None where those symbols are not exported."""

    def __init__(self, lib: Any):
        self._content, self._length, self._is_error = (lib.ZSTD_getFrameContentSize, lib.ZSTD_findFrameCompressedSize,
                                                       lib.ZSTD_isError)
        for fn, restype in ((self._content, ctypes.c_ulonglong), (self._length, ctypes.c_size_t)):
            fn.restype, fn.argtypes = restype, (ctypes.c_void_p, ctypes.c_size_t)
        self._is_error.restype, self._is_error.argtypes = ctypes.c_uint, (ctypes.c_size_t,)

    @classmethod
    def load(cls) -> _ZstdFunctions | None:
        try:
            import numcodecs.zstd
            return cls(ctypes.PyDLL(numcodecs.zstd.__file__))  # PyDLL: short calls, the GIL stays held
        except (ImportError, OSError, AttributeError, TypeError):
            return None

    def measure(self, data: Any, end: int) -> tuple[int | None, int | None]:
        """(declared content size or None, the first frame's length in bytes or None) of data[:end]."""
        address = np.frombuffer(data, np.uint8, count=end).ctypes.data if end else 0  # `data` outlives the calls
        size, length = self._content(address, end), self._length(address, end)
        return (None if size >= _ZSTD_CONTENTSIZE_ERROR else size), (None if self._is_error(length) else length)


_ZSTD = _ZstdFunctions.load()


def _zstd_frame(data: Any, end: int) -> tuple[int | None, int | None]:
    """(declared content size, length of the first frame) of the zstd chunk data[:end], each None where
    there is none; by zstd's own functions, or where they are not exported by the frame's headers."""
    return _ZSTD.measure(data, end) if _ZSTD is not None else _zstd_headers(data, end)


def _zstd_headers(data: Any, end: int) -> tuple[int | None, int | None]:
    """The same read from the first frame's headers (RFC 8878 3.1.1): the content size its frame header
    declares, and where it ends (its blocks up to the one flagged last, then its checksum). A bounded
    decode cannot stand in for the length: zstd's one-shot decoders also decode skippable and empty
    frames after the first, which change nothing they write."""
    if end < 6 or struct.unpack_from("<I", data, 0)[0] != _ZSTD_MAGIC:
        return None, None
    fhd = data[4]
    fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    size = None
    if width and pos + width <= end:
        size = int.from_bytes(bytes(data[pos:pos + width]), "little") + (256 if width == 2 else 0)
    if fhd & 0x08:  # the reserved bit
        return size, None
    pos += width
    while True:  # at most end / 3 blocks: each has a 3-byte header
        if pos + 3 > end:
            return size, None
        header = int.from_bytes(bytes(data[pos:pos + 3]), "little")
        last, kind, block_size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:  # reserved block type
            return size, None
        pos += 3 + (1 if kind == 1 else block_size)  # an RLE block stores one byte
        if last:
            pos += 4 * checksum
            return size, (pos if pos <= end else None)


def _committed_axis(path: str, shape: tuple[int, ...]) -> str | None:
    """What counts an array's committed extent: the frame count (per-frame arrays, overlays), one
    variant field's event count (its event arrays), or nothing (the whole shape: world_id, bundle)."""
    parts = path.split("/")
    if not shape:
        return None
    if parts[0] == "variants" and len(parts) == 3:
        return f"events/{parts[1]}"
    if (parts[0] == "overlays" and len(parts) == 3) or (len(parts) == 1 and path != "world_id"):
        return "frames"
    return None
