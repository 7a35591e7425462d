"""Faults on object storage: every entry point retries transient faults and finishes with the right data,
or fails with a StorageError naming the object within a bounded time; never hangs, never commits a
frame whose chunks failed to store, never returns a damaged read as data.

The S3 traffic crosses a fault-injecting TCP proxy (tests/fault_proxy.py) in front of the real moto
server (tests/s3_server.py): connection resets, `503 SlowDown`, stalled answers and bodies cut short.
The clients' timeouts are made small through storage_options (1 s read timeout), so a stall costs
about a second per attempt.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

import mjarchive
from mjarchive import StorageError
from fault_proxy import MODES, FaultProxy
from s3_server import s3_server  # noqa: F401  (pytest fixture)

NQ = 28  # the humanoid
WORLDS = [3, 9]
BOUND_S = 30.0  # a permanent fault fails within this (generous: the retries take ~1-15 s here)


def qpos_frames(start: int, stop: int) -> np.ndarray:
    f = np.arange(start, stop, dtype=np.float64)[:, None, None]
    w = np.arange(len(WORLDS))[None, :, None]
    q = np.arange(NQ)[None, None, :]
    return np.sin(0.05 * f + 0.7 * w + 0.3 * q).astype(np.float32)


def times(start: int, stop: int) -> np.ndarray:
    return 0.02 * np.arange(start + 1, stop + 1)


@pytest.fixture(scope="module")
def proxy(s3_server):
    p = FaultProxy(s3_server.endpoint_url).start()
    yield p
    p.stop()


@pytest.fixture(autouse=True)
def _no_faults_left(proxy):
    proxy.clear()
    yield
    proxy.clear()


@pytest.fixture
def faulty(s3_server, proxy):
    """storage_options that reach moto through the proxy, with a 1 s connect and read timeout."""
    return s3_server.storage_options(endpoint_url=proxy.endpoint_url,
                                     config_kwargs={"connect_timeout": 1, "read_timeout": 1})


def new_url(s3_server) -> str:
    bucket = f"mjarchive-faults-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/run.mjarchive"


@pytest.fixture(scope="module")
def archive_url(s3_server, humanoid_xml):
    """20 frames of 2 worlds in chunks of 8, written straight to moto (no faults)."""
    url = new_url(s3_server)
    with mjarchive.create(url, humanoid_xml, world_ids=WORLDS, chunk_frames=8,
                          storage_options=s3_server.storage_options()) as w:
        w.append(times(0, 20), qpos_frames(0, 20))
    return url


class within:
    """`with within(BOUND_S): ...` fails the test if the block took longer (a generous bound, not a timing test)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.monotonic() - self.t0
        assert self.elapsed < self.seconds, f"took {self.elapsed:.1f} s, beyond the {self.seconds} s bound"


# -- reading: open, select, verify ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_transient_read_faults_are_retried(mode, proxy, faulty, archive_url):
    proxy.inject(mode, times=1, method="GET", stall_s=2)  # the first read of open()
    proxy.inject(mode, times=2, method="GET", path="/qpos/c", stall_s=2)  # the first two chunk reads
    with within(BOUND_S):
        archive = mjarchive.open(archive_url, storage_options=faulty)
        np.testing.assert_array_equal(archive.select(worlds=[9], frames=slice(2, 18)).qpos, qpos_frames(2, 18)[:, 1:])
        report = archive.verify()
    assert report.ok, str(report)
    assert proxy.faults() == [mode] * 3


@pytest.mark.parametrize("mode", MODES)
def test_permanent_read_faults_fail_clearly(mode, proxy, faulty, archive_url):
    # A stall costs the 1 s read timeout per attempt, and s3fs nests its attempts around botocore's
    # (3 x 3 x 3 for a GET): one s3fs attempt keeps this test short (the deadline test covers the rest).
    archive = mjarchive.open(archive_url, storage_options={**faulty, "retries": 1} if mode == "stall" else faulty)
    proxy.inject(mode, times=None, method="GET", path="/qpos/c", stall_s=2)
    with within(BOUND_S), pytest.raises(StorageError, match=r"'qpos/c/.*of 's3://.*retry later"):
        archive.select(worlds=[3], frames=slice(0, 20)).qpos
    assert proxy.faults()
    if mode in ("reset", "truncate"):  # verify() raises too, it does not report the archive damaged
        with within(BOUND_S), pytest.raises(StorageError):
            archive.verify()
    proxy.clear()
    np.testing.assert_array_equal(archive.select(worlds=[3]).qpos, qpos_frames(0, 20)[:, :1])


def test_open_against_a_dead_endpoint_fails_clearly(proxy, faulty, archive_url):
    proxy.inject("reset", times=None)
    with within(BOUND_S), pytest.raises(StorageError, match=r"'zarr\.json' of 's3://.*endpoint_url"):
        mjarchive.open(archive_url, storage_options=faulty)


