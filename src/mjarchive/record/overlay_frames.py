"""Overlays on their way from `Recorder.record()` to the archive writer.

`select_overlays` keeps the recorded worlds' values of one frame (in `worlds` order); on the device
paths the recorder keeps them by recorder frame until the block holding that frame is appended,
and `block_overlays` gives them to the writer in its block form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import AppendError

__all__ = ["block_overlays", "select_overlays"]


def select_overlays(overlays: Mapping[str, Any], declared: Mapping[str, Any], sel: np.ndarray,
                    nworld: int, copy: bool) -> dict[str, Any]:
    """One frame's overlay values for the recorded worlds, in `worlds` order.

    A value with one entry per simulated world (`nworld` entries, an array or a list) gives the
    selected worlds' entries `value[sel]`, whatever the order of `sel`. One with `len(sel)` entries,
    when that differs from `nworld`, is taken as the recorded worlds' values already. With `copy`,
    values are copied, because the frame reaches the writer later and the caller may reuse its
    buffers.
    """
    identity = len(sel) == nworld and bool((sel == np.arange(nworld)).all())
    out = {}
    for name, value in overlays.items():
        overlay = declared.get(name)
        if overlay is None:
            raise AppendError(f"unknown overlay {name!r}; declared: {sorted(declared)} (declare overlays when "
                              "creating the Recorder: overlays={'name': mjarchive.Overlay.points(...)})")
        if value is None:
            out[name] = None
            continue
        text = overlay.kind == "text"
        if not text and not isinstance(value, (list, tuple)) and hasattr(value, "__array__"):
            value = np.asarray(value)
            if value.ndim and len(value) == nworld and not identity:
                value = value[sel]  # fancy indexing copies
            elif copy:
                value = value.copy()
        elif isinstance(value, (list, tuple)):
            if len(value) == nworld and not identity:
                value = [value[i] for i in sel.tolist()]
            if copy:
                value = [None if v is None else (list(v) if text else np.array(v, dtype=np.float64)) for v in value]
        out[name] = value
    return out


def block_overlays(frames: dict[int, dict[str, Any]], s0: int, n: int) -> dict[str, list]:
    """Take the kept overlays of recorder frames s0 .. s0+n-1 out of `frames`, as the writer's block
    form: per overlay name, one value per frame (None where that frame has none)."""
    per_frame = [frames.pop(s, None) for s in range(s0, s0 + n)]
    names = {name for f in per_frame if f for name in f}
    return {name: [None if f is None else f.get(name) for f in per_frame] for name in names}
