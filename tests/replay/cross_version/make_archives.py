"""Write `written-by-mujoco-<version>.mjarchive` here with the installed MuJoCo (run it once under
each end of the supported range: 3.11 and 4.x). Each holds a model bundled from an edited MjSpec
(so MuJoCo before 3.16 bundles compiled values) and, as the track `geom_xpos`, the poses the writer's
own MuJoCo computed for each recorded state: `test_cross_version.py` replays every archive here
with whatever MuJoCo is installed and compares."""

from __future__ import annotations

import shutil
from importlib.resources import files
from pathlib import Path

import mujoco
import numpy as np

import mjarchive

HERE = Path(__file__).resolve().parent


def edited_spec() -> mujoco.MjSpec:
    spec = mujoco.MjSpec.from_file(str(files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))
    body = spec.worldbody.add_body(name="marker", pos=[0.1234567891234, 1 / 3, 1 / 7], mocap=True)
    body.add_geom(size=[0.0123456789, 0, 0], rgba=[0.9, 0.2, 0.1, 1])
    spec.geoms[1].size = np.asarray(spec.geoms[1].size) * (1 + 1 / 3e5)
    return spec


def main() -> Path:
    spec = edited_spec()
    model = spec.compile()
    path = HERE / f"written-by-mujoco-{mujoco.__version__}.mjarchive"
    shutil.rmtree(path, ignore_errors=True)
    rng = np.random.default_rng(7)
    data = mujoco.MjData(model)
    with mjarchive.create(path, mjarchive.ModelBundle.from_spec(spec), world_ids=[3, 8], dtype="float64",
                          chunk_frames=4, tracks={"geom_xpos": ((model.ngeom, 3), "float64")}) as writer:
        for f in range(4):
            qpos = np.tile(model.qpos0, (2, 1))
            qpos[:, 7:] += rng.uniform(-0.4, 0.4, (2, model.nq - 7))
            qpos[:, 2] += 0.3
            mocap_pos = np.tile([[0.5, 0.2 * f, 1.0]], (2, 1, 1))
            mocap_quat = np.tile([[1.0, 0, 0, 0]], (2, 1, 1))
            poses = []
            for w in range(2):
                data.qpos[:] = qpos[w]
                data.mocap_pos[:], data.mocap_quat[:] = mocap_pos[w], mocap_quat[w]
                mujoco.mj_kinematics(model, data)
                poses.append(data.geom_xpos.copy())
            writer.append(0.05 * f, qpos, mocap_pos=mocap_pos, mocap_quat=mocap_quat, geom_xpos=np.stack(poses))
    return path


if __name__ == "__main__":
    print(main())
