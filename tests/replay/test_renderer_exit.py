"""Cached renderers are closed before MuJoCo tears EGL down at interpreter exit."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import importlib.resources, tempfile
import mujoco, numpy as np
import mjarchive

xml = str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml")
m = mujoco.MjModel.from_xml_path(xml)
d = tempfile.mkdtemp()
with mjarchive.create(d + "/a", xml, world_ids=[0]) as w:
    w.append(0.0, m.qpos0[None].astype(np.float32))
with mjarchive.open(d + "/a") as a:  # in-process render: its renderer stays cached for the next call
    list(mjarchive.iter_frames(a, worlds=[0], frames=[0], size=(48, 64)))
with mujoco.Renderer(m, 48, 64) as r:  # another renderer, made and closed after it (a peer's render)
    data = mujoco.MjData(m)
    mujoco.mj_forward(m, data)
    r.update_scene(data)
    r.render()
print("rendered")
"""


def test_no_gl_errors_at_exit_after_another_renderer_closed():
    """MuJoCo 3.16's EGL context, freed at interpreter exit after another renderer released the
    display, raised 'Exception ignored ... EGLError' on every such run (flygym's and Playground's
    renders next to mjarchive's)."""
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rendered" in done.stdout
    assert "Exception ignored" not in done.stderr and "Error" not in done.stderr, done.stderr[-3000:]
