"""One writer per archive, enforced (spec "Writer lease"): a second writer is refused with the first
one's host and pid, a killed writer never blocks a resume, readers are never blocked, and on S3 a
lease taken over (after it expired, or by force) fences its old writer before it writes.

Writers run in real child processes where a process matters (the lock of a local disk belongs to
its process); the S3 tests talk to the real moto server of tests/s3_server.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import mjarchive
from mjarchive import FormatError, WriterLockedError
from s3_server import s3_server, s3_url  # noqa: F401  (pytest fixtures)

HINGE = """<mujoco><worldbody><body><joint name="hinge" axis="0 0 1"/><geom size="0.1"/></body>
</worldbody></mujoco>"""
W = 2


def frames(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(time, qpos) of frames [start, stop): qpos (k, W, 1) float32, exact."""
    f = np.arange(start, stop, dtype=np.float64)
    q = (f[:, None, None] / 8 + np.arange(W)[None, :, None]).astype(np.float32)
    return (f + 1) / 32, q


def new_archive(location, n: int, **kwargs) -> None:
    with mjarchive.create(location, mjarchive.ModelBundle.from_xml(HINGE), n_worlds=W, chunk_frames=4,
                          **kwargs) as w:
        w.append(*frames(0, n))


def assert_frames(location, n: int, **kwargs) -> None:
    with mjarchive.open(location, **kwargs) as archive:
        assert archive.n_frames == n
        np.testing.assert_array_equal(archive.select().qpos, frames(0, n)[1])
        np.testing.assert_array_equal(archive.time, frames(0, n)[0])


# A writer in another process: appends 5 frames, flushes, says "ready", waits for a line on stdin,
# then appends 5 more and closes.
_CHILD = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [sys.argv[3], sys.argv[4]]
    import mjarchive
    from test_single_writer import frames
    url, options = sys.argv[1], json.loads(sys.argv[2])
    w = mjarchive.open(url, mode="a", **options)
    n = w.n_committed
    w.append(*frames(n, n + 5))
    w.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        w.append(*frames(n + 5, n + 10))
        w.close()
    except mjarchive.WriterLockedError as exc:
        print("fenced", exc, flush=True)
    else:
        print("done", flush=True)
