"""The writer lease: one writer per archive, enforced (spec/README.md, "Writer lease").

A writer takes the lease before it reads the commit record and holds it until `close()`; a second
writer is refused with `WriterLockedError` naming the first (host, pid, start time). Readers never
read or wait for it. The lease document `<prefix>_writer/zarr.json` is a Zarr v3 group document
whose attribute `mjarchive_writer` names the holder; `prefix` keys the lease, so that each part of
a multi-part archive can have its own writer.

- Local disk: an exclusive `flock` on the `_writer` directory (opened without following links),
  held for the writer's lifetime. The kernel releases it when the process ends, however it ends,
  so a crashed writer never blocks a resume; the document only names the holder for the message,
  and is rewritten as released (expires 0, no host or pid) at release. flock belongs to an open
  file description, so a second writer in the same process is refused too. `create()` takes it
  before writing anything (overwriting deletes all but `_writer`); `check()` fences a writer whose
  locked directory was removed or replaced (device and inode). A file system that cannot lock
  (ENOLCK, EOPNOTSUPP...) gets the unenforced lease and its warning; one shared between machines
  (NFS, SMB, cluster file systems, by their type in /proc/mounts) keeps the lock, which covers this
  machine only (Linux locks an NFS directory locally), and warns so. The document is written
  through the locked descriptor, never a second one of that directory (where flock is emulated
  with POSIX locks, closing any descriptor of the file would end it).
- S3 (s3fs, `s3_lease.py`): the document is the lease. It is created with a conditional PUT
  (`If-None-Match: *`) and renewed or taken over with `If-Match: <ETag>`, so of two writers racing
  for it exactly one wins. It expires `ttl` seconds after its last renewal; a heartbeat thread renews it ttl/4 after
  the last renewal, and the writer renews it again before each write cycle (chunks, then commit).
  It refuses to write once its last renewal is older than 3/4 ttl (a paused process, or renewals
  failing on the network: until then a failed renewal is not a lost one): a taker's clock may run
  up to ttl/4 ahead. Each lease request is bounded by ttl/4 (at least 1 s).
  What this does not fence: a writer whose lease is taken over with `take_over=True` between its
  renewal at the start of a write cycle and that cycle's commit still writes the cycle's chunks and
  commit (the commit record is an unconditional PUT); it fails at its next cycle. After a takeover
  of an expired lease, chunk PUTs sent before the old writer's lease went stale may still land.
- Memory stores: an in-process registry.

A lease document that is not a valid one (too large, not JSON, wrong types) is hostile input: on a
local disk, where the lock decides, it is overwritten by the writer that gets the lock; on S3 it is
treated as held by an unknown writer, and only `take_over=True` replaces it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import sys
import threading
import warnings
from typing import Any

import zarr.storage
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ..._errors import ArchiveNotFoundError, FormatError, MjArchiveError, StorageError, UnenforcedWriterWarning, WriterLockedError
from ..format import LEASE_GROUP, MAX_LEASE_BYTES
from .checked import CheckedStore
from .prefixed import PrefixStore
from .lease_record import DEFAULT_LEASE_TTL, Holder, WriterLease, check_ttl
from .local import SafeLocalStore, key_parts, lstat_at, read_file, walk_dir, write_at
from .remote import TOTAL_TIMEOUT_S
from .s3_lease import S3Lease

__all__ = ["DEFAULT_LEASE_TTL", "WriterLease", "Holder", "acquire_lease", "check_ttl"]


# -- local disk --------------------------------------------------------------------------------------
# flock errors that mean "this file system cannot lock" (NFS without lockd, some FUSE and parallel file
# systems; EBADF: NFS emulates flock with POSIX locks, which a read-only directory cannot take).
_NO_LOCK_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOLCK", "ENOSYS", "EOPNOTSUPP", "ENOTSUP", "EINVAL", "EBADF")
                            if hasattr(errno, n))


# File systems shared between machines whose directory flock only covers this machine (Linux NFS and
# SMB clients lock directories locally; cluster file systems vary): a second writer here is refused, one
# on another machine is not. Found by the mount's type in /proc/mounts (Linux only; None elsewhere).
_SHARED_FS = frozenset(("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "glusterfs", "ceph",
                        "9p", "afs", "fuse.sshfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.rclone", "fuse.glusterfs",
                        "fuse.ceph-fuse", "fuse.juicefs", "fuse.goofys", "fuse.mountpoint-s3"))


def _shared_fs_type(path: Any) -> str | None:
    """The type of the shared file system `path` is on (the longest matching mount), or None."""
    try:
        real, best, kind = os.path.realpath(path), "", None
        with open("/proc/mounts", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        return None
    return kind if kind in _SHARED_FS else None


class _NoLock(Exception):
    """flock is not supported on this file system (the errno is in the message)."""


class _LocalLease(WriterLease):
    def __init__(self, root: Any, prefix: str, where: str, creating: bool = False):
        self.root, self.where, self.key = root, where, f"{prefix}{LEASE_GROUP}/zarr.json"
        self._parts = key_parts(prefix.rstrip("/"))
        if creating:  # create() takes the lease before it writes anything, so the folder may not exist yet
            os.makedirs(root, exist_ok=True)
        try:
            top = walk_dir(root, self._parts, create=creating)
        except (FileNotFoundError, NotADirectoryError):
            raise ArchiveNotFoundError(f"no archive at {where} (no zarr.json there)") from None
        try:
            st = lstat_at(top, "zarr.json")
            if not creating and (st is None or not stat.S_ISREG(st.st_mode)):
                raise ArchiveNotFoundError(f"no archive at {where} (no zarr.json there)")
        finally:
            os.close(top)
        # A directory opened with O_NOFOLLOW (a planted link is refused with FormatError); its lock lives
        # on the open file description, so only the kernel (at process exit) or release() ends it.
        try:
            self._fd: int | None = walk_dir(root, [*self._parts, LEASE_GROUP], create=True)
        except NotADirectoryError:
            raise FormatError(f"archive entry {prefix + LEASE_GROUP!r} in {where} is a file where the writer lease's "
                              "folder belongs; the archive is damaged (remove that file to append)") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._fd)
            self._fd = None
            if exc.errno in _NO_LOCK_ERRNOS:
                raise _NoLock(errno.errorcode.get(exc.errno, str(exc.errno))) from None
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StorageError(f"could not lock the writer lease of {where}: {exc}") from exc
            raise WriterLockedError(self._locked_message(where)) from None
        try:
            st = os.fstat(self._fd)
            self._id = (st.st_dev, st.st_ino)
            self.holder = Holder.new(expires=None)
            # Written through the locked descriptor: closing another descriptor of the directory would drop
            # an NFS lock (emulated with POSIX locks, which end when any descriptor of the file closes).
            write_at(self._fd, "zarr.json", self.holder.document(), root=root, key=self.key)
        except BaseException:
            self.release()
            raise

    def _locked_message(self, where: str) -> str:
        try:
            data = read_file(self.root, self.key, None, MAX_LEASE_BYTES)
            holder, problem = (None, "it has not written its lease document yet") if data is None else (
                Holder.parse(data), None)
            if holder is not None and holder.is_released:
                holder, problem = None, "it has not written its lease document yet"
        except (FormatError, OSError) as exc:
            holder, problem = None, f"its lease document {exc}"
        if holder is not None and holder.is_me():
            return (f"{where} already has a writer open in this process ({holder.describe()}): one writer per "
                    "archive; close that writer (or use it) before opening another")
        who = holder.describe() if holder is not None else f"an unknown writer: {problem}"
        return (f"{where} is being written by another writer ({who}); one writer per archive at a time. Wait "
                "for it to close, or stop it. A writer that crashed or was killed never blocks a resume on a "
                "local disk: the operating system releases its lock when its process ends, so that process "
                "is still running (readers may open the archive meanwhile)")

    def check(self) -> None:
        """The locked directory must still be the archive's `_writer`: a fence against one removed or
        replaced behind this writer's back (by hand, or by a writer that did not honour the lock)."""
        if self._fd is None:
            raise WriterLockedError(f"this writer released its lease of {self.where}; it writes nothing more")
        try:
            top = walk_dir(self.root, self._parts)
            try:
                st = lstat_at(top, LEASE_GROUP)
            finally:
                os.close(top)
        except (OSError, FormatError):
            st = None
        if st is None or (st.st_dev, st.st_ino) != self._id:
            raise WriterLockedError(
                f"the writer lease folder {self.key.rsplit('/', 1)[0]!r} of {self.where} was removed or replaced "
                "while this writer held its lock; another writer may be writing the archive, so this one "
                "refuses to write (check the archive with mjarchive verify, then reopen it with mode='a')")

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:  # the document names a writer only while it writes: no host and pid left behind
                write_at(fd, "zarr.json", self.holder.released().document(), root=self.root, key=self.key)
            except (OSError, FormatError):
                pass
            try:
                os.close(fd)  # closing the only descriptor of the description releases the lock
            except OSError:
                pass


