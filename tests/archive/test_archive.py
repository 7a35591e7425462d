"""Archive writer and reader: selection properties, stateful append/reopen, dtypes, precision,
resume, live refresh, episodes, validation errors, lifecycle and xarray interop."""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import mjarchive
from mjarchive import AppendError, ArchiveExistsError, ClosedError, MjArchiveError, ModelBundle, SelectionError
from mjarchive.testing import (
    archive_shapes,
    deterministic_frames,
    frame_selections,
    hinge_chain_xml,
    world_selections,
)

_memory_ids = itertools.count()


@functools.lru_cache(maxsize=None)
def chain_bundle(nq: int, n_mocap: int = 0) -> ModelBundle:
    return ModelBundle.from_xml(hinge_chain_xml(nq, n_mocap=n_mocap))


def _world_ids(n: int) -> list[int]:
    # Original IDs that are neither 0..W-1 nor sorted, so position and ID cannot be confused.
    return [(7 * i + 3) % 101 for i in reversed(range(n))]


# -- property: select == NumPy indexing --------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=archive_shapes(), data=st.data())
def test_select_matches_numpy_indexing(shape, data):
    W, nq, T = shape.n_worlds, shape.nq, shape.n_frames
    ids = _world_ids(W)
    rng = np.random.default_rng(T * 31 + W)
    qpos = rng.normal(size=(T, W, nq)).astype(np.float32)
    reset = rng.random((T, W)) < 0.2
    reward = rng.normal(size=(T, W)).astype(np.float32)
    time = np.cumsum(rng.uniform(0.01, 1.0, T))
    url = f"memory://select-{next(_memory_ids)}"
    with mjarchive.create(url, chain_bundle(nq), world_ids=ids, chunk_frames=shape.chunk_frames,
                          shard_worlds=shape.shard_worlds, tracks={"reward": ()}) as writer:
        # Append in random-sized blocks, mixing single frames and blocks.
        start = 0
        while start < T:
            k = data.draw(st.integers(1, T - start), label="block")
            if k == 1 and data.draw(st.booleans(), label="single"):
                writer.append(time[start], qpos[start], reset=reset[start], reward=reward[start])
            else:
                s = slice(start, start + k)
                writer.append(time[s], qpos[s], reset=reset[s], reward=reward[s])
            start += k

    worlds = data.draw(world_selections(tuple(ids)), label="worlds")
    frames = data.draw(frame_selections(T), label="frames")
    positions = (np.arange(W) if worlds is None
                 else np.array([ids.index(w) for w in np.atleast_1d(worlds).tolist()]))
    f_idx = slice(None) if frames is None else (frames if isinstance(frames, slice) else np.atleast_1d(frames))

    with mjarchive.open(url) as archive:
        assert archive.n_frames == T and archive.world_ids == tuple(ids)
        sel = archive.select(worlds=worlds, frames=frames)
        np.testing.assert_array_equal(sel.qpos, qpos[f_idx][:, positions])
        np.testing.assert_array_equal(sel.reset, reset[f_idx][:, positions])
        np.testing.assert_array_equal(sel.reward, reward[f_idx][:, positions])
        np.testing.assert_array_equal(sel.track("reward"), reward[f_idx][:, positions])
        np.testing.assert_array_equal(sel.time, time[f_idx])
        np.testing.assert_array_equal(sel.frame_indices, np.arange(T)[f_idx])
        assert sel.world_ids == tuple(ids[p] for p in positions)
        assert sel.shape == (len(np.arange(T)[f_idx]), len(positions))


def test_world_slice_selects_by_original_id(tmp_path):
    ids = [42, 7, 100, 8]
    qpos = deterministic_frames(0, 5, 4, 2)
    with mjarchive.create(tmp_path / "a.zarr", chain_bundle(2), world_ids=ids, chunk_frames=4) as writer:
        writer.append(np.arange(5.0), qpos)
    with mjarchive.open(tmp_path / "a.zarr") as archive:
        sel = archive.select(worlds=slice(7, 43))  # IDs 7, 8, 42 in ascending ID order
        assert sel.world_ids == (7, 8, 42)
        np.testing.assert_array_equal(sel.qpos, qpos[:, [1, 3, 0]])
        assert archive.world_index(100) == 2


# -- stateful: append / flush / reopen / append / read -------------------------------------------------

