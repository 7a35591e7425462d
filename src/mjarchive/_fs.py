"""Writing into an output folder that someone else may have prepared, never through a link.

An output folder may be shared (a team directory, /tmp) and may hold whatever an attacker planted
at the names mjarchive writes: a symlink into the user's home, a FIFO, a device, a directory. The
folder path itself is the user's choice and may be a symlink; entries *inside* it are not trusted:

- a file is written to a fresh temporary entry created with O_CREAT | O_EXCL | O_NOFOLLOW under
  an unpredictable name (nothing planted can already be there), then renamed over the final
  name. rename(2) replaces a symlink, FIFO or file at the destination without following it, so
  a planted link is replaced by our file and its target is never touched;
- a directory at a final name is refused with a clear error (replacing it would mean deleting
  someone's directory);
- a file is read only if lstat says it is a regular file, opened with O_NOFOLLOW | O_NONBLOCK
  (a FIFO swapped in between never blocks) and checked again with fstat, with a size limit.

All operations are relative to the folder opened once (`dir_fd`) where the OS supports it, so
the folder cannot be swapped under a running render.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from ._errors import MjArchiveError

__all__ = ["MAX_NAME_BYTES", "check_name", "describe_mode", "OutputDir", "TempFile"]

#: The longest file name most file systems take (bytes of its UTF-8 form).
MAX_NAME_BYTES = 255
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)
# os.replace takes src_dir_fd/dst_dir_fd wherever os.rename does, but CPython lists only rename.
_DIR_FD = os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd and hasattr(os, "O_DIRECTORY")
_BLOCK = 1 << 20
_EUID = os.geteuid() if hasattr(os, "geteuid") else None


def _mine(st: os.stat_result) -> bool:
    """Owned by this user: someone else who can write a shared folder cannot make such a file."""
    return _EUID is None or st.st_uid == _EUID


def check_name(name: str) -> str:
    """`name` if it is a flat, bounded file name (no separator, NUL or control character, not '.'
    or '..', at most MAX_NAME_BYTES); else MjArchiveError."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or any(ord(c) < 32 or ord(c) == 127 for c in name)
            or len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES):
        raise MjArchiveError(f"{name!r} is not a flat file name of at most {MAX_NAME_BYTES} bytes")
    return name


def describe_mode(mode: int) -> str:
    """What kind of file system entry an `st_mode` is, in words ('a symbolic link', 'a FIFO', ...)."""
    for test, word in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return word
    return "not a regular file"


