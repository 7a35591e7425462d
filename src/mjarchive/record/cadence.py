"""The recorder's clock: which simulation steps are output frames, from the batch time alone."""

from __future__ import annotations

import math
from fractions import Fraction

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
