"""The metadata documents of an archive opened for reading: each read once through the
CheckedStore, checked, and remembered by its exact bytes (a warm reopen then costs one read per
document, not a re-derivation); the archive's arrays are built from their own documents."""

from __future__ import annotations

import collections
import collections.abc
import threading
from typing import Any

import zarr
from zarr.core.array import AsyncArray
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.storage import StorePath

from .._errors import FormatError
from .format import check_codec_settings
from .manifest import parse_root_attributes

__all__ = ["ArrayDocuments", "open_array", "parse_root"]

_ROOT_CACHE: collections.OrderedDict = collections.OrderedDict()
_ARRAY_CACHE: collections.OrderedDict = collections.OrderedDict()
_CACHE_ENTRIES, _CACHE_DOC_BYTES = 32, 1 << 20
_CACHE_LOCK = threading.Lock()  # archives may be opened from several threads (renders, viewers)


def _cached(cache: collections.OrderedDict, raw: bytes, make: Any) -> Any:
    if len(raw) > _CACHE_DOC_BYTES:
        return make()
    with _CACHE_LOCK:
        value = cache.get(raw)
        if value is not None:
            cache.move_to_end(raw)
            return value
    value = make()  # raises (nothing cached) on invalid metadata
    with _CACHE_LOCK:
        cache[raw] = value
        while len(cache) > _CACHE_ENTRIES:
            cache.popitem(last=False)
    return value


def parse_root(raw: bytes, doc: dict) -> tuple:
    """(manifest, n_frames, status, n_events) of a root document (`raw` its bytes, `doc` parsed)."""
    manifest, n_frames, status, n_events = _cached(_ROOT_CACHE, raw, lambda: parse_root_attributes(doc.get("attributes")))
    return manifest, n_frames, status, dict(n_events)


class ArrayDocuments(collections.abc.Mapping):
    """The archive's arrays by name, each opened from its own metadata document and checked against
    the manifest on first access (an Archive touches all of them when it opens)."""

    def __init__(self, archive: Any, names: list[str]):
        self._archive, self._names, self._open = archive, names, {}

    def __getitem__(self, name: str) -> Any:
        arr = self._open.get(name)
        if arr is None:
            if name not in self._names and name != "world_id":
                raise KeyError(name)
            archive = self._archive
            arr, raw = open_array(archive._store, name, with_bytes=True)
            key = (archive._root_raw, archive._n_frames, name, raw)  # all the checks depend on
            with _CACHE_LOCK:
                checked = key in _CHECKED
            if not checked:
                archive._check_array(name, arr)
                _remember(_CHECKED, key)
            self._open[name] = arr
        return arr

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


_CHECKED: collections.OrderedDict = collections.OrderedDict()  # array checks passed, by what they depend on


def _remember(cache: collections.OrderedDict, key: Any) -> None:
    if sum(len(k) for k in key if isinstance(k, bytes)) <= 2 * _CACHE_DOC_BYTES:
        with _CACHE_LOCK:
            cache[key] = True
            while len(cache) > 4 * _CACHE_ENTRIES:
                cache.popitem(last=False)


def open_array(store: Any, name: str, *, with_bytes: bool = False) -> Any:
    """A zarr array built from its metadata document (read once, through the CheckedStore); with
    `with_bytes`, also the document's bytes."""
    try:
        found = store.read_json_now(f"{name}/zarr.json")
    except (FileNotFoundError, NotADirectoryError):
        found = None
    if found is None:
        raise FormatError(f"the archive is missing its {name!r} array")
    raw, meta = found
    if meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        raise FormatError(f"{name!r} should be a Zarr v3 array")
    check_codec_settings(meta, name)
    problem = store.metadata_error(name)
    if problem is not None:  # what the CheckedStore would refuse at the first chunk, refused now
        raise FormatError(f"array {name!r} cannot be read safely: {problem}")
    try:
        metadata = _cached(_ARRAY_CACHE, raw, lambda: ArrayV3Metadata.from_dict(dict(meta)))  # frozen: shareable
        arr = zarr.Array(AsyncArray(metadata=metadata, store_path=StorePath(store, name)))
    except Exception as exc:
        raise FormatError(f"the metadata of array {name!r} is unreadable (its shape, chunk grid, codecs or data "
                          f"type): {exc}") from None
    return (arr, raw) if with_bytes else arr
