"""The fast whole-shard writer: its objects are byte-identical to zarr-python's and decode to the input."""

from __future__ import annotations

import faulthandler
import gc
import os
import threading
from pathlib import Path

import numcodecs.blosc
import numpy as np
import pytest
import zarr
import zarr.codecs
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

import mjarchive
from mjarchive import ModelBundle
from mjarchive.archive.storage.chunk_writer import ChunkWriter
from mjarchive.archive.storage import shard_writer
from mjarchive.archive.storage.shard_writer import ShardWriter, _DirectBlosc
from mjarchive.archive.creation import _frame_world_array
from mjarchive.testing import hinge_chain_xml


def stored_objects(array: zarr.Array) -> dict[str, bytes]:
    """Every chunk object of `array`, keyed relative to the array."""
    store, prefix = array.store_path.store, array.store_path.path + "/c"

    async def collect() -> dict[str, bytes]:
        keys = [k async for k in store.list_prefix(prefix)]
        bufs = [await store.get(k, default_buffer_prototype()) for k in keys]
        return {k[len(array.store_path.path):]: b.to_bytes() for k, b in zip(keys, bufs)}

    return sync(collect())


def sample(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.1
    if np.dtype(dtype).kind == "f":
        # Smooth in time like a trajectory, plus exact zeros so some inner chunks equal the fill value.
        data = np.cumsum(rng.normal(0, 0.01, shape), axis=0).astype(dtype)
        data[:, :1] = 0
        return data
    return rng.integers(-1000, 1000, shape).astype(dtype)


def pair(tmp_path: Path, name: str, W: int, tail: tuple[int, ...], dtype: str, cf: int, sw: int, frames: int):
    """Two arrays with the archive's exact metadata: one written by ShardWriter, one by zarr."""
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / name), mode="w", zarr_format=3)
    dims = tuple(f"d{i}" for i in range(len(tail)))
    arrays = []
    for which in ("fast", "zarr"):
        root.create_array(which, **_frame_world_array(W, tail, dims, dtype, cf, min(sw, W)))
        a = root[which].with_config({"write_empty_chunks": True})
        a.resize((frames, W, *tail))
        arrays.append(a)
    return arrays


CASES = [
    # W, tail, dtype, chunk_frames, shard_worlds
    (8, (5,), "float32", 4, 4),
    (10, (3,), "float32", 3, 4),       # W not a multiple of shard_worlds: an edge shard
    (7, (), "bool", 5, 3),             # reset-like, itemsize 1 (noshuffle)
    (6, (2, 3), "float64", 2, 6),      # two tail dims, one shard
    (5, (4,), "int32", 1, 2),          # chunk_frames 1
    (9, (), "int64", 4, 16),           # shard_worlds > W (clipped like create() does)
    (3, (2,), "float32", 8, 1),        # one world per shard
]


needs_direct_blosc = pytest.mark.skipif(shard_writer._blosc_ctx is None,
                                        reason="numcodecs' c-blosc 1 cannot be reached through ctypes here")
needs_kept_zstd = pytest.mark.skipif(shard_writer._kept_zstd is None,
                                     reason="numcodecs' c-blosc does not export zstd's context functions here")


@pytest.mark.parametrize("direct", [pytest.param(True, marks=needs_direct_blosc), False],
                         ids=["c-blosc-direct", "numcodecs-compress"])
