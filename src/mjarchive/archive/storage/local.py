"""A local store for untrusted archives: plain files only, nothing followed or opened beyond them.

`SafeLocalStore` is zarr's LocalStore without following anything: below the root (which may
itself be a symlink) every path component must be a real directory and every key a regular file;
a symlink, FIFO, device or socket is refused with a FormatError naming it. Paths are walked one
component at a time with `O_NOFOLLOW` directory descriptors, files are opened with
`O_NOFOLLOW | O_NONBLOCK` after an lstat and re-checked with fstat, so a FIFO never blocks and a
swapped-in link is never followed. Writes, deletes and listings walk the same way.

Bounded metadata and chunks are checked by `checked.CheckedStore`, which wraps this store.
"""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
import shutil
import stat
import threading
import uuid
from pathlib import Path
from typing import Any

from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore

from ..._errors import FormatError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
from ..._fs import describe_mode
from ..format import MAX_JSON_BYTES

__all__ = ["SafeLocalStore", "key_parts", "lstat_at", "read_file", "walk_dir", "walk_files", "write_at", "write_file"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_IOV_MAX = 1024  # the most pieces one writev takes on Linux and macOS
# Files of at least _DIRECT_MIN_BYTES (shards) are written with O_DIRECT where the file system takes
# it: from a reused aligned buffer straight to the device, instead of into fresh page-cache pages,
# which cost more than the copy (and evict what readers cache) when a run writes gigabytes.
_O_DIRECT = (0 if fcntl is None or os.environ.get("MJARCHIVE_DIRECT_IO", "") in ("0", "false", "no")
             else getattr(os, "O_DIRECT", 0))
_DIRECT_MIN_BYTES = 1 << 20
_DIRECT_ALIGN = 4096  # the largest logical block size of common devices
_DIRECT_SEGMENT = 4 << 20  # bytes per write: the size of each thread's aligned buffer
_direct_buffers = threading.local()
_no_direct_devices: set[int] = set()  # file systems that refused O_DIRECT


# -- plain files only ------------------------------------------------------------------------------

def _refuse(root: Path, rel: str, mode: int) -> FormatError:
    return FormatError(
        f"archive entry {rel!r} (in {str(root)!r}) is {describe_mode(mode)}; an archive on disk holds only plain "
        "directories and regular files, so mjarchive refuses to follow it (replace it with a real copy)"
    )


def key_parts(key: str) -> list[str]:
    parts = key.split("/") if key else []
    if any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise FormatError(f"store key {key!r} is not a plain relative path")
    return parts


def walk_dir(root: Path, parts: list[str], *, create: bool = False) -> int:
    """A descriptor of the directory `root/parts...`, each component a real directory (not followed).

    Raises FileNotFoundError/NotADirectoryError when a component is missing or a regular file.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the root itself may be a link
    try:
        for i, name in enumerate(parts):
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                if stat.S_ISREG(mode):
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", "/".join(parts[: i + 1])) from None
                raise _refuse(root, "/".join(parts[: i + 1]), mode) from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def lstat_at(dfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_file(root: Path, key: str, byte_range: Any, limit: int | None) -> bytes | None:
    """The bytes of regular file `key` (or a range of them); None where zarr's LocalStore has none."""
    parts = key_parts(key)
    if not parts:
        return None
    document = parts[-1] == "zarr.json"
    try:
        dfd = walk_dir(root, parts[:-1])
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        if document:  # a file where a node's folder belongs is damage, not an absent node
            raise FormatError(f"archive entry {'/'.join(parts[:-1])!r} is a file where a Zarr node's folder belongs; "
                              "the archive is damaged") from None
        return None
    try:
        st = lstat_at(dfd, parts[-1])
        if st is not None and stat.S_ISDIR(st.st_mode) and document:
            raise _refuse(root, key, st.st_mode)
        if st is None or stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):  # checked before open(): opening a FIFO or device can block or act
            raise _refuse(root, key, st.st_mode)
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse(root, key, stat.S_IFLNK) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped between lstat and open
                raise _refuse(root, key, st.st_mode)
            size = st.st_size
            if limit is not None and size > limit:
                raise FormatError(f"archive entry {key!r} is {size} bytes, above the limit of {limit} for it")
            if byte_range is None:
                start, stop = 0, size
            elif isinstance(byte_range, RangeByteRequest):
                start, stop = byte_range.start, byte_range.end
            elif isinstance(byte_range, OffsetByteRequest):
                start, stop = byte_range.offset, size
            elif isinstance(byte_range, SuffixByteRequest):
                start, stop = max(0, size - byte_range.suffix), size
            else:
                raise TypeError(f"Unexpected byte_range, got {byte_range}.")
            start, stop = min(max(0, start), size), min(max(0, stop), size)  # never allocate past the file
            chunks, pos = [], start
            while pos < stop:
                data = os.pread(fd, stop - pos, pos)
                if not data:
                    break
                chunks.append(data)
                pos += len(data)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def write_file(root: Path, key: str, view: Any, exclusive: bool = False) -> None:
    """Write regular file `key` atomically (a temporary file, then a rename), following nothing.
    `view` is a bytes-like object or a list of them (the file's pieces, in order)."""
    parts = key_parts(key)
    dfd = walk_dir(root, parts[:-1], create=True)
    try:
        write_at(dfd, parts[-1], view, exclusive, root=root, key=key)
    finally:
        os.close(dfd)


