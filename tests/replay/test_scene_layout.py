"""layout='scene': several worlds side by side in one 3D scene, on the CPU and Warp backends.

Each world is the real humanoid with a red marker sphere on the torso's frame origin (see
test_cameras.py); the red blob nearest a world's expected place is that world's torso.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from conftest import requires_warp_replay

import mjarchive
from mjarchive import Camera
from mjarchive.replay.views.camera import project, view_pose
from mjarchive.replay.views.scene import ScenePlan

from _walkers import marker_centroids, walker_spec

SIZE = (96, 128)
WORLDS = [5, 9, 42, 7]
N = 8
SPACING = 2.0


@pytest.fixture(scope="module")
def run(tmp_path_factory, humanoid_xml):
    spec = walker_spec(humanoid_xml)
    model = spec.compile()
    rng = np.random.default_rng(3)
    qpos = np.tile(model.qpos0, (N, len(WORLDS), 1))
    qpos[:, :, 0] = np.linspace(0, 0.4, N)[:, None] + rng.uniform(-0.3, 0.3, len(WORLDS))
    qpos[:, :, 1] = rng.uniform(-0.3, 0.3, len(WORLDS))
    qpos[:, :, 2] = 1.3
    qpos[:, :, 7:] = rng.uniform(-0.4, 0.4, (N, len(WORLDS), model.nq - 7))
    reset = np.zeros((N, len(WORLDS)), bool)
    reset[N // 2, 2] = True
    qpos[N // 2:, 2, 0] -= 0.5  # world 42 restarts half a metre back: a jump, never a blend
    path = tmp_path_factory.mktemp("scene") / "walkers.mjarchive"
    with mjarchive.create(path, spec, world_ids=WORLDS, dtype="float64", chunk_frames=4) as w:
        w.append(np.arange(N) * 0.02, qpos, reset=reset)
    return path, model, qpos


def _frames(path, backend="cpu", **kw):
    return np.stack([rgb for _, _, rgb in mjarchive.iter_frames(path, size=SIZE, quality="fast", backend=backend,
                                                                **kw)])


def _scene(path, out, camera, backend="cpu", **kw):
    captured = []
    mjarchive.render(path, out, layout="scene", spacing=SPACING, cameras=[camera], size=SIZE, quality="fast",
                     backend=backend, workers=1, progress=False, resume=False,
                     on_frame=lambda w, f, rgb: captured.append(rgb.copy()), **kw)
    return np.stack(captured)


def _blobs(frame: np.ndarray, near: np.ndarray, radius: float = 10.0) -> np.ndarray:
    """Centroid of the red pixels within `radius` px of each of `near` (k, 2)."""
    f = frame.astype(np.int16)
    ys, xs = np.nonzero((f[..., 0] > 120) & (f[..., 1] < 70) & (f[..., 2] < 70))
    pts = np.stack([xs + 0.5, ys + 0.5], axis=1)
    out = np.full((len(near), 2), np.nan)
    for k, c in enumerate(near):
        mine = pts[np.linalg.norm(pts - c, axis=1) < radius]
        if len(mine) >= 3:
            out[k] = mine.mean(axis=0)
    return out


CAMERA = dict(distance=7.0, azimuth=90.0, elevation=-35.0)


def test_each_world_of_a_scene_looks_as_it_does_alone_under_the_offset_camera(run, tmp_path):
    path, _, _ = run
    plan = ScenePlan.grid(WORLDS, SPACING)
    lookat = np.array([0.2, 0.0, 1.0])
    scene = _scene(path, tmp_path / "s", Camera.free(lookat=tuple(lookat), **CAMERA), hud=None)
    assert scene.shape == (N, *SIZE, 3)
    for i, wid in enumerate(WORLDS):
        alone = _frames(path, worlds=[wid], camera=Camera.free(lookat=tuple(lookat - plan.offsets[i]), **CAMERA))
        expected = marker_centroids(alone)
        assert not np.isnan(expected).any(), f"world {wid}'s marker is in view"
        for k in range(N):
            got = _blobs(scene[k], expected[k:k + 1])[0]
            # Same model, same camera relative to the world: the torso lands on the same pixel. The
            # documented tolerance, 2.5 px at 96x128 (measured up to 2.0): every copy keeps its own
            # spotlight, so neighbours light and shade the small blob's edge, and the red threshold
            # moves with the brightness.
            np.testing.assert_allclose(got, expected[k], atol=2.5, err_msg=f"world {wid} frame {k}")
            x, y = expected[k].round().astype(int)
            window = (slice(max(0, y - 6), y + 6), slice(max(0, x - 6), x + 6))
            diff = np.abs(scene[k][window].astype(int) - alone[k][window].astype(int)).mean()
            # Brightness differs (measured up to 18/255 on average): the neighbours' spotlights.
            assert diff < 30, f"world {wid} frame {k}: mean |diff| {diff:.1f}/255 around the torso"


def test_tracking_one_world_of_a_scene_keeps_it_centred_and_the_others_in_view(run, tmp_path):
    path, _, _ = run
    frames = _scene(path, tmp_path / "t", Camera.track("torso", world=42, **CAMERA), hud=None)
    centre = np.array([SIZE[1] / 2, SIZE[0] / 2])
    for frame in frames:
        got = _blobs(frame, centre[None], radius=8)[0]
        assert np.linalg.norm(got - centre) < 2.5
        red = (frame[..., 0] > 120) & (frame[..., 1] < 70) & (frame[..., 2] < 70)
        assert red.sum() > 3 * ((np.linalg.norm(np.stack(np.nonzero(red)[::-1], 1) + 0.5 - centre, axis=1) < 8).sum())


def test_cpu_and_warp_scenes_agree_on_each_robots_image_position(run, tmp_path):
    requires_warp_replay()
    path, _, qpos = run
    lookat = (0.2, 0.0, 1.0)
    cam = Camera.free(lookat=lookat, **CAMERA)
    frames = list(range(0, N, 3))
    cpu = _scene(path, tmp_path / "c", cam, frames=frames, hud=None)
    gpu = _scene(path, tmp_path / "w", cam, backend="warp:cpu", frames=frames, hud=None)
    plan = ScenePlan.grid(WORLDS, SPACING)
    pos, xmat = view_pose(lookat, CAMERA["distance"], CAMERA["azimuth"], CAMERA["elevation"])
    fovy = mjarchive.open(path).model().vis.global_.fovy
    for k, f in enumerate(frames):
        torsos = project(qpos[f, :, :3] + np.asarray(plan.offsets), pos, xmat, fovy, SIZE)
        a, b = _blobs(cpu[k], torsos, radius=6), _blobs(gpu[k], torsos, radius=6)
        assert not np.isnan(a).any() and not np.isnan(b).any(), f"every torso is seen at frame {f}"
        np.testing.assert_allclose(a, torsos, atol=2.5, err_msg=f"CPU, frame {f}")
        np.testing.assert_allclose(b, a, atol=2.0, err_msg=f"Warp vs CPU, frame {f}")


def test_scene_labels_name_each_world_where_it_stands(run, tmp_path):
    path, _, _ = run
    cam = Camera.free(lookat=(0.2, 0.0, 1.0), **CAMERA)
    bare = _scene(path, tmp_path / "a", cam, hud=None, frames=slice(0, 1))[0]
    labelled = _scene(path, tmp_path / "b", cam, frames=slice(0, 1))[0]  # default: world IDs
    changed = np.any(bare != labelled, axis=-1)
    blobs = _blobs(bare, np.array([[x, y] for y in range(8, SIZE[0], 16) for x in range(8, SIZE[1], 16)]), radius=12)
    torsos = np.unique(np.round(blobs[~np.isnan(blobs[:, 0])]).astype(int), axis=0)
    assert changed.any()
    for x, y in torsos:  # a label sits above every torso
        assert changed[max(0, y - 30):y, max(0, x - 15):x + 15].any(), (x, y)
    corner = _scene(path, tmp_path / "c", cam, hud=("frame", "time", "top-right"), frames=slice(0, 1))[0]
    ys, xs = np.nonzero(np.any(corner != bare, axis=-1))
    assert xs.min() > SIZE[1] // 3 and ys.max() < SIZE[0] // 2, "frame and time go in the chosen corner"


def test_scene_output_name_and_limits(run, tmp_path, humanoid_xml):
    path, _, _ = run
    paths = mjarchive.render(path, tmp_path / "n", layout="scene", size=SIZE, quality="fast", workers=2,
                             frames=slice(0, 2), progress=False)
    assert [p.name for p in paths] == ["scene_cam-auto.mp4"]
    with pytest.raises(mjarchive.MjArchiveError, match="spacing"):
        mjarchive.render(path, tmp_path / "x", layout="scene", spacing=0, progress=False)
    with pytest.raises(mjarchive.MjArchiveError, match="split_episodes"):
        mjarchive.render(path, tmp_path / "x", layout="scene", split_episodes=True, progress=False)
    many = tmp_path / "many.mjarchive"
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    with mjarchive.create(many, humanoid_xml, n_worlds=65) as w:
        w.append(0.0, np.tile(model.qpos0, (65, 1)))
    with pytest.raises(mjarchive.SelectionError, match="at most 64 worlds in one scene"):
        mjarchive.render(many, tmp_path / "x", layout="scene", progress=False)
    with pytest.raises(mjarchive.SelectionError, match="world 3 is not among the selected worlds"):
        mjarchive.render(path, tmp_path / "x", layout="scene", cameras=[Camera.track("torso", world=3)],
                         progress=False)


def test_a_many_dof_robot_fills_a_64_world_scene_and_replay_names_are_free():
    from mjarchive.archive.bundle.compile_child import apply_recipe
    from mjarchive.archive.bundle.model_bundle import ModelBundle
    from mjarchive.replay.views.scene import derived_model

    chain = "".join(f'<body pos="0 0 .05"><joint type="hinge" axis="{"1 0 0" if i % 2 else "0 1 0"}"/>'
                    '<geom type="capsule" size=".01 .02"/>' for i in range(60)) + "</body>" * 60
    bundle = ModelBundle(f"<mujoco><worldbody>{chain}</worldbody></mujoco>", {})
    plan = ScenePlan.grid(range(64), 1.0)
    scene = derived_model(bundle, plan.recipe(), trusted=False)  # in the sandbox, under its limits
    assert scene.nq == 64 * 60
    # A model may use the replay's names: the replay takes free ones (tests/replay/test_bounded_work.py).
    named = mujoco.MjSpec.from_string('<mujoco><worldbody><body name="mjarchive-replay"/></worldbody></mujoco>')
    model = apply_recipe(named, {"cameras": [45.0]}).compile()
    assert model.body(model.nbody - 1).name == "mjarchive-replay~1" and model.camera(0).name == "mjarchive-replay~1-0"
