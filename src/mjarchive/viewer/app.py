"""The browser viewer: `mjarchive view ARCHIVE` and `mjarchive.view(archive)`.

A `viser` server (its prebuilt client comes in the wheel, so it works offline) shows the selected
worlds side by side, laid out like `render(layout='scene')` (`ScenePlan.grid`), each labelled with
its original ID. Every drawn geom (`geometry.geom_meshes`, from the archive's bundled model compiled
in the sandbox) is one batched mesh with an instance per world (`drawing.GeomLayer`), posed each frame
from `PoseWindow`, which reads only the selected worlds and a window of chunks around the playhead.

Format 1.1: each world is drawn with its variant values in force at the frame shown (poses with its
body and geom placements, colours and sizes re-sent when some world's values change); fields the
viewer cannot draw (sites, lights, cameras) are named in the status line. Overlay tracks are drawn
over the worlds (`overlays.OverlayLayer`), each with a checkbox.

One driver thread owns the playhead: GUI callbacks (viser's thread pool) only change requests under
the lock and wake it; it plays, polls a live archive and sends each frame in one atomic message group.
The page's controls are built and handled in `controls.py`, the playhead and that thread live in
`playback.py`; `Viewer` brings them together with the worlds shown and the drawing of each frame.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Any

import numpy as np

from .._errors import BackendError, ClosedError, MjArchiveError, SelectionError
from ..archive.opening import open as open_archive
from ..archive.reader import Archive
from ..replay.views.scene import ScenePlan
from .cameras import NO_BODY, BodyFollow, body_choices, home_view, set_initial
from .controls import SPEEDS, ViewerControls
from .drawing import COLOUR_FIELDS, GeomLayer, Part, not_shown, world_labels, world_looks
from .frames import MAX_VIEW_WORLDS, FramePoses, PoseWindow
from .geometry import geom_meshes
from .looks import add_lights, headlight_position, sky_image
from .overlays import MAX_LABELS, VIEW_PRIMITIVES_PER_TRACK, OverlayLayer
from .playback import ViewerPlayback
from .request import (check_listen, check_max_worlds, format_ids, is_loopback, markdown_text, parse_worlds, quiet,
                      url_for)

__all__ = ["DEFAULT_MAX_WORLDS", "SPEEDS", "Viewer", "parse_worlds", "view"]

#: Worlds shown at once unless `max_worlds` says otherwise (the hard limit is MAX_VIEW_WORLDS).
DEFAULT_MAX_WORLDS = 16
_log = logging.getLogger(__name__)


class Viewer(ViewerControls, ViewerPlayback):
    """A running viewer; made by `mjarchive.view(..., block=False)`. A context manager.

    `url`, `host` and `port` (the real one when port 0 was asked for); `world_ids` and `frame` shown
    now, `n_frames` known; `seek(frame)` and `show_worlds(worlds)` act as the page's controls do.
    """

    def __init__(self, archive: Archive, *, owns_archive: bool, worlds: Any, frame: int, port: int, host: str,
                 spacing: float, max_worlds: int):
        try:
            import viser
        except ImportError:
            raise BackendError("the viewer needs the 'viser' package; install it with: pip install 'mjarchive[view]'") \
                from None
        self._archive, self._owns_archive = archive, owns_archive
        self._spacing, self._max_worlds = spacing, check_max_worlds(max_worlds)
        self._lock = threading.RLock()  # guards the state below and what is sent
        self._wake = threading.Event()
        self._closed = False
        self._window: PoseWindow | None = None
        self._layer: GeomLayer | None = None
        self._look_key: tuple[int, ...] | None = None  # the worlds' variant segments the looks were set for
        self._labels: list[Any] = []
        self._hidden_primitives = 0  # overlay primitives not drawn at the frame shown (chunks.shown_at_most)
        self._notice = ""  # said in the status line until the committed count changes again
        self._playing, self._speed, self._loop = False, 1.0, True
        self._follow_live = archive.status == "live"
        self._follow_body: int | None = None  # body id the cameras follow, in world self._follow_world
        self._follow_world: int | None = None
        self._follow = BodyFollow()  # moves the pages' cameras with that body
        self._pos = 0.0  # the playhead in frames, fractional while playing
        self._target: int | None = None  # frame to show
        self._shown: int | None = None  # frame on the handles now
        self._target_from_slider = False  # the slider already shows the target: do not set it back
        self._time = 0.0  # simulation time of the frame shown
        self._invalid: list[int] = []  # worlds whose pose at the frame shown is not finite

        self._model = archive.model()
        self._variant_fields = archive.variant_fields
        self._not_shown = not_shown(self._variant_fields)
        # A geom whose model alpha is 0 may be visible in some world: build it too, hidden where it is clear.
        self._meshes = geom_meshes(self._model, keep_clear=bool(COLOUR_FIELDS & set(self._variant_fields)))
        self._geoms = [m.geom for m in self._meshes]
        self._fps = float(archive.output_fps or 30.0)
        self._overlays: OverlayLayer | None = None
        self._body_names = body_choices(self._model)
        ids = self._resolve(worlds)
        n = archive.n_frames
        if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)):
            raise SelectionError(f"frame must be an integer, got {frame!r}")
        if not (-n <= frame < n if n else frame in (0, -1)):
            raise SelectionError(f"frame {frame} is out of range: the archive has {n} committed frames (0..{n - 1})")
        start = int(frame) % n if n else 0

        self.host = host
        listen_port = check_listen(host, port)
        with quiet():
            self._server = viser.ViserServer(host=host, port=listen_port, label="mjarchive", verbose=False)
        try:
            self.port = int(self._server.get_port()) or listen_port
            self.url = url_for(host, self.port)
            self._disable_sharing()
            self._build_gui(ids)
            with self._lock:
                self._set_worlds(ids, reset_camera=True)
                self._light_scene()
                self._request(start)
                if n:
                    self._show(start)  # ready when returned: a page that connects now sees the frame
            self._thread = threading.Thread(target=self._drive, name="mjarchive-view", daemon=True)
            self._thread.start()
        except BaseException:
            self._shutdown()
            raise

    # -- public ------------------------------------------------------------------------------------------
    @property
    def world_ids(self) -> tuple[int, ...]:
        return self._window.world_ids if self._window is not None else ()

    @property
    def frame(self) -> int | None:
        """The frame on screen (None before the archive has a committed frame)."""
        return self._shown

    @property
    def n_frames(self) -> int:
        return self._window.n_frames if self._window is not None else 0

    def seek(self, frame: int) -> None:
        """Show `frame` (0 <= frame < n_frames) now, on every connected page."""
        self._check_open()
        with self._lock:
            n = self.n_frames
            if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)) or not 0 <= frame < n:
                raise SelectionError(f"frame {frame!r} is out of range: the viewer knows {n} committed frames")
            self._request(int(frame))
            self._show(int(frame))

    def show_worlds(self, worlds: Any) -> tuple[int, ...]:
        """Show other worlds (IDs, a slice over IDs or text such as '0:8'); keeps camera and playhead.
        Worlds the viewer refuses to draw (MjArchiveError: too many shapes, too much memory) leave
        those shown before on the page."""
        self._check_open()
        ids = self._resolve(worlds)
        with self._lock:
            before = self.world_ids
            self._set_worlds(ids)
            if self._shown is not None:
                try:
                    self._show(self._shown)
                except MjArchiveError:
                    self._set_worlds(before)
                    self._show(self._shown)
                    raise
        return ids

    def serve_forever(self) -> None:
        """Block until close() or Ctrl-C (KeyboardInterrupt, after closing)."""
        try:
            while not self._closed:
                time.sleep(0.2)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the server and the reads; the page shows 'disconnected'. Closing twice is fine."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        if getattr(self, "_thread", None) is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._shutdown()

    def __enter__(self) -> Viewer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.url
        return f"<mjarchive.view.Viewer {state} worlds={list(self.world_ids)[:8]} frame={self._shown}>"

    @property
    def _drawn(self) -> list[Part]:
        """The batched meshes on the page now (empty before the first frame)."""
        return self._layer.parts if self._layer is not None else []

    # -- setup -----------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this viewer is closed; start another with mjarchive.view()")

    def _shutdown(self) -> None:
        self._closed = True
        if self._window is not None:
            self._window.close()
        server = getattr(self, "_server", None)
        if server is not None:
            with quiet():
                server.stop()
        if self._owns_archive:
            self._archive.close()

    def _disable_sharing(self) -> None:
        """viser lets any page ask for a public share.viser.studio tunnel to this server; the viewer has
        no authentication, so that request is dropped (and the button hidden)."""
        try:
            from viser import _messages

            self._server._websock_server.unregister_handler(_messages.ShareUrlRequest)
        except Exception:  # another viser version: the hidden button still stands
            _log.debug("could not remove viser's share-URL handler", exc_info=True)

    def _light_scene(self) -> None:
        """The model's lights and headlight (following each page's camera) instead of viser's, and its
        skybox as the background."""
        scene = self._server.scene
        lights = add_lights(scene, self._model, *self._home)
        self._headlight = next((h for h in lights if h.name == "/lights/headlight"), None)
        if self._headlight is not None:  # MuJoCo's headlight moves with the camera
            self._server.on_client_connect(self._follow_with_headlight)
        scene.set_background_image(sky_image(self._model), format="png")

    def _follow_with_headlight(self, client: Any) -> None:
        def moved(camera: Any) -> None:
            with contextlib.suppress(Exception):  # a page leaving, or a viewer closing
                self._headlight.position = headlight_position(camera.position, camera.look_at)

        client.camera.on_update(moved)

    def _resolve(self, worlds: Any) -> tuple[int, ...]:
        """Original world IDs to show, checked against the archive and the limit; SelectionError if not."""
        archive = self._archive
        if worlds is None:
            return tuple(archive.world_ids[:self._max_worlds])
        if isinstance(worlds, str):
            worlds = parse_worlds(worlds)
        ids = archive.select(worlds=worlds).world_ids  # reads nothing; unknown IDs raise SelectionError
        if not ids:
            raise SelectionError("no worlds selected; write original world IDs, e.g. 7,42 or 0:8")
        if len(ids) > self._max_worlds:
            more = (f" or start the viewer with a larger --max-worlds (at most {MAX_VIEW_WORLDS})"
                    if self._max_worlds < MAX_VIEW_WORLDS else "")
            raise SelectionError(f"{len(ids)} worlds selected, but this viewer shows at most {self._max_worlds} "
                                 f"at once; select fewer, e.g. {format_ids(ids[:self._max_worlds])}{more}")
        ScenePlan.grid(ids, self._spacing)  # refuses repeated IDs and a bad spacing
        return tuple(int(w) for w in ids)

    # -- state changes (caller holds the lock) ------------------------------------------------------------------
    def _set_worlds(self, ids: tuple[int, ...], *, reset_camera: bool = False) -> None:
        plan = ScenePlan.grid(ids, self._spacing)
        window = PoseWindow(self._archive, self._model, ids, self._geoms)
        if self._window is not None:
            self._window.close()  # before the new window reads: both would use the one archive
        self._window, self._plan = window, plan
        self._offsets = np.asarray(plan.offsets, dtype=np.float64)  # (W, 3)
        if self._layer is not None:
            self._layer.remove()
        for label in self._labels:
            label.remove()
        self._layer = GeomLayer(self._server.scene, self._model, self._meshes, self._offsets,
                                variant_fields=self._variant_fields)
        self._look_key = None
        self._labels = world_labels(self._server.scene, ids, self._offsets + (0.0, -0.4 * self._spacing, 0.0))
        self._home = home_view(self._model, self._offsets)
        set_initial(self._server, self._home)
        if reset_camera:
            self._reset_cameras()
        if self._follow_world not in ids:
            self._follow_body = None
            if self._body_in.value != NO_BODY:
                self._body_in.value = NO_BODY
        self._follow.forget()
        self._worlds_in.value = format_ids(ids)
        self._timeline_changed()
        if self._shown is not None and self.n_frames:
            self._request(min(self._shown, self.n_frames - 1))

    # -- drawing -------------------------------------------------------------------------------------------------
    def _show(self, frame: int) -> None:
        """Pose every handle for `frame` and move following cameras, as one atomic update."""
        window = self._window
        window.set_playhead(frame)
        poses = window.poses(frame)  # SelectionError past the committed frames: never shown
        pos = poses.geom_pos + self._offsets[:, None, :]  # (W, G, 3)
        quat = poses.geom_quat
        # A diverged world (NaN or huge qpos, stored with check_finite=False) is drawn collapsed
        # at its grid cell and named in the status line, never sent as NaN.
        bad = ~(np.all(np.isfinite(pos) & (np.abs(pos) < 1e6), axis=(1, 2)) & np.all(np.isfinite(quat), axis=(1, 2)))
        if bad.any():
            quat = quat.copy()
            pos[bad] = self._offsets[bad][:, None, :]
            quat[bad] = (1.0, 0.0, 0.0, 0.0)
        self._invalid = [w for w, b in zip(self.world_ids, bad) if b]
        server, layer = self._server, self._layer
        looks = key = groups = None
        if layer.varies:
            key = window.variant_segments(frame)
            if key != self._look_key:  # some world's values in force differ from those on the page
                looks = world_looks(self._model, layer.geoms, [window.variant(w, frame) for w in self.world_ids])
                groups = layer.check_looks(looks)  # counted from the model's sizes before anything is built or sent
        with server.atomic():
            layer.update(pos, quat)
            if looks is not None:
                layer.set_looks(looks, pos, quat, groups)
                self._look_key = key
            if self._overlays is not None:
                self._show_overlays(frame, poses, bad)
            if self._follow_body is not None and self._follow_world in self.world_ids:
                w = self.world_ids.index(self._follow_world)
                self._follow.move(self._server.get_clients(), poses.body_pos[w, self._follow_body] + self._offsets[w])
            if not getattr(self, "_target_from_slider", False):
                self._slider.value = frame
            self._time = poses.time
            self._status.content = self._status_text(frame, poses.time)
        server.flush()
        self._shown = frame

    def _show_overlays(self, frame: int, poses: FramePoses, bad: np.ndarray) -> None:
        """A label without position stands at its world's body 1 (the grid cell if not finite)."""
        anchors = np.array(poses.body_pos[:, 1]) if self._model.nbody > 1 else None
        if anchors is not None:
            anchors[bad] = 0.0
        window = self._window
        self._hidden_primitives = self._overlays.show_frame(window.overlays(frame), self._offsets, anchors,
                                                            window.hidden_primitives(frame))

    def _status_text(self, frame: int, t: float) -> str:
        n, a = self.n_frames, self._archive
        state = "live" if a.status == "live" else "finalized"
        text = f"**frame {frame} / {n}** · t = {t:.3f} s · {state}"
        invalid = self._invalid
        if invalid:
            text += f" · **not finite here: world {format_ids(invalid)}** (drawn collapsed)"
        if self._notice:
            text += f" · **{markdown_text(self._notice)}**"
        if self._hidden_primitives:
            text += (f" · {self._hidden_primitives} overlay primitives not shown (at most {MAX_LABELS} labels or "
                     f"{VIEW_PRIMITIVES_PER_TRACK:,} points or arrows per overlay and frame)")
        if self._not_shown:
            text += " · " + markdown_text(f"not shown in the viewer: {', '.join(self._not_shown)}; "
                                          "mjarchive render draws them")
        return text

    def _report(self, exc: BaseException) -> None:
        text = str(exc) if isinstance(exc, MjArchiveError) else f"unexpected error: {exc!r}"
        with contextlib.suppress(Exception):
            self._status.content = f"**Error:** {markdown_text(text)}"


