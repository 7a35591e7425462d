"""The viewer's playhead: requests from the controls and the API, playing at a speed and looping,
following a live archive, the timeline's range and episode marks, and the one driver thread that
shows each frame.

The driver thread owns the playhead: it plays, polls a live archive and sends each frame in one
atomic message group; everything else only changes requests under the lock and wakes it.
"""

from __future__ import annotations

import logging
import time

from .._errors import ClosedError, MjArchiveError
from .request import markdown_text, resets_text

__all__ = ["MAX_MARKS", "POLL_SECONDS", "SEND_HZ", "ViewerPlayback"]

POLL_SECONDS = 0.5  # how often "Follow live" looks for newly committed frames
SEND_HZ = 30.0  # the most frames per second sent while playing (faster playback skips frames)
MAX_MARKS = 200  # episode starts marked on the slider; more are listed in the text only
_log = logging.getLogger(__name__)


class ViewerPlayback:
    """The playback part of `app.Viewer`: the playhead's state changes (the caller holds the lock) and
    the driver thread (`_drive`).

    Uses the viewer's lock, wake event, window and playback state, the controls' slider, play button,
    status and resets text (`controls.ViewerControls`), and `_show`, `_status_text`, `_report`.
    """

    # -- state changes (caller holds the lock) ------------------------------------------------------------------
    def _request(self, frame: int, *, user: bool = False) -> None:
        self._target, self._pos = frame, float(frame)
        self._target_from_slider = user
        self._wake.set()

    def _pause(self) -> None:
        if self._playing:
            self._playing = False
            self._play.label = "Play"

    def _timeline_changed(self) -> None:
        """The slider's range and marks, the resets list: after a refresh or a world switch."""
        n = self.n_frames
        self._slider.max = max(n - 1, 0)
        self._slider.disabled = n == 0
        per_world = {w: self._window.episode_starts(w) for w in self.world_ids} if n else {}
        marks = tuple(self._window.episode_marks(MAX_MARKS) or ()) if n else ()
        try:  # viser has no public setter for a slider's marks: assign the prop the constructor fills
            from viser._messages import GuiSliderMark

            self._slider._marks = tuple(GuiSliderMark(value=float(s), label=None) for s in marks) or None
        except Exception:  # another viser version: the resets are still listed below
            _log.debug("could not update the slider's marks", exc_info=True)
        self._resets.content = resets_text(per_world, {w: self._window.episode_count(w) - 1 for w in per_world})
        if not n:
            self._status.content = ("**frame – / 0** · no committed frames yet"
                                    + (" · waiting for some (Follow live)" if self._follow_live else "")
                                    + (" · **" + markdown_text(self._notice) + "**" if self._notice else ""))

    def _poll(self) -> None:
        before, status = self.n_frames, self._archive.status
        n = self._window.refresh()
        if n == before:
            if self._archive.status != status and self._shown is not None:  # the writer closed: finalized
                self._status.content = self._status_text(self._shown, self._time)
            return
        if n < before:
            self._frames_dropped(before, n)
        elif before:  # (from 0: a rewrite's first commit after its drop to 0 frames, whose notice stays)
            self._notice = ""
        self._timeline_changed()
        at_end = self._shown is None or self._shown == before - 1
        if n and at_end and not self._playing:
            self._request(n - 1)  # following a live run: stay on its newest committed frame
        elif self._shown is not None:
            self._status.content = self._status_text(self._shown, self._time)

    def _frames_dropped(self, before: int, n: int) -> None:
        """The committed count went down (never for a valid archive: it was rewritten or damaged): the
        playhead is clamped to the frames committed now, and the page and the log say so."""
        shown = self._shown
        if shown is not None and shown >= n:
            self._pos = float(max(n - 1, 0))
            if n:
                self._request(n - 1)
            else:
                self._shown = self._target = None
        where = f"showing frame {n - 1}" if n else "no frame to show"
        self._notice = (f"the archive's committed frames dropped from {before} to {n} (rewritten or damaged?); "
                        + (where if shown is not None and shown >= n else f"frame {shown} is still committed"))
        _log.warning("mjarchive view: %s", self._notice)

    def _advance(self, dt: float) -> None:
        n = self.n_frames
        if not n:
            return
        self._pos += dt * self._fps * self._speed
        if self._pos > n - 1:
            if self._follow_live and self._archive.status == "live":
                self._pos = float(n - 1)  # wait at the newest frame for more
            elif self._loop:
                self._pos = 0.0 if self._pos >= n else self._pos % n
            else:
                self._pos = float(n - 1)
                self._pause()
        frame = int(self._pos)
        if frame != self._shown:
            self._target, self._target_from_slider = frame, False

    # -- the driver thread ------------------------------------------------------------------------------------------
    def _drive(self) -> None:
        last = time.monotonic()
        next_poll = last
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                dt, last = now - last, now
                try:
                    if self._follow_live and now >= next_poll:
                        next_poll = now + POLL_SECONDS
                        self._poll()
                    if self._playing:
                        self._advance(dt)
                    target = self._target
                    if target is not None and target != self._shown and self.n_frames:
                        self._show(min(target, self.n_frames - 1))
                        self._target_from_slider = False
                except ClosedError:
                    if self._closed:
                        return
                except Exception as exc:  # shown in the page; the server keeps running
                    if not isinstance(exc, MjArchiveError):
                        _log.exception("the viewer failed to show a frame")
                    self._report(exc)
                    self._pause()
                    self._target = self._shown
                if self._playing:
                    timeout = 1.0 / SEND_HZ
                else:
                    timeout = max(0.0, next_poll - time.monotonic()) if self._follow_live else 1.0
            self._wake.wait(timeout)
            self._wake.clear()
