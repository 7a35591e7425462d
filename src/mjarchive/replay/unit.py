"""Rendering one work unit, in whatever process runs it: read its slice, pose, render.

`render_unit` is a top-level function, so any `concurrent.futures.Executor` can run it. A scene
unit holds every world of a `layout='scene'` video: their states are joined into one state of
the scene model (`scene.ScenePlan.combine`), and each world is labelled where it stands.

Model variants: the values in force for each frame's world(s) are set on the renderer's model
(CPU, again wherever they change within the unit) or on its per-world model arrays (Warp, one
row per state), always over the model's own values, so nothing of an earlier unit or world
stays. Per-world units never straddle a change (`plan.plan_units`); grid and scene units may,
as every world's units there cover the same frames. Overlays (CPU) are added to each frame's
MuJoCo scene.
"""

from __future__ import annotations

import copy

import numpy as np

from ..archive.variants import apply_variant
from .backends import cpu, warp
from .views.camera import View, project
from .backends.cpu import gl_renderer_name
from .views.variant_map import KINEMATIC_FIELDS, VariantSpans
from .worker import RenderUnit, UnitResult, archive_for, model_for

__all__ = ["render_unit"]


def render_unit(unit: RenderUnit) -> UnitResult:
    """Render one unit: rgb (n_frames, H, W, 3) uint8 in the unit's frame order."""
    archive = archive_for(unit)
    model = model_for(unit, archive)
    frames = np.asarray(unit.frames, dtype=np.int64)
    contiguous = bool(np.all(np.diff(frames) == 1))
    frame_sel = slice(int(frames[0]), int(frames[-1]) + 1) if contiguous else frames
    nmocap = archive.manifest.layout.nmocap
    if unit.scene is not None:
        sel = archive.select(worlds=list(unit.scene.world_ids), frames=frame_sel)
        qpos, mocap_pos, mocap_quat = unit.scene.combine(
            archive.manifest.layout, sel.qpos, sel.mocap_pos if nmocap else None, sel.mocap_quat if nmocap else None)
    else:
        sel = archive.select(worlds=[unit.world_id], frames=frame_sel)
        qpos = sel.qpos[:, 0]
        mocap_pos = sel.mocap_pos[:, 0] if nmocap else None
        mocap_quat = sel.mocap_quat[:, 0] if nmocap else None
    renderer = (cpu if unit.backend == "cpu" else warp).renderer_for(unit, archive, model)
    h, w = unit.size
    n = len(frames)
    rgb = np.empty((n, h, w, 3), np.uint8)
    poses = unit.poses
    worlds = unit.scene.world_ids if unit.scene is not None else (unit.world_id,)
    spans = VariantSpans(archive, worlds, renderer, unit.scene) if archive.variant_fields else None
    gl = ""
    labelled = unit.scene is not None and unit.labels is not None
    if unit.backend == "cpu":
        span = None
        if spans is None:
            renderer.set_variant({})  # puts back what an earlier unit of another archive set
        # The labels are placed with the renderer's model, which holds the values in force.
        labels = _Labels(unit, archive, sel, renderer.model) if labelled else None
        painter = None
        if unit.overlays:
            from .views.overlay_draw import OverlayPainter

            painter = OverlayPainter(archive, unit.overlays, sel, unit.scene, renderer.model)
        for i in range(n):
            pose = None if poses is None else poses[i]
            if spans is not None and (key := spans.key(frames[i])) != span:
                span = key
                renderer.set_variant(spans.values(frames[i]))
            renderer.set_state(qpos[i], None if mocap_pos is None else mocap_pos[i],
                               None if mocap_quat is None else mocap_quat[i])
            decorate = None if painter is None else (lambda scn, data, i=i: painter.draw(i, scn, data))
            rgb[i] = renderer.render(unit.camera, pose, decorate)
            if labels is not None:
                labels.draw(rgb[i], i, qpos[i], labels.camera_pose(unit.camera, pose, qpos, mocap_pos, mocap_quat, i))
        gl = gl_renderer_name()
    else:
        labels = _Labels(unit, archive, sel, model, spans) if labelled else None
        for s in range(0, n, renderer.nworld):
            e = min(n, s + renderer.nworld)
            rows = None if spans is None else spans.rows(frames[s:e])
            rgb[s:e] = renderer.render_batch(qpos[s:e], None if mocap_pos is None else mocap_pos[s:e],
                                             None if mocap_quat is None else mocap_quat[s:e], unit.camera,
                                             None if poses is None else poses[s:e], variants=rows)
        if labels is not None:
            for i in range(n):
                pose = None if poses is None else poses[i]
                labels.set_frame(int(frames[i]))
                labels.draw(rgb[i], i, qpos[i], labels.camera_pose(unit.camera, pose, qpos, mocap_pos, mocap_quat, i))
    return UnitResult(unit.world_id, unit.camera, unit.frames, rgb, gl)