""")


def start_writer(location, **options) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(location), json.dumps(options), os.path.dirname(__file__),
                              os.path.dirname(os.path.dirname(__file__))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline().strip()
    if line != "ready":
        child.kill()
        child.wait()
        pytest.fail(f"writer process did not start (said {line!r})")
    return child


def finish(child: subprocess.Popen, said: str = "done") -> str:
    out, _ = child.communicate("go\n", timeout=120)
    assert child.returncode == 0 and out.strip().startswith(said), out
    return out


# -- local disk ----------------------------------------------------------------------------------------
def test_second_writer_process_is_refused_and_readers_are_not(tmp_path):
    path = tmp_path / "run.mjarchive"
    new_archive(path, 3)
    child = start_writer(path)
    try:
        with pytest.raises(WriterLockedError) as refused:
            mjarchive.open(path, mode="a")
        message = str(refused.value)
        assert f"pid {child.pid}" in message and repr(socket.gethostname()) in message
        assert "crashed" in message  # says a crashed writer would not block
        with pytest.raises(WriterLockedError):
            mjarchive.create(path, mjarchive.ModelBundle.from_xml(HINGE), n_worlds=W, overwrite=True)
        assert_frames(path, 8)  # readers open and read while the writer holds the lease
    finally:
        finish(child)
    assert_frames(path, 13)  # nothing lost or overwritten
    with mjarchive.open(path, mode="a") as w:  # free again once the first writer closed
        w.append(*frames(13, 14))
    assert_frames(path, 14)


def test_killed_writer_never_blocks_a_resume(tmp_path):
    path = tmp_path / "run.mjarchive"
    new_archive(path, 3)
    child = start_writer(path)
    child.send_signal(signal.SIGKILL)
    child.wait()
    with mjarchive.open(path, mode="a") as w:
        assert w.n_committed == 8
        w.append(*frames(8, 10))
    assert_frames(path, 10)


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_second_writer_in_the_same_process_is_refused(tmp_path, kind):
    location = tmp_path / "run.mjarchive" if kind == "file" else f"memory://single-writer-{os.getpid()}-{id(tmp_path)}"
    new_archive(location, 3)
    first = mjarchive.open(location, mode="a")
    with pytest.raises(WriterLockedError, match="already has a writer open in this process"):
        mjarchive.open(location, mode="a")
    first.append(*frames(3, 6))
    first.close()
    with mjarchive.open(location, mode="a") as w:
        assert w.n_committed == 6
    assert_frames(location, 6)


def test_a_memory_lease_taken_over_fences_its_old_writer():
    url = f"memory://single-writer-takeover-{os.getpid()}"
    new_archive(url, 3)
    old = mjarchive.open(url, mode="a")
    with mjarchive.open(url, mode="a", take_over=True) as new:
        new.append(*frames(3, 5))
    old.append(*frames(3, 9))
    with pytest.raises(WriterLockedError, match="took over"):
        old.flush()
    with pytest.raises(WriterLockedError):
        old.close()
    assert_frames(url, 5)


def test_storage_without_conditional_writes_is_written_with_a_warning():
    import zarr.storage

    store = zarr.storage.WrapperStore(zarr.storage.MemoryStore())  # no OS lock, no conditional write
    with pytest.warns(mjarchive.UnenforcedWriterWarning, match="cannot enforce one writer per archive"):
        new_archive(store, 3)
    with pytest.warns(mjarchive.UnenforcedWriterWarning):
        with mjarchive.open(store, mode="a") as w:
            w.append(*frames(3, 5))
    assert_frames(store, 5)


def test_lease_document_is_hostile_input(tmp_path):
    path = tmp_path / "run.mjarchive"
    new_archive(path, 3)
    # The document names a writer while it writes; released, it names no one.
    def lease_doc():
        doc = json.loads((path / "_writer" / "zarr.json").read_bytes())
        assert doc["node_type"] == "group" and set(doc["attributes"]["mjarchive_writer"]) == {
            "host", "pid", "started", "token", "expires"}
        return doc["attributes"]["mjarchive_writer"]

    released = {"host": "", "pid": 0, "started": "", "expires": 0}
    assert {k: v for k, v in lease_doc().items() if k != "token"} == released
    with mjarchive.open(path, mode="a"):
        assert lease_doc()["pid"] == os.getpid() and lease_doc()["host"] == socket.gethostname()
    assert {k: v for k, v in lease_doc().items() if k != "token"} == released
    # Garbage where no writer holds the lock: the lock decides, and the next writer rewrites it.
    (path / "_writer" / "zarr.json").write_bytes(b"\xff" * (128 * 1024))
    with mjarchive.open(path, mode="a") as w:
        w.append(*frames(3, 4))
        assert json.loads((path / "_writer" / "zarr.json").read_bytes())["attributes"]["mjarchive_writer"]["pid"] == os.getpid()
    assert_frames(path, 4)
    # A planted link is never followed, and readers do not look at the lease at all.
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.rename(path / "_writer", tmp_path / "old_writer")
    os.symlink(target, path / "_writer")
    with pytest.raises(FormatError, match="_writer"):
        mjarchive.open(path, mode="a")
    assert list(target.iterdir()) == []
    assert_frames(path, 4)
    os.unlink(path / "_writer")
    (path / "_writer").write_bytes(b"")  # a file where the lease's folder belongs
    with pytest.raises(FormatError, match="_writer.*is a file"):
        mjarchive.open(path, mode="a")
    assert_frames(path, 4)


# -- S3 ------------------------------------------------------------------------------------------------
def open_when_the_lease_lapses(url: str, storage_options: dict, timeout: float = 60):
    """`open(url, mode="a")`, retried while another writer's lease has not expired."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return mjarchive.open(url, mode="a", storage_options=storage_options)
        except WriterLockedError:
            assert time.monotonic() < deadline, "the lease did not lapse"
            time.sleep(0.25)


def put_lease(s3_server, url: str, *, expires, pid: int = 4242, raw: bytes | None = None) -> None:
    """A lease document as another (perhaps crashed) writer left it."""
    import s3fs

    attrs = {"host": "other-host", "pid": pid, "started": "2026-01-01T00:00:00+00:00", "token": "ab" * 16,
             "expires": expires}
    data = raw if raw is not None else json.dumps(
        {"zarr_format": 3, "node_type": "group", "attributes": {"mjarchive_writer": attrs}}).encode()
    s3fs.S3FileSystem(skip_instance_cache=True, **s3_server.storage_options()).pipe(url + "/_writer/zarr.json", data)


