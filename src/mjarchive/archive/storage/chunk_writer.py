"""Writing whole chunks of an unsharded Zarr v3 array without a trip through zarr-python.

The writer stores `time` and the episode index once per chunk of frames. Through zarr-python each of
those writes costs ~4 ms of event-loop hops and codec-pipeline Python on the writer's and zarr's
threads, taken from the cores that compress the frames; encoded here it is ~0.1 ms. `ChunkWriter`
builds the very objects zarr would: each chunk in C order through the array's `bytes` codec and its
`zstd` codec, if any (zarr-python's ZstdCodec is numcodecs' Zstd with the same level and checksum), a
chunk that reaches past the array's edge padded with the fill value, one store write per chunk at
the key the array's chunk key encoding gives. Anything else (other codecs, sharding, a region that
is not whole chunks) is declined, and the caller writes through zarr. `tests/archive/test_shards.py`
checks the objects are byte-identical to zarr-python's.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numcodecs
import numpy as np
import zarr
from .shard_writer import _regular_chunk_shape, stored_dtype, store_object

__all__ = ["ChunkWriter"]


class ChunkWriter:
    """Encodes and stores whole chunks of one unsharded array; `for_array` returns None if unsupported."""

    def __init__(self, array: zarr.Array, chunk_shape: tuple[int, ...], dtype: np.dtype, compressor: Any):
        self.array = array
        self.chunk_shape = chunk_shape
        self.dtype = dtype  # with the byte order the bytes codec writes
        self.compressor = compressor
        self.fill_value = np.asarray(array.fill_value, dtype=array.dtype)

    @classmethod
    def for_array(cls, array: zarr.Array) -> ChunkWriter | None:
        """A writer for `array` if its layout is one this module reproduces exactly, else None (judged
        from the metadata's JSON form, the same in every zarr version)."""
        meta = array.metadata
        chunk_shape = _regular_chunk_shape(meta) if getattr(meta, "zarr_format", None) == 3 else None
        if chunk_shape is None or not array.config.write_empty_chunks:
            return None
        codecs = [c.to_dict() for c in meta.codecs]
        dtype = np.dtype(array.dtype)
        if not codecs or codecs[0].get("name") != "bytes" or len(codecs) > 2 or dtype.kind not in "biuf":
            return None
        dtype = stored_dtype(dtype, codecs[0])
        if dtype is None:
            return None
        compressor = None
        if len(codecs) == 2:
            config = codecs[1].get("configuration") or {}
            level, checksum = config.get("level"), config.get("checksum", False)
            if (codecs[1].get("name") != "zstd" or isinstance(level, bool) or not isinstance(level, int)
                    or not isinstance(checksum, bool)):
                return None
            compressor = numcodecs.Zstd(level=level, checksum=checksum)
        return cls(array, chunk_shape, dtype, compressor)

    def write(self, start: int, data: np.ndarray) -> bool:
        """Store `data` at `array[start:start + len(data)]` if that region is whole chunks along axis 0
        and covers the other axes completely; returns False (nothing written) otherwise."""
        shape, C = tuple(self.array.shape), self.chunk_shape
        if data.shape[1:] != shape[1:] or start % C[0] or len(data) % C[0] or start + len(data) > shape[0]:
            return False
        store_path, meta = self.array.store_path, self.array.metadata
        grid = [range(math.ceil(n / c)) for n, c in zip(shape[1:], C[1:])]
        for t in range(len(data) // C[0]):
            for rest in itertools.product(*grid):
                coords = (start // C[0] + t, *rest)
                region = data[(slice(t * C[0], (t + 1) * C[0]), *(slice(i * c, (i + 1) * c) for i, c in zip(rest, C[1:])))]
                chunk = np.empty(C, self.dtype)
                if region.shape != C:  # an edge chunk: zarr stores the fill value beyond the array
                    chunk[...] = self.fill_value
                chunk[tuple(slice(0, n) for n in region.shape)] = region
                encoded = chunk.tobytes() if self.compressor is None else self.compressor.encode(chunk.tobytes())
                store_object(store_path / meta.encode_chunk_key(coords), encoded)
        return True
