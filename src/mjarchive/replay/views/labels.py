"""Labels of a scene: each world's per-world HUD fields drawn where it stands in the image.

Backends build one per scene unit (`backends.base.Backend.render_states`), with the model the frames
are rendered with, so a model camera's pose and field of view are the rendered ones.
"""

from __future__ import annotations

import copy
from typing import Any

import mujoco
import numpy as np

from ...archive.variants import apply_variant
from .camera import View, project
from .hud import draw_label, format_lines
from .variant_map import KINEMATIC_FIELDS, VariantSpans

__all__ = ["SceneLabels"]


class SceneLabels:
    """Each world's label (its per-world HUD fields) drawn over where it stands in a scene image:
    above its free joint's position if the model has one, else above its grid cell.

    model: the model the frames are rendered with. With `spans` (a Warp unit's `VariantSpans`,
    whose renderer keeps the model's own values) the labels pose a private copy of it, given the
    values in force at each frame by `set_frame`, so a model camera's pose and field of view are
    the rendered ones; without, `model` must hold them (the CPU renderer's)."""

    def __init__(self, unit: Any, archive: Any, sel: Any, model: mujoco.MjModel, spans: VariantSpans | None = None):
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
        pos, xmat, fovy = camera_pose
        xy = project(self.anchors(qpos), pos, xmat, fovy, rgb.shape[:2])
        eps = self.unit.episodes
        for k, wid in enumerate(self.scene.world_ids):
            if not np.all(np.isfinite(xy[k])):
                continue
            lines = format_lines(self.unit.labels, world=wid, episode=None if eps is None else int(eps[i, k]),
                                 tracks={name: v[i, k] for name, v in self._tracks.items()})
            if lines:
                draw_label(rgb, "  ".join(lines), (float(xy[k, 0]), float(xy[k, 1])))
