"""MuJoCo Warp backend on Warp's "cpu" device, and on CUDA where there is one: kinematics agree with
MuJoCo, renders agree with the CPU renderer."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import mujoco
import numpy as np
import pytest

import mjarchive
from mjarchive.replay.backends.warp import unavailable

pytest.importorskip("mujoco_warp")
if unavailable():
    pytest.skip(unavailable(), allow_module_level=True)
from conftest import warp_devices  # noqa: E402

SIZE = (48, 64)
N_FRAMES = 3


@pytest.fixture(scope="module", params=[f"warp:{device}" for device in warp_devices()])
def backend(request):
    """The Warp backend on each device (`warp:cpu`, and `warp:cuda:0` where there is CUDA)."""
    return request.param


def _simulated_archive(path, xml, world_ids, n_frames, *, seed, qvel_scale, **create_options):
    """A float64 archive of humanoids started with random velocities, 10 mj_steps per frame."""
    model = mujoco.MjModel.from_xml_path(str(xml))
    rng = np.random.default_rng(seed)
    datas = [mujoco.MjData(model) for _ in world_ids]
    for d in datas:
        d.qvel[:] = rng.normal(scale=qvel_scale, size=model.nv)
    with mjarchive.create(path, xml, world_ids=world_ids, dtype="float64", **create_options) as w:
        for _ in range(n_frames):
            for d in datas:
                for _ in range(10):
                    mujoco.mj_step(model, d)
            w.append(datas[0].time, np.stack([d.qpos for d in datas]))
    return path


@pytest.fixture(scope="module")
def humanoid_archive(tmp_path_factory, humanoid_xml):
    return _simulated_archive(tmp_path_factory.mktemp("warp") / "humanoid.mjarchive", humanoid_xml, [0, 9],
                              N_FRAMES, seed=1, qvel_scale=1.0)


def test_cpu_and_warp_kinematics_agree(humanoid_archive, backend):
    import mujoco_warp as mjw
    import warp as wp

    with mjarchive.open(humanoid_archive) as archive:
        model = archive.model()
        qpos = archive.select().qpos.reshape(-1, model.nq)  # every (frame, world) state
    n = len(qpos)
    cpu = {"geom_xpos": [], "geom_xmat": [], "cam_xpos": [], "cam_xmat": []}
    d = mujoco.MjData(model)
    for q in qpos:
        d.qpos[:] = q
        mujoco.mj_kinematics(model, d)
        mujoco.mj_comPos(model, d)
        mujoco.mj_camlight(model, d)
        for k in cpu:
            cpu[k].append(getattr(d, k).copy())
    with wp.ScopedDevice(backend.split(":", 1)[1]):
        m = mjw.put_model(model)
        wd = mjw.put_data(model, mujoco.MjData(model), nworld=n)
        wd.qpos.assign(qpos.astype(np.float32))
        mjw.kinematics(m, wd)
        mjw.com_pos(m, wd)
        mjw.camlight(m, wd)
        warp = {k: getattr(wd, k).numpy() for k in cpu}
    for k, v in cpu.items():
        np.testing.assert_allclose(warp[k].reshape(n, -1), np.stack(v).reshape(n, -1), atol=1e-5, err_msg=k)


def _body_mask(rgb):
    """The humanoid is orange on a blue floor and dark sky: red well above blue."""
    return rgb[..., 0].astype(int) - rgb[..., 2] > 30


def test_warp_render_matches_cpu_render(humanoid_archive, backend):
    kw = dict(camera="side", size=SIZE, quality="fast")
    warp = list(mjarchive.iter_frames(humanoid_archive, backend=backend, **kw))
    cpu = list(mjarchive.iter_frames(humanoid_archive, backend="cpu", **kw))
    assert [(w, f) for w, f, _ in warp] == [(w, f) for w, f, _ in cpu]
    for (_, _, a), (_, _, b) in zip(warp, cpu):
        assert a.shape == b.shape == (*SIZE, 3) and a.dtype == np.uint8
        assert a.std() > 5  # not blank
        ma, mb = _body_mask(a), _body_mask(b)
        assert mb.sum() > 30
        iou = (ma & mb).sum() / (ma | mb).sum()
        # Measured 0.97-1.0 here (48x64, three cameras); misses are silhouette pixels.
        assert iou >= 0.9, iou


def test_warp_render_writes_a_video(humanoid_archive, tmp_path, backend):
    pytest.importorskip("imageio_ffmpeg", reason="mp4 output needs imageio-ffmpeg")
    out = mjarchive.render(humanoid_archive, tmp_path, worlds=[9], cameras=["side"], size=SIZE, quality="fast",
                           backend=backend, progress=False)
    import imageio.v2 as iio

    with iio.get_reader(out[0], format="FFMPEG") as reader:
        assert sum(1 for _ in reader) == N_FRAMES


def test_warp_batches_smaller_than_unit_give_same_frames(humanoid_archive, backend):
    from mjarchive.replay.render import RenderUnit, render_unit

    one = render_unit(RenderUnit(str(humanoid_archive), None, 0, 1, (0, 1, 2), SIZE, "fast", backend,
                                 warp_batch=1))
    many = render_unit(RenderUnit(str(humanoid_archive), None, 0, 1, (0, 1, 2), SIZE, "fast", backend,
                                  warp_batch=4))
    np.testing.assert_array_equal(one.rgb, many.rgb)


def test_warp_refuses_what_it_cannot_draw_before_rendering(humanoid_archive, backend):
    with pytest.raises(mjarchive.BackendError, match="sites.*backend='cpu'"):
        next(mjarchive.iter_frames(humanoid_archive, camera="free", size=SIZE, backend=backend, scene="sites"))


# -- packing (world, frame) states of several worlds into one batch ---------------------------------------

PACK_WORLDS = [2, 5, 7]
PACK_FRAMES = 5
PACK_CHUNK = 2  # stored chunks {0, 1}, {2, 3}, {4}: packed batches cross worlds and chunks


@pytest.fixture(scope="module")
def multi_world_archive(tmp_path_factory, humanoid_xml):
    return _simulated_archive(tmp_path_factory.mktemp("warp-pack") / "humanoid.mjarchive", humanoid_xml,
                              PACK_WORLDS, PACK_FRAMES, seed=2, qvel_scale=1.5, chunk_frames=PACK_CHUNK)


@pytest.fixture(scope="module")
def one_world_batches(multi_world_archive, backend):
    """Reference: every (world, chunk) unit rendered on its own, one world per launch (camera 'side')."""
    from mjarchive.replay.render import RenderUnit, render_unit

    out = {}
    for wid in PACK_WORLDS:
        for s in range(0, PACK_FRAMES, PACK_CHUNK):
            frames = tuple(range(s, min(s + PACK_CHUNK, PACK_FRAMES)))
            r = render_unit(RenderUnit(str(multi_world_archive), None, wid, 1, frames, SIZE, "fast", backend,
                                       warp_batch=PACK_CHUNK))
            out.update({(wid, f): rgb for f, rgb in zip(r.frames, r.rgb)})
    return out


@pytest.mark.parametrize("warp_batch", [None, 4])
def test_packed_batches_give_the_same_pixels_as_one_world_batches(multi_world_archive, one_world_batches,
                                                                  warp_batch, backend):
    got = list(mjarchive.iter_frames(multi_world_archive, camera="side", size=SIZE, quality="fast",
                                     backend=backend, warp_batch=warp_batch))
    assert [(w, f) for w, f, _ in got] == [(w, f) for w in PACK_WORLDS for f in range(PACK_FRAMES)]
    for wid, f, rgb in got:
        np.testing.assert_array_equal(rgb, one_world_batches[wid, f], err_msg=f"world {wid} frame {f}")
    # The worlds differ (else packing mix-ups would go unnoticed).
    assert np.abs(got[0][2].astype(int) - got[PACK_FRAMES][2]).max() > 50


def test_packed_unit_reads_and_splits_in_order(multi_world_archive, one_world_batches, monkeypatch, backend):
    from mjarchive.archive.reader import Archive
    from mjarchive.replay.backends.warp import pack, render_packed, unpack
    from mjarchive.replay.render import RenderUnit

    reads = []
    select = Archive.select

    def recording_select(self, worlds=None, frames=None):
        reads.append((list(worlds), frames))
        return select(self, worlds, frames)

    monkeypatch.setattr(Archive, "select", recording_select)

    units = [RenderUnit(str(multi_world_archive), None, wid, 1, fr, SIZE, "fast", backend, warp_batch=4)
             for wid, fr in [(7, (4,)), (2, (0, 1)), (5, (2, 3)), (2, (2, 3)), (7, (0, 1))]]
    packed = list(pack(units, 3))
    assert [sum(len(fr) for _, fr in p.segments) for p in packed] == [3, 3, 3]  # units split across tasks
    assert [p.segments for p in packed] == [((7, (4,)), (2, (0, 1))), ((5, (2, 3)), (2, (2,))),
                                            ((2, (3,)), (7, (0, 1)))]
    pieces = list(unpack(units, (render_packed(p) for p in packed)))
    assert [u for u, _ in pieces] == units
    # One read per (stored chunk, world set) of each packed unit: chunks are {0, 1}, {2, 3}, {4}.
    assert reads == [([7], slice(4, 5)), ([2], slice(0, 2)), ([2, 5], slice(2, 4)), ([2], slice(3, 4)),
                     ([7], slice(0, 2))]
    for u, rgb in pieces:
        assert rgb.shape == (len(u.frames), *SIZE, 3)
        for f, img in zip(u.frames, rgb):
            np.testing.assert_array_equal(img, one_world_batches[u.world_id, f])
    # A camera change starts a new packed unit: one camera per launch.
    other = dataclasses.replace(units[1], camera=2)
    assert [p.camera for p in pack([units[0], other, units[2]], 8)] == [1, 2, 1]


def test_render_output_does_not_depend_on_packing(multi_world_archive, tmp_path, backend):
    pytest.importorskip("imageio_ffmpeg", reason="mp4 output needs imageio-ffmpeg")
    import imageio.v2 as iio

    def videos(out, **kw):
        paths = mjarchive.render(multi_world_archive, out, cameras=["side", "back"], size=SIZE, quality="fast",
                                 backend=backend, progress=False, **kw)
        frames = {}
        for p in paths:
            with iio.get_reader(p, format="FFMPEG") as reader:
                frames[p.name] = np.stack([f for f in reader])  # list(reader) asks len(): infinite
        return [p.name for p in paths], frames

    names, packed = videos(tmp_path / "packed")
    assert names == [f"world-{w:04d}_cam-{c}.mp4" for w in PACK_WORLDS for c in ("side", "back")]
    names_one, one = videos(tmp_path / "one", warp_batch=1)
    names_pool, pool = videos(tmp_path / "pool", warp_batch=3, executor=ThreadPoolExecutor(1))
    assert names_one == names_pool == names
    for name in names:
        assert packed[name].shape[0] == PACK_FRAMES
        np.testing.assert_array_equal(packed[name], one[name], err_msg=name)
        np.testing.assert_array_equal(packed[name], pool[name], err_msg=name)
    with pytest.raises(mjarchive.MjArchiveError, match="warp_batch"):
        mjarchive.render(multi_world_archive, tmp_path / "bad", cameras=["side"], size=SIZE, backend=backend,
                         warp_batch=0, progress=False)


CLOTH_XML = """<mujoco><worldbody><light pos="0 0 3" dir="0 0 -1"/>
<geom type="plane" size="2 2 .1" rgba=".2 .3 .8 1"/>
<camera name="top" pos="0 -1.2 1.4" xyaxes="1 0 0 0 .75 .66"/>
<flexcomp name="cloth" type="grid" count="6 6 1" spacing=".08 .08 .08" pos="0 0 .6" radius=".01" dim="2"
          rgba=".9 .5 .1 1"><edge equality="true"/></flexcomp>
