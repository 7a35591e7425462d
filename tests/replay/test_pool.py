"""Render worker pool: sized by the work, kept warm across calls, handed units once it answers,
shut down cleanly; a warm worker never renders a stale copy of a rewritten archive."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mjarchive
from mjarchive.replay import pool
from mjarchive.replay.render import _run_ordered, close_pool
from mjarchive.testing import decode_video

XML = """<mujoco><worldbody><light pos="0 0 3"/><geom type="plane" size="2 2 .1"/>
<camera name="cam" pos="0 -2 1" xyaxes="1 0 0 0 .45 1"/>
<body><freejoint/><geom type="box" size=".2 .2 .2" rgba="1 .3 .2 1"/></body></worldbody></mujoco>"""


def test_default_workers_follow_the_work(monkeypatch):
    monkeypatch.setattr(pool, "cpu_count", lambda: 4)
    monkeypatch.setattr(pool, "warm_workers", lambda: 0)
    assert pool.choose_workers(96, (120, 160), 4) == 1  # 2 worlds x 48 frames: start-up would cost more
    assert pool.choose_workers(9600, (120, 160), 300) == 4
    assert pool.choose_workers(10**6, (480, 640), 1) == 1  # one unit: one worker
    assert pool.choose_workers(10**6, (480, 640), 3) == 3
    cold = min(n for n in range(1, 10**5, 10) if pool.choose_workers(n, (120, 160), 100) > 1)
    monkeypatch.setattr(pool, "warm_workers", lambda: 4)
    warm = min(n for n in range(1, 10**5, 10) if pool.choose_workers(n, (120, 160), 100) > 1)
    assert warm < cold  # a warm pool has no start-up left to pay


def test_units_stay_here_until_the_pool_answers():
    ready = threading.Event()
    here = threading.current_thread()
    where = {}

    def fn(u):
        where[u] = threading.current_thread() is here
        if u == 2:
            ready.set()
        return u * 10

    with ThreadPoolExecutor(2) as ex:
        out = list(_run_ordered(range(12), ex, 3, fn=fn, ready=ready.is_set))
    assert out == [u * 10 for u in range(12)]  # in order
    assert where[0] and where[1] and where[2]  # rendered here while no worker had answered
    assert not any(where[u] for u in range(6, 12))  # then handed to the pool


def test_replaced_or_closed_pool_shuts_down_after_its_last_user():
    close_pool()
    first = pool.lease(2)  # no task submitted: no process is started
    second = pool.lease(3)  # another size replaces it; `first` is still in use
    assert pool.warm_workers() == 3 and not first.executor._shutdown_thread
    first.release()
    assert first.executor._shutdown_thread  # its last user is done
    close_pool()
    assert not second.executor._shutdown_thread and pool.warm_workers() == 0
    second.release()
    assert second.executor._shutdown_thread


def _write(path, xml_path, heights):
    with mjarchive.create(path, xml_path, n_worlds=2, overwrite=True) as w:
        for f, z in enumerate(heights):
            q = np.zeros((2, 7))
            q[:, 2], q[:, 3] = z, 1.0
            q[1, 0] = 0.3
            w.append(f / 30, q)


def _frames(out):
    return {p.name: decode_video(p)[0] for p in sorted(out.glob("*.mp4"))}


def test_warm_pool_is_reused_and_sees_a_rewritten_archive(tmp_path):
    close_pool()
    xml = tmp_path / "box.xml"
    xml.write_text(XML)
    path = tmp_path / "a.mjarchive"
    kw = dict(cameras="cam", size=(24, 32), quality="fast", progress=False, resume=False)
    _write(path, xml, [0.2, 0.3, 0.4])
    mjarchive.render(path, tmp_path / "p1", workers=2, **kw)
    procs = dict(pool._CURRENT.executor._processes)
    assert len(procs) == 2
    _write(path, xml, [0.9, 1.0, 1.1])  # same path, same model, other motion
    mjarchive.render(path, tmp_path / "p2", workers=2, **kw)
    assert dict(pool._CURRENT.executor._processes).keys() == procs.keys()  # the same, warm workers
    mjarchive.render(path, tmp_path / "one", workers=1, **kw)
    new, one, old = _frames(tmp_path / "p2"), _frames(tmp_path / "one"), _frames(tmp_path / "p1")
    assert new.keys() == one.keys() and len(new) == 2
    for name in new:
        np.testing.assert_array_equal(new[name], one[name])
        assert not np.array_equal(new[name], old[name])
    close_pool()
    for p in procs.values():
        p.join(timeout=10)
        assert not p.is_alive()  # no leaked processes
    assert pool.warm_workers() == 0


class _FakeArchive:
    n_frames = 10

    def __init__(self, location):
        self.location, self.closed = location, False

    def close(self):
        self.closed = True


def _in_fresh_thread(fn):
    """Run fn in a new thread: the worker caches are per thread, so it starts with empty ones."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised here, where pytest sees it
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_warm_worker_closes_archives_it_no_longer_caches(monkeypatch):
    """A new render call (session) closes the previous call's archive of that location; evicted
    archives are closed; an archive lent by the caller is never closed by the cache."""
    from mjarchive.replay import worker

    monkeypatch.setattr(worker, "open_archive", lambda location, storage_options=None: _FakeArchive(location))

    def scenario():
        first = worker._open("a", None, "s1")
        assert worker._open("a", None, "s1") is first and not first.closed  # the same call: reused
        second = worker._open("a", None, "s2")  # the next render call replaces it
        assert first.closed and not second.closed and len(worker._cache("archives")) == 1
        others = [worker._open(loc, None, "s2") for loc in "bcde"]  # a fifth archive evicts the oldest
        assert second.closed and not any(o.closed for o in others)
        lent = _FakeArchive("f")
        with worker.lend_archive(lent, "f", None, "s3"):
            assert worker._open("f", None, "s3") is lent
            for loc in "ghijk":
                worker._open(loc, None, "s3")  # evicts the lent archive from the cache: not closed
            worker._open("f", None, "s4")
        assert not lent.closed
        return True

    assert _in_fresh_thread(scenario)


@pytest.fixture(autouse=True)
def _no_pool_left():
    yield
    close_pool()
