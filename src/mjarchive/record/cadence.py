"""The recorder's clock: which simulation steps are output frames, from the batch time alone."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .._errors import AppendError, MjArchiveError

__all__ = ["Cadence"]


class Cadence:
    """Decides, per call, whether a frame is due (the rule: `mjarchive.record.recorder`'s docstring)."""

    def __init__(self, output_fps: float, playback_speed: float, timestep: float):
        if not output_fps > 0 or not playback_speed > 0 or not timestep > 0:
            raise MjArchiveError("output_fps, playback_speed and the model timestep must be > 0")
        self.timestep = float(timestep)
        ratio = Fraction(playback_speed / (output_fps * timestep)).limit_denominator(10**6)
        self.steps_per_frame = max(ratio, Fraction(1, 10**6))
        self._p, self._q = self.steps_per_frame.numerator, self.steps_per_frame.denominator
        self.clock: int | None = None  # monotonic step count
        self._n0 = 0
        self._last_m = 0
        self._next_k = 0

    def advance(self, t: float) -> bool:
        """Update the clock from the batch time `t` (seconds); True when a frame is due now."""
        if not math.isfinite(t):
            raise AppendError(f"simulation time must be finite, got {t!r}")
        m = round(t / self.timestep)
        if self.clock is None:
            self.clock = self._n0 = m
        else:
            self.clock += m - self._last_m if m >= self._last_m else max(m, 0)
        self._last_m = m
        rel = self.clock - self._n0
        p, q = self._p, self._q  # r = p / q, in integers so the per-call check stays cheap
        if rel < -((-self._next_k * p) // q):  # ceil(k * r)
            return False
        # Smallest k with ceil(k * r) > rel, i.e. k * r > rel.
        self._next_k = (rel * q) // p + 1
        return True

    @property
    def time(self) -> float:
        return self.clock * self.timestep

    def advance_many(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`advance` over a sequence of finite batch times at once: (indices of the steps that are
        frames, their stored times); the clock ends where the per-step calls would leave it."""
        if not len(times):
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        m = np.rint(times / self.timestep)
        if np.abs(m).max() > 2**40:  # beyond int64's room for (clock * q): Python's integers
            due, stamps = [], []
            for i, t in enumerate(times.tolist()):
                if self.advance(t):
                    due.append(i)
                    stamps.append(self.time)
            return np.asarray(due, np.int64), np.asarray(stamps, np.float64)
        m = m.astype(np.int64)
        if self.clock is None:
            self.clock = self._n0 = self._last_m = int(m[0])
        prev = np.concatenate(([self._last_m], m[:-1]))
        clock = self.clock + np.cumsum(np.where(m >= prev, m - prev, np.maximum(m, 0)))
        frame = ((clock - self._n0) * self._q) // self._p  # the last frame k with ceil(k * r) <= the step
        due = frame >= self._next_k
        due[1:] &= frame[1:] > frame[:-1]
        self.clock, self._last_m = int(clock[-1]), int(m[-1])
        self._next_k = max(self._next_k, int(frame[-1]) + 1)
        index = np.flatnonzero(due)
        return index, clock[index] * self.timestep