</worldbody></mujoco>"""


def test_a_falling_cloth_renders_the_same_in_any_batch(tmp_path, backend):
    """Flex normals are sums over faces: summed in a fixed order (mujoco-warp's deterministic atomics),
    a cloth's pixels do not depend on the batch it is rendered in, nor on the run (CUDA's atomics
    would otherwise add in any order)."""
    xml = tmp_path / "cloth.xml"
    xml.write_text(CLOTH_XML)
    model = mujoco.MjModel.from_xml_path(str(xml))
    d = mujoco.MjData(model)
    with mjarchive.create(tmp_path / "c", xml, n_worlds=2) as writer:
        for _ in range(3):
            for _ in range(20):
                mujoco.mj_step(model, d)
            writer.append(d.time, np.stack([d.qpos, d.qpos]))
    kw = dict(camera="top", size=(24, 32), quality="fast", backend=backend)
    packed = [rgb for _, _, rgb in mjarchive.iter_frames(tmp_path / "c", **kw)]
    again = [rgb for _, _, rgb in mjarchive.iter_frames(tmp_path / "c", **kw)]
    one = [rgb for _, _, rgb in mjarchive.iter_frames(tmp_path / "c", warp_batch=1, **kw)]
    assert len(packed) == 6
    cloth = [(rgb[..., 0].astype(int) - rgb[..., 2] > 60).sum() for rgb in packed]  # orange on blue
    assert min(cloth) > 20, cloth
    for a, b, c in zip(packed, again, one):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_a_renderer_keeps_the_device_it_was_made_on(humanoid_xml, backend):
    """"cuda" is resolved once, to the context current when the renderer is made; a device Warp does
    not have is refused by name."""
    from mjarchive.replay.backends.warp import WarpRenderer

    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    device = backend.split(":", 1)[1]
    alias = "cuda" if device.startswith("cuda") else device
    with WarpRenderer(model, (8, 8), device=alias, nworld=1) as renderer:
        assert renderer.device == device
    import warp as wp

    there = ", ".join(str(d) for d in wp.get_devices())
    with pytest.raises(mjarchive.BackendError, match=rf"cannot use device 'cuda:97' here .*; its devices: {there}$"):
        WarpRenderer(model, (8, 8), device="cuda:97", nworld=1)


def test_renderers_in_two_threads_with_cuda(humanoid_archive):
    """Warp's current device and streams are process-wide: renderers in two threads at once (on the
    CPU and on CUDA, or both on CUDA where Warp has no CPU device) give the frames each gives alone."""
    devices = warp_devices()
    if "cuda:0" not in devices:
        pytest.skip("needs Warp's CUDA device")
    backends = [f"warp:{d}" for d in devices] if len(devices) > 1 else ["warp:cuda:0"] * 2
    kw = dict(camera="side", size=SIZE, quality="fast")

    def frames(backend):
        return [rgb for _ in range(3) for _, _, rgb in mjarchive.iter_frames(humanoid_archive, backend=backend, **kw)]

    alone = [frames(b) for b in backends]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(frames, backends))
    for b, one, both in zip(backends, alone, together):
        for a, t in zip(one, both):
            np.testing.assert_array_equal(a, t, err_msg=b)