def write_at(dfd: int, name: str, view: Any, exclusive: bool = False, *, root: Path, key: str) -> None:
    """Write file `name` of the open directory `dfd` atomically; `root` and `key` name it in messages.
    Opens no other descriptor of that directory (an NFS lock held on `dfd` survives)."""
    st = lstat_at(dfd, name)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _refuse(root, key, st.st_mode)
    if st is not None and exclusive:
        raise FileExistsError(errno.EEXIST, "exists", key)
    tmp = f"{name}.{uuid.uuid4().hex}.partial"  # the name remove_partial_files() looks for
    pieces = [v for v in (memoryview(p).cast("B") for p in (view if isinstance(view, list) else [view])) if v.nbytes]
    total = sum(v.nbytes for v in pieces)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
    try:
        try:
            if not (_O_DIRECT and total >= _DIRECT_MIN_BYTES and _write_direct(fd, pieces, total)):
                _write_all(fd, pieces)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dfd)
        else:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        raise


def _write_direct(fd: int, pieces: list[memoryview], total: int) -> bool:
    """Write `pieces` (non-empty byte views) to the empty file `fd` with O_DIRECT, through this
    thread's aligned buffer; the last write is padded with zeros to the alignment, then cut back. False
    (`fd` still empty, without O_DIRECT) if its file system refuses that, which is remembered."""
    device = os.fstat(fd).st_dev
    if device in _no_direct_devices:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:  # set after opening: a file system without O_DIRECT fails an open only after creating the file
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        _no_direct_devices.add(device)
        return False
    buffer = getattr(_direct_buffers, "buffer", None)
    if buffer is None:
        buffer = _direct_buffers.buffer = memoryview(mmap.mmap(-1, _DIRECT_SEGMENT))  # page-aligned
    offset = fill = 0
    try:
        for piece in pieces:
            if fill + piece.nbytes < _DIRECT_SEGMENT:  # most pieces (an inner chunk, a header): no slicing
                buffer[fill:fill + piece.nbytes] = piece
                fill += piece.nbytes
                continue
            pos = 0
            while pos < piece.nbytes:
                n = min(piece.nbytes - pos, _DIRECT_SEGMENT - fill)
                buffer[fill:fill + n] = piece[pos:pos + n]
                fill, pos = fill + n, pos + n
                if fill == _DIRECT_SEGMENT:
                    _pwrite_all(fd, buffer, offset)
                    offset, fill = offset + fill, 0
        if fill:
            padded = -(-fill // _DIRECT_ALIGN) * _DIRECT_ALIGN
            buffer[fill:padded] = bytes(padded - fill)
            _pwrite_all(fd, buffer[:padded], offset)
            os.ftruncate(fd, total)
        return True
    except OSError as exc:
        if exc.errno != errno.EINVAL or offset:
            raise
        os.ftruncate(fd, 0)  # the file system took O_DIRECT but not these writes
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        _no_direct_devices.add(device)
        return False


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], offset + done)


def _write_all(fd: int, pieces: list) -> None:
    """Write all of `pieces` in order, with as few system calls as the kernel allows (writev takes at
    most IOV_MAX pieces and may write fewer bytes than asked)."""
    views = [v for v in (memoryview(p).cast("B") for p in pieces) if v.nbytes]
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i:i + _IOV_MAX])
        while i < len(views) and n >= views[i].nbytes:
            n -= views[i].nbytes
            i += 1
        if n:
            views[i] = views[i][n:]