def test_s3_second_writer_is_refused_and_a_killed_ones_lease_expires(s3_server, s3_url):
    so = s3_server.storage_options()
    new_archive(s3_url, 3, storage_options=so)
    child = start_writer(s3_url, storage_options=so, lease_ttl=4)  # renewed each second while it runs
    try:
        with pytest.raises(WriterLockedError) as refused:
            mjarchive.open(s3_url, mode="a", storage_options=so)
        assert f"pid {child.pid}" in str(refused.value) and repr(socket.gethostname()) in str(refused.value)
        assert "expires in" in str(refused.value) and "take_over=True" in str(refused.value)
        assert_frames(s3_url, 8, storage_options=so)  # readers are not blocked
    finally:
        child.send_signal(signal.SIGKILL)  # it never releases its lease
        child.wait()
    # Once its lease expired (4 s after its last renewal), the next writer takes over by itself.
    with open_when_the_lease_lapses(s3_url, so) as w:
        assert w.n_committed == 8
        w.append(*frames(8, 9))
    assert_frames(s3_url, 9, storage_options=so)


def test_s3_expired_garbage_and_forced_leases(s3_server, s3_url):
    so = s3_server.storage_options()
    new_archive(s3_url, 3, storage_options=so)
    put_lease(s3_server, s3_url, expires=time.time() + 3600)
    with pytest.raises(WriterLockedError, match="'other-host', pid 4242.*expires in"):
        mjarchive.open(s3_url, mode="a", storage_options=so)
    for far in (1e12, 1e308):  # past year 9999: still a held lease, named, not a date error
        put_lease(s3_server, s3_url, expires=far)
        with pytest.raises(WriterLockedError, match="'other-host', pid 4242.*take_over=True"):
            mjarchive.open(s3_url, mode="a", storage_options=so)
    put_lease(s3_server, s3_url, expires=time.time() - 1)  # its writer died an hour ago
    mjarchive.open(s3_url, mode="a", storage_options=so).close()
    for raw in (b"", b"\x00garbage", b"[" * 100, b"{" + b" " * (70 * 1024) + b"}"):
        put_lease(s3_server, s3_url, expires=None, raw=raw)
        with pytest.raises(WriterLockedError, match="unknown writer.*take_over=True"):
            mjarchive.open(s3_url, mode="a", storage_options=so)
    put_lease(s3_server, s3_url, expires=time.time() + 3600)
    with mjarchive.open(s3_url, mode="a", take_over=True, storage_options=so) as w:
        w.append(*frames(3, 4))
    assert_frames(s3_url, 4, storage_options=so)


def test_s3_racing_takeovers_have_one_winner(s3_server, s3_url):
    so = s3_server.storage_options()
    new_archive(s3_url, 3, storage_options=so)
    put_lease(s3_server, s3_url, expires=time.time() - 1)
    n = 6
    barrier, results = threading.Barrier(n), [None] * n

    def take(i):
        barrier.wait()
        try:
            results[i] = mjarchive.open(s3_url, mode="a", storage_options=so)
        except WriterLockedError as exc:
            results[i] = exc

    threads = [threading.Thread(target=take, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, mjarchive.ArchiveWriter)]
    assert len(winners) == 1 and all(isinstance(r, WriterLockedError) for r in results if r is not winners[0])
    winners[0].close()


def test_s3_writer_whose_lease_was_taken_cannot_write(s3_server, s3_url):
    so = s3_server.storage_options()
    new_archive(s3_url, 3, storage_options=so)
    old = mjarchive.open(s3_url, mode="a", storage_options=so)
    old.append(*frames(3, 5))
    old.flush()
    new = mjarchive.open(s3_url, mode="a", take_over=True, storage_options=so)
    assert new.n_committed == 5
    new.append(*frames(5, 7))
    new.flush()
    mark = s3_server.mark()
    old.append(*frames(5, 9))
    with pytest.raises(WriterLockedError, match="took over"):
        old.flush()
    # Fenced before writing anything: no chunk and no commit of the old writer reached the store.
    assert [r["path"] for r in s3_server.requests(mark) if r["method"] in ("PUT", "POST", "DELETE")] == [
        "/" + s3_url.removeprefix("s3://") + "/_writer/zarr.json"]
    with pytest.raises(WriterLockedError):
        old.close()
    new.append(*frames(7, 8))
    new.close()
    assert_frames(s3_url, 8, storage_options=so)


