"""Replay (CPU backend): pixel identity with inline rendering, split-independence, selection, mocap."""

from __future__ import annotations

import concurrent.futures
import copy

import mujoco
import numpy as np
import pytest

from conftest import requires_warp_replay

import mjarchive
from mjarchive.testing import decode_video

SIZE = (48, 64)
N_FRAMES = 10
WORLDS = (3, 42)


N_FULL = 2  # frames also rendered at quality="full" (slow on software GL: shadow maps)


def _inline_renderer(model, quality):
    """What quality="fast" means, applied by hand to a plain mujoco.Renderer."""
    if quality == "fast":
        model = copy.copy(model)
        model.vis.quality.offsamples = 0
    r = mujoco.Renderer(model, *SIZE)
    if quality == "fast":
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
            r.scene.flags[flag] = 0
    return r


def _simulate_and_record(path, xml):
    """Step two humanoid worlds, record float64 qpos each frame and render each frame inline.

    Returns {(world_id, camera_id, quality): (n, H, W, 3)} of inline frames, rendered after
    mj_forward by one warmed-up renderer per camera and quality ("full": first N_FULL frames, camera 0).
    """
    model = mujoco.MjModel.from_xml_path(str(xml))
    rng = np.random.default_rng(0)
    datas = []
    for _ in WORLDS:
        d = mujoco.MjData(model)
        d.qvel[:] = rng.normal(scale=0.5, size=model.nv)
        datas.append(d)
    cams = [0, 1, 2, -1]  # back and side are trackcom cameras; egocentric; the free camera
    renderers = {(c, "fast"): _inline_renderer(model, "fast") for c in cams}
    renderers[0, "full"] = _inline_renderer(model, "full")
    inline = {(w, c, q): [] for w in WORLDS for c, q in renderers}
    with mjarchive.create(path, xml, world_ids=list(WORLDS), dtype="float64", chunk_frames=4) as writer:
        for f in range(N_FRAMES):
            for w, d in zip(WORLDS, datas):
                for _ in range(5):
                    mujoco.mj_step(model, d)
                mujoco.mj_forward(model, d)
                for (c, q), r in renderers.items():
                    if q == "full" and f >= N_FULL:
                        continue
                    r.update_scene(d, camera=c)
                    if f == 0 and w == WORLDS[0]:
                        r.render()  # warm-up frame, discarded
                        r.update_scene(d, camera=c)
                    inline[w, c, q].append(r.render())
            writer.append(datas[0].time, np.stack([d.qpos for d in datas]))
    for r in renderers.values():
        r.close()
    return {k: np.stack(v) for k, v in inline.items()}


@pytest.fixture(scope="module")
def humanoid_run(tmp_path_factory, humanoid_xml):
    path = tmp_path_factory.mktemp("replay") / "humanoid.mjarchive"
    return path, _simulate_and_record(path, humanoid_xml)


def _frames(archive, **kw):
    out = {}
    for wid, f, rgb in mjarchive.iter_frames(archive, size=SIZE, **kw):
        out[wid, f] = rgb
    return out


@pytest.mark.parametrize("camera", [0, 1, 2, -1], ids=["back-trackcom", "side-trackcom", "egocentric", "free"])
def test_replay_is_pixel_identical_to_inline_render(humanoid_run, camera):
    path, inline = humanoid_run
    got = _frames(path, camera=camera, quality="fast")
    assert len(got) == len(WORLDS) * N_FRAMES
    for w in WORLDS:
        replay = np.stack([got[w, f] for f in range(N_FRAMES)])
        assert replay.std() > 1  # not blank
        np.testing.assert_array_equal(replay, inline[w, camera, "fast"])


def test_full_quality_replay_is_pixel_identical(humanoid_run):
    path, inline = humanoid_run
    got = _frames(path, camera="back", frames=slice(0, N_FULL), quality="full")
    for w in WORLDS:
        np.testing.assert_array_equal(np.stack([got[w, f] for f in range(N_FULL)]), inline[w, 0, "full"])


