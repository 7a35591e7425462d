"""Turning a path or URL into a Zarr store, and store housekeeping.

Local paths (and `file://` URLs) use zarr's LocalStore; `memory://NAME` a process-wide
MemoryStore; every other URL (`s3://`, `gs://`, `az://`, ...) zarr's FsspecStore, configured by
`storage_options` (passed to the fsspec filesystem, e.g. s3fs's `endpoint_url`, `key`, `secret`).

Why this is safe for the commit protocol on object stores: every store key is written with one
PUT (s3fs switches to a multipart upload only above 50 MiB, and a multipart object appears only
when completed), so each chunk and each `zarr.json` is replaced atomically, as on a local disk.
The writer awaits its chunk PUTs before the PUT of the root `zarr.json` that commits them, and S3
has read-after-write consistency, so a reader never trusts a frame whose chunks are not there.
A URL's store operations are bounded in time and retried (remote.py: timeouts, retries, a deadline);
what still fails is a StorageError, and a failed chunk write stops the writer before its commit.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import zarr
import zarr.storage
from zarr.core.sync import sync

from ..._errors import ArchiveExistsError, ArchiveNotFoundError, FormatError, MjArchiveError
from ..format import LEASE_GROUP
from .checked import CheckedStore
from .local import SafeLocalStore, walk_files
from .remote import fsspec_options

__all__ = ["is_url", "local_path", "make_store", "new_store", "clear_root", "open_root", "open_root_document", "remove_partial_files"]

_URL_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
# zarr's LocalStore writes `<key>.<uuid hex>.partial` and renames it into place.
_PARTIAL_RE = re.compile(r"\.[0-9a-f]{32}\.partial$")

def is_url(location: Any) -> bool:
    """True for a non-local URL such as `s3://bucket/run.mjarchive` or `memory://x` (not `file://`)."""
    return isinstance(location, str) and bool(_URL_RE.match(location)) and not location.startswith("file://")


def local_path(location: Any) -> Path | None:
    """The filesystem path of a local location, or None for URLs and store objects."""
    if isinstance(location, os.PathLike):
        return Path(location)
    if isinstance(location, str):
        if location.startswith("file://"):
            path = location[len("file://"):]
            return Path(path[len("localhost"):] if path.startswith("localhost/") else path)
        if not is_url(location):
            return Path(location)
    if isinstance(location, zarr.storage.LocalStore):
        return Path(location.root)
    return None


def _describe(location: Any) -> str:
    path = local_path(location)
    return repr(str(path)) if path is not None else repr(location if isinstance(location, str) else str(location))


def make_store(location: Any, *, read_only: bool, storage_options: dict | None = None) -> Any:
    """A Zarr store for a path, a `file://`/`memory://`/`s3://`... URL, or an existing store object.

    `storage_options` configure the fsspec filesystem of a URL; they are an error for local paths,
    memory URLs and store objects, which take none. Every store comes wrapped in a CheckedStore
    (bounded metadata and chunks, missing committed chunks are damage); local paths use a
    SafeLocalStore, which follows no symlink and opens no FIFO or device inside the archive.
    """
    if isinstance(location, CheckedStore):
        return location.with_read_only(read_only) if location.read_only != read_only else location
    return CheckedStore(*_plain_store(location, read_only=read_only, storage_options=storage_options))


def _plain_store(location: Any, *, read_only: bool, storage_options: dict | None) -> tuple[Any, Any]:
    """The store of `location`, and for an fsspec URL how its operations are bounded (remote.Remote)."""
    path = local_path(location)
    if storage_options and not (is_url(location) and not location.startswith("memory://")):
        raise MjArchiveError(
            f"storage_options only apply to fsspec URLs such as 's3://bucket/run.mjarchive'; "
            f"{_describe(location)} takes none, so drop them"
        )
    if path is not None:
        return SafeLocalStore(path, read_only=read_only), None
    if isinstance(location, str):
        if location.startswith("memory://"):
            return _memory_store(location, read_only), None
        protocol = location.split("://", 1)[0].lower()
        options, remote, retries = fsspec_options(location, protocol, storage_options)
        try:
            store = zarr.storage.FsspecStore.from_url(location, storage_options=options, read_only=read_only)
            if retries is not None:
                store.fs.retries = retries  # s3fs takes its attempt count as an attribute only
            return store, remote
        except ImportError as exc:
            extra = "mjarchive[s3]" if protocol in ("s3", "s3a") else f"the fsspec filesystem for {protocol}://"
            raise MjArchiveError(f"opening {location!r} needs an fsspec filesystem ({exc}); install {extra}") from None
        except (ValueError, TypeError) as exc:
            raise MjArchiveError(
                f"cannot open {location!r} through fsspec: {exc}; check the URL scheme and storage_options"
            ) from exc
    return location, None


_MEMORY_STORES: dict[str, Any] = {}


def _memory_store(url: str, read_only: bool) -> Any:
    """Process-local in-memory stores keyed by URL, so create() then open() see the same data."""
    store = _MEMORY_STORES.setdefault(url, zarr.storage.MemoryStore())
    return store.with_read_only(read_only) if read_only else store


def remove_partial_files(location: Any, prefix: str = "") -> int:
    """Delete zarr's leftover `*.partial` temporaries after a crash (below `prefix`, a part's folder,
    if given); returns how many.

    Only local stores have them: object stores replace each key with one atomic PUT.
    """
    path = local_path(location)
    if path is None or not path.is_dir():
        return 0
    # Walked without following anything; a link, FIFO or device anywhere inside is refused.
    store = SafeLocalStore(path, read_only=False)
    removed = 0
    for key in walk_files(path, prefix):
        if _PARTIAL_RE.search(key):
            sync(store.delete(key))
            removed += 1
    return removed


def _store_is_empty(store: Any) -> bool:
    return bool(sync(store.is_empty("")))


def new_store(location: Any, *, overwrite: bool, storage_options: dict | None = None) -> CheckedStore:
    """The writable store of an archive about to be created, refusing existing data unless `overwrite`
    (ArchiveExistsError). Nothing is written: `create()` takes the writer lease next, then `clear_root`."""
    path = local_path(location)
    store = make_store(location, read_only=False, storage_options=storage_options)
    if path is not None:
        exists = path.exists()
    else:
        try:
            exists = not _store_is_empty(store)
        except (FileNotFoundError, NotADirectoryError):
            exists = False  # an empty prefix; a missing bucket fails below with a clear message
        except Exception as exc:
            raise _remote_error(location, exc) from exc
    if exists and not overwrite:
        raise _exists_error(location, store)
    return store


def _exists_error(location: Any, store: CheckedStore) -> ArchiveExistsError:
    if not _has_root_document(location, store):
        return ArchiveExistsError(
            f"{_describe(location)} exists but holds no archive (no zarr.json: other data, or a create() that "
            "stopped part way); pass overwrite=True to replace what is there"
        )
    path = local_path(location)
    hint = "mjarchive.open(path, mode='a')" if path is not None else "mjarchive.open(url, mode='a', storage_options=...)"
    return ArchiveExistsError(
        f"{_describe(location)} already exists; pass overwrite=True to replace it, or append to it with {hint}"
    )


def _has_root_document(location: Any, store: CheckedStore) -> bool:
    """Whether a root `zarr.json` is there (True where that cannot be told: the usual message then)."""
    path = local_path(location)
    try:
        if path is not None:
            os.lstat(path / "zarr.json")  # anything by that name, not followed
            return True
        return bool(sync(store.exists("zarr.json")))
    except (FileNotFoundError, NotADirectoryError):
        return False
    except Exception:
        return True


async def _names_besides_lease(store: Any) -> list[str]:
    return [name async for name in store.list_dir("") if name.rstrip("/") != LEASE_GROUP]


def clear_root(location: Any, store: CheckedStore, *, overwrite: bool) -> None:
    """Make `store` (from `new_store`, the writer lease held) ready for a new archive: everything but
    the lease's `_writer` group is deleted if `overwrite` (so the lease is never let go while the
    archive is rebuilt), else it must hold nothing else (an archive created meanwhile by another writer,
    since closed, is refused)."""
    try:
        names = sync(_names_besides_lease(store))
        if names and not overwrite:
            raise _exists_error(location, store)
        # The root document first: from then on the location holds no archive, should deleting the rest fail.
        for name in sorted(names, key=lambda name: name != "zarr.json"):
            sync(store.delete(name))  # a key (the root zarr.json), or nothing for a prefix...
            if name != "zarr.json":
                sync(store.delete_dir(name))  # ...whose keys go here
    except MjArchiveError:
        raise
    except Exception as exc:
        if local_path(location) is not None:
            raise
        raise _remote_error(location, exc) from exc


def _check_local_root(path: Path) -> None:
    try:
        mode_bits = os.lstat(path / "zarr.json").st_mode  # not followed: the root may be a link, not its files
    except (FileNotFoundError, NotADirectoryError):
        mode_bits = None
    if mode_bits is None or stat.S_ISDIR(mode_bits):
        raise ArchiveNotFoundError(
            f"no archive at {str(path)!r} (no zarr.json there); create one with mjarchive.create()"
        )
    if not stat.S_ISREG(mode_bits):
        raise FormatError(f"{str(path / 'zarr.json')!r} is not a regular file (a link, FIFO or device); "
                          "mjarchive reads archives made of plain files only")


def open_root_document(location: Any, *, storage_options: dict | None = None) -> tuple[CheckedStore, bytes, dict]:
    """A read-only store of the archive and its root group's metadata document (bytes and parsed),
    read once and parsed once (no zarr group is opened: readers build arrays from their own
    documents as they need them)."""
    path = local_path(location)
    if path is not None:
        _check_local_root(path)
    store = make_store(location, read_only=True, storage_options=storage_options)
    try:
        found = store.read_json_now("zarr.json")
    except MjArchiveError:
        raise
    except (FileNotFoundError, NotADirectoryError):
        found = None
    except Exception as exc:
        if path is not None:
            raise
        raise _remote_error(location, exc) from exc
    if found is None:
        raise ArchiveNotFoundError(f"no archive at {_describe(location)} (no zarr.json there); check the location"
                                   + ("" if path is not None else " and storage_options")
                                   + ", or create one with mjarchive.create()")
    raw, doc = found
    if doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
        raise ArchiveNotFoundError(f"{_describe(location)} is not a readable Zarr v3 group (its zarr.json is not "
                                   "a Zarr v3 group document)")
    return store, raw, doc


def open_root(location: Any, *, mode: str, storage_options: dict | None = None) -> zarr.Group:
    """Open the archive's root group for reading ('r') or appending ('a')."""
    path = local_path(location)
    if path is not None:
        _check_local_root(path)
    store = make_store(location, read_only=(mode == "r"), storage_options=storage_options)
    try:
        # zarr_format=3: skip probing for Zarr v2 keys (.zgroup, .zattrs), a round trip each remotely.
        return zarr.open_group(store=store, mode="r" if mode == "r" else "r+", use_consolidated=False, zarr_format=3)
    except MjArchiveError:
        raise
    except (FileNotFoundError, KeyError) as exc:
        raise ArchiveNotFoundError(
            f"no archive at {_describe(location)} ({exc}); check the location"
            + ("" if path is not None else " and storage_options") + ", or create one with mjarchive.create()"
        ) from None
    except (ValueError, TypeError) as exc:
        raise ArchiveNotFoundError(f"{_describe(location)} is not a readable Zarr v3 group: {exc}") from None
    except Exception as exc:
        if path is not None:
            raise
        raise _remote_error(location, exc) from exc


def _remote_error(location: Any, exc: BaseException) -> MjArchiveError:
    """A clear mjarchive error for a failure talking to an object store."""
    if isinstance(exc, MjArchiveError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return ArchiveNotFoundError(
            f"{_describe(location)} is not reachable: {exc}; check that the bucket exists"
        )
    if isinstance(exc, PermissionError):
        return MjArchiveError(
            f"access to {_describe(location)} was denied ({exc}); check the credentials in storage_options "
            "(e.g. key/secret) or the environment"
        )
    return MjArchiveError(
        f"cannot reach {_describe(location)}: {type(exc).__name__}: {exc}; check storage_options "
        "(e.g. endpoint_url) and the network"
    )