def test_appending_to_a_1_1_archive_keeps_its_version_and_takes_the_lease(tmp_path):
    path = tmp_path / "run.mjarchive"
    new_archive(path, 3)
    doc = json.loads((path / "zarr.json").read_bytes())
    assert doc["attributes"]["mjarchive"]["format_version"] == "1.3"  # writers of 1.1 refuse to append to it
    doc["attributes"]["mjarchive"]["format_version"] = "1.1"
    (path / "zarr.json").write_text(json.dumps(doc))
    with mjarchive.open(path, mode="a") as w:
        with pytest.raises(WriterLockedError):
            mjarchive.open(path, mode="a")
        w.append(*frames(3, 5))
    with mjarchive.open(path) as archive:
        assert archive.format_version == "1.1" and archive.n_frames == 5


def test_s3_paused_writer_whose_lease_expired_writes_nothing_more(s3_server, s3_url):
    """A writer stopped (SIGSTOP: a long GC pause, a suspended VM) past its lease's expiry is taken
    over; when it runs again it refuses to write, before writing a chunk."""
    so = s3_server.storage_options()
    new_archive(s3_url, 3, storage_options=so)
    child = start_writer(s3_url, storage_options=so, lease_ttl=1)
    child.send_signal(signal.SIGSTOP)
    try:
        with open_when_the_lease_lapses(s3_url, so) as w:  # one second after its last renewal
            w.append(*frames(8, 12))
    finally:
        child.send_signal(signal.SIGCONT)
    assert "took over" in finish(child, "fenced")
    assert_frames(s3_url, 12, storage_options=so)


# -- review fixes: create holds the lease first, fences, fallbacks -------------------------------------
def test_create_holds_the_lease_before_it_writes(tmp_path, monkeypatch):
    """create(overwrite=True) takes the lease before deleting or writing anything and keeps it (and its
    `_writer` folder) while it builds: a writer opening the old archive meanwhile is refused."""
    from mjarchive.archive import writer as writer_module

    path = tmp_path / "run.mjarchive"
    new_archive(path, 3)
    (path / "_writer").mkdir(exist_ok=True)
    inode = os.stat(path / "_writer").st_ino
    build, seen = writer_module.build_archive, []

    def build_while_racing(*args, **kwargs):
        with pytest.raises(WriterLockedError, match="already has a writer open in this process"):
            mjarchive.open(path, mode="a")
        root = build(*args, **kwargs)
        with pytest.raises(WriterLockedError):
            mjarchive.open(path, mode="a")
        seen.append(os.stat(path / "_writer").st_ino)
        return root

    monkeypatch.setattr(writer_module, "build_archive", build_while_racing)
    new_archive(path, 5, overwrite=True)
    assert seen == [inode]  # the locked folder was never deleted
    assert_frames(path, 5)


def test_a_replaced_lease_folder_fences_the_local_writer(tmp_path):
    path = tmp_path / "run.mjarchive"
    new_archive(path, 3)
    w = mjarchive.open(path, mode="a")
    os.rename(path / "_writer", tmp_path / "old_writer")
    (path / "_writer").mkdir()  # what another writer, ignoring the old lock, would lock now
    w.append(*frames(3, 5))
    with pytest.raises(WriterLockedError, match="removed or replaced"):
        w.flush()
    with pytest.raises(WriterLockedError):
        w.close()
    assert_frames(path, 3)


@pytest.mark.parametrize("code", ["ENOLCK", "EOPNOTSUPP", "ENOSYS", "EINVAL", "EBADF"])
def test_a_file_system_without_locks_writes_unenforced(tmp_path, monkeypatch, code):
    import errno

    from mjarchive.archive.storage import lease

    path = tmp_path / "run.mjarchive"
    new_archive(path, 3)

    def no_lock(fd, op):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(lease.fcntl, "flock", no_lock)
    with pytest.warns(mjarchive.UnenforcedWriterWarning, match="cannot lock"):
        with mjarchive.open(path, mode="a") as w:
            w.append(*frames(3, 5))
    assert_frames(path, 5)


