"""Poses of geoms and bodies from stored qpos, for a `PoseWindow`: `mj_kinematics` on the host, world
by world, each world's kinematic variant values in force (format 1.1, `POSE_FIELDS`) set in a
private copy of the model first, so its poses follow its own body and geom placements.
"""

from __future__ import annotations

import copy
import dataclasses
import queue

import mujoco
import numpy as np

from ..archive.variants import VARIANT_FIELDS, apply_variant
from ..replay.views.variant_map import KINEMATIC_FIELDS
from .chunks import Chunk
from .drawing import SHOWN_FIELDS

__all__ = ["FramePoses", "POSE_FIELDS", "PoseSolver", "quat_mul"]

#: Variant fields set in the model before kinematics: the kinematic ones of what the viewer draws (geoms and
#: bodies; sites, lights and cameras are not drawn).
POSE_FIELDS = tuple(f for f in VARIANT_FIELDS if f in KINEMATIC_FIELDS and f in SHOWN_FIELDS)


@dataclasses.dataclass(frozen=True)
class FramePoses:
    """Poses at one frame of the window's worlds (in `PoseWindow.world_ids` order), read-only arrays.

    geom_pos (W, G, 3) float64 and geom_quat (W, G, 4) wxyz: world pose of each geom in the window's
    `geoms` order (metres); body_pos (W, nbody, 3), body_quat (W, nbody, 4) wxyz: every body's
    frame, e.g. for a camera that follows a body. `time` is the frame's simulation time (s).
    """

    frame: int
    time: float
    geom_pos: np.ndarray
    geom_quat: np.ndarray
    body_pos: np.ndarray
    body_quat: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.geom_pos.nbytes + self.geom_quat.nbytes + self.body_pos.nbytes + self.body_quat.nbytes


class PoseSolver:
    """Poses at one frame of a chunk: of the `geoms` (ids, in that order) and of every body, for
    each of the chunk's `n_worlds` worlds. Thread-safe: each concurrent caller gets its own MjData.
    """

    def __init__(self, model: mujoco.MjModel, geoms: np.ndarray, n_worlds: int, pose_fields: tuple[str, ...]):
        self._model = model
        self._geoms = geoms
        self._n_worlds = n_worlds
        self._pose_fields = pose_fields
        self._geom_body = model.geom_bodyid[self._geoms]
        self._geom_quat_local = np.array(model.geom_quat[self._geoms], dtype=np.float64)
        # One (model, MjData) per concurrent caller; the model is a private copy where per-world pose values are set.
        self._datas: queue.SimpleQueue[tuple[mujoco.MjModel, mujoco.MjData]] = queue.SimpleQueue()

    def _take_data(self) -> tuple[mujoco.MjModel, mujoco.MjData]:
        try:
            return self._datas.get_nowait()
        except queue.Empty:
            model = copy.copy(self._model) if self._pose_fields else self._model  # never write the caller's
            return model, mujoco.MjData(model)

    def poses(self, chunk: Chunk, frame: int, values: list[dict[str, np.ndarray]] | None) -> FramePoses:
        """`values`: each world's variant values in force at `frame` (None when no pose field varies)."""
        i = frame - chunk.start
        W, G, nbody = self._n_worlds, len(self._geoms), self._model.nbody
        geom_pos = np.empty((W, G, 3))
        body_pos = np.empty((W, nbody, 3))
        body_quat = np.empty((W, nbody, 4))
        model, data = self._take_data()
        try:
            for w in range(W):
                if values is not None:  # as the archive's own model of that world (Archive.model)
                    apply_variant(model, {name: values[w][name] for name in self._pose_fields})
                data.qpos[:] = chunk.qpos[i, w]
                if chunk.mocap_pos is not None:
                    data.mocap_pos[:] = chunk.mocap_pos[i, w]
                    data.mocap_quat[:] = chunk.mocap_quat[i, w]
                mujoco.mj_kinematics(model, data)
                geom_pos[w] = data.geom_xpos[self._geoms]
                body_pos[w] = data.xpos
                body_quat[w] = data.xquat
        finally:
            self._datas.put((model, data))
        local = self._geom_quat_local[None]
        if values is not None and "geom_quat" in self._pose_fields:
            local = np.stack([values[w]["geom_quat"][self._geoms] for w in range(W)])
        # MuJoCo poses a geom as body frame ∘ local frame: geom_xmat is quat2mat(xquat[body] * geom_quat).
        geom_quat = quat_mul(body_quat[:, self._geom_body], local)
        geom_quat /= np.linalg.norm(geom_quat, axis=-1, keepdims=True)
        for a in (geom_pos, geom_quat, body_pos, body_quat):
            a.flags.writeable = False
        return FramePoses(frame=frame, time=float(chunk.time[i]), geom_pos=geom_pos, geom_quat=geom_quat,
                          body_pos=body_pos, body_quat=body_quat)


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of wxyz quaternions, broadcast over leading axes (as mju_mulQuat)."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=-1)
