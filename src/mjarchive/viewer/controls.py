"""The viewer page's controls: the panels built when the viewer starts (Timeline, Worlds, Camera,
Overlays) and what each control does when a page changes it.

Callbacks run on viser's thread pool: they only change the viewer's requests under its lock and wake
the driver thread (`playback.py`), or show a frame themselves under that lock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from .._errors import MjArchiveError
from .cameras import NO_BODY, move_home
from .overlays import OverlayLayer
from .request import format_ids, markdown_text, short_ids

__all__ = ["SPEEDS", "ViewerControls"]

#: Playback speeds offered, as labels and factors of the archive's output_fps.
SPEEDS = {"0.25×": 0.25, "0.5×": 0.5, "1×": 1.0, "2×": 2.0, "4×": 4.0}
_log = logging.getLogger(__name__)


class ViewerControls:
    """The controls part of `app.Viewer`: builds the page's panels (`_build_gui`) and handles their events.

    Uses the viewer's server, archive, window, lock and follow state, its playhead (`_request`, `_pause`,
    from `playback.ViewerPlayback`) and `_show`, `show_worlds`, `_report`.
    """

    def _build_gui(self, ids: tuple[int, ...]) -> None:
        gui, archive = self._server.gui, self._archive
        gui.configure_theme(show_share_button=False, control_width="medium")
        name = str(archive.location).rstrip("/").rsplit("/", 1)[-1]
        gui.set_panel_label(f"mjarchive · {name}")
        with gui.add_folder("Timeline"):
            self._status = gui.add_markdown("loading…")
            self._slider = gui.add_slider("Frame", min=0, max=max(archive.n_frames - 1, 0), step=1, initial_value=0,
                                          disabled=archive.n_frames == 0)
            self._play = gui.add_button("Play", hint="play or pause (at the chosen speed)")
            self._step = gui.add_button_group("Step", ("◀ frame", "frame ▶"))
            self._reset_nav = gui.add_button_group("Reset", ("◀ previous", "next ▶"))
            self._speed_in = gui.add_dropdown("Speed", tuple(SPEEDS), initial_value="1×")
            self._loop_in = gui.add_checkbox("Loop", True)
            self._live_in = gui.add_checkbox("Follow live", self._follow_live,
                                             hint="look for newly committed frames every 0.5 s")
            self._resets = gui.add_markdown("")
        with gui.add_folder("Worlds"):
            self._worlds_in = gui.add_text("World IDs", format_ids(ids), hint="e.g. 7,42 or a range 0:8")
            self._show_btn = gui.add_button("Show worlds")
            self._message = gui.add_markdown(self._worlds_note(ids))
        with gui.add_folder("Camera"):
            self._body_in = gui.add_dropdown("Follow body", (NO_BODY, *self._body_names), initial_value=NO_BODY)
            self._body_world_in = gui.add_number("Of world", int(ids[0]), step=1)
            self._reset_view = gui.add_button("Reset view")
        if archive.overlays:
            self._overlays = OverlayLayer(self._server.scene, archive.overlays)
            with gui.add_folder("Overlays"):
                self._overlays.add_checkboxes(gui, self._on_overlay)

        self._slider.on_update(self._on_slider)
        self._play.on_click(lambda _: self._toggle_play())
        self._step.on_click(lambda e: self._on_step(1 if e.target.value == "frame ▶" else -1))
        self._reset_nav.on_click(lambda e: self._on_reset_nav(1 if e.target.value == "next ▶" else -1))
        self._speed_in.on_update(lambda e: self._set(speed=SPEEDS.get(e.target.value, 1.0)))
        self._loop_in.on_update(lambda e: self._set(loop=bool(e.target.value)))
        self._live_in.on_update(lambda e: self._set(follow_live=bool(e.target.value)))
        self._show_btn.on_click(lambda _: self._on_show_worlds())
        self._body_in.on_update(lambda e: e.client is not None and self._on_follow_body())
        self._body_world_in.on_update(lambda e: e.client is not None and self._on_follow_body())
        self._reset_view.on_click(lambda _: self._reset_cameras())
        if not hasattr(self._server, "initial_camera"):  # viser < 1.1: each page is moved home as it connects
            self._server.on_client_connect(lambda client: self._reset_cameras([client]))

    def _worlds_note(self, ids: Sequence[int]) -> str:
        a = self._archive
        return (f"Showing {len(ids)} of {a.n_worlds} worlds (at most {self._max_worlds} at once); "
                f"recorded IDs: {format_ids(sorted(a.world_ids)) if a.n_worlds <= 12 else short_ids(a.world_ids)}")

    # -- GUI callbacks (viser's thread pool); a value the server set itself has no client ------------------
    def _on_slider(self, event: Any) -> None:
        if event.client is None:
            return
        with self._lock:
            if self.n_frames:
                self._request(min(max(int(round(event.target.value)), 0), self.n_frames - 1), user=True)

    def _toggle_play(self) -> None:
        with self._lock:
            n = self.n_frames
            if not n:
                return
            self._playing = not self._playing
            if self._playing and self._shown == n - 1 and not self._follow_live:
                self._request(0)  # play again from the start
            self._play.label = "Pause" if self._playing else "Play"
            self._wake.set()

    def _on_step(self, delta: int) -> None:
        with self._lock:
            if self.n_frames and self._shown is not None:
                self._pause()
                self._request(min(max(self._shown + delta, 0), self.n_frames - 1))

    def _on_reset_nav(self, direction: int) -> None:
        with self._lock:
            if self._shown is None or self._window is None:
                return
            try:  # past the starts the window keeps, it reads reset markers from the playhead on
                target = self._window.episode_start_near(self._shown, direction)
            except MjArchiveError as exc:
                self._report(exc)
                return
            if target is not None:
                self._pause()
                self._request(target)

    def _set(self, **state: Any) -> None:
        with self._lock:
            for key, value in state.items():
                setattr(self, f"_{key}", value)
            self._wake.set()

    def _on_show_worlds(self) -> None:
        try:
            ids = self.show_worlds(self._worlds_in.value)
        except MjArchiveError as exc:
            self._message.content = f"**Not shown:** {markdown_text(str(exc))}"
        except Exception as exc:  # a bug, not bad input: say so in the page and keep serving
            _log.exception("switching worlds failed")
            self._message.content = f"**Not shown** (unexpected error): {markdown_text(repr(exc))}"
        else:
            self._message.content = self._worlds_note(ids)

    def _on_overlay(self, name: str, on: bool) -> None:
        with self._lock:
            self._overlays.set_visible(name, on)
            if on and self._shown is not None:
                self._show(self._shown)

    def _on_follow_body(self) -> None:
        with self._lock:
            body = self._body_names.get(self._body_in.value)
            value = self._body_world_in.value
            world = int(value) if isinstance(value, (int, float)) and math.isfinite(value) and abs(value) < 2**63 else None
            if body is not None and world not in self.world_ids:
                shown = "not a world ID" if world is None else f"world {world} is not shown"
                self._message.content = f"**Camera:** {shown}; follow one of {format_ids(self.world_ids)}"
                body = None
            elif body is not None:
                self._message.content = self._worlds_note(self.world_ids)
            self._follow_body, self._follow_world = body, world
            self._follow.forget()
            if self._shown is not None:
                self._show(self._shown)

    def _reset_cameras(self, clients: Sequence[Any] | None = None) -> None:
        with self._lock:
            self._follow.forget()
            move_home(self._server.get_clients().values() if clients is None else clients, self._home)
