"""Replay cameras: the Camera value type, free/track/auto views on the CPU and Warp backends.

The "walking humanoid" is the real humanoid model with a red marker sphere centred on the torso's
frame origin, moved along a scripted trajectory (replay is position-only: no physics needed):
4 m along x in 200 frames, bobbing and turning, joints swinging, with a reset at frame 100 (the
body jumps) and a jump without a reset at frame 150. Where the red pixels' centroid lands in an
image is where the torso's origin projects.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest

from conftest import requires_warp_replay

import mjarchive
from mjarchive import Camera
from mjarchive.replay.views.camera import View, project, track_path, view_pose

from _walkers import marker_centroids, walker_spec

N = 200
SIZE = (72, 96)
RESET, JUMP = 100, 150


def _walk(model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qpos (N, 2 worlds, nq), time (N,), reset (N, 2)."""
    t = np.arange(N) * 0.02
    qpos = np.tile(model.qpos0, (N, 2, 1))
    for w in range(2):
        x = -2.0 + 4.0 * np.arange(N) / N + (0.5 if w else 0.0)
        x[RESET:] -= 1.0  # the episode restarts 1 m back
        x[JUMP:] += 0.6  # a jump inside the episode (no reset)
        qpos[:, w, 0] = x
        qpos[:, w, 1] = 0.3 * w
        qpos[:, w, 2] = 1.3 + 0.05 * np.sin(2 * math.pi * t * 2)
        yaw = 0.8 * np.sin(t)
        qpos[:, w, 3] = np.cos(yaw / 2)
        qpos[:, w, 6] = np.sin(yaw / 2)
        qpos[:, w, 7:] = 0.3 * np.sin(2 * math.pi * t[:, None] + np.arange(model.nq - 7)[None, :])
    reset = np.zeros((N, 2), bool)
    reset[RESET] = True
    return qpos, t, reset


@pytest.fixture(scope="module")
def walker(tmp_path_factory, humanoid_xml):
    spec = walker_spec(humanoid_xml)
    model = spec.compile()
    qpos, t, reset = _walk(model)
    path = tmp_path_factory.mktemp("cameras") / "walker.mjarchive"
    with mjarchive.create(path, spec, world_ids=[0, 1], dtype="float64", chunk_frames=32) as w:
        w.append(t, qpos, reset=reset)
    return path, model, qpos


def _render(path, camera, backend="cpu", frames=None, worlds=0, **kw) -> np.ndarray:
    return np.stack([rgb for _, _, rgb in mjarchive.iter_frames(path, worlds=worlds, frames=frames, camera=camera,
                                                                size=SIZE, quality="fast", backend=backend, **kw)])


# -- the value type ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["free", "auto", "side", "0", "free:lookat=0,0,1,distance=4",
                                  "track:torso,distance=3,azimuth=90", "track:torso,yaw,smoothing=0.2,world=42",
                                  "auto:elevation=-30,fovy=60", "free:azimuth=-45.5,elevation=-10,fovy=30"])
def test_camera_cli_and_dict_forms_round_trip(text):
    cam = Camera.parse(text)
    assert Camera.parse(str(cam)) == cam
    assert Camera.from_dict(cam.to_dict()) == cam


def test_camera_constructors_equal_parsed_forms():
    assert Camera.parse("track:torso,distance=3,azimuth=90") == Camera.track("torso", distance=3, azimuth=90)
    assert Camera.parse("free:lookat=0,0,1,distance=4") == Camera.free(lookat=(0, 0, 1), distance=4)
    assert Camera.parse("side") == Camera.model("side") and Camera.parse("2") == Camera.model(2)
    assert Camera.track("torso").label() == "track-torso" and Camera.auto().label() == "auto"
    assert Camera.track("../x").label().startswith("track-.._x-")  # a hostile body name makes a safe label


@pytest.mark.parametrize("text, match", [
    ("track:", "name the body"),
    ("track:torso,distance=-1", r"distance must be a number in \(0"),
    ("free:lookat=0,0", "lookat"),
    ("free:zoom=3", r"free takes \['lookat', 'distance', 'azimuth', 'elevation', 'fovy'\]"),
    ("orbit:torso", "free:, track:, auto:"),
    ("free:distance=nan", "distance must be a number"),
    ("track:torso,elevation=95", "elevation"),
    ("auto:fovy=0", "fovy"),
    ("track:torso,world=x", "world must be a world ID"),
    ("track:torso,bogus", "expected key=value"),
])
def test_unparsable_camera_strings_list_what_is_valid(text, match):
    with pytest.raises(mjarchive.MjArchiveError, match=match):
        Camera.parse(text)


