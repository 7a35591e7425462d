"""Recorded debug overlays drawn into replayed frames (CPU backend), and the rule shared with the viewer.

An archive's overlay tracks (`Archive.overlays`) hold per frame and world points, arrows or text
labels in that world's coordinates. `frame_primitives` turns one frame of a track into what is
drawn, in scene coordinates: each world's primitives moved by its grid offset, a label without
position at body 1 of the world (its copy's in a scene; the world's origin in a model without
bodies), arrows without length left out. The viewer (`viewer.overlays`) draws the same.

`select_overlays` resolves a render's `overlays=` argument; `OverlayPainter` reads of one unit's
overlay frames only what the scene holds (per frame at most its maxgeom primitives, in draw order:
track by track, world by world; the rest is not read, and a warning says some were not drawn) and
adds them to MuJoCo's scene after `mjv_updateScene`, as user geoms: points are
spheres of the overlay's radius, arrows MuJoCo arrows of its width from start to end
(`mjv_connector`), text labels (`mjGEOM_LABEL`, at most 99 bytes shown). They are drawn emissive,
without specular light, so they read in their recorded colour.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from typing import Any

import mujoco
import numpy as np

from ..._errors import SelectionError
from ...archive.overlays import OverlayFrames, OverlayRows
from .scene import bodies_per_copy

__all__ = ["FramePrimitives", "LABEL_BYTES", "MIN_ARROW", "OverlayPainter", "SCENE_PRIMITIVES", "drawn_counts",
           "frame_primitives", "row_primitives", "select_overlays"]

#: Bytes of a label MuJoCo draws (its MjvGeom.label field holds 100, with the terminating zero).
LABEL_BYTES = 99
#: Metres; an arrow no longer than this has no direction and is not drawn.
MIN_ARROW = 1e-9
#: Primitives per frame (all tracks and worlds together) a painter reads at most when the scene's
#: room is not given (MuJoCo's Renderer holds 10000 geoms). Not the viewer's bound, which is per
#: track (`viewer.chunks.VIEW_PRIMITIVES_PER_TRACK`).
SCENE_PRIMITIVES = 10_000
_EYE = np.eye(3).ravel()
_ZERO = np.zeros(3)


@dataclasses.dataclass(frozen=True)
class FramePrimitives:
    """One frame of one overlay track over a unit's or window's worlds, in scene coordinates (metres).

    positions: points (N, 3) sphere centres; arrows (N, 2, 3) start and end; text (N, 3) anchors,
    with `labels` (N strings). `world` (N,) is each primitive's world position in the caller's order.
    """

    kind: str
    positions: np.ndarray
    world: np.ndarray
    labels: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.positions)


def frame_primitives(frames: OverlayFrames, i: int, offsets: np.ndarray,
                     anchors: np.ndarray | None = None) -> FramePrimitives:
    """Row `i` of `frames` (worlds in the order of `offsets` (W, 3)) as scene primitives.

    anchors: (W, 3) the position of each world's body 1 at that frame, in the world's own
    coordinates (without its offset), where its labels without position stand; None when the
    model has no body but the world body (they stand at the world's origin)."""
    count = np.asarray(frames.count[i], np.int64)
    used = np.arange(frames.data.shape[2]) < count[:, None]  # (W, max_count)
    data = np.asarray(frames.data[i][used], np.float64)  # (N, 3 | 6), world by world
    world = np.repeat(np.arange(len(count)), count)
    labels = ()
    if frames.overlay.kind == "text":
        labels = tuple(label for w, n in enumerate(count.tolist()) for label in frames.text[i][w][:n])
    return row_primitives(frames.overlay.kind, OverlayRows(data, world, labels), offsets, anchors)


def row_primitives(kind: str, rows: OverlayRows, offsets: np.ndarray,
                   anchors: np.ndarray | None = None) -> FramePrimitives:
    """One frame's `OverlayRows` (as `Selection.overlay_rows` reads them) as scene primitives, by
    the rule of `frame_primitives`."""
    data = np.array(rows.data, np.float64)
    world = np.asarray(rows.world, np.int64)
    offset = np.asarray(offsets, np.float64)[world]
    if kind == "points":
        return FramePrimitives(kind, data + offset, world)
    if kind == "arrows":
        seg = data.reshape(-1, 2, 3) + offset[:, None]
        keep = np.linalg.norm(seg[:, 1] - seg[:, 0], axis=-1) > MIN_ARROW
        return FramePrimitives(kind, seg[keep], world[keep])
    anchored = np.isnan(data).all(axis=-1)
    data[anchored] = 0.0 if anchors is None else np.asarray(anchors, np.float64)[world[anchored]]
    return FramePrimitives(kind, data + offset, world, tuple(rows.labels))


def select_overlays(archive: Any, overlays: Any) -> tuple[str, ...]:
    """The overlay tracks a render draws: None = all of the archive's (in its order), () or
    'none' = none, else names (one string or an iterable). Unknown names raise SelectionError."""
    available = tuple(archive.overlays)
    if overlays is None:
        return available
    if isinstance(overlays, str):
        overlays = () if overlays == "none" else (overlays,)
    try:
        names = list(overlays)
    except TypeError:
        raise SelectionError(f"overlays must be None (all), () (none) or overlay names, not {overlays!r:.60}") from None
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in available:
            listed = list(available) if available else "none"
            raise SelectionError(f"no overlay {str(name)[:64]!r} in this archive; its overlays: {listed} "
                                 "(overlays=None draws all, overlays=() none)")
        if name not in out:
            out.append(name)
    return tuple(out)


def drawn_counts(counts: list[np.ndarray], max_primitives: int) -> list[np.ndarray]:
    """How many primitives of each track, frame and world are drawn: `counts` (F, W) per track, in
    draw order (track by track, world by world), cut where a frame's total passes `max_primitives`
    (the scene holds no more). Same shapes as `counts`."""
    if not counts:
        return []
    stacked = np.stack([np.asarray(c, np.int64) for c in counts], axis=1)  # (F, tracks, W)
    flat = stacked.reshape(len(stacked), -1)
    before = np.cumsum(flat, axis=1) - flat
    take = np.clip(int(max_primitives) - before, 0, flat).reshape(stacked.shape)
    return [take[:, k] for k in range(len(counts))]


def _label(text: str) -> str:
    raw = text.encode("utf-8")[:LABEL_BYTES]
    return raw.decode("utf-8", "ignore")  # never half a character


class OverlayPainter:
    """One unit's overlays, read once: `draw(i, scene, data)` adds frame i's primitives.

    archive: the open Archive; names: the selected overlay tracks; sel: the unit's Selection
    (frames in unit order, its worlds); scene: the unit's `scene.ScenePlan` or None; model: the
    rendered model (where each world's body 1 is).
    """

    def __init__(self, archive: Any, names: Iterable[str], sel: Any, scene: Any = None,
                 model: mujoco.MjModel | None = None, max_primitives: int = SCENE_PRIMITIVES):
        names = list(names)
        # Only what the scene can show is read: counts first, then per frame at most
        # `max_primitives` primitives in draw order (track by track, world by world), so a track
        # declaring 4096 per world of 64 worlds costs what it draws, not what it stores.
        counts = [sel.overlay_counts(name) for name in names]  # (F, W) each, checked
        take = drawn_counts(counts, max_primitives)
        self.truncated = np.zeros(len(counts[0]) if counts else 0, bool)
        for c, t in zip(counts, take):
            self.truncated |= (t < c).any(axis=1)
        self.tracks = [(archive.overlays[name], sel.overlay_rows(name, t)) for name, t in zip(names, take)]
        self.offsets = np.zeros((1, 3)) if scene is None else np.asarray(scene.offsets, np.float64)
        n = len(self.offsets)
        # Body 1 of each world, where its labels without position stand: copy k's bodies follow copy
        # k-1's (compile_child.apply_recipe). None without a model, or a model whose only body is the
        # world body (labels stand at each world's origin).
        self.anchor_bodies = None
        if model is not None:
            if n == 1:
                # One world is drawn with the recorded model itself, which has no replay body: a body
                # named like one is the model's own, so every body but the world body counts.
                per_copy = int(model.nbody) - 1
            else:
                per_copy = bodies_per_copy(model, n)
            if per_copy:
                self.anchor_bodies = 1 + per_copy * np.arange(n)
        self._warned = False

    def draw(self, i: int, scn: mujoco.MjvScene, data: mujoco.MjData) -> None:
        """Add frame i's primitives (all selected tracks and worlds) to `scn`, at most up to its maxgeom."""
        anchors = None if self.anchor_bodies is None else data.xpos[self.anchor_bodies] - self.offsets
        if self.truncated[i]:
            self._full(scn)
        for overlay, rows in self.tracks:
            rgba = np.asarray(overlay.rgba, np.float32)
            prims = row_primitives(overlay.kind, rows[i], self.offsets, anchors)
            if overlay.kind == "text":
                for at, text in zip(prims.positions, prims.labels):
                    g = self._geom(scn, mujoco.mjtGeom.mjGEOM_LABEL, _ZERO, at, rgba)
                    if g is None:
                        return
                    g.label = _label(text)
            elif overlay.kind == "points":
                size = np.full(3, overlay.size)
                for at in prims.positions:
                    if self._geom(scn, mujoco.mjtGeom.mjGEOM_SPHERE, size, at, rgba) is None:
                        return
            else:
                for start, end in prims.positions:
                    g = self._geom(scn, mujoco.mjtGeom.mjGEOM_ARROW, _ZERO, start, rgba)
                    if g is None:
                        return
                    mujoco.mjv_connector(g, mujoco.mjtGeom.mjGEOM_ARROW, overlay.size, start, end)
                    # MuJoCo draws an arrow half as long as size[2] (shaft to size[2]/3, head to
                    # size[2]/2, in every renderer it has had); mjv_connector sets size[2] = length.
                    g.size[2] *= 2

    def _full(self, scn: mujoco.MjvScene) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"the MuJoCo scene is full ({scn.maxgeom} geoms): some overlay primitives are not drawn; "
                          "select fewer overlays (overlays=(...)) or fewer worlds", RuntimeWarning, stacklevel=3)

    def _geom(self, scn: mujoco.MjvScene, kind, size, pos, rgba):
        """A fresh user geom in the scene, or None (once warned) when the scene is full."""
        if scn.ngeom >= scn.maxgeom:
            self._full(scn)
            return None
        g = scn.geoms[scn.ngeom]
        mujoco.mjv_initGeom(g, kind, np.asarray(size, np.float64), np.asarray(pos, np.float64), _EYE, rgba)
        g.emission, g.specular, g.reflectance = 1.0, 0.0, 0.0
        # Decoration: no shadow or reflection passes draw it (they would cost more than the primitive).
        g.category = mujoco.mjtCatBit.mjCAT_DECOR
        scn.ngeom += 1
        return g