class _Labels:
    """Each world's label (its per-world HUD fields) drawn over where it stands in a scene image:
    above its free joint's position if the model has one, else above its grid cell.

    model: the model the frames are rendered with. With `spans` (a Warp unit's `VariantSpans`,
    whose renderer keeps the model's own values) the labels pose a private copy of it, given the
    values in force at each frame by `set_frame`, so a model camera's pose and field of view are
    the rendered ones; without, `model` must hold them (the CPU renderer's)."""

    def __init__(self, unit: RenderUnit, archive, sel, model, spans: VariantSpans | None = None):
        from .views.hud import format_lines

        self._format = format_lines
        self.unit = unit
        # What places a camera: kinematic fields (its body's pose) and its field of view.
        self._fields = [] if spans is None else [f for f in spans.layout.shapes if f in KINEMATIC_FIELDS or
                                                 f == "cam_fovy"]
        self._spans, self._span = (spans, None) if self._fields else (None, None)
        self.model = copy.copy(model) if self._spans is not None else model  # never the cached model itself
        self.scene = unit.scene
        layout = archive.manifest.layout
        free = [adr for _, kind, adr in layout.joints if kind == "free"]
        self._root = free[0] if free else None
        self._nq = layout.nq
        base_extent = float(model.stat.extent)
        self._lift = np.array([0.0, 0.0, 0.35 * base_extent])
        self._cells = np.asarray(self.scene.offsets, np.float64) + np.asarray(model.stat.center)
        self._tracks = {name: sel.track(name) for name in unit.labels.fields if name in archive.tracks}
        self._data = None

    def set_frame(self, frame: int) -> None:
        """Pose with the values in force at archive frame `frame` (with `spans`; else nothing to do)."""
        if self._spans is None or (key := self._spans.key(frame)) == self._span:
            return
        self._span = key
        values = self._spans.values(frame)
        apply_variant(self.model, {f: values[f] for f in self._fields})

    def anchors(self, qpos: np.ndarray) -> np.ndarray:
        if self._root is None:
            return self._cells + self._lift
        q = qpos.reshape(len(self.scene.world_ids), self._nq)
        return q[:, self._root:self._root + 3] + self._lift

    def camera_pose(self, camera, pose, qpos, mocap_pos, mocap_quat, i):
        """(position, orientation, fovy) of the camera at state i: a View's, or a model camera's
        from host kinematics of the scene model."""
        if isinstance(camera, View):
            return (*camera.pose(pose), camera.fovy)
        import mujoco

        if self._data is None:
            self._data = mujoco.MjData(self.model)
        d = self._data
        d.qpos[:] = qpos[i]
        if mocap_pos is not None:
            d.mocap_pos[:] = mocap_pos[i]
            d.mocap_quat[:] = mocap_quat[i]
        mujoco.mj_kinematics(self.model, d)
        mujoco.mj_comPos(self.model, d)  # a trackcom or targetbodycom camera follows a subtree's centre of mass
        mujoco.mj_camlight(self.model, d)
        return d.cam_xpos[camera].copy(), d.cam_xmat[camera].reshape(3, 3).copy(), float(self.model.cam_fovy[camera])

    def draw(self, rgb: np.ndarray, i: int, qpos: np.ndarray, camera_pose) -> None:
        from .views.hud import draw_label

        pos, xmat, fovy = camera_pose
        xy = project(self.anchors(qpos), pos, xmat, fovy, rgb.shape[:2])
        eps = self.unit.episodes
        for k, wid in enumerate(self.scene.world_ids):
            if not np.all(np.isfinite(xy[k])):
                continue
            lines = self._format(self.unit.labels, world=wid, episode=None if eps is None else int(eps[i, k]),
                                 tracks={name: v[i, k] for name, v in self._tracks.items()})
            if lines:
                draw_label(rgb, "  ".join(lines), (float(xy[k, 0]), float(xy[k, 1])))
