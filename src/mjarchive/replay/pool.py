"""The warm pool of render worker processes, kept across `render` calls in one process, and how
many workers a render is worth.

A spawned worker costs about a second before its first frame (Python, MuJoCo, the archive, a GL
context): as much as rendering a few hundred small frames. So `render` sizes the pool by the
work (`choose_workers`), starts it before planning, renders in its own process until a worker
answers (`Lease.ready`), and keeps the pool for the next call. `close()` (also run at interpreter
exit) shuts it down. Thread-safe: renders in several threads share the pool; a pool that is
replaced (another size) or closed while in use shuts down when its last render is done.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

__all__ = ["Lease", "lease", "close", "cpu_count", "choose_workers", "warm_workers"]

#: Seconds from starting a fresh pool to its workers' first frames (spawn, imports, archive, GL
#: context), and for a warm pool's workers to open an archive, compile its model and make a
#: renderer (measured on the 2-core dev VM with llvmpipe, other jobs running).
START_S = {"cold": 1.5, "warm": 0.5}
#: Estimated seconds per rendered frame: a fixed part and a part per pixel (llvmpipe,
#: quality='fast', humanoid: ~9 ms at 120x160 on a busy 2-core VM; a GPU driver is faster, so
#: this errs towards fewer workers, and the parent renders until a worker answers anyway).
FRAME_S, PIXEL_S = 1e-3, 4e-7
#: What each extra worker adds to the speed of one: software GL already spreads one renderer over
#: the cores, and this process encodes the video on them too.
EFFICIENCY = 0.5
#: Extra workers must pay for their start-up this many times over.
MARGIN = 1.5

_LOCK = threading.Lock()
_CURRENT: _Pool | None = None


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def init_worker(gl_threads: int, started=None) -> None:
    """Pool worker set-up: software GL (Mesa llvmpipe) would start one raster thread per core in
    every worker; share the cores instead. No effect on GPU drivers or when the user set it.
    `started` (a shared counter) tells the parent that this worker got past start-up."""
    os.environ.setdefault("LP_NUM_THREADS", str(gl_threads))
    if started is not None:
        with started.get_lock():
            started.value += 1


class _Pool:
    def __init__(self, workers: int):
        ctx = multiprocessing.get_context("spawn")
        self.workers = workers
        self.started = ctx.Value("i", 0)  # workers that got past start-up (see render._pool_broken)
        self.executor = ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker,
                                            initargs=(max(1, cpu_count() // workers), self.started))
        self.users = 0
        self.retired = False
        self.answered = False  # a task came back: the workers are up

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def warm_workers() -> int:
    """Workers of the warm pool (0: none)."""
    with _LOCK:
        return 0 if _CURRENT is None or _CURRENT.retired else _CURRENT.workers


def choose_workers(n_frames: int, size: tuple[int, int], n_units: int, max_workers: int | None = None) -> int:
    """The default worker count for rendering `n_frames` frames of `size` (H, W) in `n_units` units:
    1 (render in this process) unless the work saved by k workers pays for their start-up (none
    left to pay when a warm pool of k is there)."""
    k = min(max_workers or cpu_count(), n_units)
    if k < 2:
        return 1
    work = n_frames * (FRAME_S + PIXEL_S * size[0] * size[1])
    start = START_S["warm" if warm_workers() == k else "cold"]
    saved = work * (1 - 1 / (1 + (k - 1) * EFFICIENCY))
    return k if saved > MARGIN * start else 1


class Lease:
    """One render's use of the pool: `executor`, `ready()` once a worker has answered (until then
    the caller renders in its own process), and `release()` when done."""

    def __init__(self, pool: _Pool, warm: Callable[[], object] | None):
        self._pool = pool
        self.executor = pool.executor
        self.started = pool.started
        # One warm-up per worker, ahead of the units: each opens the archive and compiles its model
        # while this process plans.
        self._warmups: list[Future] = [] if warm is None else [self.executor.submit(warm) for _ in range(pool.workers)]
        self._released = False

    def ready(self) -> bool:
        if not self._pool.answered and any(f.done() for f in self._warmups):
            self._pool.answered = True  # a failed warm-up also answers: the units will raise it
        return self._pool.answered or not self._warmups

    def wait_answered(self) -> None:
        """Wait until a worker answers; BrokenProcessPool if none could start."""
        if self.broken():
            raise BrokenProcessPool("a worker process died")
        if self.ready():
            return
        wait(self._warmups, return_when=FIRST_COMPLETED)
        for f in self._warmups:
            if f.done() and not f.cancelled():
                f.result()
        self.ready()

    def broken(self) -> bool:
        """True when the pool can no longer run work (a worker died); it is then replaced next time."""
        return bool(getattr(self.executor, "_broken", False))

    def release(self, *, broken: bool = False) -> None:
        if self._released:
            return
        self._released = True
        for f in self._warmups:
            f.cancel()
        with _LOCK:
            pool = self._pool
            pool.users -= 1
            if broken or self.broken():
                _retire(pool)
            done = pool.retired and pool.users == 0
        if done:
            pool.shutdown()


def _retire(pool: _Pool) -> None:
    global _CURRENT
    pool.retired = True
    if _CURRENT is pool:
        _CURRENT = None


def lease(workers: int, warm: Callable[[], object] | None = None) -> Lease:
    """A lease on the warm pool of `workers` processes, started now if there is none of that size
    (a pool of another size is replaced). `warm`: a picklable task each worker runs first."""
    global _CURRENT
    old = None
    with _LOCK:
        if _CURRENT is not None and (_CURRENT.workers != workers or getattr(_CURRENT.executor, "_broken", False)):
            old = _CURRENT
            _retire(old)
            old = old if old.users == 0 else None  # else its last user shuts it down
        if _CURRENT is None:
            _CURRENT = _Pool(workers)
        pool = _CURRENT
        pool.users += 1
    if old is not None:
        old.shutdown()
    try:
        return Lease(pool, warm)
    except BaseException:  # a pool that broke meanwhile: let the next lease replace it
        with _LOCK:
            pool.users -= 1
            _retire(pool)
            done = pool.users == 0
        if done:
            pool.shutdown()
        raise


def close() -> None:
    """Shut the warm pool down (its worker processes exit); renders still using it finish first.
    The next render starts a new one if it needs one."""
    with _LOCK:
        pool = _CURRENT
        if pool is None:
            return
        _retire(pool)
        done = pool.users == 0
    if done:
        pool.shutdown()


atexit.register(close)
