"""Turning a path or URL into a Zarr store, and store housekeeping."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import zarr
import zarr.storage

from ._errors import ArchiveNotFoundError, MjArchiveError

_URL_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
# zarr's LocalStore writes `<key>.<uuid hex>.partial` and renames it into place.
_PARTIAL_RE = re.compile(r"\.[0-9a-f]{32}\.partial$")

Location = str | os.PathLike | zarr.storage.StoreLike


def is_url(location: Any) -> bool:
    return isinstance(location, str) and bool(_URL_RE.match(location)) and not location.startswith("file://")


def local_path(location: Any) -> Path | None:
    """The filesystem path of a local location, or None for URLs and store objects."""
    if isinstance(location, os.PathLike):
        return Path(location)
    if isinstance(location, str):
        if location.startswith("file://"):
            return Path(location[len("file://"):])
        if not is_url(location):
            return Path(location)
    if isinstance(location, zarr.storage.LocalStore):
        return Path(location.root)
    return None


def make_store(location: Any, *, read_only: bool, storage_options: dict | None = None) -> Any:
    """A Zarr store for a path, a `file://`/`memory://`/`s3://` URL, or an existing store object."""
    path = local_path(location)
    if path is not None and not isinstance(location, zarr.storage.LocalStore):
        return zarr.storage.LocalStore(path, read_only=read_only)
    if isinstance(location, str):
        if location.startswith("memory://"):
            return _memory_store(location, read_only)
        try:
            return zarr.storage.FsspecStore.from_url(
                location, storage_options=storage_options or {}, read_only=read_only
            )
        except ImportError as exc:
            raise MjArchiveError(
                f"opening {location!r} needs an fsspec filesystem: {exc}; install `mjarchive[s3]`"
            ) from None
    return location


_MEMORY_STORES: dict[str, Any] = {}


def _memory_store(url: str, read_only: bool) -> Any:
    """Process-local in-memory stores keyed by URL, so create() then open() see the same data."""
    store = _MEMORY_STORES.setdefault(url, zarr.storage.MemoryStore())
    return store.with_read_only(read_only) if read_only else store


def remove_partial_files(location: Any) -> int:
    """Delete zarr's leftover `*.partial` temporaries after a crash; returns how many."""
    path = local_path(location)
    if path is None or not path.is_dir():
        return 0
    removed = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            if _PARTIAL_RE.search(name):
                Path(dirpath, name).unlink(missing_ok=True)
                removed += 1
    return removed


def open_root(location: Any, *, mode: str, storage_options: dict | None = None) -> zarr.Group:
    """Open the archive's root group for reading ('r') or appending ('a')."""
    path = local_path(location)
    if path is not None and not (path / "zarr.json").is_file():
        raise ArchiveNotFoundError(
            f"no archive at {str(path)!r} (no zarr.json there); create one with mjarchive.create()"
        )
    store = make_store(location, read_only=(mode == "r"), storage_options=storage_options)
    try:
        return zarr.open_group(store=store, mode="r" if mode == "r" else "r+", use_consolidated=False)
    except (FileNotFoundError, KeyError) as exc:
        raise ArchiveNotFoundError(f"no archive at {location!r}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise ArchiveNotFoundError(f"{location!r} is not a readable Zarr v3 group: {exc}") from None
