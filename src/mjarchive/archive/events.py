"""The writer's side of model variants (format 1.1): events checked on the caller's thread, queued
until the frame they start at is committed, then stored just before that commit."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

import mujoco
import numpy as np
import zarr
import zarr.codecs
from zarr.core.sync import sync

from .._errors import AppendError, FormatError, MjArchiveError
from .format import MAX_UNCOMMITTED_CHUNKS
from .manifest import Manifest
from .variants import (MAX_VARIANT_EVENTS, VariantSpec, check_field_name, chunk_events_for, field_shape, needs_model,
                       variant_rows)

__all__ = ["VariantEvents", "variant_specs", "create_event_arrays"]


def variant_specs(names: Any, model: mujoco.MjModel) -> dict[str, VariantSpec]:
    """The declarations of `create(variant_fields=...)` for this model (MjArchiveError if not allowed)."""
    specs = {}
    for name in (names,) if isinstance(names, str) else names:
        try:
            rule = check_field_name(name)
        except FormatError as exc:
            raise MjArchiveError(str(exc)) from None
        shape = field_shape(model, name)
        if not shape[0]:
            raise MjArchiveError(f"variant field {name!r}: the model has no {rule.size[1:]} (its {rule.size} is 0)")
        specs[name] = VariantSpec(shape, rule.dtype, chunk_events_for(shape, rule.dtype))
    return specs


def create_event_arrays(root: zarr.Group, manifest: Manifest) -> None:
    """The groups and empty event arrays of every declared variant field."""
    if not manifest.variants:
        return
    root.create_group("variants")
    for field, spec in manifest.variants.items():
        root.create_group(f"variants/{field}")
        for key, (tail, dtype) in manifest.event_arrays(field).items():
            dims = ("event", *(f"{field}_{i}" for i in range(len(tail))))
            root.create_array(key, shape=(0, *tail), chunks=(spec.chunk_events, *tail), dtype=dtype,
                              dimension_names=dims, compressors=zarr.codecs.ZstdCodec(level=3), fill_value=0)


class VariantEvents:
    """The variant events of one writer: `prepare` checks values (caller's thread), `queue` orders
    them (under the writer's lock), `write` stores those of committed-to-be frames (writer thread)."""

    def __init__(self, root: zarr.Group, manifest: Manifest, n_events: dict[str, int],
                 model: Callable[[], mujoco.MjModel]):
        self.manifest = manifest
        # Write every chunk, even one equal to the fill value (frame 0, world 0): a missing one is damage.
        self.arrays = {key: root[key].with_config({"write_empty_chunks": True})
                       for field in manifest.variants for key in manifest.event_arrays(field)}
        self.counts = {field: n_events.get(field, 0) for field in manifest.variants}  # committed rows
        self._queued = dict(self.counts)  # committed plus queued: readers refuse more than MAX_VARIANT_EVENTS
        self._pending: deque = deque()  # (frame, world positions, {field: (k, *shape) values}), in frame order
        self._last_frame = 0
        self._model = model
        self._world_pos = {w: i for i, w in enumerate(manifest.world_ids)}

    def check_resumed(self) -> None:
        """Validate reopened event arrays as the reader does. A writer that crashed before a commit of
        many events leaves longer arrays (of any declared length): they are shrunk in the metadata
        only, since zarr's resize would list every chunk; rows past the count are rewritten first."""
        for field, spec in self.manifest.variants.items():
            self.manifest.check_event_arrays(field, self.arrays, self.counts[field])
            ce = spec.chunk_events
            keep = -(-self.counts[field] // ce) * ce
            for key in self.manifest.event_arrays(field):
                arr = self.arrays[key]
                if arr.shape[0] > keep + MAX_UNCOMMITTED_CHUNKS * ce:
                    sync(arr.async_array.resize((keep, *arr.shape[1:]), delete_outside_chunks=False))

    def prepare(self, world_ids: Any, fields: dict[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """World positions and stored rows of a `set_variant` call; AppendError on bad input."""
        declared = self.manifest.variants
        if not declared:
            raise AppendError("this archive declares no variant fields; create it with "
                              "mjarchive.create(..., variant_fields=('geom_rgba', ...))")
        if not fields:
            raise AppendError(f"set_variant() needs values of at least one of {sorted(declared)}")
        unknown = sorted(set(fields) - set(declared))
        if unknown:
            raise AppendError(f"variant field(s) {unknown} were not declared at creation (declared: "
                              f"{sorted(declared)}); pass variant_fields= to mjarchive.create")
        ids = np.atleast_1d(np.asarray(world_ids))
        if ids.ndim != 1 or not ids.size or ids.dtype.kind not in "iu":
            raise AppendError(f"world_ids must be a world ID or a non-empty sequence of them, got {world_ids!r:.80}")
        try:
            positions = np.array([self._world_pos[int(w)] for w in ids.tolist()], dtype=np.int32)
        except KeyError as exc:
            raise AppendError(f"world {exc.args[0]} is not recorded in this archive") from None
        return positions, {name: self._rows(name, value, ids) for name, value in fields.items()}

    def _rows(self, name: str, value: Any, ids: np.ndarray) -> np.ndarray:
        return variant_rows(name, value, self.manifest.variants[name].shape, ids,
                            self._model() if needs_model(name) else None)

    def queue(self, frame: Any, n_appended: int, positions: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Queue prepared rows from `frame` (None: the next appended one); call under the writer's lock."""
        start = n_appended if frame is None else frame
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < n_appended:
            raise AppendError(f"frame={frame!r}: a variant starts at the next appended frame ({n_appended}) or "
                              "later, never at a frame already appended")
        if start < self._last_frame:
            raise AppendError(f"frame={start}: variants are recorded in frame order (the last started at "
                              f"frame {self._last_frame})")
        full = [name for name in values if self._queued[name] + len(positions) > MAX_VARIANT_EVENTS]
        if full:
            raise AppendError(f"variant field {full[0]!r} already has {self._queued[full[0]]} events; the format "
                              f"allows {MAX_VARIANT_EVENTS} per field (readers refuse more): record changes only "
                              "where values change, or continue in a new archive")
        for name in values:
            self._queued[name] += len(positions)
        self._pending.append((int(start), positions, values))
        self._last_frame = int(start)

    def write(self, stop: int, lock: threading.Condition) -> None:
        """Store the events that start before frame `stop` (just before the commit of `stop`)."""
        due: list = []
        with lock:
            while self._pending and self._pending[0][0] < stop:
                due.append(self._pending.popleft())
        rows: dict[str, list] = {}
        for frame, positions, values in due:
            for name, value in values.items():
                rows.setdefault(name, []).append((np.full(len(positions), frame, np.int64), positions, value))
        for name, parts in rows.items():
            columns = [np.concatenate([p[i] for p in parts]) for i in range(3)]
            lo = self.counts[name]
            hi = lo + len(columns[0])
            ce = self.manifest.variants[name].chunk_events
            for key, column in zip(self.manifest.event_arrays(name), columns):
                arr = self.arrays[key]
                if arr.shape[0] < hi:
                    arr.resize((-(-hi // ce) * ce, *arr.shape[1:]))
                arr[lo:hi] = column
            self.counts[name] = hi

    def trim(self) -> None:
        """At close: event arrays hold exactly the committed rows (events of frames never appended are dropped)."""
        for field in self.manifest.variants:
            for key in self.manifest.event_arrays(field):
                arr = self.arrays[key]
                if arr.shape[0] != self.counts[field]:
                    arr.resize((self.counts[field], *arr.shape[1:]))
