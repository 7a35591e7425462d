"""Codec pipelines of the per-frame arrays: the whole-shard writer's objects are byte-identical to
zarr-python's for every pipeline it accepts (transpose, shuffle variants, pcodec), decode exactly,
and the default pipeline round-trips through an archive bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
import zarr.codecs

import mjarchive
from mjarchive import ModelBundle
from mjarchive.archive.storage.shard_writer import ShardWriter
from mjarchive.testing import hinge_chain_xml
from test_shards import stored_objects  # the same byte-for-byte comparison


def _blosc(shuffle: str, cname: str = "zstd", clevel: int = 3) -> dict:
    return {"compressors": zarr.codecs.BloscCodec(cname=cname, clevel=clevel, shuffle=shuffle, typesize=4)}


def _transposed(ndim: int, **kw) -> dict:
    return {"filters": [zarr.codecs.TransposeCodec(order=(*range(1, ndim), 0))], **kw}


def _pcodec(**kw) -> dict:
    pytest.importorskip("pcodec")
    from zarr.codecs.numcodecs import PCodec
    return {"serializer": PCodec(level=8), "compressors": None, **kw}


PIPELINES = {
    "bitshuffle": lambda nd: _blosc("bitshuffle"),
    "transpose_shuffle": lambda nd: _transposed(nd, **_blosc("shuffle")),
    "transpose_bitshuffle_lz4": lambda nd: _transposed(nd, **_blosc("bitshuffle", "lz4", 5)),
    "transpose_none": lambda nd: _transposed(nd, compressors=None),
    "pcodec": lambda nd: _pcodec(),
}
CASES = [
    # W, tail, chunk_frames, shard_worlds
    (6, (5,), 4, 4),      # an edge shard (W not a multiple of shard_worlds)
    (4, (2, 3), 3, 4),    # two tail dims: transpose order (1, 2, 3, 0)
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("W,tail,cf,sw", CASES)
def test_pipeline_byte_identical_to_zarr_and_exact(tmp_path, pipeline, W, tail, cf, sw):
    kw = PIPELINES[pipeline](2 + len(tail))
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path), mode="w", zarr_format=3)
    frames = 2 * cf
    arrays = []
    for which in ("fast", "zarr"):
        a = root.create_array(which, shape=(frames, W, *tail), chunks=(cf, 1, *tail), shards=(cf, sw, *tail),
                              dtype="float32", fill_value=0, **kw)
        arrays.append(a.with_config({"write_empty_chunks": True}))
    fast, ref = arrays
    rng = np.random.default_rng(W)
    data = np.cumsum(rng.normal(0, 0.01, (frames, W, *tail)), axis=0).astype("float32")
    data[:, 0] = 0  # whole inner chunks equal to the fill value are still written
    data[1, 1].flat[0] = np.float32(-0.0)  # exactness: the sign of zero survives
    writer = ShardWriter.for_array(fast)
    assert writer is not None, pipeline
    assert writer.write(0, data)
    ref[...] = data
    assert stored_objects(fast) == stored_objects(ref)
    got = zarr.open_array(tmp_path / "fast", mode="r")[...]
    assert np.array_equal(got.view(np.uint32), data.view(np.uint32))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_writer_declines_transpose_before_pcodec(tmp_path):
    # zarr-python 3.1 encodes that chain in memory (F) order; our C-order objects would differ.
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path), mode="w", zarr_format=3)
    a = root.create_array("a", shape=(4, 2, 3), chunks=(2, 1, 3), shards=(2, 2, 3), dtype="float32",
                          fill_value=0, **_transposed(3, **_pcodec()))
    assert ShardWriter.for_array(a.with_config({"write_empty_chunks": True})) is None


def test_default_pipeline_on_disk_and_round_trip(tmp_path):
    bundle = ModelBundle.from_xml(hinge_chain_xml(3))
    rng = np.random.default_rng(0)
    nq = bundle.compile().nq
    with mjarchive.create(tmp_path / "a", bundle, n_worlds=3, chunk_frames=4, shard_worlds=2) as w:
        qpos = np.cumsum(rng.normal(0, 0.01, (10, 3, nq)), axis=0).astype(np.float32)
        w.append(np.arange(10) * 0.01, qpos)
    meta = zarr.open_array(tmp_path / "a" / "qpos", mode="r").metadata.to_dict()
    inner = [c["name"] for c in meta["codecs"][0]["configuration"]["codecs"]]
    assert inner == ["transpose", "bytes", "blosc"]
    assert list(meta["codecs"][0]["configuration"]["codecs"][0]["configuration"]["order"]) == [1, 2, 0]
    blosc = meta["codecs"][0]["configuration"]["codecs"][2]["configuration"]
    assert (blosc["cname"], blosc["clevel"], blosc["shuffle"], blosc["typesize"]) == ("zstd", 2, "shuffle", 4)
    with mjarchive.open(tmp_path / "a") as a:
        got = np.asarray(a.select().qpos)
    assert np.array_equal(got.view(np.uint32), qpos.view(np.uint32))


@pytest.mark.parametrize("order", [[0, 0, 1], [1, 0], [1, 2, 3], "x"])
def test_hostile_transpose_order_is_refused(tmp_path, order):
    bundle = ModelBundle.from_xml(hinge_chain_xml(2))
    nq = bundle.compile().nq
    with mjarchive.create(tmp_path / "a", bundle, n_worlds=2, chunk_frames=4) as w:
        w.append(np.arange(4) * 0.01, np.ones((4, 2, nq), np.float32))
    meta_path = tmp_path / "a" / "qpos" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["codecs"][0]["configuration"]["codecs"][0]["configuration"]["order"] = order
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(mjarchive.FormatError, match="order|iterable"):
        with mjarchive.open(tmp_path / "a") as a:
            np.asarray(a.select().qpos)


def test_archive_in_the_0_1_pipeline_reads_and_appends(tmp_path, monkeypatch):
    """Archives written with 0.1's bitshuffle, frame-major chunks keep reading and appending."""
    from mjarchive.archive import creation

    def old_pipeline(W, tail, dims, dtype, chunk_frames, shard_worlds):
        itemsize = np.dtype(dtype).itemsize
        t = tuple(max(1, n) for n in tail)
        return dict(shape=(0, W, *tail), chunks=(chunk_frames, 1, *t), shards=(chunk_frames, shard_worlds, *t),
                    dtype=dtype, dimension_names=("frame", "world", *dims), fill_value=0,
                    compressors=zarr.codecs.BloscCodec(cname="zstd", clevel=3, typesize=itemsize,
                                                       shuffle="bitshuffle" if itemsize > 1 else "noshuffle"))

    bundle = ModelBundle.from_xml(hinge_chain_xml(3))
    nq = bundle.compile().nq
    qpos = np.cumsum(np.random.default_rng(1).normal(0, 0.01, (12, 2, nq)), axis=0).astype(np.float32)
    with monkeypatch.context() as m:
        m.setattr(creation, "_frame_world_array", old_pipeline)
        with mjarchive.create(tmp_path / "a", bundle, n_worlds=2, chunk_frames=4) as w:
            w.append(np.arange(8) * 0.01, qpos[:8])
    with mjarchive.open(tmp_path / "a", mode="a") as w:
        w.append(np.arange(8, 12) * 0.01, qpos[8:])
    meta = zarr.open_array(tmp_path / "a" / "qpos", mode="r").metadata.to_dict()
    assert [c["name"] for c in meta["codecs"][0]["configuration"]["codecs"]] == ["bytes", "blosc"]
    with mjarchive.open(tmp_path / "a") as a:
        got = np.asarray(a.select().qpos)
    assert np.array_equal(got.view(np.uint32), qpos.view(np.uint32))