class AppendReopenMachine(RuleBasedStateMachine):
    """Appends deterministic frames, flushes, closes and reopens in append mode, and reads back."""

    W, NQ = 3, 2

    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="mjarchive-stateful-"))
        self.path = self.dir / "a.zarr"
        self.chunk_frames = 5
        self.writer = mjarchive.create(self.path, chain_bundle(self.NQ), world_ids=[4, 2, 9],
                                       chunk_frames=self.chunk_frames, tracks={"reward": ()})
        self.appended = 0
        self.durable = 0  # frames guaranteed committed (after flush/close)

    def frames(self, start, stop):
        return deterministic_frames(start, stop, self.W, self.NQ)

    @rule(k=st.integers(1, 12), block=st.booleans())
    def append(self, k, block):
        if block:
            q = self.frames(self.appended, self.appended + k)
            self.writer.append(np.arange(self.appended, self.appended + k) * 0.5, q, reward=q[..., 0])
        else:
            for i in range(self.appended, self.appended + k):
                q = self.frames(i, i + 1)[0]
                self.writer.append(i * 0.5, q, reward=q[:, 0])
        self.appended += k
        assert self.writer.n_frames == self.appended

    @rule()
    def flush(self):
        self.writer.flush()
        self.durable = self.appended
        assert self.writer.n_committed == self.appended

    @rule()
    def reopen(self):
        self.writer.close()
        self.durable = self.appended
        with pytest.raises(ClosedError):
            self.writer.append(0.0, np.zeros((self.W, self.NQ)))
        self.writer = mjarchive.open(self.path, mode="a")
        assert self.writer.n_frames == self.writer.n_committed == self.appended

    @precondition(lambda self: self.appended > 0)
    @rule(data=st.data())
    def read(self, data):
        with mjarchive.open(self.path) as archive:
            n = archive.n_frames
            # Chunks that filled up are committed even without flush; nothing beyond what was appended.
            assert self.durable <= n <= self.appended
            if self.durable:
                # Drawn within the frames known to be committed: `n` itself depends on the writer
                # thread's timing, and Hypothesis needs the same draws when it replays a case.
                frames = data.draw(frame_selections(self.durable))
                expected = self.frames(0, n)
                idx = slice(None) if frames is None else (frames if isinstance(frames, slice) else np.atleast_1d(frames))
                sel = archive.select(frames=frames)
                np.testing.assert_array_equal(sel.qpos, expected[idx])
                np.testing.assert_array_equal(sel.reward, expected[idx][..., 0])
                np.testing.assert_array_equal(sel.time, (np.arange(n) * 0.5)[idx])

    @invariant()
    def committed_never_exceeds_appended(self):
        assert self.writer.n_committed <= self.writer.n_frames == self.appended

    def teardown(self):
        self.writer.close()
        with mjarchive.open(self.path) as archive:
            assert archive.n_frames == self.appended and archive.status == "finalized"
            assert archive.verify().ok
            if self.appended:
                np.testing.assert_array_equal(archive.select().qpos, self.frames(0, self.appended))
        shutil.rmtree(self.dir, ignore_errors=True)


AppendReopenMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=12, deadline=None)
TestAppendReopen = AppendReopenMachine.TestCase


# -- dtypes and precision ----------------------------------------------------------------------------

def test_float64_roundtrip_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    qpos = rng.normal(size=(9, 2, 3)) * 10.0 ** rng.integers(-30, 30, size=(9, 2, 3))
    mocap_pos = rng.normal(size=(9, 2, 1, 3))
    mocap_quat = rng.normal(size=(9, 2, 1, 4))
    with mjarchive.create(tmp_path / "a.zarr", chain_bundle(3, n_mocap=1), n_worlds=2, dtype="float64",
                          chunk_frames=4) as writer:
        writer.append(np.arange(9.0) + 1e-9, qpos, mocap_pos=mocap_pos, mocap_quat=mocap_quat)
    with mjarchive.open(tmp_path / "a.zarr") as archive:
        sel = archive.select()
        assert sel.qpos.dtype == np.float64
        np.testing.assert_array_equal(sel.qpos, qpos)
        np.testing.assert_array_equal(sel.mocap_pos, mocap_pos)
        np.testing.assert_array_equal(sel.mocap_quat, mocap_quat)
        np.testing.assert_array_equal(archive.time, np.arange(9.0) + 1e-9)
        assert archive.nmocap == 1