def test_unenforced_warning_points_at_the_caller_once():
    import warnings

    import zarr.storage

    store = zarr.storage.WrapperStore(zarr.storage.MemoryStore())
    with pytest.warns(mjarchive.UnenforcedWriterWarning):
        new_archive(store, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mjarchive.create(store, mjarchive.ModelBundle.from_xml(HINGE), n_worlds=W, overwrite=True).close()  # here
        mjarchive.open(store, mode="a").close()  # and here
    ours = [w for w in caught if issubclass(w.category, mjarchive.UnenforcedWriterWarning)]
    assert [(w.filename, w.lineno) for w in ours] == [(__file__, ours[0].lineno), (__file__, ours[0].lineno + 1)]


def test_a_memory_lease_whose_document_cannot_be_written_is_not_kept():
    import zarr.storage

    from mjarchive.archive.storage.lease import acquire_lease

    class Failing(zarr.storage.MemoryStore):
        fail = True

        async def set(self, key, value):
            if self.fail:
                raise OSError("disk full")
            await super().set(key, value)

    store = Failing()
    with pytest.raises(OSError, match="disk full"):
        acquire_lease(store, where="'x'")
    store.fail = False
    acquire_lease(store, where="'x'").release()  # not "already has a writer open"


def test_s3_failed_renewals_are_not_a_lost_lease(s3_server, s3_url):
    """Network trouble while the lease is fresh: the writer carries on (each lease request bounded in
    time); once its last renewal is older than 3/4 ttl it refuses to write, with a WriterLockedError."""
    so = s3_server.storage_options()
    new_archive(s3_url, 3, storage_options=so)
    w = mjarchive.open(s3_url, mode="a", storage_options=so, lease_ttl=8)
    lease = w._lease
    put = lease._put

    stalls = []

    async def stalled(data, etag):  # one request that never answers
        import asyncio

        if not stalls:
            stalls.append(etag)
            await asyncio.sleep(30)
        return await put(data, etag)

    lease._put = stalled
    started = time.monotonic()
    w.append(*frames(3, 5))
    lease._renewed_at -= 1  # the next beat renews now
    w.flush()  # a renewal timed out (2 s): not lost, still fresh
    assert stalls and time.monotonic() - started < 15

    async def reset(data, etag):
        raise ConnectionResetError("connection reset by peer")

    lease._put = reset
    w.append(*frames(5, 6))
    w.flush()
    lease._renewed_at -= 7  # no renewal for 7 s of 8
    w.append(*frames(6, 7))
    with pytest.raises(WriterLockedError, match="could not renew"):
        w.flush()
    with pytest.raises(WriterLockedError):
        w.close()  # never a raw transport error
    lease._put = put
    assert_frames(s3_url, 6, storage_options=so)


def test_s3_renewal_after_a_conflict_is_written_again(s3_server, s3_url):
    """A renewal whose conditional PUT failed (409) while the stored lease is still our older document
    is not taken for a renewal: it is written again, so the stored expiry is the new one."""
    from mjarchive.archive.storage import s3_lease as lease_module

    so = s3_server.storage_options()
    new_archive(s3_url, 3, storage_options=so)
    w = mjarchive.open(s3_url, mode="a", storage_options=so, lease_ttl=30)
    lease = w._lease
    put, calls = lease._put, []

    async def conflict_once(data, etag):
        calls.append(etag)
        if len(calls) == 1:
            raise lease_module._Lost()
        return await put(data, etag)

    lease._put = conflict_once
    time.sleep(0.01)
    lease.renew()
    lease._put = put
    holder, _, etag = lease._read()
    assert len(calls) == 2 and holder.token == lease.holder.token and holder.expires == lease.holder.expires
    assert etag == lease._etag
    w.close()


def test_a_shared_file_system_warns_that_the_lock_covers_this_machine_only(tmp_path, monkeypatch):
    from mjarchive.archive.storage import lease

    path = tmp_path / "run.mjarchive"
    new_archive(path, 3)
    monkeypatch.setattr(lease, "_shared_fs_type", lambda root: "nfs4")
    with pytest.warns(mjarchive.UnenforcedWriterWarning, match="nfs4 file system.*this machine only") as caught:
        w = mjarchive.open(path, mode="a")
    assert caught[0].filename == __file__
    with pytest.raises(WriterLockedError):
        mjarchive.open(path, mode="a")  # still locked here
    w.close()


def test_s3_heartbeat_renews_a_quarter_ttl_after_the_last_renewal():
    """The heartbeat counts from the last renewal, a write cycle's included, so a lease is never older
    than about ttl/4 when renewed (waking every ttl/4 and skipping a young lease let it reach ttl/2)."""
    from mjarchive.archive.storage.s3_lease import S3Lease

    lease = S3Lease.__new__(S3Lease)  # the heartbeat alone, without S3
    lease.ttl, lease._stop, lease._renewed_at, ages = 2.0, threading.Event(), time.monotonic(), []

    def renew():
        now = time.monotonic()
        ages.append(now - lease._renewed_at)
        lease._renewed_at = now

    lease._renew = renew
    beat = threading.Thread(target=lease._beat)
    beat.start()
    time.sleep(0.25)
    lease._renewed_at = time.monotonic()  # a write cycle renewed it
    time.sleep(1.6)
    lease._stop.set()
    beat.join()
    assert len(ages) >= 2 and max(ages) < 0.65, ages