def test_selection_renders_exactly_those_frames(humanoid_run):
    path, inline = humanoid_run
    got = list(mjarchive.iter_frames(path, worlds=[42], frames=[7, 2, 5], camera="side", size=SIZE, quality="fast"))
    assert [(w, f) for w, f, _ in got] == [(42, 7), (42, 2), (42, 5)]
    for w, f, rgb in got:
        np.testing.assert_array_equal(rgb, inline[42, 1, "fast"][f])
    sliced = [(w, f) for w, f, _ in mjarchive.iter_frames(path, worlds=slice(0, 10), frames=slice(3, 9, 2),
                                                            camera=0, size=SIZE, quality="fast")]
    assert sliced == [(3, 3), (3, 5), (3, 7)]


def test_one_and_two_workers_write_identical_frames(humanoid_run, tmp_path):
    path, _ = humanoid_run
    a = {(w, f): rgb for w, f, rgb in mjarchive.iter_frames(path, camera="back", size=SIZE, quality="fast")}
    # Two spawned workers, units of 4 chunk-aligned frames interleaving worlds and cameras.
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=__import__("multiprocessing").get_context("spawn")) as ex:
        from mjarchive.replay.render import RenderUnit, render_unit

        units = [RenderUnit(str(path), None, w, 0, tuple(range(s, min(s + 4, N_FRAMES))), SIZE, "fast", "cpu")
                 for s in range(0, N_FRAMES, 4) for w in WORLDS]
        units.insert(1, RenderUnit(str(path), None, 3, 1, (9,), SIZE, "fast", "cpu"))  # camera switch in between
        results = list(ex.map(render_unit, units))
    for r in results:
        if r.camera == 0:
            for f, rgb in zip(r.frames, r.rgb):
                np.testing.assert_array_equal(rgb, a[r.world_id, f])
    # And through render(): workers=1 and workers=2 produce identical video files' frames.
    out1 = mjarchive.render(path, tmp_path / "w1", cameras=["back"], size=SIZE, quality="fast", workers=1,
                            progress=False)
    out2 = mjarchive.render(path, tmp_path / "w2", cameras=["back"], size=SIZE, quality="fast", workers=2,
                            progress=False)
    assert [p.name for p in out1] == [p.name for p in out2] == ["world-0003_cam-back.mp4", "world-0042_cam-back.mp4"]
    for p1, p2 in zip(out1, out2):
        np.testing.assert_array_equal(decode_video(p1)[0], decode_video(p2)[0])


def test_wrong_layout_model_is_refused(humanoid_run, mug_xml):
    path, _ = humanoid_run
    with pytest.raises(mjarchive.LayoutMismatchError):
        next(mjarchive.iter_frames(path, size=SIZE, model=str(mug_xml)))
    with pytest.raises(mjarchive.LayoutMismatchError):
        mjarchive.render(path, "unused", size=SIZE, model=mujoco.MjModel.from_xml_path(str(mug_xml)), progress=False)


def test_caller_model_is_used_after_layout_check(humanoid_run, humanoid_xml):
    path, inline = humanoid_run
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    got = list(mjarchive.iter_frames(path, worlds=3, frames=[4], camera="back", size=SIZE, model=model,
                                         quality="fast"))
    np.testing.assert_array_equal(got[0][2], inline[3, 0, "fast"][4])


def test_invalid_choices_fail_loudly(humanoid_run):
    path, _ = humanoid_run
    with pytest.raises(mjarchive.MjArchiveError, match="'cpu'"):
        mjarchive.render(path, "x", backend="opengl", progress=False)
    with pytest.raises(mjarchive.MjArchiveError, match="'fast'"):
        mjarchive.render(path, "x", quality="ultra", progress=False)
    with pytest.raises(mjarchive.MjArchiveError, match="'grid'"):
        mjarchive.render(path, "x", layout="mosaic", progress=False)
    with pytest.raises(mjarchive.SelectionError, match="'back'"):
        next(mjarchive.iter_frames(path, camera="top", size=SIZE))
    with pytest.raises(mjarchive.SelectionError):
        next(mjarchive.iter_frames(path, worlds=[7], size=SIZE))
    with pytest.raises(mjarchive.SelectionError, match="no frames"):
        mjarchive.render(path, "x", frames=slice(5, 5), progress=False)


