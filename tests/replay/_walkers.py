"""A humanoid with a red marker on the torso's frame origin: where the red pixels' centroid lands
in an image is where the torso's origin projects (tests of cameras and scenes)."""

from __future__ import annotations

import mujoco
import numpy as np


def walker_spec(humanoid_xml) -> mujoco.MjSpec:
    spec = mujoco.MjSpec.from_file(str(humanoid_xml))
    torso = spec.body("torso")
    torso.add_geom(type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[0.16, 0, 0], rgba=[1, 0, 0, 1], contype=0,
                   conaffinity=0, material="")
    return spec


def marker_centroids(frames: np.ndarray) -> np.ndarray:
    """(n, 2) x, y centroid of the red marker's pixels per frame (NaN where none is visible)."""
    f = frames.astype(np.int16)
    red = (f[..., 0] > 120) & (f[..., 1] < 70) & (f[..., 2] < 70)
    out = np.full((len(frames), 2), np.nan)
    for i, m in enumerate(red):
        ys, xs = np.nonzero(m)
        if len(xs) >= 3:
            out[i] = xs.mean() + 0.5, ys.mean() + 0.5
    return out


