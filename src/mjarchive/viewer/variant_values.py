"""The variant values in force (format 1.1) of a `PoseWindow`'s worlds: the frames where each
world's values change, and its values over each stretch between changes, read once and kept (a few
stretches per world)."""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np

__all__ = ["VARIANT_CACHE_PER_WORLD", "VariantValues"]

#: A world's variant values kept per stretch between its changes (its current ones and a few more).
VARIANT_CACHE_PER_WORLD = 4


class VariantValues:
    """Variant values of `world_ids` by world position (0..W-1), cached.

    Shares the window's locks: `io_lock` for archive reads, `cond` guarding what is cached here (the
    window calls `forget_changes()` and `clear()` holding it).
    """

    def __init__(self, archive: Any, world_ids: tuple[int, ...], io_lock: threading.Lock,
                 cond: threading.Condition):
        self._archive = archive
        self.world_ids = world_ids
        self._io_lock, self._cond = io_lock, cond
        self._changes: list[np.ndarray] | None = None  # per world position: frames its variant values change
        self._values: collections.OrderedDict[tuple[int, int], dict[str, np.ndarray]] = collections.OrderedDict()

    @property
    def held(self) -> int:
        """Sets of values held now (one per world and stretch)."""
        return len(self._values)

    def forget_changes(self) -> None:
        self._changes = None  # a live writer's new events change values only from its new frames on

    def clear(self) -> None:
        self._values.clear()

    def segments(self, frame: int) -> tuple[int, ...]:
        """Per world: how many of its variant changes lie at or before `frame`."""
        return tuple(int(np.searchsorted(ch, frame, side="right")) for ch in self.changes())

    def changes(self) -> list[np.ndarray]:
        """Per world: the frames where its values change (read once, until `forget_changes()`)."""
        changes = self._changes
        if changes is None:
            with self._io_lock:
                changes = [np.asarray(self._archive.variant_changes(w), np.int64) for w in self.world_ids]
            with self._cond:
                self._changes = changes
        return changes

    def at(self, w: int, frame: int) -> dict[str, np.ndarray]:
        """World position w's values in force at `frame`, cached per (world, stretch between changes)."""
        key = (w, int(np.searchsorted(self.changes()[w], frame, side="right")))
        with self._cond:
            hit = self._values.get(key)
            if hit is not None:
                self._values.move_to_end(key)
                return hit
        with self._io_lock:
            values = self._archive.variant(self.world_ids[w], frame)  # checked against the model's rules
        for v in values.values():
            v.flags.writeable = False
        with self._cond:
            self._values[key] = values
            while len(self._values) > VARIANT_CACHE_PER_WORLD * len(self.world_ids):
                self._values.popitem(last=False)
        return values