MOCAP_XML = """
<mujoco>
  <worldbody>
    <light pos="0 0 3"/>
    <geom type="plane" size="2 2 .1" rgba=".3 .3 .3 1"/>
    <body name="target" mocap="true" pos="0 0 .2"><geom type="box" size=".15 .15 .15" rgba="1 0 0 1"/></body>
    <body name="arm"><joint name="hinge" type="hinge" axis="0 0 1"/><geom type="capsule" fromto="0 0 .5 .3 0 .5" size=".03"/></body>
    <camera name="top" pos="0 0 3"/>
  </worldbody>
</mujoco>
"""


@pytest.mark.parametrize("backend", ["cpu", "warp:cpu"])
def test_mocap_body_visibly_moves(tmp_path, backend):
    if backend != "cpu":
        requires_warp_replay()
    xml = tmp_path / "mocap.xml"
    xml.write_text(MOCAP_XML)
    path = tmp_path / "mocap.mjarchive"
    with mjarchive.create(path, xml, n_worlds=1) as w:
        for f in range(3):
            pos = np.array([[[0.8 * (f - 1), 0.0, 0.2]]])
            w.append(f / 30, np.zeros((1, 1)), mocap_pos=pos, mocap_quat=np.array([[[1.0, 0, 0, 0]]]))
    frames = [rgb for _, _, rgb in mjarchive.iter_frames(path, camera="top", size=(64, 64), quality="fast",
                                                         backend=backend)]
    red = [np.argwhere(f[..., 0].astype(int) - f[..., 1] > 60) for f in frames]
    assert all(len(r) > 10 for r in red)
    cols = [r[:, 1].mean() for r in red]
    assert cols[0] < cols[1] - 5 < cols[2] - 10  # the box moves along +x, i.e. across the image


def test_cpu_replay_never_imports_warp(humanoid_run):
    import subprocess
    import sys

    path, _ = humanoid_run
    code = (
        "import sys, mjarchive\n"
        f"out = list(mjarchive.iter_frames({str(path)!r}, frames=[0], camera='back', size=(16, 16), quality='fast'))\n"
        "assert len(out) == 2, out\n"
        "assert not any(m == 'warp' or m.startswith(('warp.', 'mujoco_warp')) for m in sys.modules), 'warp imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_warp_replay_gate_reads_the_installed_mujoco_warp(monkeypatch):
    mjw = pytest.importorskip("mujoco_warp")
    from mjarchive.replay.backends import warp

    for version, refused in (("3.11.0", True), ("3.15.2", True), ("3.16.0", False), ("4.0.0", False)):
        monkeypatch.setattr(mjw, "__version__", version)
        reason = warp.unavailable.__wrapped__()
        assert (reason is not None) == refused, (version, reason)
        if refused:
            assert f"(installed: {version})" in reason and "backend='cpu'" in reason


def test_warp_replay_refused_with_the_reason_where_it_cannot_render(tmp_path, humanoid_xml):
    from mjarchive.replay.backends.warp import unavailable

    if unavailable() is None:
        pytest.skip("backend 'warp' renders here")
    path = tmp_path / "a.mjarchive"
    with mjarchive.create(path, humanoid_xml, n_worlds=1) as writer:
        writer.append([0.0], np.zeros((1, 1, 28)))
    with pytest.raises(mjarchive.BackendError) as refused:
        mjarchive.render(path, tmp_path / "out", backend="warp:cpu", size=(24, 32), progress=False)
    assert str(refused.value) == unavailable()
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
