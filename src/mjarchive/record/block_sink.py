"""Recorded blocks on their way from the recorder's gatherers to the archive writer.

The gatherers (MjData, Warp Data, arrays) hand each full block to a `BlockSink`, which appends it
with the variant events and overlays of its frames, keeps a refused block's good frames and raises
the first refusal after them. Frames are numbered by `seq`, the recorder's count of recorded frames
(0: its first), so `appended` is the seq of the next frame to reach the writer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._errors import AppendError
from ..archive.writer import ArchiveWriter
from .overlay_frames import block_overlays, select_overlays
from .variants_capture import VariantLog

__all__ = ["BlockSink"]


class BlockSink:
    """Appends a recorder's gathered blocks to `writer`; `log`: its variant events (None: no variants)."""

    def __init__(self, writer: ArchiveWriter, log: VariantLog | None):
        self._writer = writer
        self._log = log
        self.appended = 0  # recorded frames handed to the writer
        self._overlay_frames: dict[int, dict[str, Any]] = {}  # seq -> overlays of frames in flight

    def keep_overlays(self, overlays: Mapping, sel: np.ndarray, nworld: int, seq: int) -> None:
        """Check and copy recorded frame `seq`'s overlays until its block is appended."""
        declared = self._writer.manifest.overlays
        values = select_overlays(overlays, declared, sel, nworld, copy=True)
        frame = self._writer.n_frames + seq - self.appended
        for name, value in values.items():  # refused now, at the call that gave them, not at the block
            declared[name].pack(name, value, len(sel), frame)
        self._overlay_frames[seq] = values

    def drop_overlays(self, seq: int) -> None:
        """Forget frame `seq`'s overlays: the frame was refused before it was gathered."""
        self._overlay_frames.pop(seq, None)

    def append_block(self, times: np.ndarray, fields: dict[str, np.ndarray], reset: np.ndarray,
                     captured: Sequence = ()) -> None:
        """The gatherers' sink. A block the writer refuses (a NaN, say) keeps its good frames, as the
        MjData path keeps every frame but the bad one; the first refusal (naming the frame and world)
        is raised after them. `captured`: the block's variant captures, (frame in block, selection
        positions, values). Each event reaches the writer just before its frame: the block is
        appended in parts split at the frames that carry events (one part when none do)."""
        s0, n = self.appended, len(times)
        self.appended = s0 + n
        log = self._log
        if log is not None:
            for j, pos, values in captured:
                log.add(s0 + j, pos, values, captured=True)
        overlays = block_overlays(self._overlay_frames, s0, n) if self._overlay_frames else None
        cuts = (0, n) if log is None else log.cuts(s0, n)

        def append(part: slice) -> None:
            one = None if overlays is None else {k: v[part] for k, v in overlays.items()}
            self._writer.append(times[part], reset=reset[part], overlays=one, **{k: f[part] for k, f in fields.items()})

        first: AppendError | None = None
        for a, b in zip(cuts, cuts[1:]):
            try:
                if log is not None:
                    log.emit(self._writer, s0 + a, s0 + a + 1)
            except AppendError as exc:  # the frames are still appended
                first = first or exc
            try:
                append(slice(a, b))
            except AppendError as exc:
                first = first or exc
                for i in range(a, b):  # frame by frame: every good frame is kept
                    try:
                        append(slice(i, i + 1))
                    except AppendError:
                        pass
        if first is not None:
            raise AppendError(f"{first} (detected when the block of {n} recorded frames holding it was checked "
                              "on its hand-off to the writer: that frame may have come from an earlier call "
                              "than this one)") from None
