"""A hostile episode index (`reset_count`, format 1.3) and the reads built on it: every damage is an
MjArchiveError with a message, never another exception, a wrong answer that verify passes, or an
archive of an earlier version whose track of that name stops working."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import zarr

import mjarchive
from mjarchive import FormatError, MjArchiveError
from mjarchive.testing import hinge_chain_xml
from mjarchive.viewer.frames import PoseWindow
from test_untrusted_store import _zstd_rle  # a real zstd frame of RLE blocks

C = 8
W_IDS = [3, 11, 12, 40, 41]
N = 70 * C + 3  # two stored chunks of index rows (64 + 6 whole rows) and a partial chunk of frames


def _bundle():
    return mjarchive.ModelBundle.from_xml(hinge_chain_xml(2))


def _markers(n: int) -> np.ndarray:
    reset = np.random.default_rng(0).random((n, len(W_IDS))) < 0.1
    reset[:, 2] = False
    return reset


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pristine") / "a"
    with mjarchive.create(path, _bundle(), world_ids=W_IDS, chunk_frames=C, shard_worlds=2,
                          tracks={"rcx": {"shape": [], "dtype": "int64"}}) as w:
        w.append(0.01 * np.arange(1, N + 1), np.zeros((N, len(W_IDS), 2)), reset=_markers(N),
                 rcx=np.arange(N * len(W_IDS)).reshape(N, len(W_IDS)))
    return path


@pytest.fixture
def copy(pristine, tmp_path):
    def make() -> Path:
        path = tmp_path / "a"
        shutil.copytree(pristine, path)
        return path
    return make


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _edit_index_meta(path: Path, edit) -> None:
    _edit_json(path / "reset_count" / "zarr.json", edit)


def _edit_rows(path: Path, edit) -> None:
    arr = zarr.open_array(path / "reset_count", mode="r+").with_config({"write_empty_chunks": True})
    rows = arr[:]
    edit(rows)
    arr[:] = rows


def _append_one(path: Path) -> None:
    with mjarchive.open(path, mode="a") as w:
        w.append([100.0], np.zeros((1, len(W_IDS), 2)), reset=np.ones((1, len(W_IDS)), bool),
                 rcx=np.zeros((1, len(W_IDS)), np.int64))


def _expected_counts() -> np.ndarray:
    return 1 + _markers(N)[1:].sum(axis=0)


# -- metadata ----------------------------------------------------------------------------------------------

UNREADABLE_META = {  # metadata zarr itself cannot build an array from
    "fill-null": lambda d: d.update(fill_value=None),
    "fill-huge": lambda d: d.update(fill_value=2**70),
    "shape-negative": lambda d: d.update(shape=[-1, 5]),
    "shape-float": lambda d: d.update(shape=[71.0, 5]),
    "codec-unknown": lambda d: d.update(codecs=[{"name": "bytes"}, {"name": "lzma"}]),
    "no-codecs": lambda d: d.update(codecs=[]),
    "dimension-names-too-many": lambda d: d.update(dimension_names=["a", "b", "c"]),
    "grid-irregular": lambda d: d["chunk_grid"].update(name="rectilinear"),
}
REFUSED_META = {  # well-formed zarr, refused by the spec's checks
    **UNREADABLE_META,
    "int32": lambda d: d.update(data_type="int32"),
    "float64": lambda d: d.update(data_type="float64"),
    "3-d": lambda d: d.update(shape=[71, 5, 1], dimension_names=["chunk", "world", "x"],
                              chunk_grid={"name": "regular", "configuration": {"chunk_shape": [64, 2, 1]}}),
    "worlds-6": lambda d: d.update(shape=[71, 6]),
    "rows-fewer-than-whole-chunks": lambda d: d.update(shape=[69, 5]),
    "rows-2-pow-62": lambda d: d.update(shape=[2**62, 5]),
    "rows-past-limit": lambda d: d.update(shape=[71 + 128 + 1, 5]),
    "chunks-64x1": lambda d: d["chunk_grid"]["configuration"].update(chunk_shape=[64, 1]),
    "chunks-huge": lambda d: d["chunk_grid"]["configuration"].update(chunk_shape=[2**40, 2]),
    "big-endian": lambda d: d["codecs"][0]["configuration"].update(endian="big"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_META))
def test_hostile_index_metadata_is_refused_when_read_and_reported_by_verify(case, copy):
    path = copy()
    _edit_index_meta(path, REFUSED_META[case])
    with mjarchive.open(path) as archive:  # opening reads no more than it needs
        with pytest.raises(FormatError, match="reset_count"):
            archive.episode_counts()
        with pytest.raises(FormatError, match="reset_count"):
            archive.episode_starts([3, 40], limit=2, reverse=True)
        np.testing.assert_array_equal(archive.select(frames=slice(0, 9)).reset, _markers(N)[:9])
        report = archive.verify()
        assert any(p.startswith("reset_count: ") for p in report.problems), report.problems


@pytest.mark.parametrize("case", sorted(UNREADABLE_META))
def test_resuming_an_archive_with_unreadable_index_metadata_is_a_format_error(case, copy):
    path = copy()
    _edit_index_meta(path, UNREADABLE_META[case])
    with pytest.raises(FormatError, match="reset_count"):
        _append_one(path)


# -- rows and chunks -------------------------------------------------------------------------------------

@pytest.mark.parametrize("row, value", [(10, -1), (3, 2**63 - 1), (69, 70 * C), (0, C), (65, -(2**63))])
def test_rows_out_of_bounds_are_refused(copy, row, value):
    path = copy()
    _edit_rows(path, lambda rows: rows.__setitem__((slice(row, None), 1), value))
    with mjarchive.open(path) as archive:
        with pytest.raises(FormatError, match="episode index is corrupt"):
            [archive.episode_starts(w) for w in W_IDS]
        assert not archive.verify().ok


def test_a_falling_row_is_refused(copy):
    path = copy()
    _edit_rows(path, lambda rows: rows.__setitem__((40, 0), rows[39, 0] - 1))
    with mjarchive.open(path) as archive:
        with pytest.raises(FormatError, match="fall"):
            archive.episodes(3)
        assert any("reset_count" in p for p in archive.verify().problems)


def test_the_partial_chunks_row_is_never_trusted(copy):
    path = copy()
    _edit_rows(path, lambda rows: rows.__setitem__(70, -5))  # row of frames 560..562, not a whole chunk
    with mjarchive.open(path) as archive:
        np.testing.assert_array_equal(archive.episode_counts(), _expected_counts())
        assert archive.verify().ok


def _zstd(raw: bytes, content_size: bool = True) -> bytes:
    import zstandard
    return zstandard.ZstdCompressor(write_content_size=content_size).compress(raw)


CHUNK_DAMAGE = {
    "truncated": (lambda b: b[:len(b) // 2], "reset_count"),
    "a-second-frame-inflating": (lambda b: b + _zstd_rle(None, 64), "a chunk is one frame"),  # 64 x 128 KiB
    "trailing-bytes": (lambda b: b + b"\x00" * 7, "a chunk is one frame"),
    # frames a bounded decode would pass: they add no byte to the output
    "trailing-skippable-frame": (lambda b: b + (0x184D2A50).to_bytes(4, "little") + bytes(4), "a chunk is one frame"),
    "trailing-empty-frame": (lambda b: b + _zstd(b""), "a chunk is one frame"),
    "truncated-frame": (lambda b: b[:-2], "truncated or malformed"),
    "empty": (lambda b: b"", "declares no decoded bytes"),
    "claims-a-gigabyte": (lambda b: _zstd(bytes(1 << 30)), "more than a chunk of 1024 bytes"),
    "claims-too-little": (lambda b: _zstd(bytes(100)), "declares 100 decoded bytes"),
    "no-content-size": (lambda b: _zstd(bytes(1024), content_size=False), "declares no decoded bytes"),
    "padded": (lambda b: b + bytes(2 << 20), "more than a chunk of 1024 bytes"),
}


@pytest.mark.parametrize("frames", ["zstd", "headers"])  # zstd's own frame functions, or (not exported) headers
@pytest.mark.parametrize("case", sorted(CHUNK_DAMAGE))
def test_damaged_index_chunks_are_format_errors(case, frames, copy, monkeypatch):
    if frames == "headers":
        from mjarchive.archive.storage import chunk_layout
        monkeypatch.setattr(chunk_layout, "_ZSTD", None)
    path = copy()
    chunk = path / "reset_count" / "c" / "1" / "1"  # rows 64..70 of worlds 12 and 40
    damage, message = CHUNK_DAMAGE[case]
    chunk.write_bytes(damage(chunk.read_bytes()))
    with mjarchive.open(path) as archive:
        with pytest.raises(FormatError, match=message):
            archive.episode_counts([12, 40])
        with pytest.raises(FormatError):
            archive.episode_numbers(40, [N - 1])
        report = archive.verify()
    assert any(p.startswith("reset_count: ") for p in report.problems), report.problems
    with pytest.raises(FormatError):
        _append_one(path)  # the writer reads the rows of the block it continues


def test_a_missing_index_chunk_of_whole_chunks_is_damage_never_fill_values(copy):
    path = copy()
    _edit_index_meta(path, lambda d: d.update(fill_value=3))
    (path / "reset_count" / "c" / "1" / "0").unlink()
    with mjarchive.open(path) as archive:
        with pytest.raises(FormatError, match="missing"):
            archive.episode_counts()
        with pytest.raises(FormatError, match="missing"):
            PoseWindow(archive, archive.model(), W_IDS, [], prefetch=False).episode_count(3)


# -- versions --------------------------------------------------------------------------------------------

def _as_version_1_2_with_track_named_reset_count(path: Path) -> None:
    shutil.rmtree(path / "reset_count")
    (path / "rcx").rename(path / "reset_count")

    def edit(doc):
        man = doc["attributes"]["mjarchive"]
        man["format_version"] = "1.2"
        man["tracks"] = {"reset_count": man["tracks"].pop("rcx")}
    _edit_json(path / "zarr.json", edit)


def test_a_1_2_archive_with_a_track_named_reset_count_reads_it_as_a_track(copy):
    path = copy()
    _as_version_1_2_with_track_named_reset_count(path)
    with mjarchive.open(path) as archive:
        np.testing.assert_array_equal(archive.select(frames=slice(0, 3)).track("reset_count"),
                                      np.arange(3 * len(W_IDS)).reshape(3, len(W_IDS)))
        np.testing.assert_array_equal(archive.episode_counts(), _expected_counts())
        assert archive.verify().ok


def test_a_1_2_archive_ignores_a_stray_reset_count_array(copy):
    path = copy()
    (path / "reset_count" / "zarr.json").write_text("garbage")
    _edit_json(path / "zarr.json", lambda d: d["attributes"]["mjarchive"].update(format_version="1.2"))
    with mjarchive.open(path) as archive:
        np.testing.assert_array_equal(archive.episode_counts(), _expected_counts())
        assert archive.verify().ok


def test_a_1_3_archive_may_not_name_a_track_reset_count(copy):
    path = copy()
    _edit_json(path / "zarr.json", lambda d: d["attributes"]["mjarchive"]["tracks"].update(
        reset_count={"shape": [], "dtype": "int64"}))
    with pytest.raises(MjArchiveError, match="reset_count"):
        mjarchive.open(path)


# -- time ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values", ["decreasing", "nan", "equal"])
def test_a_time_range_over_hostile_times_stays_in_bounds_and_verify_refuses_them(copy, values):
    path = copy()
    arr = zarr.open_array(path / "time", mode="r+")
    t = arr[:]
    arr[:] = {"decreasing": t[::-1].copy(), "nan": np.where(np.arange(N) % 7 == 3, np.nan, t),
              "equal": np.ones(N)}[values]
    with mjarchive.open(path) as archive:
        for bounds in ((0.05, 0.3), (None, 1.0), (2.0, None), (-np.inf, np.inf)):
            got = archive.select(time=bounds).frame_indices
            assert got.size == 0 or (0 <= got.min() and got.max() < N)
        assert any("time" in p for p in archive.verify().problems)


# -- whole shards read at once ----------------------------------------------------------------------------

def test_swapped_reset_inner_chunks_are_caught_by_the_index(tmp_path):
    """300 worlds in shards of 128: verify reads `reset` whole shards at a time (read_region_now); inner
    chunks of two worlds swapped in the shard index decode cleanly, and only the index tells."""
    W, S = 300, 128
    path = tmp_path / "w"
    rng = np.random.default_rng(1)
    reset = rng.random((2 * C, W)) < 0.2
    with mjarchive.create(path, _bundle(), n_worlds=W, chunk_frames=C, shard_worlds=S) as w:
        w.append(0.01 * np.arange(1, 2 * C + 1), np.zeros((2 * C, W, 2), np.float32), reset=reset)
    shard = path / "reset" / "c" / "0" / "1"  # frames 0..7, worlds 128..255
    blob = shard.read_bytes()
    size = 16 * S + 4
    table = np.frombuffer(blob[-size:-4], "<u8").reshape(S, 2).copy()
    a, b = next((i, j) for i in range(S) for j in range(i + 1, S)
                if reset[1:C, 128 + i].sum() != reset[1:C, 128 + j].sum())
    table[[a, b]] = table[[b, a]]
    raw = table.astype("<u8").tobytes()
    shard.write_bytes(blob[:-size] + raw + google_crc32c.value(raw).to_bytes(4, "little"))
    with mjarchive.open(path) as archive:
        fast = archive._read("reset", slice(0, 2 * C), None)  # whole shards at once
        slow = archive.select(worlds=archive.world_ids[::-1]).reset[:, ::-1]  # through zarr
        np.testing.assert_array_equal(fast, slow)
        report = archive.verify()
    assert any(p.startswith("reset_count: row 0 says world") for p in report.problems), report.problems
