"""Object-store I/O in bounded time: fsspec defaults and a deadline on each store operation.

An object store fails in ways a disk does not: connections reset, `503 SlowDown`, answers that stall
or stop half way. Each layer handles what it sees:

- botocore (through s3fs's `config_kwargs`) times out a connect after `connect_timeout` and a socket
  read after `read_timeout`, and retries resets, timeouts, 500/502/503/504 and throttling (`SlowDown`)
  with exponential backoff and jitter (the "standard" mode, capped at 20 s), `total_max_attempts`
  attempts in all;
- s3fs retries a whole request whose body stopped short or stalled (`retries` attempts; s3fs nests a
  second such loop around each read, so a GET that keeps failing is tried up to retries**2 times
  botocore's attempts), and `SlowDown` that outlasted botocore's attempts;
- `Remote.call` bounds each store operation, every retry included, by `total_timeout` seconds, and
  turns whatever failure remains into a `StorageError` naming the object: nothing a failed request
  returned is passed on as data (aiohttp refuses a body shorter than its `Content-Length`), and the
  writer commits no frame after a chunk write that failed.

The defaults, overridable in `storage_options`: connect 5 s, read 10 s (no byte for 10 s is an
endpoint in trouble, not a slow link), 3 botocore attempts, 3 s3fs attempts (a body cut short is
retried by s3fs alone, so at least 2), 60 s per operation (a shard of tens of MB over a link slower
than ~1 MB/s needs a larger `total_timeout`).
"""

from __future__ import annotations

import asyncio
import copy
import math
from dataclasses import dataclass
from typing import Any

from ..._errors import MjArchiveError, StorageError

__all__ = ["Remote", "fsspec_options", "is_transport_error"]

#: Seconds one store operation may take, every retry included (storage_options["total_timeout"]).
TOTAL_TIMEOUT_S = 60.0
#: s3fs's own attempts per request (storage_options["retries"]; s3fs takes it as an attribute only).
S3_RETRIES = 3
_S3_CONFIG = {"connect_timeout": 5, "read_timeout": 10,
              "retries": {"mode": "standard", "total_max_attempts": 3}}
# - max_concurrency=1: s3fs otherwise sends a HEAD before every whole-object GET (to decide on a
#   parallel download), doubling metadata round trips for objects that are at most a few MiB.
# - use_listings_cache=False: a cached listing could hide keys a live writer added since.
_FSSPEC_DEFAULTS: dict[str, dict[str, Any]] = {
    "s3": {"max_concurrency": 1, "use_listings_cache": False, "config_kwargs": _S3_CONFIG},
    "s3a": {"max_concurrency": 1, "use_listings_cache": False, "config_kwargs": _S3_CONFIG},
}
# Exceptions of these libraries are failures of the transport, not of mjarchive's logic.
_TRANSPORT_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3", "s3fs", "fsspec", "gcsfs", "adlfs")


@dataclass(frozen=True)
class Remote:
    """How a CheckedStore bounds and reports the operations of the object store it wraps."""

    where: str  # the archive's URL, for messages
    total_timeout: float = TOTAL_TIMEOUT_S

    async def call(self, op: str, key: str, awaitable: Any) -> Any:
        """Await one store operation (`op` of object `key`: "reading", "writing"...) within the deadline;
        a transport failure left after the retries becomes a StorageError."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            return await asyncio.wait_for(awaitable, self.total_timeout)
        except BaseException as exc:
            if isinstance(exc, TimeoutError) and loop.time() - start >= self.total_timeout:
                raise StorageError(
                    f"{op} {key!r} of {self.where} got no complete answer within {self.total_timeout:g} s (retries "
                    "included); the object store is unreachable or overloaded: retry later, and check "
                    "storage_options (endpoint_url, total_timeout) and the network") from exc
            if is_transport_error(exc):
                raise self.error(op, key, exc) from exc
            raise

    async def iterate(self, op: str, key: str, iterator: Any) -> Any:
        """An async iterator's items (a listing), each page within the deadline."""
        it = iterator.__aiter__()
        while True:
            try:
                item = await self.call(op, key, it.__anext__())
            except StopAsyncIteration:
                return
            yield item

    def error(self, op: str, key: str, exc: BaseException) -> StorageError:
        reason = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PermissionError):
            hint = "check the credentials in storage_options (key/secret) or the environment"
        else:
            hint = ("the object store kept failing after retries: retry later, and check storage_options "
                    "(endpoint_url, timeouts) and the network")
        return StorageError(f"{op} {key!r} of {self.where} failed ({reason}); {hint}")


def is_transport_error(exc: BaseException) -> bool:
    """Whether `exc` is a failure to talk to the store (after its retries), not absence or a bug."""
    if isinstance(exc, MjArchiveError) or isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, OSError):  # connection errors, timeouts, and what s3fs translates errors to
        return True
    return any(cls.__module__.split(".")[0] in _TRANSPORT_MODULES for cls in type(exc).__mro__)


def fsspec_options(url: str, protocol: str, storage_options: dict | None) -> tuple[dict, Remote, int | None]:
    """The fsspec filesystem's options (mjarchive's defaults under the caller's, `config_kwargs`
    merged key by key), the deadline (`total_timeout`, taken out) and s3fs's `retries` (taken out)."""
    given = dict(storage_options or {})
    total = given.pop("total_timeout", TOTAL_TIMEOUT_S)
    if isinstance(total, bool) or not isinstance(total, (int, float)) or not (0 < total < math.inf):
        raise MjArchiveError(f"storage_options total_timeout must be a positive number of seconds, got {total!r}")
    retries = None
    defaults = copy.deepcopy(_FSSPEC_DEFAULTS.get(protocol, {}))  # the filesystem keeps what it is given
    if protocol in ("s3", "s3a"):
        retries = given.pop("retries", S3_RETRIES)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 1 <= retries <= 100:
            raise MjArchiveError(f"storage_options retries (s3fs's attempts per request) must be an integer from 1 "
                                 f"to 100, got {retries!r}")
    options = {**defaults, **given}
    if isinstance(defaults.get("config_kwargs"), dict) and isinstance(given.get("config_kwargs"), dict):
        options["config_kwargs"] = {**defaults["config_kwargs"], **given["config_kwargs"]}
    return options, Remote(repr(url), float(total)), retries
