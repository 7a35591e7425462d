"""Video output: streaming mp4 files that decode with the right frame count, size and fps."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

import mjarchive
from mjarchive.testing import decode_video
from mjarchive.replay.video import GridComposer, VideoWriter, grid_shape, video_name

ARM_XML = """
<mujoco>
  <worldbody>
    <light pos="0 0 3"/>
    <geom type="plane" size="2 2 .1" rgba=".4 .4 .4 1"/>
    <body name="arm" pos="0 0 .3">
      <joint name="hinge" type="hinge" axis="0 0 1"/>
      <geom type="box" size=".6 .08 .08" pos=".6 0 0" rgba="0 .8 0 1"/>
    </body>
    <camera name="top" pos="0 0 4"/>
    <camera name="angled" pos="2 -2 2" xyaxes="1 1 0 -.5 .5 1"/>
  </worldbody>
</mujoco>
"""
N = 12


@pytest.fixture(scope="module")
def arm_archive(tmp_path_factory):
    d = tmp_path_factory.mktemp("video")
    (d / "arm.xml").write_text(ARM_XML)
    path = d / "arm.mjarchive"
    with mjarchive.create(path, d / "arm.xml", world_ids=[5, 17, 99], output_fps=25.0, chunk_frames=5) as w:
        for f in range(N):
            qpos = np.array([[0.25 * f], [-0.25 * f], [0.1 * f]])
            reset = np.array([False, f in (4, 9), False])
            w.append(f / 25, qpos, reset=reset)
    return path


def test_per_world_videos_decode_with_expected_count_size_fps(arm_archive, tmp_path):
    out = mjarchive.render(arm_archive, tmp_path, worlds=[17, 5], cameras=["top", "angled"], size=(48, 64),
                           quality="fast", workers=1, progress=False)
    assert [p.name for p in out] == ["world-0017_cam-top.mp4", "world-0017_cam-angled.mp4",
                                     "world-0005_cam-top.mp4", "world-0005_cam-angled.mp4"]
    frames, fps = decode_video(out[0])
    assert frames.shape == (N, 48, 64, 3)
    assert fps == pytest.approx(25.0)
    # the encoded video is close to the raw frames (lossy, but not another scene)
    raw = np.stack([rgb for _, _, rgb in mjarchive.iter_frames(arm_archive, worlds=17, camera="top", size=(48, 64),
                                                                quality="fast")])
    assert np.abs(frames.astype(int) - raw).mean() < 4
    assert not np.array_equal(frames[0], frames[-1])  # the arm turns


def test_frame_selection_fps_override_and_odd_size(arm_archive, tmp_path):
    out = mjarchive.render(arm_archive, tmp_path, worlds=99, frames=slice(2, 9, 3), cameras="top", size=(33, 47),
                           fps=10, quality="fast", workers=1, progress=False)
    frames, fps = decode_video(out[0])
    assert frames.shape == (3, 34, 48, 3)  # padded to even dimensions for yuv420p
    assert fps == pytest.approx(10.0)


def test_split_episodes_writes_one_file_per_episode(arm_archive, tmp_path):
    out = mjarchive.render(arm_archive, tmp_path, worlds=17, frames=slice(2, N), cameras="top", size=(32, 32),
                           quality="fast", workers=1, progress=False, split_episodes=True)
    assert [p.name for p in out] == [f"world-0017_cam-top_ep-{k:03d}.mp4" for k in range(3)]
    # episodes start at frames 0, 4, 9; frames 2.. are selected
    assert [len(decode_video(p)[0]) for p in out] == [2, 5, 3]
    with pytest.raises(mjarchive.MjArchiveError, match="per-world"):
        mjarchive.render(arm_archive, tmp_path, layout="grid", split_episodes=True, progress=False)


def test_grid_tiles_worlds_with_labels(arm_archive, tmp_path):
    out = mjarchive.render(arm_archive, tmp_path, cameras="top", size=(32, 48), layout="grid", quality="fast",
                           workers=1, progress=False)
    assert [p.name for p in out] == ["grid_cam-top.mp4"]
    frames, _ = decode_video(out[0])
    rows, cols = grid_shape(3)
    assert frames.shape == (N, rows * 32, cols * 48, 3)
    # each tile carries a white label on black in its top-left corner
    for i in range(3):
        r, c = divmod(i, cols)
        corner = frames[0, r * 32 + 2:r * 32 + 10, c * 48 + 2:c * 48 + 30]
        assert corner.max() > 200 and corner.min() < 40
    empty = frames[0, 32:, 48:]  # 4th tile of a 2x2 grid holds no world
    assert empty.max() < 20


def test_executor_argument_runs_units_elsewhere(arm_archive, tmp_path):
    kw = dict(worlds=5, cameras="angled", size=(32, 32), quality="fast", progress=False)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as ex:
        a = mjarchive.render(arm_archive, tmp_path / "a", executor=ex, **kw)
    with ThreadPoolExecutor(2) as ex:  # one GL context per thread
        t = mjarchive.render(arm_archive, tmp_path / "t", executor=ex, **kw)
    b = mjarchive.render(arm_archive, tmp_path / "b", workers=1, **kw)
    np.testing.assert_array_equal(decode_video(a[0])[0], decode_video(b[0])[0])
    np.testing.assert_array_equal(decode_video(t[0])[0], decode_video(b[0])[0])


def test_progress_bar_reports_frames(arm_archive, tmp_path, capsys):
    mjarchive.render(arm_archive, tmp_path, worlds=5, cameras="top", size=(32, 32), quality="fast", workers=1)
    err = capsys.readouterr().err
    assert f"{N}/{N}" in err and "frame/s" in err
    mjarchive.render(arm_archive, tmp_path, worlds=5, cameras="top", size=(32, 32), quality="fast", workers=1,
                     progress=False, resume=False)  # resume=True would skip it, saying so
    assert capsys.readouterr().err == ""


def test_video_writer_streams_and_closes(tmp_path):
    path = tmp_path / video_name(42, "free")
    assert path.name == "world-0042_cam-free.mp4"
    with VideoWriter(path, (16, 16), 12.0) as v:
        for i in range(5):
            v.write(np.full((16, 16, 3), 40 * i, np.uint8))
        with pytest.raises(mjarchive.MjArchiveError):
            v.write(np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(mjarchive.ClosedError):
        v.write(np.zeros((16, 16, 3), np.uint8))
    frames, fps = decode_video(path)
    assert len(frames) == 5 and fps == pytest.approx(12.0)
    assert [int(f.mean()) for f in frames] == pytest.approx([0, 40, 80, 120, 160], abs=3)


def test_grid_composer_places_tiles():
    comp = GridComposer([1, 2, 3, 4, 5], (4, 6))
    assert (comp.rows, comp.cols) == (2, 3)
    canvas = comp.canvas(1)
    comp.paste(canvas, 5, np.full((1, 4, 6, 3), 77, np.uint8))
    assert canvas[0, 4:8, 6:12].max() > 0 and canvas[0, :4].max() == 0


def test_software_gl_prints_one_fast_quality_hint(arm_archive, tmp_path, capsys):
    from mjarchive.replay.backends.cpu import CpuRenderer, gl_renderer_name

    with mjarchive.open(arm_archive) as a, CpuRenderer(a.model(), (8, 8), "fast") as r:
        r.render()
        software = "llvmpipe" in gl_renderer_name()
    mjarchive.render(arm_archive, tmp_path, worlds=[5, 17], frames=slice(0, 1), cameras="top", size=(16, 16),
                     workers=1)
    err = capsys.readouterr().err
    assert err.count("quality='fast'") == (1 if software else 0)