def test_natural_inputs_are_accepted_and_extreme_ones_refused_clearly(walker, tmp_path):
    assert Camera.free(lookat=np.array([0, 0, 1])).lookat == (0.0, 0.0, 1.0)
    assert Camera.track("torso", world=np.int64(3)).to_dict() == {"kind": "track", "body": "torso", "world": 3}
    with pytest.raises(mjarchive.MjArchiveError, match="distance"):
        Camera.free(distance=10**400)
    assert Camera.parse("9" * 5000) == Camera.model("9" * 5000)  # a name (no camera has it), not an id
    with pytest.raises(mjarchive.MjArchiveError, match="non-empty list"):
        mjarchive.render(walker[0], tmp_path, cameras=[], progress=False)


def test_a_hostile_models_view_defaults_fall_back_to_mujocos(tmp_path):
    spec = mujoco.MjSpec.from_string("""
    <mujoco><visual><global fovy="0" azimuth="1e9"/></visual><statistic extent="1e300"/>
      <worldbody><light pos="0 0 3"/><geom type="plane" size="2 2 .1"/>
        <body pos="0 0 .3"><freejoint/><geom type="box" size=".1 .1 .1" rgba="1 0 0 1"/></body>
      </worldbody></mujoco>""")
    model = spec.compile()
    path = tmp_path / "hostile.mjarchive"
    with mjarchive.create(path, spec, world_ids=[0]) as w:
        w.append(0.0, model.qpos0[None])
    for camera in (None, "free", "auto"):
        rgb = next(mjarchive.iter_frames(path, camera=camera, size=(32, 48), quality="fast"))[2]
        assert rgb.std() > 1, f"{camera}: a real image, not a blank one"


def test_track_path_holds_the_camera_over_non_finite_poses():
    view = View("t", (0, 0, 0), 3.0, 90.0, -20.0, 45.0, body=1, yaw=True, smoothing=0.1)
    xpos = np.zeros((6, 3))
    xmat = np.tile(np.eye(3).reshape(9), (6, 1))
    xpos[2], xmat[2] = np.nan, np.nan  # a diverged frame
    xpos[4] = 1e300
    path = track_path(view, xpos, xmat, np.arange(6) * 0.1, np.array([0, 0, 0, 1, 1, 1]))
    assert np.isfinite(path).all() and np.all(np.abs(path) < 1e6)
    np.testing.assert_allclose(path[:, 3], 90.0)


def test_bad_parameters_and_unknown_names_are_one_clear_error(walker):
    path, _, _ = walker
    with pytest.raises(mjarchive.MjArchiveError, match="smoothing"):
        Camera.track("torso", smoothing=-1)
    with pytest.raises(mjarchive.MjArchiveError, match="takes no"):
        Camera("free", body="torso")
    with pytest.raises(mjarchive.SelectionError, match="no body 'tail'.*'torso'"):
        _render(path, Camera.track("tail"), frames=slice(0, 1))
    with pytest.raises(mjarchive.SelectionError, match="no camera 'nope'.*'side'.*track:BODY"):
        _render(path, "nope", frames=slice(0, 1))
    with pytest.raises(mjarchive.MjArchiveError, match="layout='scene'"):
        _render(path, Camera.track("torso", world=1), frames=slice(0, 1))


# -- geometry --------------------------------------------------------------------------------------------------

