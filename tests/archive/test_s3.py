"""Archives on object storage: the same API on `file://`, `memory://` and `s3://` URLs.

The S3 tests talk HTTP to a real moto S3 server that the suite starts on 127.0.0.1
(tests/s3_server.py); the request counts come from that server's own log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import mjarchive
from mjarchive._errors import ArchiveExistsError, ArchiveNotFoundError, MjArchiveError
from s3_server import s3_server, s3_url  # noqa: F401  (pytest fixtures)

NQ = 28  # the humanoid


def qpos_frames(start: int, stop: int, n_worlds: int) -> np.ndarray:
    """Deterministic, smooth qpos for frames [start, stop): (stop - start, n_worlds, NQ) float32."""
    f = np.arange(start, stop, dtype=np.float64)[:, None, None]
    w = np.arange(n_worlds)[None, :, None]
    q = np.arange(NQ)[None, None, :]
    return np.sin(0.05 * f + 0.7 * w + 0.3 * q).astype(np.float32)


def times(start: int, stop: int) -> np.ndarray:
    return 0.02 * np.arange(start + 1, stop + 1)


@pytest.fixture(params=["file", "memory", "s3"])
def location(request, tmp_path):
    """(url, storage_options) for one archive on each kind of store."""
    if request.param == "file":
        return f"file://{tmp_path}/run.mjarchive", None
    if request.param == "memory":
        return f"memory://mjarchive-test-{uuid.uuid4().hex}", None
    server = request.getfixturevalue("s3_server")
    return request.getfixturevalue("s3_url"), server.storage_options()


def test_create_append_reopen_select_verify(location, humanoid_xml):
    url, so = location
    ids = [7, 42, 3]
    writer = mjarchive.create(url, humanoid_xml, world_ids=ids, chunk_frames=8, tracks={"reward": ()},
                              storage_options=so)
    q = qpos_frames(0, 26, 3)
    reward = q[:, :, 0] * 2
    reset = np.zeros((26, 3), bool)
    reset[12, 1] = True
    for i in range(5):
        writer.append(times(i, i + 1)[0], q[i], reset=reset[i], reward=reward[i])
    writer.append(times(5, 20), q[5:20], reset=reset[5:20], reward=reward[5:20])
    writer.flush()
    assert writer.n_committed == 20

    live = mjarchive.open(url, storage_options=so)
    assert (live.n_frames, live.status, live.world_ids) == (20, "live", tuple(ids))
    np.testing.assert_array_equal(live.select(worlds=[42], frames=slice(4, 18)).qpos, q[4:18, 1:2])

    writer.append(times(20, 26), q[20:26], reset=reset[20:26], reward=reward[20:26])
    writer.close()
    assert live.refresh() == 26 and live.status == "finalized"

    with mjarchive.open(url, storage_options=so) as archive:
        assert archive.n_frames == 26 and archive.nq == NQ
        np.testing.assert_array_equal(archive.time, times(0, 26))
        sel = archive.select(worlds=[3, 7], frames=np.array([25, 0, 9]))
        np.testing.assert_array_equal(sel.qpos, q[[25, 0, 9]][:, [2, 0]])
        np.testing.assert_array_equal(sel.track("reward"), reward[[25, 0, 9]][:, [2, 0]])
        assert archive.episodes(42) == [range(0, 12), range(12, 26)]
        assert archive.episodes(7) == [range(0, 26)]
        assert archive.model().nq == NQ
        report = archive.verify()
        assert report.ok, str(report)


def test_resume_appends_after_last_committed_frame(location, humanoid_xml):
    url, so = location
    with mjarchive.create(url, humanoid_xml, n_worlds=2, chunk_frames=4, storage_options=so) as w:
        w.append(times(0, 11), qpos_frames(0, 11, 2))
    with mjarchive.open(url, mode="a", storage_options=so) as w:
        assert w.n_committed == 11
        w.append(times(11, 17), qpos_frames(11, 17, 2))
    with mjarchive.open(url, storage_options=so) as archive:
        assert archive.n_frames == 17
        np.testing.assert_array_equal(archive.select().qpos, qpos_frames(0, 17, 2))
        assert archive.verify().ok


def test_existing_archive_is_not_replaced_without_overwrite(location, humanoid_xml):
    url, so = location
    with mjarchive.create(url, humanoid_xml, n_worlds=1, storage_options=so) as w:
        w.append(times(0, 3), qpos_frames(0, 3, 1))
    with pytest.raises(ArchiveExistsError, match="overwrite=True"):
        mjarchive.create(url, humanoid_xml, n_worlds=1, storage_options=so)
    with mjarchive.open(url, storage_options=so) as archive:
        assert archive.n_frames == 3  # untouched
    with mjarchive.create(url, humanoid_xml, n_worlds=2, overwrite=True, storage_options=so) as w:
        w.append(times(0, 1), qpos_frames(0, 1, 2))
    with mjarchive.open(url, storage_options=so) as archive:
        assert (archive.n_frames, archive.n_worlds) == (1, 2)


def test_s3_prefix_with_foreign_objects_counts_as_existing(s3_server, s3_url, humanoid_xml):
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_server.storage_options())
    fs.pipe(s3_url + "/notes.txt", b"someone else's data")
    with pytest.raises(ArchiveExistsError):
        mjarchive.create(s3_url, humanoid_xml, n_worlds=1, storage_options=s3_server.storage_options())
    assert fs.cat(s3_url + "/notes.txt") == b"someone else's data"


def test_s3_missing_archive_bucket_and_endpoint_are_clear_errors(s3_server, s3_url, humanoid_xml):
    so = s3_server.storage_options()
    with pytest.raises(ArchiveNotFoundError, match="no archive"):
        mjarchive.open(s3_url, storage_options=so)
    with pytest.raises(ArchiveNotFoundError):
        mjarchive.open(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/run.mjarchive", storage_options=so)
    with pytest.raises(ArchiveNotFoundError):
        mjarchive.open(s3_url, mode="a", storage_options=so)
    with pytest.raises(ArchiveNotFoundError, match="bucket"):
        mjarchive.create(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/run.mjarchive", humanoid_xml,
                         n_worlds=1, storage_options=so)
    dead = s3_server.storage_options(endpoint_url="http://127.0.0.1:9",
                                     config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2})
    with pytest.raises(MjArchiveError, match="endpoint_url"):
        mjarchive.open(s3_url, storage_options=dead)


def test_storage_options_on_a_local_path_are_refused(tmp_path, humanoid_xml):
    with pytest.raises(MjArchiveError, match="storage_options"):
        mjarchive.create(tmp_path / "a.mjarchive", humanoid_xml, n_worlds=1, storage_options={"key": "x"})


def test_s3_commit_record_is_written_after_the_chunks(s3_server, s3_url, humanoid_xml):
    """On the wire: within one flush, every chunk PUT completes before the PUT of the commit
    document (`_commit/zarr.json`, format 1.1); the root zarr.json is not rewritten while live."""
    so = s3_server.storage_options()
    prefix = "/" + s3_url.removeprefix("s3://")
    with mjarchive.create(s3_url, humanoid_xml, n_worlds=3, chunk_frames=4, storage_options=so) as w:
        for start in (0, 6):  # a partial chunk, then one that completes a chunk and starts the next
            mark = s3_server.mark()
            w.append(times(start, start + 6), qpos_frames(start, start + 6, 3))
            w.flush()
            puts = [r["path"] for r in s3_server.requests(mark) if r["method"] == "PUT"]
            # Split the PUTs at each commit record: every commit follows PUTs of the chunks it
            # covers, and no chunk is written after the last commit of the flush.
            commits = [i for i, p in enumerate(puts) if p == prefix + "/_commit/zarr.json"]
            assert len(commits) == 2, puts  # one full chunk, then the rest at flush()
            assert prefix + "/zarr.json" not in puts, puts
            segments = [puts[a + 1:b] for a, b in zip([-1, *commits], [*commits, len(puts)])]
            assert all(any("/qpos/c/" in p for p in seg) for seg in segments[:-1]), puts
            assert not any("/c/" in p for p in segments[-1]), puts


def test_s3_live_reader_never_sees_uncommitted_frames(s3_server, s3_url, humanoid_xml):
    import threading

    so = s3_server.storage_options()
    n_worlds, total = 2, 40
    q = qpos_frames(0, total, n_worlds)
    writer = mjarchive.create(s3_url, humanoid_xml, n_worlds=n_worlds, chunk_frames=4, storage_options=so)

    def produce():
        for i in range(total):
            writer.append(times(i, i + 1)[0], q[i])
            if i % 3 == 2:
                writer.flush()
        writer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    seen = []
    with mjarchive.open(s3_url, storage_options=so) as reader:
        while True:
            finished = not thread.is_alive()
            n = reader.refresh()
            if n:
                np.testing.assert_array_equal(reader.select(frames=slice(max(0, n - 5), n)).qpos,
                                              q[max(0, n - 5):n])
            seen.append(n)
            if finished:
                break
    thread.join()
    assert seen[-1] == total and seen == sorted(seen)
    assert len(set(seen)) > 2  # the reader really polled a growing archive


_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mjarchive
    sys.path[:0] = [sys.argv[3], sys.argv[4]]
    from test_s3 import qpos_frames, times
    url, so = sys.argv[1], json.loads(sys.argv[2])
    # The killed writer's lease has not expired yet: a resume after a crash takes it over.
    w = mjarchive.open(url, mode="a", take_over=True, storage_options=so)
    print("started", flush=True)
    for i in range(w.n_committed, 100000):
        w.append(times(i, i + 1)[0], qpos_frames(i, i + 1, 3)[0])
        if i % 2:
            w.flush()
""")