def view(archive: Any, *, worlds: Any = None, frame: int = 0, port: int = 8080, host: str = "127.0.0.1",
         storage_options: dict | None = None, spacing: float = 2.0, max_worlds: int = DEFAULT_MAX_WORLDS,
         block: bool = True) -> Viewer | None:
    """Serve a browser viewer of an archive's worlds and print its URL.

    archive: a path or URL (opened here, with `storage_options` for s3:// and other fsspec URLs) or an
    open `Archive` (left open). worlds: original IDs shown at first (a list, an ID, a slice over IDs or
    text like '0:8'; default the first `max_worlds`); at most `max_worlds` at once (1..64). frame: the
    first frame shown (negative: from the end). port: 0 picks a free one (see `.port`). host: 127.0.0.1
    by default; any other address is reachable by others and the viewer has no authentication.
    spacing: metres between neighbouring worlds, as `render(layout='scene')`.

    block=True serves until Ctrl-C and returns None; block=False returns the running `Viewer` (a
    context manager with `.url`, `.port`, `.close()`).

        with mjarchive.view("run.mjarchive", worlds=[7, 42], port=0, block=False) as v:
            print(v.url)
    """
    own = not isinstance(archive, Archive)
    if own:
        archive = open_archive(archive, storage_options=storage_options)
    elif storage_options:
        raise MjArchiveError("storage_options apply when opening an archive; pass a path or URL, not an Archive")
    try:
        viewer = Viewer(archive, owns_archive=own, worlds=worlds, frame=frame, port=port, host=host,
                        spacing=spacing, max_worlds=max_worlds)
    except BaseException:
        if own:
            archive.close()
        raise
    if not is_loopback(host):
        print(f"mjarchive view: warning: listening on {host}, reachable from other machines, and the viewer "
              "has no authentication; prefer the default 127.0.0.1 and an SSH tunnel "
              f"(ssh -L {viewer.port}:localhost:{viewer.port} THIS-MACHINE)", file=sys.stderr)
    if port and viewer.port != port:
        print(f"mjarchive view: port {port} was taken; serving on {viewer.port}", file=sys.stderr)
    print(f"mjarchive view: serving {len(viewer.world_ids)} world(s) of {archive.location} at {viewer.url} "
          "(Ctrl-C to stop)" if block else f"mjarchive view: serving at {viewer.url}", flush=True)
    if not block:
        return viewer
    with contextlib.suppress(KeyboardInterrupt):
        viewer.serve_forever()
    return None