def test_view_pose_is_mujocos_free_camera(humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    cam = mujoco.MjvCamera()
    cam.type = mujoco.mjtCamera.mjCAMERA_FREE
    cam.lookat[:], cam.distance, cam.azimuth, cam.elevation = (0.3, -0.2, 1.1), 3.5, 37.0, -25.0
    scene = mujoco.MjvScene(model, 1000)
    mujoco.mjv_updateScene(model, data, mujoco.MjvOption(), None, cam, mujoco.mjtCatBit.mjCAT_ALL, scene)
    eyes = [scene.camera[i] for i in range(2)]
    centre = (np.asarray(eyes[0].pos) + np.asarray(eyes[1].pos)) / 2  # the two stereo eyes, averaged
    pos, xmat = view_pose((0.3, -0.2, 1.1), 3.5, 37.0, -25.0)
    np.testing.assert_allclose(pos, centre, atol=1e-5)
    np.testing.assert_allclose(-xmat[:, 2], eyes[0].forward, atol=1e-6)
    np.testing.assert_allclose(xmat[:, 1], eyes[0].up, atol=1e-6)


def test_track_path_smooths_within_episodes_and_restarts_at_resets():
    view = View("t", (0, 0, 0), 3.0, 90.0, -20.0, 45.0, body=1, smoothing=0.5)
    xpos = np.zeros((10, 3))
    xpos[3:, 0] = 1.0  # a jump inside episode 0
    xpos[6:, 0] = 5.0  # a jump at the start of episode 1
    times = np.arange(10) * 0.1
    episode = np.array([0] * 6 + [1] * 4)
    path = track_path(view, xpos, None, times, episode)
    assert path[0, 0] == 0 and 0 < path[3, 0] < path[4, 0] < path[5, 0] < 1.0  # lags, converges
    np.testing.assert_allclose(path[3, 0], 1 - math.exp(-0.1 / 0.5))
    assert path[6, 0] == 5.0  # a new episode starts unsmoothed
    np.testing.assert_array_equal(path[:, 3], 90.0)
    unsmoothed = track_path(View("t", (0, 0, 0), 3.0, 90.0, -20.0, 45.0, body=1), xpos, None, times, episode)
    np.testing.assert_array_equal(unsmoothed[:, :3], xpos)


def test_track_path_yaw_follows_heading_without_wrapping():
    view = View("t", (0, 0, 0), 3.0, 10.0, -20.0, 45.0, body=1, yaw=True)
    heading = np.radians(np.linspace(0, 400, 9))  # past a full turn
    xmat = np.zeros((9, 9))
    xmat[:, 0], xmat[:, 3], xmat[:, 8] = np.cos(heading), np.sin(heading), 1
    path = track_path(view, np.zeros((9, 3)), xmat, np.arange(9.0), np.zeros(9))
    np.testing.assert_allclose(path[:, 3], 10.0 + np.linspace(0, 400, 9), atol=1e-9)


# -- rendering ---------------------------------------------------------------------------------------------------

def test_free_camera_is_pixel_identical_to_mujoco_renderer_with_that_mjvcamera(walker):
    path, model, qpos = walker
    cam = Camera.free(lookat=(0.5, 0.2, 1.0), distance=4.0, azimuth=120.0, elevation=-15.0)
    frames = [0, 57, 123]
    got = _render(path, cam, frames=frames)
    m = mujoco.MjModel.from_xml_string(mjarchive.open(path).bundle.xml)  # the bundled model itself
    m.vis.quality.offsamples = 0
    renderer = mujoco.Renderer(m, *SIZE)
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        renderer.scene.flags[flag] = 0
    mjv = mujoco.MjvCamera()
    mjv.type = mujoco.mjtCamera.mjCAMERA_FREE
    mjv.lookat[:], mjv.distance, mjv.azimuth, mjv.elevation = (0.5, 0.2, 1.0), 4.0, 120.0, -15.0
    data = mujoco.MjData(m)
    for k, f in enumerate(frames):
        data.qpos[:] = qpos[f, 0]
        mujoco.mj_forward(m, data)
        renderer.update_scene(data, camera=mjv)
        if k == 0:
            renderer.render()  # MuJoCo's first frame after a camera switch differs: warm up
            renderer.update_scene(data, camera=mjv)
        np.testing.assert_array_equal(got[k], renderer.render(), err_msg=f"frame {f}")
    renderer.close()


def test_tracked_body_stays_at_the_image_centre_while_a_static_camera_loses_it(walker):
    path, _, _ = walker
    centre = np.array([SIZE[1] / 2, SIZE[0] / 2])
    tracked = marker_centroids(_render(path, Camera.track("torso", distance=3.0, azimuth=90, elevation=-10)))
    assert not np.isnan(tracked).any(), "the marker is visible in every tracked frame"
    err = np.linalg.norm(tracked - centre, axis=1)
    assert err.max() < 2.5, f"tracked body off centre by up to {err.max():.1f} px"
    static = marker_centroids(_render(path, Camera.free(lookat=(-2, 0, 1.3), distance=3.0, azimuth=90,
                                                         elevation=-10)))
    lost = np.isnan(static[:, 0]) | (np.linalg.norm(np.nan_to_num(static, nan=1e9) - centre, axis=1) > SIZE[1] / 4)
    assert lost[RESET - 10:RESET].all() and not lost[0], "a static camera loses the walking body"


def test_smoothing_restarts_unsmoothed_at_a_reset_but_lags_a_jump_inside_an_episode(walker):
    path, _, _ = walker
    centre = np.array([SIZE[1] / 2, SIZE[0] / 2])
    cam = Camera.track("torso", distance=3.0, azimuth=90, elevation=-10, smoothing=0.5)
    got = marker_centroids(_render(path, cam, frames=[RESET - 1, RESET, JUMP - 1, JUMP]))
    err = np.linalg.norm(got - centre, axis=1)
    assert err[1] < 2.5, "the first frame of an episode is not smoothed"
    assert err[3] > 5 * max(err[2], 1.0), "a jump inside an episode is smoothed (the camera lags behind)"
    # The path is computed over the whole video in frame order: a sub-selection that starts later
    # smooths from its own first frame, but the same selection always renders the same pixels.
    again = marker_centroids(_render(path, cam, frames=[RESET - 1, RESET, JUMP - 1, JUMP]))
    np.testing.assert_array_equal(got, again)


def test_auto_camera_frames_every_selected_world_over_the_selection(walker):
    path, model, qpos = walker
    with mjarchive.open(path) as archive:
        from mjarchive.replay.plan import resolve_cameras

        (view, label), = resolve_cameras(archive, archive.model(), "auto", world_ids=[0, 1],
                                         frame_idx=np.arange(N), size=SIZE)
    assert label == "auto" and isinstance(view, View)
    pos, xmat = view_pose(view.lookat, view.distance, view.azimuth, view.elevation)
    assert view.elevation == -20.0
    data = mujoco.MjData(model)
    for f in range(0, N, 7):
        for w in range(2):
            data.qpos[:] = qpos[f, w]
            mujoco.mj_kinematics(model, data)
            xy = project(data.xpos[1:], pos, xmat, view.fovy, SIZE)
            assert np.all((xy >= 0) & (xy <= [SIZE[1], SIZE[0]])), f"a body leaves the auto view at frame {f}"


def test_model_cameras_are_the_default_when_named_and_auto_otherwise(walker, mug_xml, tmp_path):
    path, _, _ = walker
    with mjarchive.open(path) as archive:
        from mjarchive.replay.plan import resolve_cameras

        cams = resolve_cameras(archive, archive.model(), None, world_ids=[0], frame_idx=np.arange(3), size=SIZE)
    assert [label for _, label in cams] == ["back", "side", "egocentric"]
    mixed = mjarchive.render(path, tmp_path / "v", worlds=[0], frames=slice(0, 2), size=SIZE, quality="fast",
                             workers=1, progress=False,
                             cameras=["side", "auto", Camera.track("torso"), "track:torso,distance=2", -1])
    assert [p.name for p in mixed] == ["world-0000_cam-side.mp4", "world-0000_cam-auto.mp4",
                                       "world-0000_cam-track-torso.mp4", "world-0000_cam-track-torso-2.mp4",
                                       "world-0000_cam-free.mp4"]


def test_cpu_and_warp_put_the_tracked_body_at_the_same_place(walker):
    requires_warp_replay()
    path, _, _ = walker
    frames = list(range(0, N, 20))
    for cam in (Camera.track("torso", distance=3.0, azimuth=60, elevation=-15, yaw=True),
                Camera.track("torso", distance=3.0, azimuth=60, elevation=-15, smoothing=0.3),
                Camera.free(lookat=(0, 0, 1.2), distance=5.0, azimuth=100, elevation=-20)):
        cpu = marker_centroids(_render(path, cam, frames=frames))
        gpu = marker_centroids(_render(path, cam, backend="warp:cpu", frames=frames))
        assert np.array_equal(np.isnan(cpu), np.isnan(gpu)) and (~np.isnan(cpu)).sum() >= len(frames), str(cam)
        np.testing.assert_allclose(gpu, cpu, atol=2.0, err_msg=str(cam))  # measured: within 1.7 px
        if cam.kind == "track" and not cam.smoothing:
            np.testing.assert_allclose(gpu, np.tile([SIZE[1] / 2, SIZE[0] / 2], (len(frames), 1)), atol=2.5)