@pytest.mark.slow
def test_s3_survives_kill_9_and_resumes(s3_server, s3_url, humanoid_xml):
    """A child appends to S3 and is SIGKILLed at a random moment, twice, resuming each time."""
    so = s3_server.storage_options()
    mjarchive.create(s3_url, humanoid_xml, n_worlds=3, chunk_frames=4, storage_options=so).close()
    rng = np.random.default_rng()
    for _ in range(2):
        child = subprocess.Popen([sys.executable, "-c", _CHILD, s3_url, json.dumps(so), os.path.dirname(__file__),
                                  os.path.dirname(os.path.dirname(__file__))],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.3, 1.5))
        child.send_signal(signal.SIGKILL)
        child.wait()
        with mjarchive.open(s3_url, storage_options=so) as archive:
            n = archive.n_frames
            assert archive.status == "live"
            assert archive.verify().ok
            np.testing.assert_array_equal(archive.select().qpos, qpos_frames(0, n, 3))
    with mjarchive.open(s3_url, mode="a", take_over=True, storage_options=so) as w:
        w.append(times(n, n + 5), qpos_frames(n, n + 5, 3))
    with mjarchive.open(s3_url, storage_options=so) as archive:
        assert archive.n_frames == n + 5 and n > 0
        np.testing.assert_array_equal(archive.select().qpos, qpos_frames(0, n + 5, 3))