def test_bodies_cut_short_are_never_data(proxy, faulty, archive_url):
    """The first answer for every object stops half way (its headers promise the full length): each is
    retried, and what is read is exactly what was written. (Faulting every other request instead let a
    read and all its retries land on faulted turns when requests interleaved under load: a flaky test.)"""
    archive = mjarchive.open(archive_url, storage_options=faulty)
    proxy.inject("truncate", times=None, first_per_path=True, method="GET")
    q = qpos_frames(0, 20)
    with within(BOUND_S):
        for lo in range(0, 20, 8):
            frames = slice(lo, min(lo + 8, 20))
            np.testing.assert_array_equal(archive.select(frames=frames).time, times(0, 20)[frames])
            for i, w in enumerate(WORLDS):
                np.testing.assert_array_equal(archive.select(worlds=[w], frames=frames).qpos, q[frames, i:i + 1])
    assert proxy.faults().count("truncate") >= 6


def test_total_timeout_bounds_an_operation(proxy, faulty, archive_url):
    """A stall outlasting every retry is cut by storage_options total_timeout, whatever the attempts left."""
    archive = mjarchive.open(archive_url, storage_options={**faulty, "total_timeout": 1.5})
    proxy.inject("stall", times=None, method="GET", path="/qpos/c", stall_s=5)
    with within(10), pytest.raises(StorageError, match=r"within 1\.5 s"):
        archive.select(worlds=[3]).qpos


# -- render -----------------------------------------------------------------------------------------------------------

def _render(url, out, so):
    return mjarchive.render(url, out, worlds=[9], frames=slice(0, 2), size=(16, 16), quality="fast", workers=1,
                            cameras=["free"], progress=False, storage_options=so)


@pytest.mark.parametrize("mode", ["reset", "slowdown", "truncate"])
def test_render_retries_transient_faults(mode, proxy, faulty, archive_url, tmp_path):
    proxy.inject(mode, times=2, method="GET", path="/qpos/c")
    with within(BOUND_S):
        paths = _render(archive_url, tmp_path, faulty)
    assert len(paths) == 1 and paths[0].stat().st_size > 0
    assert proxy.faults() == [mode, mode]


def test_render_fails_clearly_on_a_permanent_fault(proxy, faulty, archive_url, tmp_path):
    proxy.inject("reset_mid", times=None, method="GET", path="/qpos/c")
    with within(BOUND_S), pytest.raises(StorageError, match="qpos/c/"):
        _render(archive_url, tmp_path, faulty)


# -- refresh: a reader (the viewer's Follow live) polling a live archive ----------------------------------------

def test_follow_live_rides_out_faults(s3_server, proxy, faulty, humanoid_xml):
    from mjarchive.viewer.frames import PoseWindow

    url = new_url(s3_server)
    writer = mjarchive.create(url, humanoid_xml, world_ids=WORLDS, chunk_frames=8,
                              storage_options=s3_server.storage_options())
    q = qpos_frames(0, 40)
    writer.append(times(0, 8), q[:8])
    writer.flush()
    archive = mjarchive.open(url, storage_options=faulty)
    window = PoseWindow(archive, archive.model(), WORLDS, [], prefetch=False)
    try:
        for i, mode in enumerate(MODES[:4], start=1):  # each poll meets a transient fault
            writer.append(times(8 * i, 8 * i + 8), q[8 * i:8 * i + 8])
            writer.flush()
            proxy.inject(mode, times=1, method="GET", stall_s=2)
            with within(BOUND_S):
                assert window.refresh() == 8 * i + 8
            np.testing.assert_array_equal(archive.select(frames=[-1]).qpos, q[8 * i + 7:8 * i + 8])
            window.poses(8 * i + 7)
        assert proxy.faults() == list(MODES[:4])
        # A permanent fault: refresh fails clearly and keeps the last accepted state; then recovers.
        proxy.inject("reset", times=None, method="GET")
        with within(BOUND_S), pytest.raises(StorageError, match="'zarr.json' of 's3://.*retry later"):
            window.refresh()
        assert window.n_frames == archive.n_frames == 40
        proxy.clear()
        writer.close()
        assert window.refresh() == 40 and archive.status == "finalized"
    finally:
        window.close()
        writer.close()


# -- appending: chunks, then the commit ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_append_retries_transient_faults(mode, s3_server, proxy, faulty, humanoid_xml):
    url = new_url(s3_server)
    q = qpos_frames(0, 24)
    with within(BOUND_S):
        with mjarchive.create(url, humanoid_xml, world_ids=WORLDS, chunk_frames=8, storage_options=faulty) as w:
            proxy.inject(mode, times=2, method="PUT", path="/qpos/c", stall_s=2)
            proxy.inject(mode, times=1, method="PUT", path="_commit/", stall_s=2)
            w.append(times(0, 24), q)
            w.flush()
            assert w.n_committed == 24
    assert proxy.faults() == [mode] * 3
    with mjarchive.open(url, storage_options=s3_server.storage_options()) as archive:
        assert archive.n_frames == 24
        np.testing.assert_array_equal(archive.select().qpos, q)


