"""Large all-worlds reads (verify's) decode each shard in one go, without zarr's sharding codec: the
values are zarr's, and every damage zarr's path refuses is refused here too, with a clear message."""

from __future__ import annotations

import math
import shutil
import uuid
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import zarr

import mjarchive
import mjarchive.testing
from mjarchive._errors import MjArchiveError
from s3_server import s3_server, s3_url  # noqa: F401  (pytest fixtures)

W, CF, T, S = 300, 32, 80, 128  # 3 chunks of frames (the last partial), 3 shards of worlds (the last partly outside)
EMPTY = 2**64 - 1
INDEX = 16 * S + 4


def _write(location, options=None) -> None:
    rng = np.random.default_rng(7)
    qpos = np.round(np.sin(0.1 * np.arange(T)[:, None, None] + np.arange(W)[:, None] + np.arange(2)), 2)
    bundle = mjarchive.ModelBundle.from_xml(mjarchive.testing.hinge_chain_xml(2))
    with mjarchive.create(location, bundle, n_worlds=W, chunk_frames=CF, shard_worlds=S,
                          storage_options=options) as w:
        w.append(0.1 * np.arange(1, T + 1), qpos.astype(np.float32),
                 reset=rng.random((T, W)) < 0.1)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pristine") / "a.mjarchive"
    _write(path)
    return path


def test_values_are_zarrs_and_verify_passes(pristine):
    with mjarchive.open(pristine) as archive:
        for name in ("qpos", "reset"):
            stored = zarr.open_array(pristine / name, mode="r")
            fast = archive._store.read_region_now(name, ((0, T), (0, W)), stored.fill_value)
            assert fast is not None and fast.dtype == stored.dtype
            np.testing.assert_array_equal(fast, stored[:T])
            np.testing.assert_array_equal(archive._read(name, slice(3, 71), None), stored[3:71])
            part = archive._read(name, slice(0, T), np.arange(100, W))  # a contiguous range of worlds
            np.testing.assert_array_equal(part, stored[:T, 100:])
        seen = []
        report = archive.verify(lambda done, total: seen.append((done, total)))
        assert report.ok, report.problems
        assert seen[-1] == (3 * 3, 3 * 3)  # qpos, reset, time: one call per chunk of frames of each


@pytest.mark.parametrize("where", ["memory", "s3"])
def test_values_on_object_stores_are_zarrs(where, pristine, request):
    if where == "memory":
        url, options = f"memory://mjarchive-test-{uuid.uuid4().hex}", None
    else:
        url, options = request.getfixturevalue("s3_url"), request.getfixturevalue("s3_server").storage_options()
    _write(url, options)
    with mjarchive.open(url, storage_options=options) as archive, mjarchive.open(pristine) as local:
        reversed_worlds = archive.world_ids[::-1]  # not a range of worlds: read through zarr
        np.testing.assert_array_equal(archive._read("qpos", slice(0, T), None),
                                      archive.select(worlds=reversed_worlds).qpos[:, ::-1])
        np.testing.assert_array_equal(archive._read("qpos", slice(0, T), None), local._read("qpos", slice(0, T), None))
        assert archive.verify().ok


# -- damage to shard qpos/c/1/1/0 (frames 32..63, worlds 128..255: all committed) -------------------------

def _table(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob[-INDEX:-4], "<u8").reshape(S, 2).copy()


def _with_table(blob: bytes, table: np.ndarray) -> bytes:
    raw = table.astype("<u8").tobytes()
    return blob[:-INDEX] + raw + google_crc32c.value(raw).to_bytes(4, "little")


def _flip(blob: bytes) -> bytes:
    off = int(_table(blob)[5, 0])
    assert not blob[off + 2] & 0x02  # compressed, not stored as it is: a zstd stream follows blosc's header
    off += 24  # its first byte, past blosc's header, block table and block size
    return blob[:off] + bytes([blob[off] ^ 0xFF]) + blob[off + 1:]


