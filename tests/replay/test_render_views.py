"""What render() burns into and hands out of each frame (HUD, on_frame) and what it draws (scene=)."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

import mjarchive
from mjarchive.testing import decode_video

SIZE = (48, 64)
N = 12
WORLDS = [3, 42]


@pytest.fixture(scope="module")
def run(tmp_path_factory, humanoid_xml):
    """Two humanoid worlds, a scripted motion, a `reward` track that changes every frame, a reset."""
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    path = tmp_path_factory.mktemp("views") / "run.mjarchive"
    qpos = np.tile(model.qpos0, (N, 2, 1))
    qpos[:, :, 0] = np.linspace(0, 0.5, N)[:, None]
    qpos[:, 1, 1] = 0.5
    reward = np.arange(N * 2, dtype=np.float32).reshape(N, 2) / 7
    reset = np.zeros((N, 2), bool)
    reset[N // 2, 1] = True
    with mjarchive.create(path, humanoid_xml, world_ids=WORLDS, dtype="float64", chunk_frames=4,
                          tracks={"reward": ()}) as w:
        w.append(np.arange(N) * 0.05, qpos, reset=reset, reward=reward)
    return path


def _captured(path, out, size=SIZE, **kw):
    """render(...) with on_frame recording every (world_id, frame) and a copy of the frame."""
    calls, frames = [], []

    def on_frame(world_id, frame_index, rgb):
        calls.append((world_id, frame_index))
        frames.append(rgb.copy())

    paths = mjarchive.render(path, out, size=size, quality="fast", progress=False, on_frame=on_frame,
                             resume=False, **kw)
    return paths, calls, np.stack(frames)


def test_hud_burns_in_values_and_they_change_when_the_value_changes(run, tmp_path):
    kw = dict(worlds=[3], cameras="side", workers=1, size=(120, 160))
    _, _, plain = _captured(run, tmp_path / "a", hud=None, **kw)
    _, _, hud = _captured(run, tmp_path / "b", hud=("world", "frame", "reward", "bottom-right"), **kw)
    burned = np.any(hud != plain, axis=-1)  # (N, H, W): where text and its box are
    ys, xs = np.nonzero(burned.any(axis=0))
    assert ys.min() >= 120 // 2 and xs.min() >= 160 // 3, "the HUD stays in its corner"
    # Every frame shows another frame number and reward: the burned-in pixels differ frame to frame.
    text = np.where(burned[..., None], hud, 0)
    for k in range(1, N):
        assert np.any(text[k] != text[k - 1]), f"frames {k - 1} and {k} show the same text"


def test_hud_is_off_per_world_and_shows_world_ids_in_grids(run, tmp_path):
    _, _, default = _captured(run, tmp_path / "a", worlds=[3], cameras="side", frames=slice(0, 2), workers=1)
    _, _, none = _captured(run, tmp_path / "b", worlds=[3], cameras="side", frames=slice(0, 2), workers=1, hud=None)
    np.testing.assert_array_equal(default, none)
    _, _, grid = _captured(run, tmp_path / "c", cameras="side", frames=slice(0, 2), workers=1, layout="grid")
    _, _, bare = _captured(run, tmp_path / "d", cameras="side", frames=slice(0, 2), workers=1, layout="grid",
                           hud=None)
    diff = np.any(grid != bare, axis=-1)[0]
    assert diff[:SIZE[0] // 2, :SIZE[1] // 2].any() and diff[:SIZE[0] // 2, SIZE[1]:SIZE[1] + SIZE[1] // 2].any()
    with pytest.raises(mjarchive.MjArchiveError, match="reward"):
        mjarchive.render(run, tmp_path / "e", hud=("world", "score"), progress=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_on_frame_sees_every_frame_once_in_order_and_its_result_is_encoded(run, tmp_path, workers):
    seen = []

    def on_frame(world_id, frame_index, rgb):
        seen.append((world_id, frame_index))
        out = np.zeros_like(rgb)
        out[..., 1] = 200  # what gets encoded: a green frame
        return out

    paths = mjarchive.render(run, tmp_path / "v", cameras=["side", "back"], size=SIZE, quality="fast",
                             workers=workers, progress=False, on_frame=on_frame)
    expected = [(w, f) for w in WORLDS for _ in ("side", "back") for f in range(N)]
    assert seen == expected
    video, _ = decode_video(paths[0])
    assert len(video) == N and abs(float(video[..., 1].mean()) - 200) < 3 and float(video[..., 0].mean()) < 5


def test_a_render_with_on_frame_is_never_skipped_by_resume(run, tmp_path):
    calls = []
    for k in range(2):
        mjarchive.render(run, tmp_path / "v", worlds=[3], cameras="side", frames=slice(0, 2), size=SIZE,
                         quality="fast", workers=1, progress=False, on_frame=lambda w, f, rgb: calls.append(k))
    assert calls == [0, 0, 1, 1]


def test_on_frame_in_grid_videos_gets_the_whole_canvas_and_bad_results_are_refused(run, tmp_path):
    shapes = []
    mjarchive.render(run, tmp_path / "g", cameras="side", size=SIZE, quality="fast", workers=1, progress=False,
                     layout="grid", on_frame=lambda w, f, rgb: shapes.append((w, f, rgb.shape)))
    assert shapes == [(None, f, (SIZE[0], 2 * SIZE[1], 3)) for f in range(N)]
    with pytest.raises(mjarchive.MjArchiveError, match="on_frame must return None or a uint8 array"):
        mjarchive.render(run, tmp_path / "h", cameras="side", size=SIZE, quality="fast", workers=1, progress=False,
                         on_frame=lambda w, f, rgb: rgb[:10])
    with pytest.raises(mjarchive.MjArchiveError, match="on_frame must be a callable"):
        mjarchive.render(run, tmp_path / "i", on_frame="print", progress=False)


def test_scene_options_hide_geom_groups_and_show_sites(run):
    def frames(**kw):
        return np.stack([rgb for _, _, rgb in mjarchive.iter_frames(run, worlds=[3], frames=slice(0, 2), camera="side",
                                                                    size=SIZE, quality="fast", **kw)])

    default = frames()
    model = mjarchive.open(run).model()
    robot_groups = sorted({int(g) for g, b in zip(model.geom_group, model.geom_bodyid) if b != 0})
    hidden = [0 if g in robot_groups else 1 for g in range(3)]
    without_robot = frames(scene={"geomgroup": hidden})
    assert np.any(default != without_robot)
    with_frames = frames(scene="frames=body")
    assert np.any(with_frames != default)
    with pytest.raises(mjarchive.MjArchiveError, match="geomgroup"):
        frames(scene="zoom")


def test_showing_sites_adds_their_pixels(tmp_path):
    spec = mujoco.MjSpec.from_string("""
    <mujoco><worldbody><light pos="0 0 3"/><geom type="plane" size="2 2 .1"/>
      <body pos="0 0 .3"><freejoint/><geom type="box" size=".1 .1 .1"/>
        <site name="marker" group="4" pos=".25 0 0" size=".08" rgba="1 0 0 1"/></body>
    </worldbody></mujoco>""")
    model = spec.compile()
    path = tmp_path / "sites.mjarchive"
    with mjarchive.create(path, spec, world_ids=[0]) as w:
        w.append(0.0, model.qpos0[None])

    def frame(**kw):
        return next(mjarchive.iter_frames(path, camera=mjarchive.Camera.free(lookat=(0, 0, .3), distance=1.5),
                                          size=SIZE, quality="fast", **kw))[2].astype(int)

    default, shown, hidden = frame(), frame(scene={"sites": True}), frame(scene="sites=0")
    red = lambda f: int(((f[..., 0] > 150) & (f[..., 1] < 80)).sum())  # noqa: E731
    assert red(default) == 0 and red(hidden) == 0 and red(shown) > 10
