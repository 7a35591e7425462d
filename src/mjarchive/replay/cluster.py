"""Rendering on a Dask cluster: connect to a scheduler or start a local cluster, and hand `render`
a `concurrent.futures.Executor` (Dask's `client.get_executor()`).

Dask is imported only here, only when asked for. Work units (`worker.RenderUnit`) are plain data
that name the archive by path or URL, so Dask ships them between our own processes and each worker
opens the archive itself; pixels come back to the parent, which encodes them in order.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import Any

from .._errors import BackendError, MjArchiveError

__all__ = ["dask_executor", "executor_slots"]


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise BackendError(
            f"rendering on a Dask cluster needs dask.distributed ({exc}); install it with "
            "pip install 'mjarchive[dask]'"
        ) from None
    return distributed


@contextlib.contextmanager
def dask_executor(scheduler: str | None = None, *, n_workers: int | None = None,
                  connect_timeout: float = 30.0) -> Iterator[Executor]:
    """An Executor that runs render units on Dask; the client (and a local cluster) close on exit.

    scheduler: address of a running dask.distributed scheduler (`tcp://HOST:PORT`). Without it, a
    local cluster is started: `n_workers` worker processes (default one per core), one thread
    each, listening on 127.0.0.1 only, no dashboard. connect_timeout: seconds to wait for the
    scheduler.

    Example::

        with dask_executor("tcp://10.0.0.5:8786") as ex:
            mjarchive.render("s3://runs/a.mjarchive", "videos", executor=ex, storage_options=so)
    """
    distributed = _import_distributed()
    with contextlib.ExitStack() as stack:
        if scheduler is None:
            n = max(1, int(n_workers or os.cpu_count() or 1))
            cluster = stack.enter_context(distributed.LocalCluster(
                n_workers=n, processes=True, threads_per_worker=1, host="127.0.0.1", scheduler_port=0,
                dashboard_address=None, silence_logs=logging.ERROR,
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},  # its health/metrics routes: loopback, any port
                # Software GL (Mesa llvmpipe) starts a raster thread per core in every worker: share.
                env={"LP_NUM_THREADS": os.environ.get("LP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))},
            ))
            address = cluster.scheduler_address
        else:
            if not isinstance(scheduler, str) or "://" not in scheduler:
                raise MjArchiveError(f"scheduler address {scheduler!r} must look like tcp://HOST:PORT")
            address = scheduler
        try:
            client = distributed.Client(address, timeout=connect_timeout, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise BackendError(
                f"cannot connect to the Dask scheduler at {address} within {connect_timeout:g} s ({exc}); "
                "check the address, or start one with `dask scheduler` and workers with `dask worker ADDRESS`"
            ) from None
        stack.enter_context(client)
        if scheduler is not None and not client.scheduler_info().get("workers"):
            # Units would wait forever; say so instead of hanging silently.
            try:
                client.wait_for_workers(1, timeout=connect_timeout)
            except (OSError, TimeoutError):
                raise BackendError(
                    f"the Dask scheduler at {address} has no workers; start some with `dask worker {address}`"
                ) from None
        # pure=False: units are not hashed to task keys (a unit may carry a model of several MB).
        yield client.get_executor(pure=False)


def executor_slots(executor: Executor) -> int | None:
    """How many units the executor runs at once, if it can tell: a stdlib pool's workers, or the
    total worker threads of a Dask client's cluster. Sizes the window of units kept in flight."""
    n = getattr(executor, "_max_workers", None)
    if isinstance(n, int) and n > 0:
        return n
    client = getattr(executor, "_client", None)
    if client is not None and hasattr(client, "nthreads"):
        try:
            total = sum(int(v) for v in client.nthreads().values())
        except Exception:  # a scheduler that does not answer: fall back to the default window
            return None
        return total or None
    return None