def _point_outside(blob: bytes) -> bytes:
    table = _table(blob)
    table[5, 0] = len(blob)
    return _with_table(blob, table)


def _drop_inner(blob: bytes) -> bytes:
    table = _table(blob)
    table[5] = EMPTY
    return _with_table(blob, table)


def _replace_inner(blob: bytes, piece: bytes) -> bytes:
    """Inner chunk 5 stored again as `piece`, after the others (the index pointing at it)."""
    table = _table(blob)
    body = blob[:-INDEX]
    table[5] = (len(body), len(piece))
    return _with_table(body + piece + bytes(INDEX), table)


def _blosc(raw: bytes) -> bytes:
    import numcodecs
    return numcodecs.Blosc(cname="zstd", clevel=2, shuffle=numcodecs.Blosc.SHUFFLE).encode(raw)


DAMAGE = {
    "inner-chunk-of-half-its-size": (lambda blob: _replace_inner(blob, _blosc(bytes(CF * 2 * 4 // 2))),
                                     "(inner chunk 5)' declares 128 decoded"),
    "inner-chunk-header-cut": (lambda blob: _replace_inner(blob, _blosc(bytes(CF * 2 * 4))[:12]), "is truncated"),
    "truncated": (lambda blob: blob[:len(blob) // 2], "crc32c"),
    "truncated-below-index": (lambda blob: blob[:10], "truncated"),
    "index-points-outside": (_point_outside, "points outside the shard object"),
    "inner-chunk-missing": (_drop_inner, "marks inner chunk 5 as missing"),
    "bit-flip": (_flip, "inner chunk 5 of shard 'qpos/c/1/1/0' does not decode"),
    "shard-missing": (None, "is missing from the store"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damage_zarrs_path_refuses_is_reported(case, pristine, tmp_path):
    path = tmp_path / "a.mjarchive"
    shutil.copytree(pristine, path)
    shard = path / "qpos" / "c" / "1" / "1" / "0"
    damage, message = DAMAGE[case]
    if damage is None:
        shard.unlink()
    else:
        shard.write_bytes(damage(shard.read_bytes()))
    with mjarchive.open(path) as archive:
        with pytest.raises(MjArchiveError):  # zarr's path (worlds in no range order) refuses it too
            archive.select(worlds=archive.world_ids[::-1]).qpos
        report = archive.verify()
    assert not report.ok
    assert [p for p in report.problems if p.startswith("qpos: ") and message in p], report.problems
    assert any(c.startswith("reset: every committed chunk present") for c in report.checked)  # verify went on


def test_a_shard_larger_than_its_inner_chunks_can_be_is_refused_unread(pristine, tmp_path):
    path = tmp_path / "a.mjarchive"
    shutil.copytree(pristine, path)
    shard = path / "qpos" / "c" / "1" / "1" / "0"
    blob = shard.read_bytes()
    pad = 2**21  # two megabytes of nothing before inner chunks of 256 bytes each: no writer makes this
    table = _table(blob)
    table[:, 0] += pad
    shard.write_bytes(_with_table(bytes(pad) + blob, table))
    with mjarchive.open(path) as archive:
        report = archive.verify()
    assert any(p.startswith("qpos: ") and "shard 'qpos/c/1/1/0' is more than" in p for p in report.problems)


# -- shards decoded a group of inner chunks at a time: every codec chain the fast path reads ----------

def _chains() -> dict:
    blosc = zarr.codecs.BloscCodec
    return {
        "transpose-blosc-shuffle": ("float32", [zarr.codecs.TransposeCodec(order=(1, 2, 3, 0))],
                                    blosc(cname="zstd", clevel=3, shuffle="shuffle", typesize=4)),
        "blosc-bitshuffle-lz4": ("float32", [], blosc(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=4)),
        "transpose-uncompressed": ("float32", [zarr.codecs.TransposeCodec(order=(3, 1, 0, 2))], None),
        "zstd": ("float64", [], zarr.codecs.ZstdCodec(level=1)),
        "uint8-blosc": ("uint8", [], blosc(cname="zstd", clevel=2, shuffle="noshuffle", typesize=1)),
    }


@pytest.mark.parametrize("steps", [1, 3, None])  # steps of the walked grid axis per group (3: a last group short)
@pytest.mark.parametrize("inner", [(8, 1, 3, 1), (2, 2, 3, 1)])  # grids (2, 4, 1, 2): worlds walked; (8, 2, 1, 2): frames
@pytest.mark.parametrize("chain", sorted(_chains()))
def test_shards_decoded_in_groups_give_zarrs_values_in_any_chain(chain, inner, steps, tmp_path, monkeypatch):
    from zarr.storage import LocalStore

    from mjarchive.archive.storage import checked

    dtype, filters, compressor = _chains()[chain]
    shape, shard = (40, 12, 3, 2), (16, 4, 3, 2)  # inner chunks split frames, worlds and the last axis
    root = zarr.open_group(LocalStore(tmp_path), mode="w", zarr_format=3)
    array = root.create_array("x", shape=shape, chunks=inner, shards=shard, dtype=dtype,
                              fill_value=0, filters=filters, compressors=compressor)
    data = (np.random.default_rng(3).normal(size=shape) * 50).astype(dtype)
    array[...] = data
    store = checked.CheckedStore(LocalStore(tmp_path, read_only=True))
    zarr.open_array(store, path="x", mode="r")  # its metadata read through the checked store
    seen = []
    grid = [s // c for s, c in zip(shard, inner)]
    step_bytes = math.prod(grid) // max(grid) * math.prod(inner) * np.dtype(dtype).itemsize
    monkeypatch.setattr(checked, "_GROUP_BYTES", 2**30 if steps is None else steps * step_bytes)
    unpack = checked._unpack_shard

    def spy(*args):  # the shards it took (it declines those with inner chunks left out)
        took = unpack(*args)
        if took:
            seen.append(args[1])
        return took
    monkeypatch.setattr(checked, "_unpack_shard", spy)
    all_six = [f"x/c/{f}/{w}/0/0" for f in (0, 1) for w in (0, 1, 2)]
    in_groups = {  # frames 32.. are an edge shard (its inner chunks past frame 40 left out): read chunk by chunk
        ((0, 32), (0, 12)): all_six, ((0, 40), (0, 12)): all_six, ((5, 37), (2, 11)): all_six,
        ((16, 32), (4, 8)): ["x/c/1/1/0/0"], ((20, 21), (0, 12)): ["x/c/1/0/0/0", "x/c/1/1/0/0", "x/c/1/2/0/0"],
    }
    for region, keys in in_groups.items():
        seen.clear()
        got = store.read_region_now("x", region, 0)
        assert got is not None and got.dtype == data.dtype
        (f0, f1), (w0, w1) = region
        np.testing.assert_array_equal(got, data[f0:f1, w0:w1])
        assert sorted(seen) == keys


def test_a_model_without_joints_reads_wide_and_verifies(tmp_path):
    path = tmp_path / "a.mjarchive"
    bundle = mjarchive.ModelBundle.from_xml("<mujoco><worldbody><body><geom size='.1'/></body></worldbody></mujoco>")
    with mjarchive.create(path, bundle, n_worlds=W, chunk_frames=CF, shard_worlds=S) as w:
        w.append(0.1 * np.arange(1, T + 1), np.zeros((T, W, 0), np.float32))
    with mjarchive.open(path) as archive:
        assert archive._read("qpos", slice(0, T), None).shape == (T, W, 0)
        assert archive.select(worlds=[7, 42]).qpos.shape == (T, 2, 0)
        report = archive.verify()
        assert report.ok, report.problems