# -- memory stores -----------------------------------------------------------------------------------
_MEMORY: dict[tuple[int, str], tuple[Any, Holder]] = {}
_MEMORY_LOCK = threading.Lock()


class _MemoryLease(WriterLease):
    def __init__(self, store: Any, prefix: str, where: str, take_over: bool):
        self.key = f"{prefix}{LEASE_GROUP}/zarr.json"
        self._slot = (id(store), self.key)
        self.holder = Holder.new(expires=None)
        with _MEMORY_LOCK:
            held = _MEMORY.get(self._slot)
            if held is not None and not take_over:
                raise WriterLockedError(f"{where} already has a writer open in this process ({held[1].describe()}): "
                                        "one writer per archive; close it first, or pass take_over=True")
            _MEMORY[self._slot] = (store, self.holder)  # the store is kept alive: its id stays its own
        try:
            sync(store.set(self.key, _buffer(self.holder.document())))
        except BaseException:
            self.release()  # the slot must not stay taken for the rest of the process
            raise

    def check(self) -> None:
        with _MEMORY_LOCK:
            held = _MEMORY.get(self._slot)
        if held is None or held[1] is not self.holder:
            raise WriterLockedError("another writer took over this archive's writer lease "
                                    f"({held[1].describe() if held else 'since released'}); this writer "
                                    "refuses to write (reopen with mjarchive.open(..., mode='a'), with part= for a part, once it "
                                    "is done)")

    def release(self) -> None:
        with _MEMORY_LOCK:
            if (held := _MEMORY.get(self._slot)) is not None and held[1] is self.holder:
                del _MEMORY[self._slot]


