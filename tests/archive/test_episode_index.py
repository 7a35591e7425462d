"""The episode index (format 1.3, `reset_count`): counts, starts and episode numbers agree with the reset
markers, survive flushes, resumes and finalizing, are read without the `reset` chunks they summarize, and a
damaged or lying index is refused or reported."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr

import mjarchive
from mjarchive import FormatError, MjArchiveError, SelectionError
from mjarchive.cli.info import archive_info
from mjarchive.testing import hinge_chain_xml

C = 8  # chunk_frames
W_IDS = [3, 11, 12, 40, 41]


def _bundle():
    return mjarchive.ModelBundle.from_xml(hinge_chain_xml(2))


def _markers(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    reset = rng.random((n, len(W_IDS))) < 0.06
    reset[:, 2] = False  # world 12 never resets
    reset[C * 3 + 2:C * 9, 3] = True  # world 40: a long run of resets across chunks
    return reset


def _append(writer, reset: np.ndarray, lo: int, hi: int) -> None:
    writer.append(0.01 * np.arange(lo + 1, hi + 1), np.zeros((hi - lo, len(W_IDS), 2)), reset=reset[lo:hi])


def _write(path, reset: np.ndarray, *, close: bool = True, shard_worlds: int = 2):
    """Appended in uneven blocks with flushes between (partial chunks written, then rewritten)."""
    writer = mjarchive.create(path, _bundle(), world_ids=W_IDS, chunk_frames=C, shard_worlds=shard_worlds)
    bounds = sorted({min(b, len(reset)) for b in (0, 3, 5, 19, 40, 41, 77, len(reset))})
    for lo, hi in zip(bounds, bounds[1:] or [0]):
        _append(writer, reset, lo, max(lo, hi))
        writer.flush()
    if close:
        writer.close()
    return writer


def _expected_starts(reset: np.ndarray, w: int) -> list[int]:
    return ([0] if len(reset) else []) + [int(f) for f in np.flatnonzero(reset[:, w]) if f > 0]


def _check_against_markers(archive, reset: np.ndarray) -> None:
    n = len(reset)
    assert archive.n_frames == n
    first = 1 if n else 0  # frame 0 starts an episode of every world
    np.testing.assert_array_equal(archive.episode_counts(), first + reset[1:].sum(axis=0))
    np.testing.assert_array_equal(archive.episode_counts([40, 3]), first + reset[1:, [3, 0]].sum(axis=0))
    union = sorted({s for w in (0, 3) for s in _expected_starts(reset, w)})  # worlds 3 and 40
    assert archive.episode_starts([40, 3]) == union
    assert archive.episode_starts([3, 40], 1, limit=3) == [s for s in union if s >= 1][:3]
    assert archive.episode_starts([3, 40], 0, n, limit=4, reverse=True) == union[::-1][:4]
    for w, wid in enumerate(W_IDS):
        starts = _expected_starts(reset, w)
        assert archive.episode_starts(wid) == starts
        assert [r.start for r in archive.episodes(wid)] == starts
        assert archive.episode_starts(wid, C + 3, 5 * C + 1) == [s for s in starts if C + 3 <= s < 5 * C + 1]
        assert archive.episode_starts(wid, 0, max(0, n - 2), limit=2, reverse=True) == [s for s in starts if s < n - 2][::-1][:2]
        assert archive.episode_starts(wid, 1, limit=1) == [s for s in starts if s >= 1][:1]
        numbers = np.cumsum(np.r_[0, reset[1:, w]])
        frames = np.array([f for f in (0, 1, C - 1, C, 3 * C + 5, n - 1, 2) if 0 <= f < n], np.int64)
        np.testing.assert_array_equal(archive.episode_numbers(wid, frames), numbers[frames])
        np.testing.assert_array_equal(archive.episode_numbers(wid, slice(min(n, 1), n, 3)), numbers[min(n, 1):n:3])


@pytest.mark.parametrize("n", [0, 1, C, 12 * C, 12 * C + 5])
def test_counts_starts_and_numbers_agree_with_the_markers(tmp_path, n):
    reset = _markers(n)
    _write(tmp_path / "a", reset)
    with mjarchive.open(tmp_path / "a") as archive:
        assert archive.format_version == "1.3"
        _check_against_markers(archive, reset)
        assert archive.verify().ok
        # finalized: the index is trimmed to the chunks of frames
        assert zarr.open_array(tmp_path / "a" / "reset_count").shape == (-(-n // C), len(W_IDS))


def test_a_live_archive_and_a_resumed_one_keep_the_index(tmp_path):
    reset = _markers(15 * C + 3, seed=1)
    writer = _write(tmp_path / "a", reset[:9 * C + 5], close=False)
    with mjarchive.open(tmp_path / "a") as live:
        _check_against_markers(live, reset[:9 * C + 5])
        writer.close()
        with mjarchive.open(tmp_path / "a", mode="a") as resumed:
            _append(resumed, reset, 9 * C + 5, 12 * C)  # fills the partial chunk, then whole ones
            resumed.flush()
            assert live.refresh() == 12 * C
            _check_against_markers(live, reset[:12 * C])
            _append(resumed, reset, 12 * C, len(reset))
    with mjarchive.open(tmp_path / "a") as archive:
        _check_against_markers(archive, reset)
        assert archive.verify().ok


def _drop_reset_chunks(path, chunks) -> None:
    """Delete the stored `reset` shards of these chunks of frames (all worlds)."""
    for k in chunks:
        shutil.rmtree(path / "reset" / "c" / str(k))


def test_counts_and_numbers_read_the_index_not_every_reset_chunk(tmp_path):
    reset = _markers(20 * C + 3, seed=2)
    _write(tmp_path / "a", reset)
    # Every reset chunk but the partial last one (5) and chunk 5 (asked for below) is gone: reading one
    # would refuse the archive as damaged, so what follows proves none is read.
    _drop_reset_chunks(tmp_path / "a", [k for k in range(20) if k != 5])
    with mjarchive.open(tmp_path / "a") as archive:
        np.testing.assert_array_equal(archive.episode_counts(), 1 + reset[1:].sum(axis=0))
        numbers = np.cumsum(np.r_[0, reset[1:, 3]])
        frames = np.arange(5 * C, 6 * C)
        np.testing.assert_array_equal(archive.episode_numbers(40, frames), numbers[frames])
        assert archive_info(archive)["n_episodes"] == int((1 + reset[1:].sum(axis=0)).sum())
        with pytest.raises(FormatError, match="missing"):
            archive.episode_numbers(40, [3 * C])  # that chunk's markers are needed, and gone
        assert not archive.verify().ok


def test_starts_read_only_the_chunks_that_hold_them(tmp_path):
    reset = np.zeros((30 * C, len(W_IDS)), bool)
    reset[[3, 7 * C + 2, 7 * C + 5, 22 * C], 1] = True  # world 11
    _write(tmp_path / "a", reset)
    _drop_reset_chunks(tmp_path / "a", [k for k in range(30) if k not in (0, 7, 22)])
    with mjarchive.open(tmp_path / "a") as archive:
        assert archive.episode_starts(11) == [0, 3, 7 * C + 2, 7 * C + 5, 22 * C]
        assert archive.episode_starts(11, 8 * C, reverse=True, limit=1) == [22 * C]
        assert archive.episode_starts(11, 1, 22 * C, reverse=True, limit=1) == [7 * C + 5]


def test_multi_part_archives_answer_from_each_part(tmp_path):
    loc = tmp_path / "p"
    reset = _markers(6 * C + 1, seed=3)
    for part, ids, n in (("a", W_IDS[:2], 6 * C + 1), ("b", W_IDS[2:], 4 * C)):
        cols = [W_IDS.index(i) for i in ids]
        with mjarchive.create(loc, _bundle(), part=part, world_ids=ids, chunk_frames=C) as w:
            w.append(0.01 * np.arange(1, n + 1), np.zeros((n, len(ids), 2)), reset=reset[:n, cols])
    with mjarchive.open(loc) as archive:
        expected = [1 + reset[1:6 * C + 1, 0].sum(), 1 + reset[1:6 * C + 1, 1].sum(),
                    *(1 + reset[1:4 * C, 2:].sum(axis=0))]  # each world in its own part's frames
        np.testing.assert_array_equal(archive.episode_counts(W_IDS), expected)
        assert archive.episode_starts(3) == _expected_starts(reset[:6 * C + 1], 0)
        np.testing.assert_array_equal(archive.episode_numbers(41, [0, 3 * C, 4 * C - 1]),
                                      np.cumsum(np.r_[0, reset[1:4 * C, 4]])[[0, 3 * C, 4 * C - 1]])
        assert archive_info(archive)["n_episodes"] == sum(expected)
        seen = []
        assert archive.verify(lambda done, total: seen.append((done, total))).ok
        assert seen and seen[-1][0] == seen[-1][1] and all(d <= t for d, t in seen)


def _rewrite_rows(path, rows: dict[int, list[int]]) -> None:
    arr = zarr.open_array(path / "reset_count", mode="r+").with_config({"write_empty_chunks": True})
    for k, row in rows.items():
        arr[k] = row


def test_a_lying_or_damaged_index_is_refused_or_reported(tmp_path):
    reset = _markers(6 * C + 2, seed=4)
    _write(tmp_path / "a", reset)
    truth = np.cumsum(np.r_[np.zeros((1, len(W_IDS)), int), reset[1:]], axis=0)

    def fresh(name):
        shutil.copytree(tmp_path / "a", tmp_path / name)
        return tmp_path / name

    falls = fresh("falls")
    _rewrite_rows(falls, {0: list(truth[C - 1] + 1), 1: [0] * len(W_IDS)})
    with mjarchive.open(falls) as archive, pytest.raises(FormatError, match="episode index is corrupt"):
        archive.episode_starts(3)
    beyond = fresh("beyond")
    _rewrite_rows(beyond, {5: [6 * C] * len(W_IDS)})
    with mjarchive.open(beyond) as archive, pytest.raises(FormatError, match="exceed the frames"):
        archive.episode_counts()
    lies = fresh("lies")
    rows = {k: truth[(k + 1) * C - 1] + np.eye(len(W_IDS), dtype=int)[2] for k in range(1, 6)}
    _rewrite_rows(lies, rows)  # world 12 one more from row 1 on: within its frames, never falling
    with mjarchive.open(lies) as archive:
        report = archive.verify()
        assert not report.ok and any("reset_count" in p and "world 12" in p for p in report.problems)
    missing = fresh("missing")
    shutil.rmtree(missing / "reset_count" / "c" / "0")
    with mjarchive.open(missing) as archive, pytest.raises(FormatError, match="missing"):
        archive.episode_counts()
    gone = fresh("gone")
    shutil.rmtree(gone / "reset_count")
    with mjarchive.open(gone) as archive:  # opening reads only what it needs
        with pytest.raises(FormatError, match="reset_count"):
            archive.episode_counts()
        assert any("reset_count" in p for p in archive.verify().problems)
    with pytest.raises(MjArchiveError, match="reset_count"):
        mjarchive.open(gone, mode="a")
    long = fresh("long")
    meta = json.loads((long / "reset_count" / "zarr.json").read_text())
    meta["shape"][0] = 10_000
    (long / "reset_count" / "zarr.json").write_text(json.dumps(meta))
    with mjarchive.open(long) as archive, pytest.raises(FormatError, match="far beyond"):
        archive.episode_counts()


def test_a_1_2_archive_counts_from_its_markers(tmp_path):
    reset = _markers(5 * C + 1, seed=5)
    _write(tmp_path / "a", reset)
    shutil.rmtree(tmp_path / "a" / "reset_count")
    doc = json.loads((tmp_path / "a" / "zarr.json").read_text())
    doc["attributes"]["mjarchive"]["format_version"] = "1.2"
    (tmp_path / "a" / "zarr.json").write_text(json.dumps(doc))
    with mjarchive.open(tmp_path / "a") as archive:
        _check_against_markers(archive, reset)
        assert archive.verify().ok
    with mjarchive.open(tmp_path / "a", mode="a") as resumed:  # keeps its version, writes no index
        _append(resumed, np.vstack([reset, reset]), len(reset), len(reset) + C)
    with mjarchive.open(tmp_path / "a") as archive:
        assert archive.format_version == "1.2" and not (tmp_path / "a" / "reset_count").exists()
        _check_against_markers(archive, np.vstack([reset, reset])[:len(reset) + C])


def test_reset_count_is_no_track_name_and_arguments_are_checked(tmp_path):
    with pytest.raises(MjArchiveError, match="reset_count"):
        mjarchive.create(tmp_path / "t", _bundle(), n_worlds=1, tracks={"reset_count": ()})
    _write(tmp_path / "a", _markers(2 * C))
    with mjarchive.open(tmp_path / "a") as archive:
        for bad in (dict(start=-1), dict(limit=-2), dict(stop=1.5), dict(start=True)):
            with pytest.raises(SelectionError):
                archive.episode_starts(3, **bad)
        with pytest.raises(SelectionError, match="recorded world IDs"):
            archive.episode_counts([4])
        with pytest.raises(SelectionError, match="out of range"):
            archive.episode_numbers(3, [2 * C])


def test_a_time_range_is_found_by_bisection_reading_few_time_chunks(tmp_path):
    times = np.cumsum(np.random.default_rng(6).random(40 * C) + 1e-3)
    with mjarchive.create(tmp_path / "t", _bundle(), n_worlds=1, chunk_frames=C) as w:
        w.append(times, np.zeros((len(times), 1, 2)))
    edges = [None, -1.0, times[0], times[C - 1], times[C], times[C] + 1e-9, times[17 * C + 3], times[-1],
             times[-1] + 1, *np.random.default_rng(7).uniform(0, times[-1], 12)]
    with mjarchive.open(tmp_path / "t") as archive:
        reads = []
        read = archive._read
        archive._read = lambda name, frames, worlds: reads.append(name) or read(name, frames, worlds)
        for t0 in edges:
            for t1 in edges[::3]:
                lo = -np.inf if t0 is None else t0
                hi = np.inf if t1 is None else t1
                if not lo <= hi:
                    continue
                reads.clear()
                got = archive.select(time=(t0, t1)).frame_indices
                np.testing.assert_array_equal(got, np.arange(np.searchsorted(times, lo), np.searchsorted(times, hi)))
                assert len(reads) <= 2 * (6 + 1)  # log2(40) bisection steps and one chunk, per end