def test_float32_default_rounds_to_nearest(tmp_path):
    qpos = np.random.default_rng(1).normal(size=(3, 2, 2))
    with mjarchive.create(tmp_path / "a.zarr", chain_bundle(2), n_worlds=2) as writer:
        writer.append(np.arange(3.0), qpos)
    with mjarchive.open(tmp_path / "a.zarr") as archive:
        stored = archive.select().qpos
        assert stored.dtype == np.float32
        np.testing.assert_array_equal(stored, qpos.astype(np.float32))


@pytest.mark.parametrize("precision,dtype", [(1e-3, "float32"), (1e-6, "float64"), (0.05, "float32")])
def test_lossy_precision_bound_holds(tmp_path, precision, dtype):
    rng = np.random.default_rng(2)
    qpos = rng.uniform(-20, 20, size=(40, 3, 4))
    mocap_pos = rng.uniform(-3, 3, size=(40, 3, 1, 3))
    mocap_quat = rng.normal(size=(40, 3, 1, 4))
    with mjarchive.create(tmp_path / "lossy.zarr", chain_bundle(4, n_mocap=1), n_worlds=3, dtype=dtype,
                          precision=precision, chunk_frames=16) as writer:
        writer.append(np.arange(40.0), qpos, mocap_pos=mocap_pos, mocap_quat=mocap_quat)
    with mjarchive.open(tmp_path / "lossy.zarr") as archive:
        bound = archive.manifest.abs_error
        assert 0 < bound <= precision
        assert archive.manifest.to_dict(0, "live")["storage"]["precision"]["abs_error"] == bound
        sel = archive.select()
        for stored, original in [(sel.qpos, qpos), (sel.mocap_pos, mocap_pos), (sel.mocap_quat, mocap_quat)]:
            error = np.abs(stored.astype(np.float64) - original)
            assert error.max() <= bound
            assert error.max() > 0  # it really is lossy
        assert archive.verify().ok


# -- resume, refresh, episodes ------------------------------------------------------------------------

def test_resume_after_close(tmp_path):
    path = tmp_path / "a.zarr"
    with mjarchive.create(path, chain_bundle(2), world_ids=[3, 1], chunk_frames=4, tracks={"qvel": (2,)}) as w:
        q = deterministic_frames(0, 10, 2, 2)
        w.append(np.arange(10.0), q, qvel=-q)
    with mjarchive.open(path, mode="a") as w:
        assert w.n_frames == 10 and w.world_ids == (3, 1)
        with pytest.raises(AppendError, match="strictly increase"):
            w.append(9.0, np.zeros((2, 2)), qvel=np.zeros((2, 2)))
        q = deterministic_frames(10, 17, 2, 2)
        w.append(np.arange(10.0, 17.0), q, qvel=-q)
    with mjarchive.open(path) as archive:
        assert archive.n_frames == 17 and archive.status == "finalized"
        expected = deterministic_frames(0, 17, 2, 2)
        np.testing.assert_array_equal(archive.select().qpos, expected)
        np.testing.assert_array_equal(archive.select().qvel, -expected)
        np.testing.assert_array_equal(archive.time, np.arange(17.0))
        assert archive.verify().ok