class OutputDir:
    """An output folder, opened once; files inside are created, replaced and read without ever
    following a link (see the module docstring). Use as a context manager.

    path: the folder (created with its parents when `create`); it may itself be a symlink.
    """

    def __init__(self, path: str | os.PathLike, *, create: bool = True):
        self.path = Path(path)
        self._fd = None
        try:
            if create:
                self.path.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC) if _DIR_FD else None
        except NotADirectoryError:
            raise MjArchiveError(f"the output folder {str(self.path)!r} is not a directory; choose a directory") from None
        except FileExistsError:
            raise MjArchiveError(f"the output folder {str(self.path)!r} exists and is not a directory; "
                                 "choose a directory") from None
        except OSError as exc:
            raise MjArchiveError(f"cannot use the output folder {str(self.path)!r}: {exc.strerror or exc}") from None
        if not _DIR_FD and not self.path.is_dir():
            raise MjArchiveError(f"the output folder {str(self.path)!r} is not a directory; choose a directory")

    # -- plumbing -----------------------------------------------------------------------------------
    def _at(self, name: str) -> tuple[str, dict]:
        name = check_name(name)
        return (name, {"dir_fd": self._fd}) if self._fd is not None else (str(self.path / name), {})

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # -- queries -------------------------------------------------------------------------------------
    def lstat(self, name: str) -> os.stat_result | None:
        """The entry's own status (a link is not followed), or None when there is none."""
        path, kw = self._at(name)
        try:
            return os.stat(path, follow_symlinks=False, **kw)
        except FileNotFoundError:
            return None

    def check_writable(self, name: str) -> None:
        """Refuse early a final name that cannot be replaced by a file: a directory sits there."""
        st = self.lstat(name)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise MjArchiveError(
                f"{str(self.path / name)!r} is a directory, where mjarchive writes a file; remove or rename it, "
                "or choose another output folder")

    def names(self, limit: int = 1_000_000) -> Iterator[str]:
        """The folder's entry names, streamed, at most `limit` of them (a folder someone filled with
        millions of entries costs bounded time)."""
        with os.scandir(self._fd if self._fd is not None else self.path) as it:
            for k, entry in enumerate(it):
                if k >= limit:
                    break
                yield entry.name

    def unlink(self, name: str) -> None:
        """Remove an entry (a link itself, never its target); no error if it is gone."""
        path, kw = self._at(name)
        try:
            os.unlink(path, **kw)
        except FileNotFoundError:
            pass

    # -- reading ---------------------------------------------------------------------------------------
    def _open_regular(self, name: str) -> tuple[int, os.stat_result] | None:
        """An fd of the regular file at `name`, or None if there is none; MjArchiveError if
        something else (a link, FIFO, device, directory) is there."""
        path, kw = self._at(name)
        st = self.lstat(name)
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise MjArchiveError(f"{str(self.path / name)!r} is {describe_mode(st.st_mode)}, not a regular file")
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC | _BINARY, **kw)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise MjArchiveError(f"cannot read {str(self.path / name)!r}: {exc.strerror or exc}") from None
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise MjArchiveError(f"{str(self.path / name)!r} changed while it was opened")
        return fd, fst

    def read_regular(self, name: str, limit: int, *, mine: bool = False) -> bytes | None:
        """The bytes of the regular file `name` (None if absent); MjArchiveError if it is not a
        regular file, holds more than `limit` bytes or, with `mine`, belongs to another user."""
        opened = self._open_regular(name)
        if opened is None:
            return None
        fd, st = opened
        try:
            if mine and not _mine(st):
                raise MjArchiveError(f"{str(self.path / name)!r} belongs to another user")
            if st.st_size > limit:
                raise MjArchiveError(f"{str(self.path / name)!r} holds {st.st_size} bytes (limit {limit})")
            chunks, n = [], 0
            while n <= limit:
                block = os.read(fd, min(_BLOCK, limit + 1 - n))
                if not block:
                    break
                chunks.append(block)
                n += len(block)
            if n > limit:  # grew since fstat
                raise MjArchiveError(f"{str(self.path / name)!r} holds more than {limit} bytes")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def digest(self, name: str, size: int) -> str | None:
        """sha256 hex of the regular, single-link file `name` that this user owns, if it holds
        exactly `size` bytes, read in blocks (bounded memory); None when absent, of another size,
        or not such a file (a file planted by someone else never counts as ours)."""
        try:
            opened = self._open_regular(name)
        except MjArchiveError:
            return None
        if opened is None:
            return None
        fd, st = opened
        try:
            if st.st_size != size or st.st_nlink != 1 or not _mine(st):  # we write fresh single-link files
                return None
            h, n = hashlib.sha256(), 0
            while n <= size:
                block = os.read(fd, _BLOCK)
                if not block:
                    break
                h.update(block)
                n += len(block)
            return h.hexdigest() if n == size else None
        finally:
            os.close(fd)

    # -- writing -----------------------------------------------------------------------------------------
    def create_temp(self, prefix: str, suffix: str = ".tmp") -> TempFile:
        """A fresh, empty regular file `prefix-<random>suffix` that nothing planted can be: created
        with O_CREAT | O_EXCL | O_NOFOLLOW (default permissions, like any file the user creates)."""
        for _ in range(100):
            name = check_name(f"{prefix}-{secrets.token_hex(8)}{suffix}")
            path, kw = self._at(name)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | _BINARY, 0o666, **kw)
            except FileExistsError:
                continue
            except OSError as exc:
                raise MjArchiveError(f"cannot create a file in {str(self.path)!r}: {exc.strerror or exc}") from None
            return TempFile(self, name, fd)
        raise MjArchiveError(f"cannot create a temporary file in {str(self.path)!r}")  # pragma: no cover

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write `data` as the file `name`, atomically, replacing (never following) what is there."""
        check_name(name)
        self.check_writable(name)
        tmp = self.create_temp(f".{name[:200]}")
        try:
            tmp.write(data)
            tmp.commit(name)
        finally:
            tmp.discard()
        return self.path / name


class TempFile:
    """A temporary file made by `OutputDir.create_temp`: write to it (or hand `open_path` to a
    program such as ffmpeg), then `commit(name)` renames it over the final name; `discard()` removes it if
    it was not committed (safe to call twice)."""

    def __init__(self, folder: OutputDir, name: str, fd: int):
        self.folder, self.name, self._fd = folder, name, fd
        st = os.fstat(fd)
        self._id = (st.st_dev, st.st_ino)
        self._committed = False

    @property
    def path(self) -> Path:
        """Absolute path of the temporary file's entry in the folder."""
        return Path(os.path.abspath(self.folder.path / self.name))

    @property
    def open_path(self) -> Path:
        """A path another program (ffmpeg) can open that names this very file, through our open
        descriptor (`/proc/<pid>/fd/<fd>` on Linux), not its name in the folder: whoever swaps the
        folder entry or the folder for a link in the meantime gains nothing. `path` elsewhere."""
        proc = Path(f"/proc/{os.getpid()}/fd/{self._fd}")
        return proc if self._fd >= 0 and proc.exists() else self.path

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def _still_ours(self) -> bool:
        st = self.folder.lstat(self.name)
        return st is not None and stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == self._id

    def digest(self) -> tuple[str, int]:
        """(sha256 hex, size in bytes) of what the file holds, read through our own descriptor
        (so what is hashed is the file we created, whatever happened to its name)."""
        h, n = hashlib.sha256(), 0
        os.lseek(self._fd, 0, os.SEEK_SET)
        while block := os.read(self._fd, _BLOCK):
            h.update(block)
            n += len(block)
        return h.hexdigest(), n

    def commit(self, name: str) -> Path:
        """Rename the temporary file over `name` (a link, FIFO or file there is replaced, never
        followed); MjArchiveError if a directory is there or the temporary entry was swapped."""
        folder = self.folder
        if not self._still_ours():
            raise MjArchiveError(f"the temporary file {str(folder.path / self.name)!r} was replaced or removed by "
                                 "someone else while it was written; is another program using the output folder?")
        folder.check_writable(name)
        src, kw = folder._at(self.name)
        dst, _ = folder._at(name)
        try:
            if folder._fd is not None:
                os.replace(src, dst, src_dir_fd=folder._fd, dst_dir_fd=folder._fd)
            else:
                os.replace(src, dst)
        except OSError as exc:
            raise MjArchiveError(f"cannot write {str(folder.path / name)!r}: {exc.strerror or exc}") from None
        self._committed = True
        self._close()
        return folder.path / name

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        if not self._committed and self._fd >= 0 and self._still_ours():
            self.folder.unlink(self.name)
        self._close()