@pytest.mark.parametrize("W,tail,dtype,cf,sw", CASES)
def test_objects_byte_identical_to_zarr(tmp_path, W, tail, dtype, cf, sw, direct):
    rng = np.random.default_rng(W * 100 + cf)
    frames = 3 * cf
    fast, ref = pair(tmp_path, "g", W, tail, dtype, cf, sw, frames)
    writer = ShardWriter.for_array(fast)
    assert writer is not None
    assert writer._direct is not None or not direct  # the archive's blosc chains take the direct path
    if not direct:
        writer._direct = None
    data = sample(rng, (frames, W, *tail), dtype)
    # One time chunk, then two at once.
    assert writer.write(0, data[:cf])
    assert writer.write(cf, data[cf:])
    ref[:] = data
    np.testing.assert_array_equal(fast[:], data)
    ours, theirs = stored_objects(fast), stored_objects(ref)
    assert sorted(ours) == sorted(theirs)
    assert len(ours) == 3 * -(-W // min(sw, W))
    for key in theirs:
        assert ours[key] == theirs[key], key


@needs_direct_blosc
@pytest.mark.parametrize("cname,clevel,shuffle,blocksize,typesize", [
    (b"zstd", 2, 1, 0, 4), (b"zstd", 2, 0, 0, 1), (b"zstd", 3, 2, 0, 8), (b"lz4", 5, 1, 0, 2),
    (b"lz4hc", 9, 2, 0, 4), (b"blosclz", 1, 0, 4096, 4), (b"zlib", 1, 1, 0, 8),
])
def test_direct_blosc_equals_numcodecs_compress(cname, clevel, shuffle, blocksize, typesize):
    """Rows that compress, rows blosc stores as they are, and rows of lengths that are no multiple of
    the type size: the same bytes as numcodecs' compress, one after another, with their lengths."""
    # As the writer calls them: numcodecs < 0.16 takes no typesize and shuffles with the rows' item size, 1.
    args = (cname, clevel, shuffle, blocksize, *([typesize] if shard_writer._NUMCODECS_TYPESIZE else []))
    direct = _DirectBlosc.for_config(cname, clevel, shuffle, blocksize, typesize if len(args) == 5 else 1, args)
    assert direct is not None
    rng = np.random.default_rng(clevel)
    for rows in (np.cumsum(rng.normal(0, 0.01, (7, 512)), axis=1).astype("<f8").view(np.uint8),
                 rng.integers(0, 256, (3, 40000), dtype=np.uint8),
                 np.zeros((5, 37), np.uint8), np.ones((1, 1), np.uint8)):
        rows = np.ascontiguousarray(rows)
        expected = [shard_writer._blosc_compress(row, *args) for row in rows]
        got, lengths = direct.encode_rows(rows)
        assert lengths == [len(e) for e in expected]
        assert b"".join(got) == b"".join(expected)


@needs_direct_blosc
def test_direct_blosc_compresses_rows_of_one_block_in_one_call(monkeypatch):
    """Rows that blosc compresses as one block each (the archive's qpos inner chunks) go to blosc in one
    call, and come out as each row's own call writes it: also a row that does not compress (its own
    call stores it as it is, so it is compressed again on its own) and rows of two blocks (one call each)."""
    typesize = (4,) if shard_writer._NUMCODECS_TYPESIZE else ()
    args = (b"zstd", 2, 1, 0, *typesize)
    direct = _DirectBlosc.for_config(*args[:4], typesize[0] if typesize else 1, args)
    nbytes = 512 * 28 * 4  # a qpos inner chunk of the default layout
    assert direct._one_block(nbytes) and not direct._one_block(2 * nbytes)
    calls = []
    real = shard_writer._blosc_ctx
    monkeypatch.setattr(shard_writer, "_blosc_ctx", lambda *a: calls.append(a[3]) or real(*a))
    rng = np.random.default_rng(3)
    smooth = np.cumsum(rng.normal(0, 0.01, (5, nbytes // 4)), axis=1).astype("<f4").view(np.uint8)
    noise = rng.integers(0, 256, (1, nbytes), dtype=np.uint8)
    for rows, expected_calls in ((np.concatenate([smooth[:2], noise, smooth[2:]]), [6 * nbytes, nbytes]),
                                 (smooth.reshape(-1)[None, :2 * nbytes].repeat(3, axis=0), [2 * nbytes] * 3)):
        calls.clear()
        rows = np.ascontiguousarray(rows)
        got, lengths = direct.encode_rows(rows)
        expected = [shard_writer._blosc_compress(row, *args) for row in rows]
        assert calls == expected_calls
        assert lengths == [len(e) for e in expected]
        assert b"".join(got) == b"".join(expected)


@needs_direct_blosc
@pytest.mark.parametrize("cname,clevel,shuffle,typesize,nbytes", [
    (b"zstd", 2, 0, 1, 512), (b"zstd", 2, 1, 4, 2048), (b"blosclz", 9, 0, 32, 1024),
])
def test_direct_blosc_rows_at_the_edge_of_compressing_alone(cname, clevel, shuffle, typesize, nbytes):
    """Rows that a row's own call only just compresses, or only just stores as they are: codecs fail a few
    bytes short of their output limit, which that call gives them tighter than a batch does, so the
    batch's block is not what that call writes; each such row is compressed alone."""
    if typesize > 1 and not shard_writer._NUMCODECS_TYPESIZE and cname != b"zstd":
        pytest.skip("numcodecs < 0.16 compresses with a type size of 1, where blosclz splits blocks: no batches")
    args = (cname, clevel, shuffle, 0, *([typesize] if shard_writer._NUMCODECS_TYPESIZE else []))
    direct = _DirectBlosc.for_config(cname, clevel, shuffle, 0, typesize if len(args) == 5 else 1, args)
    assert direct is not None and direct._one_block(nbytes)
    noise = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    rows = np.zeros((nbytes // 4, nbytes), np.uint8)
    for i, k in enumerate(range(nbytes - len(rows), nbytes)):  # noise, then zeros: more noise, less gain
        rows[i, :k] = noise[:k]
    expected = [shard_writer._blosc_compress(row, *args) for row in rows]
    assert {e[2] & 0x2 for e in expected} == {0, 0x2}  # the rows span the edge: some stored as they are
    got, lengths = direct.encode_rows(rows)
    assert lengths == [len(e) for e in expected]
    assert b"".join(got) == b"".join(expected)


@needs_kept_zstd
def test_small_zstd_rows_use_a_kept_context_and_give_numcodecs_bytes(monkeypatch):
    """Inner chunks of `reset` (512 bytes, zstd, no shuffle) go to zstd with a context kept per thread,
    not through c-blosc (which makes a context per block), and come out as numcodecs' bytes: sparse masks,
    rows whose zstd frame is exactly the room c-blosc gives it or one byte more (c-blosc stores those as
    they are), noise, zeros. Only the rows stored as they are reach c-blosc, one call each."""
    args = (b"zstd", 2, 0, 0, *((1,) if shard_writer._NUMCODECS_TYPESIZE else ()))
    direct = _DirectBlosc.for_config(b"zstd", 2, 0, 0, 1, args)
    nbytes = 512
    room = nbytes + numcodecs.blosc.MAX_OVERHEAD - 24  # after the header, block offset and stream length
    assert direct._kept_context_header(nbytes) is not None
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, nbytes, dtype=np.uint8)
    edge = np.zeros((2 * 20, nbytes), np.uint8)
    for i, (k, j) in enumerate((k, j) for k in range(458, 478) for j in (10, 11)):
        edge[i, :k], edge[i, k + 8:k + 8 + j] = noise[:k], noise[:j][::-1]  # frames of ~k + j + 24 bytes
    kept = shard_writer._kept_zstd
    scratch = np.empty(2 * nbytes, np.uint8)
    frames = {kept.compress(kept.context(), scratch.ctypes.data, len(scratch), row.ctypes.data, nbytes, 3)
              for row in edge}
    assert {room - 1, room, room + 1} <= frames  # the edge itself, on both sides
    rows = np.concatenate([(rng.random((6, nbytes)) < 0.06).view(np.uint8), edge, noise[None],
                           np.zeros((1, nbytes), np.uint8)])
    expected = [shard_writer._blosc_compress(row, *args) for row in rows]
    stored_as_is = [e[2] & 0x2 != 0 for e in expected]
    blosc_calls = []
    real = shard_writer._blosc_ctx
    monkeypatch.setattr(shard_writer, "_blosc_ctx", lambda *a: blosc_calls.append(a[3]) or real(*a))
    got, lengths = direct.encode_rows(rows)
    assert lengths == [len(e) for e in expected]
    assert b"".join(got) == b"".join(expected)
    assert blosc_calls == [nbytes] * sum(stored_as_is)


@needs_kept_zstd
@pytest.mark.parametrize("clevel,shuffle", [(2, 2), (9, 0)])
def test_kept_zstd_context_declined_where_blosc_does_more(clevel, shuffle):
    """Not for rows c-blosc bitshuffles (type size 1, a length of whole bytes of bits) nor for high levels
    (calls of milliseconds with the GIL held): c-blosc compresses those, and the bytes are numcodecs'."""
    args = (b"zstd", clevel, shuffle, 0, *((1,) if shard_writer._NUMCODECS_TYPESIZE else ()))
    direct = _DirectBlosc.for_config(b"zstd", clevel, shuffle, 0, 1, args)
    assert direct is not None and direct._kept_context_header(512) is None
    rows = (np.random.default_rng(1).random((4, 512)) < 0.06).view(np.uint8)
    got, _ = direct.encode_rows(rows)
    assert b"".join(got) == b"".join(shard_writer._blosc_compress(row, *args) for row in rows)


@needs_direct_blosc
def test_batched_rows_do_not_keep_room_for_raw_rows():
    """The pieces of a batch (kept until their shard is stored) refer to memory of about their own size,
    not to the batch call's output room (every row stored as it is)."""
    typesize = (4,) if shard_writer._NUMCODECS_TYPESIZE else ()
    args = (b"zstd", 2, 1, 0, *typesize)
    direct = _DirectBlosc.for_config(*args[:4], typesize[0] if typesize else 1, args)
    rows = np.zeros((16, 512 * 28 * 4), np.uint8)  # compresses to almost nothing
    got, lengths = direct.encode_rows(rows)
    held = {id(base): base.nbytes for base in (p if p.base is None else p.base for p in got)}
    assert sum(held.values()) < 4 * sum(lengths) < rows.nbytes // 100


@needs_kept_zstd
def test_kept_zstd_context_is_freed_with_its_thread(monkeypatch):
    """Each thread that compresses small zstd rows keeps one context, freed when that thread ends."""
    kept = shard_writer._kept_zstd
    freed, real_free = [], kept._free
    monkeypatch.setattr(kept, "_free", lambda address: freed.append(address) or real_free(address))
    args = (b"zstd", 2, 0, 0, *((1,) if shard_writer._NUMCODECS_TYPESIZE else ()))
    direct = _DirectBlosc.for_config(b"zstd", 2, 0, 0, 1, args)
    used = []

    def compress_twice() -> None:
        for _ in range(2):
            direct.encode_rows(np.zeros((3, 512), np.uint8))
            used.append(kept.context())

    thread = threading.Thread(target=compress_twice)
    thread.start()
    thread.join()
    gc.collect()
    assert len(set(used)) == 1 and freed == used[:1]


@needs_direct_blosc
def test_direct_blosc_one_call_per_row_where_blosc_enlarges_the_block_size(monkeypatch):
    """Where blosc splits blocks (lz4 with a type size of 4) it enlarges the block size a batch asks for,
    so rows are compressed one call each, without a batch first."""
    typesize = (4,) if shard_writer._NUMCODECS_TYPESIZE else ()
    if not typesize:
        pytest.skip("numcodecs < 0.16 shuffles with the byte view's item size, 1: nothing to split")
    args = (b"lz4", 5, 1, 0, 4)
    direct = _DirectBlosc.for_config(*args, args)
    nbytes = 512 * 28 * 4
    assert direct is not None and not direct._one_block(nbytes)
    calls = []
    real = shard_writer._blosc_ctx
    monkeypatch.setattr(shard_writer, "_blosc_ctx", lambda *a: calls.append(a[3]) or real(*a))
    rows = np.cumsum(np.random.default_rng(5).normal(0, 0.01, (3, nbytes // 4)), axis=1).astype("<f4").view(np.uint8)
    got, lengths = direct.encode_rows(np.ascontiguousarray(rows))
    assert calls == [nbytes] * 3
    assert b"".join(got) == b"".join(shard_writer._blosc_compress(row, *args) for row in rows)


@needs_direct_blosc
def test_direct_blosc_declined_where_it_would_write_other_bytes(tmp_path):
    """A configuration whose probe compresses to other bytes than numcodecs' (here: another level or
    shuffle) gets no direct path; the writer then calls numcodecs (the `numcodecs-compress` cases)."""
    typesize = (4,) if shard_writer._NUMCODECS_TYPESIZE else ()
    direct_typesize = typesize[0] if typesize else 1
    assert _DirectBlosc.for_config(b"zstd", 2, 1, 0, direct_typesize, (b"zstd", 2, 1, 0, *typesize)) is not None
    assert _DirectBlosc.for_config(b"zstd", 2, 1, 0, direct_typesize, (b"zstd", 5, 1, 0, *typesize)) is None
    assert _DirectBlosc.for_config(b"zstd", 2, 1, 0, direct_typesize, (b"zstd", 2, 2, 0, *typesize)) is None
    # Arguments numcodecs' compress refuses: declined, not raised.
    assert _DirectBlosc.for_config(b"zstd", 2, 1, 0, direct_typesize, (b"zstd", 2, 1, 0, 4, "extra")) is None
    with pytest.raises(ValueError):  # memory it would read by address must be what it assumes
        _DirectBlosc.for_config(b"zstd", 2, 1, 0, direct_typesize, (b"zstd", 2, 1, 0, *typesize)).encode_rows(
            np.zeros((4, 8), np.uint8)[:, ::2])


def test_edge_shard_leaves_out_chunks_outside_the_array(tmp_path):
    fast, _ = pair(tmp_path, "g", 5, (2,), "float32", 4, 4, 4)
    data = sample(np.random.default_rng(0), (4, 5, 2), "float32")
    assert ShardWriter.for_array(fast).write(0, data)
    obj = stored_objects(fast)["/c/0/1/0"]
    index = np.frombuffer(obj[-4 * 16 - 4:-4], "<u8").reshape(4, 2)
    assert index[0, 0] == 0 and 0 < index[0, 1] < len(obj)
    assert (index[1:] == 2**64 - 1).all()
    np.testing.assert_array_equal(fast[:], data)


def test_rewrite_replaces_the_shard(tmp_path):
    fast, _ = pair(tmp_path, "g", 4, (3,), "float32", 2, 2, 2)
    writer = ShardWriter.for_array(fast)
    first, second = (sample(np.random.default_rng(s), (2, 4, 3), "float32") for s in (1, 2))
    writer.write(0, first)
    writer.write(0, second)
    np.testing.assert_array_equal(fast[:], second)


def test_declines_regions_that_are_not_whole_shards(tmp_path):
    fast, _ = pair(tmp_path, "g", 4, (3,), "float32", 4, 2, 8)
    writer = ShardWriter.for_array(fast)
    data = np.ones((8, 4, 3), np.float32)
    assert not writer.write(0, data[:3])          # part of a time chunk
    assert not writer.write(2, data[:4])          # not aligned
    assert not writer.write(4, data)              # beyond the array
    assert not writer.write(0, data[:4, :3])      # not every world
    assert stored_objects(fast) == {}


def test_declines_layouts_it_does_not_reproduce(tmp_path):
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / "g"), mode="w", zarr_format=3)
    plain = root.create_array("plain", shape=(4, 4), chunks=(2, 1), dtype="float32").with_config(
        {"write_empty_chunks": True})
    start = root.create_array("start", shape=(4, 4), chunks=(2, 1), shards=(2, 4), dtype="float32",
                              serializer=zarr.codecs.ShardingCodec(chunk_shape=(2, 1), index_location="start"))
    two_axes = root.create_array("two", shape=(4, 4), chunks=(1, 1), shards=(2, 2), dtype="float32")
    big_endian = root.create_array("be", shape=(4, 4), chunks=(2, 1), shards=(2, 4), dtype="float32",
                                   serializer=zarr.codecs.BytesCodec(endian="big"))
    assert ShardWriter.for_array(plain) is None
    assert ShardWriter.for_array(start.with_config({"write_empty_chunks": True})) is None
    assert ShardWriter.for_array(two_axes.with_config({"write_empty_chunks": True})) is None
    assert ShardWriter.for_array(big_endian.with_config({"write_empty_chunks": True})) is None
    # write_empty_chunks=False would skip fill-value chunks; only zarr does that exactly.
    zstd = root.create_array("zstd", shape=(4, 4), chunks=(2, 1), shards=(2, 4), dtype="float32",
                             compressors=zarr.codecs.ZstdCodec())
    assert ShardWriter.for_array(zstd.with_config({"write_empty_chunks": True})) is None
    sharded = root.create_array("ok", shape=(4, 4), chunks=(2, 1), shards=(2, 4), dtype="float32",
                                compressors=zarr.codecs.BloscCodec(cname="lz4", shuffle="shuffle"))
    assert ShardWriter.for_array(sharded.with_config({"write_empty_chunks": False})) is None
    assert ShardWriter.for_array(sharded.with_config({"write_empty_chunks": True})) is not None


def _record(path: Path, frames: int, bundle: ModelBundle, rng_seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rng_seed)
    W, nq = 5, bundle.layout.nq
    qpos = np.cumsum(rng.normal(0, 0.01, (frames, W, nq)), axis=0).astype(np.float32)
    reset = rng.random((frames, W)) < 0.05
    qvel = rng.normal(size=(frames, W, 2)).astype(np.float32)
    reward = rng.normal(size=(frames, W)).astype(np.float32)
    times = np.arange(1, frames + 1) * 0.01
    with mjarchive.create(path, bundle, world_ids=[3, 1, 4, 15, 9], chunk_frames=4, shard_worlds=2,
                          tracks={"qvel": (2,), "reward": ()}) as writer:
        fast, plain = set(writer._arrays.shard_writers), set(writer._arrays.chunk_writers)
        zarr_only = bool(os.environ.get("MJARCHIVE_ZARR_WRITES"))
        assert fast == (set() if zarr_only else {"qpos", "reset", "qvel", "reward"})
        assert plain == (set() if zarr_only else {"time"})
        assert (writer._index._chunks is None) == zarr_only
        writer.append(times[:6], qpos[:6], reset=reset[:6], qvel=qvel[:6], reward=reward[:6])
        writer.flush()  # a partial chunk, written through zarr
        writer.append(times[6:], qpos[6:], reset=reset[6:], qvel=qvel[6:], reward=reward[6:])
    return {"qpos": qpos, "reset": reset, "qvel": qvel, "reward": reward}


def test_archive_through_fast_path_matches_zarr_writes(tmp_path, monkeypatch):
    bundle = ModelBundle.from_xml(hinge_chain_xml(3))
    written, write = [], ChunkWriter.write

    def counted_write(self, start, data):
        done = write(self, start, data)
        written.extend([self.array.path] if done else [])
        return done

    monkeypatch.setattr(ChunkWriter, "write", counted_write)
    data = _record(tmp_path / "fast.zarr", 19, bundle, 0)
    # Whole chunks of time (4 of 19 frames); the index's block at each write (partial chunks of frames too);
    # world_id's one chunk when the archive is created.
    assert written.count("time") == 4 and written.count("reset_count") == 6 and written.count("world_id") == 1
    monkeypatch.setenv("MJARCHIVE_ZARR_WRITES", "1")
    _record(tmp_path / "zarr.zarr", 19, bundle, 0)
    monkeypatch.delenv("MJARCHIVE_ZARR_WRITES")
    for name in [*data, "time", "reset_count", "world_id"]:  # the last three: ChunkWriter's, unsharded (an edge column)
        fast_files = {p.relative_to(tmp_path / "fast.zarr"): p.read_bytes()
                      for p in (tmp_path / "fast.zarr" / name).rglob("c/**/*") if p.is_file()}
        zarr_files = {p.relative_to(tmp_path / "zarr.zarr"): p.read_bytes()
                      for p in (tmp_path / "zarr.zarr" / name).rglob("c/**/*") if p.is_file()}
        assert fast_files and fast_files == zarr_files, name
    with mjarchive.open(tmp_path / "fast.zarr") as archive:
        assert archive.verify().ok
        sel = archive.select()
        for name, value in data.items():
            np.testing.assert_array_equal(getattr(sel, name) if name in ("qpos", "reset") else sel.track(name), value)
    # Resume after close() trimmed the arrays to 19 frames, then fill whole chunks again.
    with mjarchive.open(tmp_path / "fast.zarr", mode="a") as writer:
        more = np.full((9, 5, 3), 0.5, np.float32)
        writer.append(np.arange(20, 29) * 0.01, more, qvel=np.zeros((9, 5, 2), np.float32),
                      reward=np.ones((9, 5), np.float32))
    with mjarchive.open(tmp_path / "fast.zarr") as archive:
        assert archive.n_frames == 28 and archive.verify().ok
        np.testing.assert_array_equal(archive.select().qpos, np.concatenate([data["qpos"], more]))


def _write_in_child(path: str, start: int, value: float) -> None:
    faulthandler.dump_traceback_later(20)  # a hang prints where the child waits (the failure alone does not say)
    array = zarr.open_array(zarr.storage.LocalStore(path), path="fast", mode="r+").with_config(
        {"write_empty_chunks": True})
    data = np.full((2, *array.shape[1:]), value, np.float32)
    raise SystemExit(0 if ShardWriter.for_array(array).write(start, data) else 3)


def test_forked_child_gets_its_own_compression_pool(tmp_path):
    import multiprocessing

    fast, _ = pair(tmp_path, "g", 4, (3,), "float32", 2, 2, 4)
    first = sample(np.random.default_rng(5), (2, 4, 3), "float32")
    assert ShardWriter.for_array(fast).write(0, first)  # the parent's pool now has threads
    child = multiprocessing.get_context("fork").Process(target=_write_in_child, args=(str(tmp_path / "g"), 2, 7.0))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung waiting for the parent's compression threads")
    assert child.exitcode == 0
    np.testing.assert_array_equal(fast[:2], first)
    assert (fast[2:] == 7.0).all()


def test_uncompressed_shards_byte_identical(tmp_path):
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / "g"), mode="w", zarr_format=3)
    arrays = [root.create_array(n, shape=(6, 5, 2), chunks=(3, 1, 2), shards=(3, 2, 2), dtype="int16",
                                compressors=None, fill_value=0).with_config({"write_empty_chunks": True})
              for n in ("fast", "zarr")]
    data = sample(np.random.default_rng(3), (6, 5, 2), "int16")
    writer = ShardWriter.for_array(arrays[0])
    assert writer is not None and writer.compressor is None
    assert writer.write(0, data)
    arrays[1][:] = data
    assert stored_objects(arrays[0]) == stored_objects(arrays[1])
    np.testing.assert_array_equal(arrays[0][:], data)


PLAIN_CASES = [
    # shape, chunks, dtype, compressors, fill value
    ((24,), (8,), "float64", zarr.codecs.ZstdCodec(level=3), 0.0),          # like `time`
    ((8, 5), (4, 2), "int64", zarr.codecs.ZstdCodec(level=3), 0),            # like the episode index: an edge column
    ((6, 3), (3, 3), "bool", None, False),
    ((4, 7, 2), (2, 3, 2), "int16", zarr.codecs.ZstdCodec(level=1, checksum=True), -5),
]


@pytest.mark.parametrize("shape,chunks,dtype,compressor,fill", PLAIN_CASES)
def test_unsharded_chunks_byte_identical_to_zarr(tmp_path, shape, chunks, dtype, compressor, fill):
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / "g"), mode="w", zarr_format=3)
    fast, ref = (root.create_array(n, shape=shape, chunks=chunks, dtype=dtype, compressors=compressor,
                                   fill_value=fill).with_config({"write_empty_chunks": True})
                 for n in ("fast", "zarr"))
    rng = np.random.default_rng(len(shape))
    data = (rng.random(shape) < 0.3) if dtype == "bool" else (rng.normal(0, 100, shape).astype(dtype))
    data.reshape(-1)[::5] = fill  # values equal to the fill value are stored like any other
    writer = ChunkWriter.for_array(fast)
    assert writer is not None
    C = chunks[0]
    assert writer.write(0, data[:C]) and writer.write(C, data[C:])  # one chunk of rows, then the rest
    ref[:] = data
    ours, theirs = stored_objects(fast), stored_objects(ref)
    assert sorted(ours) == sorted(theirs) and len(ours) == np.prod([-(-n // c) for n, c in zip(shape, chunks)])
    for key in theirs:
        assert ours[key] == theirs[key], key
    np.testing.assert_array_equal(fast[:], data)


def test_unsharded_writer_declines_what_it_does_not_reproduce(tmp_path):
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / "g"), mode="w", zarr_format=3)

    def make(name, **kw):
        kw.setdefault("dtype", "float32")
        return root.create_array(name, shape=(8, 4), chunks=(4, 2), **kw).with_config({"write_empty_chunks": True})

    ok = make("ok", compressors=zarr.codecs.ZstdCodec())
    writer = ChunkWriter.for_array(ok)
    data = np.ones((8, 4), np.float32)
    assert not writer.write(0, data[:3])       # part of a chunk of rows
    assert not writer.write(2, data[:4])       # not aligned
    assert not writer.write(4, data)           # beyond the array
    assert not writer.write(0, data[:4, :3])   # not every column
    assert stored_objects(ok) == {}
    assert ChunkWriter.for_array(ok.with_config({"write_empty_chunks": False})) is None
    assert ChunkWriter.for_array(make("blosc", compressors=zarr.codecs.BloscCodec())) is None
    assert ChunkWriter.for_array(make("two", compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.GzipCodec()])) is None
    assert ChunkWriter.for_array(make("be", serializer=zarr.codecs.BytesCodec(endian="big"))) is None
    assert ChunkWriter.for_array(make("sharded", shards=(4, 4))) is None
    assert ChunkWriter.for_array(make("transposed", filters=[zarr.codecs.TransposeCodec(order=(1, 0))])) is None
    assert ChunkWriter.for_array(make("complex", dtype="complex64")) is None