def test_close_trims_chunks_a_previous_writer_left_beyond_the_commit(tmp_path, monkeypatch):
    """Chunks stored but never committed (a writer killed before its commit) lie beyond the committed frames,
    within the shape the arrays declared (which may differ between arrays). A writer that resumes and stops
    short of them deletes them when it trims at close; a writer of a new archive has nothing beyond its own
    frames and never asks zarr to delete."""
    import zarr

    asked = []
    real_resize = zarr.AsyncArray.resize

    async def resize(self, new_shape, delete_outside_chunks=True):
        if self.store_path.path.rsplit("/", 1)[-1] in ("time", "qpos", "reset"):  # the writer's frame arrays
            asked.append(delete_outside_chunks)
        return await real_resize(self, new_shape, delete_outside_chunks=delete_outside_chunks)

    monkeypatch.setattr(zarr.AsyncArray, "resize", resize)
    path = tmp_path / "a.zarr"
    with mjarchive.create(path, chain_bundle(2), n_worlds=2, chunk_frames=4) as w:
        w.append(np.arange(6.0), deterministic_frames(0, 6, 2, 2))
    assert asked and not any(asked)  # grown, then trimmed: nothing asked to be deleted

    with mjarchive.create(path, chain_bundle(2), n_worlds=2, chunk_frames=4, overwrite=True) as w:
        w.append(np.arange(8.0), deterministic_frames(0, 8, 2, 2))
    qpos = zarr.open_array(path / "qpos", mode="r+")  # what a killed writer leaves: two more chunks, uncommitted
    qpos.resize((16, *qpos.shape[1:]))
    qpos[8:16] = np.ones((8, *qpos.shape[1:]), qpos.dtype)
    assert (path / "qpos" / "c" / "3").exists()
    with mjarchive.open(path, mode="a") as w:
        w.append(np.arange(8.0, 12.0), deterministic_frames(8, 12, 2, 2))
    for name in ("time", "qpos", "reset"):  # chunk keys c/<frames>[/<worlds>/0]: rows 0-2 kept, row 3 gone
        rows = {f.relative_to(path / name / "c").parts[0] for f in (path / name / "c").rglob("*") if f.is_file()}
        assert rows == {"0", "1", "2"}, name
    with mjarchive.open(path) as archive:
        assert archive.n_frames == 12 and archive.verify().ok
        np.testing.assert_array_equal(archive.select().qpos, deterministic_frames(0, 12, 2, 2))


def test_refresh_sees_frames_of_a_live_writer(tmp_path):
    path = tmp_path / "live.zarr"
    writer = mjarchive.create(path, chain_bundle(2), n_worlds=2, chunk_frames=4)
    archive = mjarchive.open(path)
    assert archive.n_frames == 0 and archive.status == "live"
    writer.append(np.arange(3.0), deterministic_frames(0, 3, 2, 2))
    writer.flush()
    assert archive.n_frames == 0  # a reader sees nothing new until it refreshes
    assert archive.refresh() == 3 and archive.n_frames == 3
    np.testing.assert_array_equal(archive.select().qpos, deterministic_frames(0, 3, 2, 2))
    writer.append(np.arange(3.0, 9.0), deterministic_frames(3, 9, 2, 2))
    writer.close()
    assert archive.refresh() == 9 and archive.status == "finalized"
    np.testing.assert_array_equal(archive.select(frames=slice(2, 9)).qpos, deterministic_frames(2, 9, 2, 2))
    archive.close()


def test_episodes_from_reset_markers(tmp_path):
    reset = np.zeros((12, 3), bool)
    reset[[0, 4, 9], 0] = True   # world 10: explicit reset at 0
    reset[[5], 1] = True          # world 20: no marker at 0, still an episode from 0
    with mjarchive.create(tmp_path / "a.zarr", chain_bundle(1), world_ids=[10, 20, 30], chunk_frames=4) as w:
        w.append(np.arange(12.0), np.zeros((12, 3, 1)), reset=reset)
    with mjarchive.open(tmp_path / "a.zarr") as archive:
        assert archive.episodes(10) == [range(0, 4), range(4, 9), range(9, 12)]
        assert archive.episodes(20) == [range(0, 5), range(5, 12)]
        assert archive.episodes(30) == [range(0, 12)]
        np.testing.assert_array_equal(archive.select(worlds=[20, 10]).reset, reset[:, [1, 0]])
        with pytest.raises(SelectionError, match="not in this archive"):
            archive.episodes(40)


# -- selection errors ---------------------------------------------------------------------------------

@pytest.fixture
def small_archive(tmp_path) -> Path:
    path = tmp_path / "small.zarr"
    with mjarchive.create(path, chain_bundle(2), world_ids=[7, 42], chunk_frames=4, tracks={"reward": ()}) as w:
        w.append(np.arange(6.0), deterministic_frames(0, 6, 2, 2), reward=np.ones((6, 2)))
    return path