def _shard_index(blob: bytes, n_inner: int) -> np.ndarray:
    """(offset, nbytes) of each inner chunk from a shard's trailing index (uint64 pairs + crc32c)."""
    index_size = n_inner * 16 + 4
    return np.frombuffer(blob[-index_size:-4], dtype="<u8").reshape(n_inner, 2)


def test_s3_one_world_selection_fetches_only_that_worlds_chunks(s3_server, s3_url, humanoid_xml):
    """Count the server's GETs: metadata, then per shard its index and one inner chunk, by byte range."""
    import s3fs

    so = s3_server.storage_options()
    ids = [10, 11, 12, 13]
    with mjarchive.create(s3_url, humanoid_xml, world_ids=ids, chunk_frames=8, storage_options=so) as w:
        w.append(times(0, 20), qpos_frames(0, 20, 4))  # 3 frame chunks; all 4 worlds share each shard
    prefix = "/" + s3_url.removeprefix("s3://")

    mark = s3_server.mark()
    with mjarchive.open(s3_url, storage_options=so) as archive:
        qpos = archive.select(worlds=[12]).qpos
    log = s3_server.requests(mark)
    np.testing.assert_array_equal(qpos, qpos_frames(0, 20, 4)[:, 2:3])

    assert {r["method"] for r in log} == {"GET"} and all(not r["query"] for r in log), log  # no HEAD, no LIST
    metadata = [r for r in log if r["path"].endswith("/zarr.json")]
    data = [r for r in log if not r["path"].endswith("/zarr.json")]
    assert all(r["range"] is None for r in metadata)
    assert {r["path"].removeprefix(prefix) for r in metadata} <= {
        "/zarr.json", "/qpos/zarr.json", "/time/zarr.json", "/reset/zarr.json", "/world_id/zarr.json"}

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **so)
    shards = [f"/qpos/c/{i}/0/0" for i in range(3)]
    expected, needed = set(), 0
    index_size = 4 * 16 + 4
    for key in shards:
        offset, nbytes = _shard_index(fs.cat(s3_url + key), 4)[2]  # world 12 is the third world
        expected |= {(prefix + key, f"bytes=-{index_size}"), (prefix + key, f"bytes={offset}-{offset + nbytes - 1}")}
        needed += int(nbytes) + index_size
    assert {(r["path"], r["range"]) for r in data} == expected
    assert len(data) == len(expected) == 6
    fetched = sum(r["length"] for r in data)
    assert fetched == needed
    shard_bytes = sum(fs.size(s3_url + key) for key in shards)
    assert fetched < shard_bytes / 2, (fetched, shard_bytes)

    # The log is not blind: reading every world fetches every inner chunk of every shard.
    mark = s3_server.mark()
    with mjarchive.open(s3_url, storage_options=so) as archive:
        archive.select().qpos
    data_all = [r for r in s3_server.requests(mark) if not r["path"].endswith("/zarr.json")]
    assert sum(r["length"] for r in data_all) >= shard_bytes - 3 * index_size


