"""The append path's shortcuts: shards written as pieces (no joined copy) and compressed ahead of
their store write; the bytes stay exactly what zarr-python writes."""

from __future__ import annotations

import numpy as np
import zarr

from mjarchive.archive.creation import _create_frame_world_array
from mjarchive.archive.storage.locations import make_store
from mjarchive.archive.storage.shard_writer import ShardWriter


def _pair(path, W: int, tail: tuple[int, ...], cf: int, sw: int, frames: int) -> list[zarr.Array]:
    """Two float32 arrays with the archive's exact metadata, for the fast writer and for zarr."""
    root = zarr.open_group(zarr.storage.LocalStore(path), mode="w", zarr_format=3)
    arrays = []
    for which in ("fast", "zarr"):
        _create_frame_world_array(root, which, W, tail, tuple(f"d{i}" for i in range(len(tail))), "float32", cf, sw)
        arrays.append(root[which].with_config({"write_empty_chunks": True}))
        arrays[-1].resize((frames, W, *tail))
    return arrays


def _objects(root, name: str) -> dict[str, bytes]:
    return {str(p.relative_to(root / name)): p.read_bytes() for p in (root / name / "c").rglob("*") if p.is_file()}


def test_pieces_are_written_as_one_object(tmp_path):
    store = make_store(tmp_path / "s", read_only=False)
    rng = np.random.default_rng(0)
    # More pieces than one writev takes, empty ones and several kinds of bytes-like among them.
    pieces = [rng.bytes(int(n)) for n in rng.integers(0, 300, 2500)]
    pieces[7], pieces[1500] = memoryview(pieces[7]), np.frombuffer(pieces[1500], np.uint8)
    store.write_now("a/c/0", pieces)
    assert (tmp_path / "s" / "a" / "c" / "0").read_bytes() == b"".join(bytes(p) for p in pieces)
    store.write_now("a/c/0", [b"x"])  # replaces the object, like bytes do
    assert (tmp_path / "s" / "a" / "c" / "0").read_bytes() == b"x"
    assert not [p for p in (tmp_path / "s" / "a" / "c").iterdir() if p.name != "0"]  # no temporary file left


def test_shards_compressed_ahead_match_zarr(tmp_path):
    W, tail, cf, sw = 10, (3,), 4, 4  # an edge shard too
    rng = np.random.default_rng(1)
    fast, ref = _pair(tmp_path / "g", W, tail, cf, sw, 3 * cf)
    writer = ShardWriter.for_array(fast)
    data = np.cumsum(rng.normal(0, 0.01, (3 * cf, W, *tail)), axis=0).astype(np.float32)
    other = rng.normal(size=(cf, W, *tail)).astype(np.float32)
    writer.encode_async(0, data[:cf])
    assert writer.write(0, data[:cf])  # the same region and memory: what was compressed ahead is stored
    writer.encode_async(cf, data[cf:2 * cf])
    assert writer.write(cf, other)  # other memory: compressed again, the early work is dropped
    writer.encode_async(2 * cf, data[2 * cf:])
    assert writer.write(2 * cf, data[2 * cf:].copy())
    ref[:cf] = data[:cf]
    ref[cf:2 * cf] = other
    ref[2 * cf:] = data[2 * cf:]
    fast_objects = _objects(tmp_path / "g", "fast")
    assert len(fast_objects) == 9 and fast_objects == _objects(tmp_path / "g", "zarr")
    np.testing.assert_array_equal(fast[:], ref[:])