@pytest.mark.parametrize("worlds,frames,match", [
    ([3], None, "world 3 is not in this archive"),
    (99, None, "world 99"),
    ([7, 8], None, "world 8"),
    (slice(100, 200), None, "no recorded world ID"),
    ("7", None, "worlds must be"),
    ([7.5], None, "worlds must be"),
    (None, 6, "frame 6 is out of range"),
    (None, -7, "frame -7 is out of range"),
    (None, [0, 1, 60], "frame 60"),
    (None, slice(0, 7), "ends past"),
    (None, slice(-9, None), "starts outside"),
    (None, slice(None, None, -1), "positive step"),
    (None, [[0, 1]], "frames must be"),
    (None, np.array([0.5]), "frames must be"),
])
def test_selection_errors(small_archive, worlds, frames, match):
    with mjarchive.open(small_archive) as archive:
        with pytest.raises(SelectionError, match=match) as info:
            archive.select(worlds=worlds, frames=frames)
        assert isinstance(info.value, IndexError)  # the error also behaves as the builtin


def test_unknown_track_in_selection(small_archive):
    with mjarchive.open(small_archive) as archive:
        with pytest.raises(SelectionError, match="no track 'qvel'"):
            archive.select().track("qvel")
        with pytest.raises(AttributeError):
            archive.select().qvel


# -- append validation -----------------------------------------------------------------------------

@pytest.fixture
def writer(tmp_path):
    w = mjarchive.create(tmp_path / "w.zarr", chain_bundle(2, n_mocap=1), world_ids=[5, 6, 7],
                         chunk_frames=4, tracks={"reward": ()})
    yield w
    w.close()


def _ok_frame(**overrides):
    frame = dict(qpos=np.zeros((3, 2)), mocap_pos=np.zeros((3, 1, 3)), mocap_quat=np.ones((3, 1, 4)),
                 reward=np.zeros(3))
    frame.update(overrides)
    return frame


@pytest.mark.parametrize("overrides,match", [
    (dict(qpos=np.zeros((3, 3))), "qpos has shape"),
    (dict(qpos=np.zeros((2, 2))), "qpos has shape"),
    (dict(qpos=np.zeros(6)), "qpos must be"),
    (dict(mocap_pos=np.zeros((3, 2, 3))), "mocap_pos has shape"),
    (dict(reward=np.zeros((3, 1))), "reward has shape"),
    (dict(reset=np.zeros(4, bool)), "reset has shape"),
    (dict(qvel=np.zeros((3, 2))), "unknown track 'qvel'.*tracks="),
    (dict(mocap_quat=None), "needs 'mocap_quat'"),
    (dict(reward=None), "needs 'reward'"),
    (dict(qpos=np.array([["a", "b"]] * 3)), "must be numeric"),
])
def test_append_shape_and_track_errors(writer, overrides, match):
    with pytest.raises(AppendError, match=match):
        writer.append(1.0, **_ok_frame(**overrides))
    assert writer.n_frames == 0
    writer.append(1.0, **_ok_frame())  # the writer is still usable
    assert writer.n_frames == 1


def test_non_finite_error_names_frame_and_world(writer):
    writer.append(0.0, **_ok_frame())
    qpos = np.zeros((3, 3, 2))
    qpos[2, 1, 1] = np.nan
    with pytest.raises(AppendError, match=r"qpos is not finite at frame 3, world 6.*check_finite=False"):
        writer.append(np.array([1.0, 2.0, 3.0]), qpos, mocap_pos=np.zeros((3, 3, 1, 3)),
                      mocap_quat=np.ones((3, 3, 1, 4)), reward=np.zeros((3, 3)))
    mocap = np.zeros((3, 1, 3))
    mocap[0, 0, 2] = np.inf
    with pytest.raises(AppendError, match="mocap_pos is not finite at frame 1, world 5"):
        writer.append(1.0, **_ok_frame(mocap_pos=mocap))
    assert writer.n_frames == 1


def test_values_that_overflow_the_stored_dtype_are_refused(writer):
    with pytest.raises(AppendError, match=r"qpos is not finite at frame 0, world 7 \(as stored in float32\)"):
        writer.append(1.0, **_ok_frame(qpos=np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 1e39]])))
    assert writer.n_frames == 0