def test_s3_render_two_frames_matches_local_archive(s3_server, s3_url, humanoid_xml, tmp_path):
    """render() and iter_frames() take the URL and storage_options; pixels equal a local copy's."""
    iio = pytest.importorskip("imageio.v2")
    so = s3_server.storage_options()
    q = qpos_frames(0, 2, 2).astype(np.float64) * 0.2
    q[:, :, 2] += 1.3  # the humanoid's free joint: stand above the floor
    local = tmp_path / "local.mjarchive"
    for loc, opts in ((s3_url, so), (local, None)):
        with mjarchive.create(loc, humanoid_xml, world_ids=[5, 9], dtype="float64", storage_options=opts) as w:
            w.append(times(0, 2), q)
    kw = dict(worlds=[9], camera="back", size=(48, 64), quality="fast")
    remote = [rgb for _, _, rgb in mjarchive.iter_frames(s3_url, storage_options=so, **kw)]
    there = [rgb for _, _, rgb in mjarchive.iter_frames(local, **kw)]
    assert len(remote) == 2 and remote[0].shape == (48, 64, 3) and remote[0].std() > 0
    np.testing.assert_array_equal(np.stack(remote), np.stack(there))
    (video,) = mjarchive.render(s3_url, tmp_path / "out", worlds=[9], cameras=["back"], size=(48, 64),
                                quality="fast", workers=1, progress=False, storage_options=so)
    assert video.name == "world-0009_cam-back.mp4"
    with iio.get_reader(video, format="FFMPEG") as reader:
        decoded = np.stack([frame for frame in reader.iter_data()])
    assert decoded.shape == (2, 48, 64, 3)
