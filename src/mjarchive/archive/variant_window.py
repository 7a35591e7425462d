"""The variant values some worlds draw at some frames, for a replay of that selection
(`Archive.variant_window`): only the events that decide those frames are read and kept
(`variants.window_events`).

Replay and viewer plumbing, not part of `mjarchive.__all__`. Reads through the archive it is
given (`reader.Archive`, passed in, never imported: the reader imports this module).
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from .._errors import FormatError, MjArchiveError, SelectionError
from .variants import check_values, default_values, window_events

__all__ = ["VariantWindow", "variant_window"]


def variant_window(archive: Any, worlds: Any, frames: Any) -> VariantWindow:
    """The variant values of `worlds` (original IDs) at `frames` (committed frame indices) of an open
    `Archive`: event rows are read only up to the last of those frames, and only the events that
    decide them are kept (see `variants.window_events` for what bounds the reads)."""
    archive._check_open()
    positions = np.unique(np.asarray([archive.world_index(w) for w in np.atleast_1d(np.asarray(worlds)).tolist()],
                                     np.int64))
    idx = archive._frame_index(frames)
    drawn = np.arange(idx.start, idx.stop, idx.step or 1) if isinstance(idx, slice) else np.unique(idx)
    model = archive._base_model  # checks the declared shapes against the model before any value is read
    found = {}
    for field, spec in archive.manifest.variants.items():
        def read(column: str, lo: int, hi: int, field=field) -> np.ndarray:
            key = f"variants/{field}/{column}"
            try:
                direct = _read_events_direct(archive, key, lo, hi)
                return direct if direct is not None else np.asarray(archive._event_arrays[key][lo:hi])
            except MjArchiveError:
                raise
            except Exception as exc:
                raise FormatError(f"reading variant events {lo}.. of {field!r} failed; the archive may be "
                                  f"corrupt: {exc!r}") from exc
        found[field] = window_events(field, archive._n_events[field], spec.chunk_events, read, drawn, positions,
                                     archive.n_frames, archive.n_worlds)
    return VariantWindow(archive, model, drawn, found)


def _read_events_direct(archive: Any, key: str, lo: int, hi: int) -> np.ndarray | None:
    """Rows [lo, hi) of an event array of a local archive, chunk by chunk without zarr (a scan
    of 2**24 events costs 0.6 s, not 8); None where that path does not apply."""
    store = archive._store
    ce = archive._event_arrays[key].chunks[0]
    if lo % ce or not store.reads_directly(key):
        return None
    parts = []
    for c in range(lo // ce, -(-hi // ce)):
        chunk = store.read_chunk_now(key, (c,), None)
        if chunk is None:
            return None
        parts.append(np.asarray(chunk)[:min(ce, hi - c * ce)])
    return np.concatenate(parts) if parts else None


class VariantWindow:
    """The variant values of some worlds at some frames (`Archive.variant_window`): `changes` and
    `values` as `Archive.variant_changes` and `Archive.variant` answer them, for those only."""

    def __init__(self, archive: Any, model: mujoco.MjModel, frames: np.ndarray,
                 found: dict[str, dict[int, tuple[np.ndarray, ...]]]):
        self._archive, self._model, self.frames, self._found = archive, model, frames, found

    def _mine(self, world_id: int) -> dict[str, tuple[np.ndarray, ...]]:
        w = self._archive.world_index(world_id)
        if any(w not in per_world for per_world in self._found.values()):
            raise SelectionError(f"world {world_id!r} is not in this variant window")
        return {field: per_world[w] for field, per_world in self._found.items()}

    def changes(self, world_id: int) -> np.ndarray:
        """Sorted distinct frames > 0 at which some value of `world_id` changes between the window's
        frames (each change at the frame of the event that decides the next drawn frame)."""
        frames = [at for _, _, at in self._mine(world_id).values()]
        out = np.unique(np.concatenate(frames)) if frames else np.zeros(0, np.int64)
        return out[out > 0]

    def values(self, world_id: int, frame: int) -> dict[str, np.ndarray]:
        """Every variant field's value in force for `world_id` at `frame`, one of the window's frames."""
        f = int(frame)
        slot = int(np.searchsorted(self.frames, f))
        if slot >= len(self.frames) or self.frames[slot] != f:
            raise SelectionError(f"frame {f} is not in this variant window")
        values = default_values(self._model, self._archive.manifest.variants)
        for field, (slots, index, _) in self._mine(world_id).items():
            k = int(np.searchsorted(slots, slot, side="right"))
            if k:
                row = self._archive._read_event(field, int(index[k - 1]))
                check_values(field, row[None], self._model, what=f" (event {int(index[k - 1])})")
                values[field] = row
        return values