def _delete(root: Path, key: str, *, dir_only: bool = False) -> None:
    parts = key_parts(key)
    if not parts:
        return
    try:
        dfd = walk_dir(root, parts[:-1])
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        st = lstat_at(dfd, parts[-1])
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(parts[-1], dir_fd=dfd)  # fd-based: links inside are removed, never followed
        elif dir_only and stat.S_ISREG(st.st_mode):
            raise ValueError(f"delete_dir was passed a prefix={key!r} that is a file")
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            os.unlink(parts[-1], dir_fd=dfd)  # unlinking a link removes the link only
        else:
            raise _refuse(root, key, st.st_mode)
    finally:
        os.close(dfd)


def walk_files(root: Path, prefix: str = "") -> list[str]:
    """Keys (relative to `root`) of every regular file below `root/prefix`, walked without following.

    Raises FormatError on a link, FIFO, device or socket.
    """
    out: list[str] = []
    base = key_parts(prefix.rstrip("/"))
    try:
        top = walk_dir(root, base)
    except (FileNotFoundError, NotADirectoryError):
        return out
    stack = [(top, "/".join(base))]
    while stack:
        fd, rel = stack.pop()
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    key = f"{rel}/{entry.name}" if rel else entry.name
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((os.open(entry.name, _DIR_FLAGS, dir_fd=fd), key))
                    elif entry.is_file(follow_symlinks=False):
                        out.append(key)
                    else:
                        raise _refuse(root, key, entry.stat(follow_symlinks=False).st_mode)
        except BaseException:
            for other, _ in stack:
                os.close(other)
            raise
        finally:
            os.close(fd)
    return out


class SafeLocalStore(LocalStore):
    """zarr's LocalStore that follows no symlink and opens no FIFO, device or socket below its root."""

    def _limit(self, key: str) -> int | None:
        return MAX_JSON_BYTES if key == "zarr.json" or key.endswith("/zarr.json") else None

    def _get_bytes_safe(self, key: str, prototype: Any, byte_range: Any) -> Any:
        data = read_file(self.root, key, byte_range, self._limit(key))
        return None if data is None else (prototype or default_buffer_prototype()).buffer.from_bytes(data)

    def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
        self._ensure_open_sync()
        return self._get_bytes_safe(key, prototype, byte_range)

    async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
        if not self._is_open:
            await self._open()
        return await asyncio.to_thread(self._get_bytes_safe, key, prototype, byte_range)

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    def set_sync(self, key: str, value: Any) -> None:
        self._ensure_open_sync()
        self._check_writable()
        write_file(self.root, key, value.as_buffer_like())

    def set_parts_sync(self, key: str, pieces: list) -> None:
        """`set_sync` of the bytes-like `pieces` one after another, written without joining them."""
        self._ensure_open_sync()
        self._check_writable()
        write_file(self.root, key, pieces)

    async def _set(self, key: str, value: Any, exclusive: bool = False) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        await asyncio.to_thread(write_file, self.root, key, value.as_buffer_like(), exclusive)

    def delete_sync(self, key: str) -> None:
        self._ensure_open_sync()
        self._check_writable()
        _delete(self.root, key)

    async def delete(self, key: str) -> None:
        self._check_writable()
        await asyncio.to_thread(_delete, self.root, key)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        if prefix.rstrip("/"):
            await asyncio.to_thread(_delete, self.root, prefix.rstrip("/"), dir_only=True)
        else:
            await self.clear()

    async def exists(self, key: str) -> bool:
        return await asyncio.to_thread(_is_file, self.root, key)

    async def list(self) -> Any:
        for key in await asyncio.to_thread(walk_files, self.root):
            yield key

    async def list_prefix(self, prefix: str) -> Any:
        for key in await asyncio.to_thread(walk_files, self.root, prefix):
            yield key

    async def list_dir(self, prefix: str) -> Any:
        try:
            fd = walk_dir(self.root, key_parts(prefix.rstrip("/")))
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        for name in names:
            yield name


def _is_file(root: Path, key: str) -> bool:
    parts = key_parts(key)
    if not parts:
        return False
    try:
        dfd = walk_dir(root, parts[:-1])
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        st = lstat_at(dfd, parts[-1])
        if st is None or stat.S_ISDIR(st.st_mode):
            return False
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(root, key, st.st_mode)
        return True
    finally:
        os.close(dfd)
