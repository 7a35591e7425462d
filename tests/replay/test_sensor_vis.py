"""Sensor visualization: rangefinder rays are drawn from sensordata, so replay runs mj_sensorPos
for models that draw them (and only those), and the frames equal a direct render after mj_forward."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import mujoco
import numpy as np
import pytest

import mjarchive
from mjarchive.replay.backends.cpu import CpuRenderer, prepare_model
from mjarchive.replay.views.options import SceneOptions

SIZE = (48, 64)

# A walker-like body with a fan of rangefinders pointing ahead and down at the floor, as on
# dm_control's quadruped (rays drawn opaque here, so they are plain to see).
RANGEFINDER_XML = """
<mujoco>
  <visual><rgba rangefinder="1 1 0.1 1"/></visual>
  <worldbody>
    <light pos="0 0 3"/>
    <geom type="plane" size="3 3 .1" rgba=".3 .3 .4 1"/>
    <camera name="side" pos="0.4 -1.6 0.6" xyaxes="1 0 0 0 0.35 1"/>
    <body name="torso" pos="0 0 .4">
      <freejoint/>
      <geom type="box" size=".15 .08 .05" rgba=".8 .5 .3 1"/>
      <site name="rf0" pos=".15 0 0" zaxis="1 0 -1"/>
      <site name="rf1" pos=".15 .04 0" zaxis="1 .3 -1"/>
      <site name="rf2" pos=".15 -.04 0" zaxis="1 -.3 -1"/>
    </body>
  </worldbody>
  <sensor>
    <rangefinder site="rf0"/><rangefinder site="rf1"/><rangefinder site="rf2"/>
    <framepos objtype="body" objname="torso"/>
  </sensor>
</mujoco>
"""


def _model(xml: str = RANGEFINDER_XML) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(xml)


def _qpos(model: mujoco.MjModel) -> np.ndarray:
    q = model.qpos0.copy()
    q[2] = 0.35
    q[3:7] = [0.995, 0.0, 0.1, 0.0]  # pitched a little, so the rays hit the floor at an angle
    return q


def _direct(model: mujoco.MjModel, qpos: np.ndarray, camera: int) -> np.ndarray:
    """What a simulation shows: mj_forward, then a plain mujoco.Renderer (second frame)."""
    model = prepare_model(model, SIZE, "full")
    d = mujoco.MjData(model)
    d.qpos[:] = qpos
    mujoco.mj_forward(model, d)
    with mujoco.Renderer(model, *SIZE) as r:
        for _ in range(2):
            r.update_scene(d, camera=camera)
            rgb = r.render()
    return rgb


def test_rangefinder_rays_render_as_in_simulation():
    m = _model()
    q = _qpos(m)
    cam = m.camera("side").id
    with CpuRenderer(m, SIZE, "full") as r:
        assert r._sensor
        r.set_state(q)
        ours = r.render(cam)
        r._sensor = False  # what replay drew before: no rays
        r.data.sensordata[:] = 0
        r.set_state(q)
        without = r.render(cam)
    np.testing.assert_array_equal(ours, _direct(m, q, cam))
    assert np.any(ours != without, axis=-1).sum() > 20  # the rays are drawn


def test_sensor_stage_only_when_rays_are_drawn():
    plain = _model(re.sub(r"<rangefinder [^>]*/>", "", RANGEFINDER_XML))
    assert not any(plain.sensor_type == mujoco.mjtSensor.mjSENS_RANGEFINDER)
    with CpuRenderer(plain, SIZE, "fast") as r:
        assert not r._sensor  # no rangefinders: no stage
    with CpuRenderer(_model(), SIZE, "fast", SceneOptions.parse({"rangefinder": False})) as r:
        assert not r._sensor  # rays switched off
    off = _model()
    off.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_SENSOR
    with CpuRenderer(off, SIZE, "fast") as r:
        assert not r._sensor  # a simulation with sensors disabled draws no rays either


def test_render_from_archive_draws_the_rays(tmp_path):
    m = _model()
    q = _qpos(m)
    xml = tmp_path / "rf.xml"
    xml.write_text(RANGEFINDER_XML)
    with mjarchive.create(tmp_path / "rf.mjarchive", xml, n_worlds=1, dtype="float64") as w:
        for f in range(2):
            w.append(f / 30, q[None])
    (_, _, rgb), = list(mjarchive.iter_frames(tmp_path / "rf.mjarchive", frames=[1], camera="side", size=SIZE,
                                              quality="full"))
    np.testing.assert_array_equal(rgb, _direct(m, q, m.camera("side").id))


@pytest.mark.skipif(importlib.util.find_spec("dm_control") is None, reason="dm_control is not installed")
def test_dm_control_quadruped_rays():
    suite = Path(importlib.util.find_spec("dm_control").submodule_search_locations[0]) / "suite"
    m = mujoco.MjModel.from_xml_path(str(suite / "quadruped.xml"))
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    with CpuRenderer(m, SIZE, "full") as r:
        r.set_state(d.qpos)
        np.testing.assert_array_equal(r.render(1), _direct(m, d.qpos, 1))
