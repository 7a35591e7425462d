"""The writer lease on S3 (s3fs): the document is the lease, taken and renewed with conditional PUTs
(see lease.py for the whole scheme and spec/README.md, "Writer lease")."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from zarr.core.sync import sync

from ..._errors import ArchiveNotFoundError, FormatError, MjArchiveError, StorageError, WriterLockedError
from ..format import LEASE_GROUP, MAX_LEASE_BYTES
from .lease_record import Holder, WriterLease, iso_time
from .remote import TOTAL_TIMEOUT_S

__all__ = ["S3Lease"]


class _Lost(Exception):
    """A conditional request failed: the lease changed since we read or wrote it."""


def _s3_status(exc: BaseException) -> tuple[str, Any]:
    """(error code, HTTP status) of the botocore error behind an s3fs error; ("", None) if none."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            return (str(response.get("Error", {}).get("Code", "")),
                    response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
        seen = seen.__cause__ or seen.__context__
    return "", None


def _precondition_failed(exc: BaseException) -> bool:
    """Whether an s3fs error is S3's answer to a failed condition (412, or 409 for a concurrent one)."""
    code, status = _s3_status(exc)
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


def _unsupported(exc: BaseException) -> MjArchiveError | None:
    """A clear error where botocore is too old to send S3 conditional writes."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        if type(seen).__name__ == "ParamValidationError":
            import botocore

            return MjArchiveError(
                f"the S3 writer lease needs conditional writes (PutObject If-None-Match and If-Match, in "
                f"botocore since November 2024); this botocore {botocore.__version__} cannot send them: "
                f"upgrade s3fs and aiobotocore ({seen})")
        seen = seen.__cause__ or seen.__context__
    return None


class S3Lease(WriterLease):
    def __init__(self, fs: Any, base: str, prefix: str, where: str, take_over: bool, ttl: float,
                 total_timeout: float = TOTAL_TIMEOUT_S):
        self.fs, self.ttl, self.where = fs, ttl, where
        self.key = f"{prefix}{LEASE_GROUP}/zarr.json"
        self.bucket, self.object = fs.split_path(f"{base.rstrip('/')}/{self.key}")[:2]
        self._lock = threading.Lock()  # renewals: one at a time, each If-Match the last ETag
        self._lost: str | None = None
        self._released = False
        self.holder = Holder.new(expires=None)
        self._timeout = total_timeout  # taking the lease: the store's deadline per request
        started = time.monotonic()  # before the PUT that set `expires`: deadlines count from here
        self._etag, self._renewed_at = self._acquire(take_over), started
        # Holding it: each request within ttl/4 (at least 1 s), so that a stalled renewal, which holds
        # self._lock, never keeps check() waiting long enough for the lease to lapse unnoticed.
        self._timeout = min(total_timeout, max(ttl / 4, 1.0))
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="mjarchive-lease", daemon=True)
        self._heartbeat.start()

    # requests
    def _call(self, coro: Any) -> Any:
        """Run one lease request within self._timeout; any failure but a lost condition is a StorageError."""
        async def bounded() -> Any:
            return await asyncio.wait_for(coro, self._timeout)

        try:
            return sync(bounded())
        except (_Lost, MjArchiveError):
            raise
        except FileNotFoundError as exc:  # a missing lease document is no error: a missing bucket
            raise ArchiveNotFoundError(f"{self.where} is not reachable: {exc}; check that the bucket exists") from exc
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise StorageError(f"a request for the writer lease of {self.where} got no answer within "
                               f"{self._timeout:g} s; check the connection and storage_options") from exc
        except Exception as exc:
            raise StorageError(f"a request for the writer lease of {self.where} failed: {exc!r}; check the "
                               "connection, the credentials and storage_options") from exc

    async def _get(self) -> tuple[bytes, str] | None:
        try:  # a bounded read: one byte past the limit tells a document that is too large
            resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.object,
                                          Range=f"bytes=0-{MAX_LEASE_BYTES}")
        except FileNotFoundError:
            return None
        except Exception as exc:
            if _s3_status(exc)[1] != 416:
                raise
            # An empty object has no byte 0 to range over: read it whole (it is empty).
            resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.object)
        body = resp["Body"]
        try:
            data = await body.read(MAX_LEASE_BYTES + 1)
        finally:
            body.close()
        return data, str(resp.get("ETag", ""))

    async def _put(self, data: bytes, etag: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            resp = await self.fs._call_s3("put_object", Bucket=self.bucket, Key=self.object, Body=data,
                                          ContentType="application/json", **condition)
        except Exception as exc:
            if (unsupported := _unsupported(exc)) is not None:
                raise unsupported from None
            if _precondition_failed(exc) or (etag is not None and isinstance(exc, FileNotFoundError)):
                raise _Lost() from None
            raise
        return str(resp["ETag"])

    def _read(self) -> tuple[Holder | None, str | None, str | None]:
        """(holder or None, its problem if unreadable, ETag); all None when there is no lease."""
        found = self._call(self._get())
        if found is None:
            return None, None, None
        data, etag = found
        try:
            return Holder.parse(data), None, etag
        except FormatError as exc:
            return None, f"its lease document {str(exc)}", etag

    def _write(self, etag: str | None) -> str:
        """PUT our document (create when `etag` is None, else If-Match), expiring ttl from now.
        Raises _Lost when the condition failed and the stored lease is not ours."""
        self.holder = self.holder.renewed(round(time.time() + self.ttl, 3))
        for _ in range(3):
            try:
                return self._call(self._put(self.holder.document(), etag))
            except _Lost:
                holder, _, stored = self._read()
                if holder is None or holder.token != self.holder.token or not stored:
                    raise
                if holder.expires == self.holder.expires:
                    # A PUT that succeeded but whose answer was lost is retried by s3fs and then fails its
                    # condition: the stored lease is the one we wrote all the same.
                    return stored
                # Our own earlier document, not this one (a 409 for a concurrent request, or an answer
                # lost): no one else wrote since, so try again on its ETag.
                etag = stored
        raise _Lost()

    def _acquire(self, take_over: bool) -> str:
        for _ in range(3):
            holder, problem, etag = self._read()
            if etag is None:
                try:
                    return self._write(None)
                except _Lost:
                    continue  # created meanwhile: look at who holds it
            expired = holder is not None and holder.expires is not None and holder.expires <= time.time()
            if not (expired or take_over):
                raise WriterLockedError(self._held_message(holder, problem))
            try:
                return self._write(etag)
            except _Lost:
                continue  # another writer took it first
        holder, problem, _ = self._read()
        raise WriterLockedError(self._held_message(holder, problem, raced=True))

    def _held_message(self, holder: Holder | None, problem: str | None, raced: bool = False) -> str:
        who = holder.describe() if holder is not None else f"an unknown writer ({problem})"
        if holder is not None and holder.expires is not None:
            left = holder.expires - time.time()
            when = (f"its lease expires in {max(0.0, left):.0f} s ({iso_time(holder.expires)})" if left > 0
                    else "its lease has just expired")
        else:
            when = "its lease has no expiry time"
        return (f"{self.where} is being written by another writer ({who}){' that took the lease first' if raced else ''}; "
                f"{when}. One writer per archive at a time: readers may open it meanwhile. If that writer crashed "
                "or was killed, its lease lapses lease_ttl seconds after its last renewal (60 by default): open it "
                f"again then, or take over now with mjarchive.open(url, mode='a', take_over=True, "
                "storage_options=...) once you are sure it no longer runs (a writer that still runs may finish the "
                "write cycle it has begun, its chunks and their commit, and then writes nothing more)")

    # holding
    def _renew(self) -> None:
        with self._lock:
            if self._lost:
                raise WriterLockedError(self._lost)
            started = time.monotonic()
            try:
                self._etag = self._write(self._etag)
            except _Lost:
                try:
                    holder, problem, _ = self._read()
                except MjArchiveError:
                    holder, problem = None, "it could not be read"
                self._lost = ("another writer took over this archive's writer lease ("
                              + (holder.describe() if holder else f"{problem or 'the lease was removed'}")
                              + f") at {self.where}; this writer refuses to write. Reopen with "
                              "mjarchive.open(url, mode='a') (with part= for a part) once that writer is done")
                raise WriterLockedError(self._lost) from None
            self._renewed_at = started

    def renew(self) -> None:
        """Renew now. A request that failed (network trouble) is not a lost lease: the writer carries on
        while its last renewal is younger than 3/4 ttl, and refuses to write after that."""
        try:
            self._renew()
        except WriterLockedError:
            raise
        except MjArchiveError as exc:  # a StorageError: the lease may still be ours
            age = time.monotonic() - self._renewed_at
            if age > 0.75 * self.ttl:
                raise WriterLockedError(
                    f"this writer could not renew its lease at {self.where} for {age:.1f} s ({exc}); another "
                    "writer may take it over, so this one refuses to write (reopen with mode='a' once the "
                    "connection is back)") from exc

    def check(self) -> None:
        with self._lock:
            if self._lost:
                raise WriterLockedError(self._lost)
            stale = time.monotonic() - self._renewed_at > 0.75 * self.ttl
        if stale:  # a paused process, or renewals failing: renew now or refuse to write
            self.renew()

    def _beat(self) -> None:
        """Renew every ttl/4 after the last renewal (a write cycle's renewal counts too); after a
        failed request, try again ttl/16 later."""
        retry_at = 0.0
        while True:
            wait = max(self._renewed_at + self.ttl / 4, retry_at) - time.monotonic()
            if wait > 0:
                if self._stop.wait(wait):
                    return
                continue
            if self._stop.is_set():
                return
            try:
                self._renew()
            except WriterLockedError:
                return
            except Exception:  # network trouble: retried soon; check() refuses once stale
                retry_at = time.monotonic() + self.ttl / 16

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._stop.set()
        with self._lock:
            if self._lost:
                return
            try:  # an expired lease, naming no one: free for the next writer, still conditional on being ours
                self.holder = self.holder.released()
                self._call(self._put(self.holder.document(), self._etag))
            except Exception:
                pass  # it lapses after ttl anyway
            self._lost = "this writer released its lease"