def test_large_tracks_get_shards_readers_accept(tmp_path):
    # 512 frames of a 64x64x3 uint8 image per world is 6 MiB: 256 worlds per shard would be 1.5 GiB.
    with mjarchive.create(tmp_path / "img.zarr", chain_bundle(1), n_worlds=64, tracks={"img": ((64, 64, 3), "uint8")},
                          chunk_frames=512) as w:
        w.append(0.0, np.zeros((64, 1)), img=np.full((64, 64, 64, 3), 7, np.uint8))
    with mjarchive.open(tmp_path / "img.zarr") as archive:
        assert archive.manifest.shard_worlds < 64 and archive.verify().ok
        assert (archive.select(worlds=[63]).img == 7).all()
    with pytest.raises(MjArchiveError, match="smaller chunk_frames"):
        mjarchive.create(tmp_path / "huge.zarr", chain_bundle(1), n_worlds=1, chunk_frames=65536,
                         tracks={"img": ((64, 64, 3), "uint8")})


def test_check_finite_opt_out(tmp_path):
    with mjarchive.create(tmp_path / "nan.zarr", chain_bundle(1), n_worlds=1, check_finite=False) as w:
        w.append(0.0, np.array([[np.nan]]))
    with mjarchive.open(tmp_path / "nan.zarr") as archive:
        assert np.isnan(archive.select().qpos).all()


@pytest.mark.parametrize("times", [[2.0, 2.0], [3.0, 1.0], [np.nan], [np.inf]])
def test_time_must_strictly_increase_and_be_finite(writer, times):
    writer.append(1.5, **_ok_frame())
    k = len(times)
    with pytest.raises(AppendError, match="time must"):
        writer.append(np.array(times), np.zeros((k, 3, 2)), mocap_pos=np.zeros((k, 3, 1, 3)),
                      mocap_quat=np.ones((k, 3, 1, 4)), reward=np.zeros((k, 3)))
    with pytest.raises(AppendError, match="strictly increase"):
        writer.append(1.5, **_ok_frame())
    writer.append(1.6, **_ok_frame())
    assert writer.n_frames == 2


def test_time_shape_mismatch(writer):
    with pytest.raises(AppendError, match="k times"):
        writer.append(np.array([1.0, 2.0]), np.zeros((3, 3, 2)))


# -- background errors and lifecycle ------------------------------------------------------------------

def test_background_error_surfaces_on_next_call_and_close(tmp_path):
    path = tmp_path / "broken.zarr"
    writer = mjarchive.create(path, chain_bundle(2), n_worlds=2, chunk_frames=2)
    # Sabotage the store: a file where the chunk directory must go makes every chunk write fail.
    shutil.rmtree(path / "qpos" / "c", ignore_errors=True)
    (path / "qpos" / "c").write_bytes(b"not a directory")
    writer.append(np.arange(4.0), np.zeros((4, 2, 2)))  # fills two chunks: the writes fail in the background
    with pytest.raises(MjArchiveError, match="failed in the background"):
        writer.flush()
    with pytest.raises(MjArchiveError, match="failed in the background"):
        writer.append(10.0, np.zeros((2, 2)))
    with pytest.raises(MjArchiveError, match="failed in the background"):
        writer.close()
    with pytest.raises(ClosedError):
        writer.append(11.0, np.zeros((2, 2)))
    with mjarchive.open(path) as archive:
        assert archive.n_frames == 0  # nothing was committed


def test_use_after_close(small_archive, tmp_path):
    archive = mjarchive.open(small_archive)
    selection = archive.select(worlds=[7])
    archive.close()
    for action in (lambda: archive.select(), lambda: selection.qpos, archive.refresh):
        with pytest.raises(ClosedError, match="closed"):
            action()
    archive.close()  # closing twice is fine

    w = mjarchive.create(tmp_path / "c.zarr", chain_bundle(2), n_worlds=2)
    w.close()
    w.close()
    with pytest.raises(ClosedError, match="mode='a'"):
        w.append(0.0, np.zeros((2, 2)))
    with pytest.raises(ClosedError):
        w.flush()


def test_backpressure_with_tiny_queue(tmp_path):
    with mjarchive.create(tmp_path / "bp.zarr", chain_bundle(3), n_worlds=4, chunk_frames=3,
                          max_pending_bytes=64) as w:
        for i in range(50):
            w.append(float(i), deterministic_frames(i, i + 1, 4, 3)[0])
    with mjarchive.open(tmp_path / "bp.zarr") as archive:
        np.testing.assert_array_equal(archive.select().qpos, deterministic_frames(0, 50, 4, 3))


