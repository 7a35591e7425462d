"""Regenerate spec/example/, the tiny example archive described in spec/README.md.

Run from the repository root:  python spec/make_example.py

The values are dyadic rationals (exact in float64), so tests/test_spec.py can regenerate them with
`expected()` and compare bit for bit on any machine. Only `created`, `producer.version` and
`mujoco_version` in the root attributes depend on when and with what the example was written.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

EXAMPLE_DIR = Path(__file__).resolve().parent / "example"

#: Two hinge joints (nq = nv = 2) and one mocap body carrying a tiny mesh, so the bundle has one
#: asset. The bundle stores this text, re-serialised by ElementTree.
MODEL_XML = """\
<mujoco model="spec_example">
  <option timestep="0.0078125"/>
  <asset>
    <mesh name="tetra" file="tetra.obj"/>
  </asset>
  <worldbody>
    <body name="upper">
      <joint name="shoulder" axis="0 0 1"/>
      <geom size="0.02 0.1" pos="0.1 0 0" quat="0.707107 0 -0.707107 0" type="capsule"/>
      <body name="lower" pos="0.2 0 0">
        <joint name="elbow" axis="0 0 1"/>
        <geom size="0.02 0.1" pos="0.1 0 0" quat="0.707107 0 -0.707107 0" type="capsule"/>
      </body>
    </body>
    <body name="target" pos="0.3 0 0" mocap="true">
      <geom type="mesh" mesh="tetra" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
</mujoco>
"""

#: A tetrahedron, 2 cm on a side.
ASSETS = {"tetra.obj": b"v 0 0 0\nv 0.02 0 0\nv 0 0.02 0\nv 0 0 0.02\nf 1 3 2\nf 1 2 4\nf 1 4 3\nf 2 3 4\n"}

WORLD_IDS = (3, 11)
N_FRAMES = 5
OUTPUT_FPS = 32.0  # one frame every 1/32 s of simulated time = 4 physics steps of 2**-7 s
CHUNK_FRAMES = 4  # so the example has one full and one partial chunk along time


def expected() -> dict[str, np.ndarray]:
    """Every stored per-frame array of the example, in (frame, world, ...) order.

    All values are multiples of powers of two, exact in float64.
    """
    f = np.arange(N_FRAMES, dtype=np.float64)[:, None]  # (frame, 1)
    w = np.asarray(WORLD_IDS, dtype=np.float64)[None, :]  # (1, world)
    time = (np.arange(N_FRAMES, dtype=np.float64) + 1.0) / OUTPUT_FPS
    qpos = np.stack([0.125 * f + 0.5 * w / 16.0, -0.25 * f + 0.0625 * w], axis=-1)  # (F, W, 2)
    mocap_pos = np.zeros((N_FRAMES, len(WORLD_IDS), 1, 3))
    mocap_pos[..., 0, 0] = 0.25 + 0.0625 * f
    mocap_pos[..., 0, 1] = 0.125 * w
    mocap_quat = np.zeros((N_FRAMES, len(WORLD_IDS), 1, 4))
    mocap_quat[..., 0, 0] = 1.0
    reward = 0.5 * f - w / 4.0  # (F, W)
    reset = np.zeros((N_FRAMES, len(WORLD_IDS)), dtype=bool)
    reset[0, :] = True
    reset[3, WORLD_IDS.index(11)] = True  # world 11 starts a second episode at frame 3
    return {"time": time, "qpos": qpos, "mocap_pos": mocap_pos, "mocap_quat": mocap_quat,
            "reward": reward, "reset": reset}


def write(directory: Path = EXAMPLE_DIR) -> Path:
    """Write the example archive to `directory` (replacing it) with the real mjarchive writer."""
    import mjarchive

    if directory.exists():
        shutil.rmtree(directory)
    data = expected()
    bundle = mjarchive.ModelBundle.from_xml(MODEL_XML, ASSETS)
    with mjarchive.create(directory, bundle, world_ids=WORLD_IDS, dtype="float64", output_fps=OUTPUT_FPS,
                          tracks={"reward": ((), "float64")}, chunk_frames=CHUNK_FRAMES) as writer:
        for i in range(N_FRAMES):
            writer.append(data["time"][i], data["qpos"][i], mocap_pos=data["mocap_pos"][i],
                          mocap_quat=data["mocap_quat"][i], reset=data["reset"][i], reward=data["reward"][i])
    # The writer lease (format 1.2), released by the writer (naming no one); its random token is pinned.
    (directory / "_writer" / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {
        "mjarchive_writer": {"host": "", "pid": 0, "started": "", "token": "0" * 32, "expires": 0}}},
        separators=(",", ":")))
    return directory


if __name__ == "__main__":
    out = write(Path(sys.argv[1]) if len(sys.argv) > 1 else EXAMPLE_DIR)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size} bytes)")