@pytest.mark.parametrize("mode", ["reset_mid", "stall"])
def test_a_chunk_that_cannot_be_stored_is_never_committed(mode, s3_server, proxy, faulty, humanoid_xml):
    """reset_mid: each PUT reaches the store, its answer is lost; stall: no PUT is answered."""
    url = new_url(s3_server)
    q = qpos_frames(0, 32)
    so = {**faulty, "retries": 1} if mode == "stall" else faulty  # 3 attempts of 1 s rather than 9
    w = mjarchive.create(url, humanoid_xml, world_ids=WORLDS, chunk_frames=8, storage_options=so)
    w.append(times(0, 16), q[:16])
    w.flush()
    since = len(proxy.requests)
    proxy.inject(mode, times=None, method="PUT", path="/qpos/c", stall_s=2)
    w.append(times(16, 32), q[16:])
    with within(BOUND_S), pytest.raises(StorageError, match=r"'qpos/c/.*frames committed: 16"):
        w.flush()
    assert w.n_committed == 16
    with pytest.raises(StorageError):
        w.close()
    commits = [p for m, p, _ in proxy.requests[since:] if m == "PUT" and "_commit" in p]
    assert not commits, "committed after a failed chunk"
    proxy.clear()
    with mjarchive.open(url, storage_options=s3_server.storage_options()) as archive:
        assert archive.n_frames == 16
        np.testing.assert_array_equal(archive.select().qpos, q[:16])
        assert archive.verify().ok


def test_a_commit_that_cannot_be_stored_leaves_the_last_one(s3_server, proxy, faulty, humanoid_xml):
    url = new_url(s3_server)
    q = qpos_frames(0, 16)
    so = {**faulty, "retries": 1}  # 3 attempts with botocore's backoff rather than 9
    w = mjarchive.create(url, humanoid_xml, world_ids=WORLDS, chunk_frames=8, storage_options=so)
    w.append(times(0, 8), q[:8])
    w.flush()
    proxy.inject("slowdown", times=None, method="PUT", path="_commit/")
    w.append(times(8, 16), q[8:])
    with within(BOUND_S), pytest.raises(StorageError, match=r"'_commit/zarr\.json'.*frames committed: 8"):
        w.flush()
    with pytest.raises(StorageError):
        w.close()
    proxy.clear()
    with mjarchive.open(url, storage_options=s3_server.storage_options()) as archive:
        assert archive.n_frames == 8
        np.testing.assert_array_equal(archive.select().qpos, q[:8])


def test_a_create_that_fails_writes_nothing_after_it_raised(s3_server, proxy, faulty, humanoid_xml):
    """create() writes a new archive's objects concurrently: one that cannot be stored fails it, and every
    other write has ended (here one retried after a stall) before it raises; the root document is never
    written, so the location holds no archive."""
    url = new_url(s3_server)
    proxy.inject("reset", times=None, method="PUT", path="/qpos/zarr.json")
    proxy.inject("stall", times=1, method="PUT", path="/time/zarr.json", stall_s=2)
    with within(BOUND_S), pytest.raises(StorageError, match="qpos/zarr.json"):
        mjarchive.create(url, humanoid_xml, world_ids=WORLDS, tracks={"reward": ()},
                         storage_options={**faulty, "retries": 1})
    seen = len(proxy.requests)
    time.sleep(3)  # longer than the stall and a retry after it
    assert proxy.requests[seen:] == [], "written after create() raised"
    assert ("PUT", next(p for m, p, _ in proxy.requests if p.endswith("/time/zarr.json")), None) in proxy.requests
    assert not any(p.endswith("run.mjarchive/zarr.json") for m, p, _ in proxy.requests if m == "PUT")
    proxy.clear()
    with pytest.raises(mjarchive.ArchiveNotFoundError):
        mjarchive.open(url, storage_options=s3_server.storage_options())
    with pytest.raises(mjarchive.ArchiveExistsError, match="holds no archive"):
        mjarchive.create(url, humanoid_xml, world_ids=WORLDS, storage_options=s3_server.storage_options())


# -- the defaults -------------------------------------------------------------------------------------------------

def test_defaults_are_bounded_and_overridable(s3_server, archive_url):
    from mjarchive.archive.storage.locations import make_store

    store = make_store(archive_url, read_only=True, storage_options=s3_server.storage_options())
    fs = store._store.fs
    assert fs.config_kwargs == {"connect_timeout": 5, "read_timeout": 10,
                                "retries": {"mode": "standard", "total_max_attempts": 3}}
    assert fs.retries == 3 and store._remote.total_timeout == 60
    so = s3_server.storage_options(config_kwargs={"read_timeout": 2}, retries=2, total_timeout=7)
    store = make_store(archive_url, read_only=True, storage_options=so)
    assert store._store.fs.config_kwargs["read_timeout"] == 2  # merged key by key: the retry policy stays
    assert store._store.fs.config_kwargs["retries"] == {"mode": "standard", "total_max_attempts": 3}
    assert store._store.fs.retries == 2 and store._remote.total_timeout == 7
    for bad in ({"total_timeout": 0}, {"total_timeout": "1"}, {"retries": 0}):
        with pytest.raises(mjarchive.MjArchiveError, match=next(iter(bad))):
            mjarchive.open(archive_url, storage_options=s3_server.storage_options(**bad))