def _buffer(data: bytes) -> Any:
    return default_buffer_prototype().buffer.from_bytes(data)


# -- storage without conditional writes ---------------------------------------------------------------
class _UnenforcedLease(WriterLease):
    """Storage where mjarchive has no conditional write (gs://, az://, other stores): writing works as
    before, one writer at a time is the caller's duty, and the writer is told so once."""

    def __init__(self, what: str, where: str):
        self.holder = Holder.new(None)
        warnings.warn(
            f"mjarchive cannot enforce one writer per archive on {what} (it needs conditional writes, "
            f"implemented for local disks, s3:// and memory://): make sure no other process writes {where} "
            "while this writer is open, or two writers will overwrite each other's frames",
            UnenforcedWriterWarning, stacklevel=_caller_stacklevel())


def _caller_stacklevel() -> int:
    """The `stacklevel` that points a warning at the first frame outside mjarchive (the caller's line),
    however deep inside mjarchive the warning is raised; counted from the function calling this one."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


# -- entry point ---------------------------------------------------------------------------------------
def acquire_lease(store: Any, *, where: str, take_over: bool = False, ttl: float = DEFAULT_LEASE_TTL,
                  prefix: str = "", creating: bool = False) -> WriterLease:
    """Take the writer lease of the archive (or part) at `prefix` of `store`, or raise WriterLockedError.

    `store` is the archive's store (a CheckedStore is unwrapped); `where` names it in messages.
    `take_over` replaces a lease that has not expired (object storage and memory); on a local disk
    a held lock always means a live process, which no one can take the lease from. `creating`: the
    archive is about to be created, so it need not exist yet (`create()` takes the lease first).
    """
    if prefix and not prefix.endswith("/"):
        raise ValueError("a lease prefix ends with '/'")
    total_timeout = TOTAL_TIMEOUT_S
    while isinstance(store, (CheckedStore, PrefixStore)):
        if isinstance(store, PrefixStore):  # a part of a multi-part archive: its lease is in its folder
            prefix = store.prefix + prefix
        elif store._remote is not None:
            total_timeout = store._remote.total_timeout
        store = store._store
    if isinstance(store, (SafeLocalStore, zarr.storage.LocalStore)):
        try:
            lease = _LocalLease(store.root, prefix, where, creating)
        except _NoLock as exc:
            return _UnenforcedLease(f"this file system (it cannot lock: flock failed with {exc})", where)
        if (shared := _shared_fs_type(store.root)) is not None:
            warnings.warn(
                f"{where} is on a {shared} file system, where mjarchive's lock refuses a second writer on this "
                "machine only: make sure no process on another machine writes it while this writer is open",
                UnenforcedWriterWarning, stacklevel=_caller_stacklevel())
        return lease
    if isinstance(store, zarr.storage.MemoryStore):
        return _MemoryLease(store, prefix, where, take_over)
    if isinstance(store, zarr.storage.FsspecStore):
        protocols = store.fs.protocol if isinstance(store.fs.protocol, (tuple, list)) else (store.fs.protocol,)
        if "s3" in protocols or "s3a" in protocols:
            try:
                return S3Lease(store.fs, store.path, prefix, where, take_over, ttl, total_timeout)
            except MjArchiveError:
                raise
            except Exception as exc:
                raise StorageError(f"could not take the writer lease of {where}: {exc!r}; check the connection, "
                                   "the credentials and storage_options") from exc
        return _UnenforcedLease(f"{protocols[0]}:// storage", where)
    return _UnenforcedLease(f"a {type(store).__name__}", where)