def test_blocks_fill_chunk_buffers_in_place_and_a_refused_block_leaves_none(tmp_path):
    """append() copies into the writer's chunk buffers (the caller's array is free again at once); a
    block may span several; a block refused after part of it was copied appends nothing."""
    W, nq, cf = 3, 2, 4
    frames = deterministic_frames(0, 40, W, nq)
    times = np.arange(40) / 30
    with mjarchive.create(tmp_path / "s.zarr", chain_bundle(nq), n_worlds=W, chunk_frames=cf,
                          max_pending_bytes=1) as w:  # two chunk buffers, the least
        reused = frames[:3].copy()
        w.append(times[:3], reused)
        reused[:] = -1.0  # what was appended is already stored in the writer
        w.append(times[3:13], frames[3:13])  # rows 3, 4-7, 8-11 and 12: three buffers' worth
        bad = frames[13:23].astype(np.float64)
        bad[7, 1, 0] = 1e39  # finite in float64, inf once stored as float32, in the block's third buffer
        with pytest.raises(AppendError, match="frame 20, world 1"):
            w.append(times[13:23], bad)
        assert w.n_frames == 13
        w.flush()  # the partly filled chunk is stored and committed; the writer keeps filling it
        assert w.n_committed == 13
        bad = frames[13:18].copy()
        bad[4, 2, 1] = np.nan  # a short block: copied in place, refused in the buffer taken for its end
        with pytest.raises(AppendError, match="frame 17, world 2"):
            w.append(times[13:18], bad)
        w.append(times[13:23], frames[13:23].astype(np.float64))
        for f in range(23, 40):
            w.append(times[f], frames[f])
        assert w._n_buffers == 2  # memory stays bounded by max_pending_bytes (at least two buffers)
    with mjarchive.open(tmp_path / "s.zarr") as archive:
        np.testing.assert_array_equal(archive.select().qpos, frames)
        np.testing.assert_array_equal(archive.select().time, times)


def test_create_refuses_existing_and_bad_arguments(small_archive, tmp_path):
    with pytest.raises(ArchiveExistsError, match="overwrite=True"):
        mjarchive.create(small_archive, chain_bundle(2), n_worlds=1)
    with pytest.raises(MjArchiveError, match="world_ids"):
        mjarchive.create(tmp_path / "x.zarr", chain_bundle(2), world_ids=[1, 1])
    with pytest.raises(MjArchiveError, match="dtype"):
        mjarchive.create(tmp_path / "x.zarr", chain_bundle(2), n_worlds=1, dtype="float16")
    with pytest.raises(MjArchiveError, match="track name"):
        mjarchive.create(tmp_path / "x.zarr", chain_bundle(2), n_worlds=1, tracks={"../x": ()})
    with pytest.raises(MjArchiveError, match="mode"):
        mjarchive.open(small_archive, mode="w")
    with pytest.raises(mjarchive.ArchiveNotFoundError):
        mjarchive.open(tmp_path / "absent.zarr")
    with mjarchive.create(small_archive, chain_bundle(3), n_worlds=1, overwrite=True) as w:
        w.append(0.0, np.zeros((1, 3)))
    with mjarchive.open(small_archive) as archive:
        assert archive.nq == 3 and archive.n_frames == 1


def test_create_writes_each_key_once_and_reads_nothing_it_wrote(tmp_path, monkeypatch, humanoid_xml):
    from mjarchive.archive.storage import local

    events = []
    write_file, read_file = local.write_file, local.read_file
    monkeypatch.setattr(local, "write_file", lambda root, key, *a, **k: (events.append(("w", key)),
                                                                        write_file(root, key, *a, **k))[1])
    monkeypatch.setattr(local, "read_file", lambda root, key, *a, **k: (events.append(("r", key)),
                                                                      read_file(root, key, *a, **k))[1])
    mjarchive.create(tmp_path / "a.zarr", humanoid_xml, n_worlds=3, tracks={"reward": ()}).close()
    events.clear()  # again over the closed archive, whose files the new one replaces
    writer = mjarchive.create(tmp_path / "a.zarr", humanoid_xml, n_worlds=3, tracks={"reward": ()},
                              overwrite=True)
    during_create = list(events)
    writer.close()
    written = [key for op, key in during_create if op == "w"]
    assert {"zarr.json", "model/zarr.json", "model/xml/zarr.json", "qpos/zarr.json", "reward/zarr.json"} <= set(written)
    assert len(written) == len(set(written)), f"written more than once: {written}"
    read_back = [key for i, (op, key) in enumerate(during_create) if op == "r" and ("w", key) in during_create[:i]]
    assert not read_back, f"read back after writing: {read_back}"
    assert written[-1] == "zarr.json"  # the root document last: before it, the folder is no archive


def test_create_failing_part_way_leaves_no_archive(tmp_path, monkeypatch):
    from mjarchive.archive.storage import local

    write_file = local.write_file

    def full_disk_at_qpos(root, key, *args, **kwargs):
        if key == "qpos/zarr.json":
            raise OSError(28, "No space left on device")
        return write_file(root, key, *args, **kwargs)

    path = tmp_path / "a.zarr"
    monkeypatch.setattr(local, "write_file", full_disk_at_qpos)
    with pytest.raises(OSError, match="No space"):
        mjarchive.create(path, chain_bundle(2), n_worlds=2)
    assert not (path / "zarr.json").exists()
    with pytest.raises(mjarchive.ArchiveNotFoundError):
        mjarchive.open(path)
    monkeypatch.setattr(local, "write_file", write_file)
    with pytest.raises(ArchiveExistsError, match="holds no archive.*overwrite=True"):  # nothing deleted unasked
        mjarchive.create(path, chain_bundle(2), n_worlds=2)
    with mjarchive.create(path, chain_bundle(2), n_worlds=2, overwrite=True) as w:  # the lease was let go
        w.append(0.0, np.ones((2, 2)))
    with mjarchive.open(path) as archive:
        assert archive.n_frames == 1 and archive.verify().ok


def test_an_overwrite_failing_part_way_leaves_no_archive(tmp_path, monkeypatch):
    from mjarchive.archive.storage import local

    path = tmp_path / "a.zarr"
    with mjarchive.create(path, chain_bundle(2), n_worlds=2) as w:
        w.append(0.0, np.ones((2, 2)))
    delete = local._delete

    def stuck_at_qpos(root, key, **kwargs):
        if key == "qpos":
            raise PermissionError(13, "Permission denied", key)
        return delete(root, key, **kwargs)

    async def listed_as_object_stores_do(self, prefix):  # sorted by name: "zarr.json" after "qpos"
        for name in sorted(os.listdir(self.root / prefix)):
            yield name

    monkeypatch.setattr(local, "_delete", stuck_at_qpos)
    monkeypatch.setattr(local.SafeLocalStore, "list_dir", listed_as_object_stores_do)
    with pytest.raises(PermissionError):
        mjarchive.create(path, chain_bundle(3), n_worlds=2, overwrite=True)
    assert (path / "qpos").is_dir()  # the old archive was partly deleted: its root document first
    with pytest.raises(mjarchive.ArchiveNotFoundError):
        mjarchive.open(path)


def test_archive_metadata_and_model(tmp_path, humanoid_xml):
    with mjarchive.create(tmp_path / "h.zarr", humanoid_xml, world_ids=[7, 42], output_fps=25.0,
                          playback_speed=0.5, chunk_frames=4) as w:
        w.append(0.0, np.zeros((2, 28)))
    with mjarchive.open(tmp_path / "h.zarr") as archive:
        assert (archive.nq, archive.nmocap, archive.n_worlds) == (28, 0, 2)
        assert archive.output_fps == 25.0 and archive.playback_speed == 0.5
        assert archive.timestep == 0.005
        assert archive.cameras == ModelBundle.from_file(humanoid_xml).layout.cameras and archive.cameras
        assert archive.bundle == ModelBundle.from_file(humanoid_xml)
        assert archive.model().nq == 28


def test_xarray_opens_tracks_with_named_dimensions(small_archive):
    xr = pytest.importorskip("xarray")
    ds = xr.open_zarr(small_archive, consolidated=False)
    assert ds["qpos"].dims == ("frame", "world", "q")
    assert ds["reward"].dims == ("frame", "world")
    assert ds["reset"].dims == ("frame", "world")
    assert ds["time"].dims == ("frame",)
    assert ds["world_id"].dims == ("world",)
    np.testing.assert_array_equal(ds["qpos"].isel(world=1).values, deterministic_frames(0, 6, 2, 2)[:, 1])
    np.testing.assert_array_equal(ds["world_id"].values, [7, 42])
