"""The viewer's non-browser parts: geom meshes checked against MuJoCo, and `PoseWindow` (poses equal
mj_kinematics of the archived qpos, bounded memory, live refresh, prefetch, errors, S3)."""

from __future__ import annotations

import threading
import time

import mujoco
import numpy as np
import pytest

import mjarchive
from mjarchive._errors import ClosedError, LayoutMismatchError, MjArchiveError, SelectionError
from mjarchive.viewer import geometry
from mjarchive.viewer.frames import MAX_VIEW_WORLDS, POSE_CACHE_FRAMES, FramePoses, PoseWindow
from mjarchive.viewer.geometry import GeomMesh, geom_meshes
from s3_server import s3_server, s3_url  # noqa: F401  (pytest fixtures)

G = mujoco.mjtGeom

MOCAP_XML = """<mujoco model="mocap">
  <worldbody>
    <geom name="floor" type="plane" size="2 1 .1"/>
    <body name="target" mocap="true" pos=".5 0 1"><geom type="sphere" size=".05"/></body>
    <body name="arm" pos="-.5 0 .5">
      <joint name="hinge" axis="0 1 0"/><geom type="capsule" size=".04" fromto="0 0 0 .4 0 0"/>
      <body name="tip" pos=".4 0 0" quat="0.9 0 0.3 0.1"><geom type="box" size=".05 .02 .03" pos=".1 0 0" euler="10 20 30"/></body>
    </body>
    <body name="box" pos="0 0 .5"><freejoint/><geom type="box" size=".1 .2 .1" quat="0.7 0.7 0 0"/></body>
    <body name="target2" mocap="true" pos="0 -.5 1" quat="0 1 0 0"><geom type="box" size=".03 .03 .03"/></body>
  </worldbody>
</mujoco>"""

# Every primitive type, a finite and an infinite plane, a height field, a hidden group, alpha 0, and
# MuJoCo's colour rule: a material's rgba only where the geom's rgba is the default.
PRIMITIVES_XML = """<mujoco>
  <asset>
    <hfield name="hf" nrow="5" ncol="4" size="1 2 .5 .1"
            elevation="0 1 2 3  4 5 6 7  8 9 10 11  1 3 5 7  2 2 2 9"/>
    <material name="red" rgba="1 0 0 1"/>
  </asset>
  <worldbody>
    <geom name="plane" type="plane" size="2 3 .1"/>
    <geom name="infinite" type="plane" size="0 0 1"/>
    <geom name="sphere" type="sphere" size=".3" material="red"/>
    <geom name="capsule" type="capsule" size=".1 .25" material="red" rgba="0 1 0 1"/>
    <geom name="ellipsoid" type="ellipsoid" size=".1 .2 .3"/>
    <geom name="cylinder" type="cylinder" size=".15 .4"/>
    <geom name="box" type="box" size=".1 .2 .3"/>
    <geom name="hfield" type="hfield" hfield="hf" pos="5 0 0"/>
    <geom name="hidden" type="box" size="1 1 1" group="3"/>
    <geom name="clear" type="box" size="1 1 1" rgba="1 1 1 0"/>
  </worldbody>
</mujoco>"""


# -- helpers -------------------------------------------------------------------------------------------

def random_qpos(model: mujoco.MjModel, n_frames: int, n_worlds: int, seed: int = 0) -> np.ndarray:
    """(n_frames, n_worlds, nq): qpos0 plus noise, free and ball joints with random unit quaternions."""
    rng = np.random.default_rng(seed)
    q = model.qpos0[None, None] + 0.3 * rng.standard_normal((n_frames, n_worlds, model.nq))
    for j in range(model.njnt):
        adr = model.jnt_qposadr[j]
        t = model.jnt_type[j]
        if t in (mujoco.mjtJoint.mjJNT_FREE, mujoco.mjtJoint.mjJNT_BALL):
            a = adr + (3 if t == mujoco.mjtJoint.mjJNT_FREE else 0)
            quat = rng.standard_normal((n_frames, n_worlds, 4))
            q[..., a:a + 4] = quat / np.linalg.norm(quat, axis=-1, keepdims=True)
    return q


def write(location, xml, world_ids, n_frames, *, chunk_frames=8, resets=(), mocap=False, storage_options=None,
          seed=0, close=True):
    """Write an archive with random qpos (and mocap) and reset markers at (frame, world position)."""
    model = mujoco.MjModel.from_xml_path(str(xml))
    W = len(world_ids)
    q = random_qpos(model, n_frames, W, seed)
    reset = np.zeros((n_frames, W), bool)
    for f, w in resets:
        reset[f, w] = True
    writer = mjarchive.create(location, xml, world_ids=world_ids, chunk_frames=chunk_frames,
                              storage_options=storage_options)
    extra = {}
    if mocap:
        rng = np.random.default_rng(seed + 1)
        quat = rng.standard_normal((n_frames, W, model.nmocap, 4))
        extra = {"mocap_pos": rng.standard_normal((n_frames, W, model.nmocap, 3)),
                 "mocap_quat": quat / np.linalg.norm(quat, axis=-1, keepdims=True)}
    writer.append(0.01 * np.arange(1, n_frames + 1), q, reset=reset, **extra)
    if close:
        writer.close()
        return None
    writer.flush()
    return writer


def expected_poses(archive, model, world_ids, geoms, frame):
    """mj_kinematics of the archived state, world by world, read independently of PoseWindow."""
    data = mujoco.MjData(model)
    out = []
    for w in world_ids:
        sel = archive.select(worlds=[w], frames=[frame])
        data.qpos[:] = sel.qpos[0, 0]
        if archive.nmocap:
            data.mocap_pos[:] = sel.mocap_pos[0, 0]
            data.mocap_quat[:] = sel.mocap_quat[0, 0]
        mujoco.mj_kinematics(model, data)
        out.append((data.geom_xpos[geoms].copy(), data.geom_xmat[geoms].copy(), data.xpos.copy(), data.xmat.copy()))
    return out


def check_poses(p: FramePoses, expected, frame, archive):
    assert p.frame == frame and p.time == archive.time[frame]
    for w, (gpos, gmat, bpos, bmat) in enumerate(expected):
        np.testing.assert_allclose(p.geom_pos[w], gpos, rtol=0, atol=1e-12)
        np.testing.assert_allclose(p.body_pos[w], bpos, rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.linalg.norm(p.geom_quat[w], axis=-1), 1.0, atol=1e-12)
        for quats, mats in ((p.geom_quat[w], gmat), (p.body_quat[w], bmat)):
            got = np.empty((len(quats), 9))
            for i, q in enumerate(quats):
                mujoco.mju_quat2Mat(got[i], q)
            np.testing.assert_allclose(got, mats, rtol=0, atol=1e-9)


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture(scope="module")
def humanoid_model(humanoid_xml):
    return mujoco.MjModel.from_xml_path(str(humanoid_xml))


@pytest.fixture(scope="module")
def humanoid_archive(tmp_path_factory, humanoid_xml):
    """4 worlds (IDs out of order), 30 frames in chunks of 8 (the last partial), resets."""
    path = tmp_path_factory.mktemp("view") / "humanoid.mjarchive"
    write(path, humanoid_xml, [7, 2, 40, 5], 30, resets=[(9, 0), (17, 0), (3, 2), (29, 3)])
    with mjarchive.open(path) as archive:
        yield archive


# -- poses -----------------------------------------------------------------------------------------------

def test_poses_equal_mj_kinematics_of_archived_qpos(humanoid_archive):
    archive = humanoid_archive
    model = archive.model()  # compiled from the archive's bundle in the sandbox
    geoms = [m.geom for m in geom_meshes(model)]
    worlds = [40, 7, 5, 2]
    with PoseWindow(archive, model, worlds, geoms, window_chunks=1) as window:
        assert window.world_ids == tuple(worlds) and window.n_frames == 30 and window.geoms == tuple(geoms)
        for frame in [29, 0, 8, 7, 16, 15, 24, 3, 17, 9, 29]:  # every chunk, both sides of each boundary
            p = window.poses(frame)
            assert p.geom_pos.shape == (4, len(geoms), 3) and p.geom_quat.shape == (4, len(geoms), 4)
            assert p.body_pos.shape == (4, model.nbody, 3) and p.geom_pos.dtype == np.float64
            check_poses(p, expected_poses(archive, model, worlds, geoms, frame), frame, archive)
        assert not p.geom_pos.flags.writeable  # cached and shared between callers
        assert window.episode_starts(7) == [0, 9, 17]
        assert window.episode_starts(40) == [0, 3]
        assert window.episode_starts(5) == [0, 29]
        assert window.episode_starts(2) == [0]


def test_poses_with_mocap(tmp_path):
    xml = tmp_path / "mocap.xml"
    xml.write_text(MOCAP_XML)
    path = tmp_path / "mocap.mjarchive"
    write(path, xml, [0, 1, 2], 12, chunk_frames=4, mocap=True)
    with mjarchive.open(path) as archive:
        model = mujoco.MjModel.from_xml_path(str(xml))
        assert archive.nmocap == 2
        geoms = list(range(model.ngeom))
        with PoseWindow(archive, model, [2, 0], geoms) as window:
            for frame in range(12):
                check_poses(window.poses(frame), expected_poses(archive, model, [2, 0], geoms, frame), frame, archive)
            p = window.poses(5)
            target = model.body("target").id
            np.testing.assert_allclose(p.body_pos[0, target], archive.select(worlds=[2], frames=[5]).mocap_pos[0, 0, 0])


def test_wrong_model_is_refused(humanoid_archive, tmp_path):
    xml = tmp_path / "mocap.xml"
    xml.write_text(MOCAP_XML)
    with pytest.raises(LayoutMismatchError):
        PoseWindow(humanoid_archive, mujoco.MjModel.from_xml_path(str(xml)), [7], [])


def test_concurrent_callers_get_right_poses(humanoid_archive, humanoid_model):
    archive, model = humanoid_archive, humanoid_model
    geoms = list(range(model.ngeom))
    expected = {f: expected_poses(archive, model, [2, 5], geoms, f) for f in range(30)}
    errors: list[BaseException] = []
    with PoseWindow(archive, model, [2, 5], geoms, window_chunks=0) as window:  # one chunk: constant eviction

        def scrub(seed):
            rng = np.random.default_rng(seed)
            try:
                for f in rng.integers(0, 30, 60):
                    window.set_playhead(int(f))
                    check_poses(window.poses(int(f)), expected[int(f)], int(f), archive)
            except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
                errors.append(exc)

        threads = [threading.Thread(target=scrub, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(window.cached_chunks) <= 1
    assert not errors, errors[0]


def test_memory_stays_bounded_over_a_long_archive(tmp_path, humanoid_xml, humanoid_model):
    path = tmp_path / "long.mjarchive"
    n, cf, wc = 4096, 16, 2
    write(path, humanoid_xml, [0, 1, 2], n, chunk_frames=cf)
    with mjarchive.open(path) as archive:
        reads = []
        select = archive.select
        archive.select = lambda *a, **k: reads.append(k["frames"]) or select(*a, **k)
        geoms = list(range(humanoid_model.ngeom))
        with PoseWindow(archive, humanoid_model, [2, 0], geoms, window_chunks=wc) as window:
            chunk = window.chunk_bytes
            assert chunk == cf * (2 * humanoid_model.nq * 4 + 8)  # float32 qpos of 2 worlds, float64 time
            bound = (2 * wc + 1) * chunk + POSE_CACHE_FRAMES * window.poses(0).nbytes
            assert window.max_memory_bytes == bound
            peak = 0
            for f in range(n):  # play forwards, a frame at a time
                window.set_playhead(f)
                window.poses(f)
                peak = max(peak, window.memory_bytes)
                assert len(window.cached_chunks) <= 2 * wc + 1
            forward = len(reads)
            for f in np.random.default_rng(1).integers(0, n, 300):  # and scrub around
                window.set_playhead(int(f))
                window.poses(int(f))
                peak = max(peak, window.memory_bytes)
            assert peak <= bound
            assert peak >= (2 * wc + 1) * chunk  # the window does fill up
            # Each read is one stored chunk; playing forwards reads each chunk once.
            assert all(s.stop - s.start == cf and s.start % cf == 0 for s in reads)
            assert forward == n // cf
            assert len(reads) <= forward + 300 * (2 * wc + 1)
            np.testing.assert_allclose(window.poses(4095).geom_pos[1],
                                       expected_poses(archive, humanoid_model, [0], geoms, 4095)[0][0], atol=1e-12)


def test_live_archive_refresh_sees_exactly_the_committed_frames(tmp_path, humanoid_xml, humanoid_model):
    path = tmp_path / "live.mjarchive"
    model = humanoid_model
    geoms = list(range(model.ngeom))
    writer = write(path, humanoid_xml, [3, 4], 20, chunk_frames=8, close=False)  # chunks 0, 1 and 16..19
    more = random_qpos(model, 30, 2, seed=9)
    with mjarchive.open(path) as archive, PoseWindow(archive, model, [4, 3], geoms, window_chunks=1) as window:
        assert window.n_frames == 20 and archive.status == "live"
        window.set_playhead(19)
        check_poses(window.poses(19), expected_poses(archive, model, [4, 3], geoms, 19), 19, archive)
        assert wait_for(lambda: set(window.cached_chunks) == {1, 2})
        with pytest.raises(SelectionError, match="refresh"):
            window.poses(20)

        writer.append(0.01 * np.arange(21, 31), more[:10])  # frames 20..29
        writer.flush()
        assert window.n_frames == 20  # not before refresh
        assert window.refresh() == 30 == writer.n_committed
        with mjarchive.open(path) as fresh:
            np.testing.assert_array_equal(fresh.select(frames=slice(20, 30)).qpos, archive.select(frames=slice(20, 30)).qpos)
        for frame in (23, 16, 19, 29, 24, 2):  # the partial chunk 2 is read again with its new frames
            check_poses(window.poses(frame), expected_poses(archive, model, [4, 3], geoms, frame), frame, archive)
        np.testing.assert_allclose(window.poses(23).geom_pos[1],
                                   _kinematics(model, more[3, 0]).geom_xpos[geoms], atol=1e-6)

        writer.append(0.01 * np.arange(31, 36), more[10:15], reset=np.array([[True, False]] * 5))
        writer.close()
        assert window.refresh() == 35 and archive.status == "finalized"
        assert window.episode_starts(3) == [0, *range(30, 35)] and window.episode_starts(4) == [0]
        for frame in (34, 30, 29):
            check_poses(window.poses(frame), expected_poses(archive, model, [4, 3], geoms, frame), frame, archive)


def _kinematics(model, qpos):
    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    mujoco.mj_kinematics(model, data)
    return data


def test_prefetch_reads_around_the_playhead_in_the_background(tmp_path, humanoid_xml, humanoid_model):
    path = tmp_path / "prefetch.mjarchive"
    write(path, humanoid_xml, [0, 1], 100, chunk_frames=4)  # 25 chunks
    with mjarchive.open(path) as archive:
        with PoseWindow(archive, humanoid_model, [1], [0, 1], window_chunks=2) as window:
            assert window.cached_chunks == () and window.memory_bytes == 0
            window.set_playhead(50)  # chunk 12
            assert wait_for(lambda: window.cached_chunks == (10, 11, 12, 13, 14)), window.cached_chunks
            window.set_playhead(1)  # chunk 0: those around it replace the old window
            assert wait_for(lambda: {0, 1, 2} <= set(window.cached_chunks)), window.cached_chunks
            assert len(window.cached_chunks) == 5
            window.set_playhead(99)  # the last chunk: only those behind it
            assert wait_for(lambda: {22, 23, 24} <= set(window.cached_chunks)), window.cached_chunks
            window.set_playhead(10_000)  # a hint past the end is the end
        with PoseWindow(archive, humanoid_model, [1], [0], prefetch=False) as window:
            window.set_playhead(50)
            time.sleep(0.2)
            assert window.cached_chunks == ()
            window.poses(50)
            assert window.cached_chunks == (12,)


def test_selection_errors_say_the_limit(tmp_path, humanoid_archive, humanoid_model):
    archive, model = humanoid_archive, humanoid_model
    with pytest.raises(SelectionError, match=r"world 99 is not in this archive.*\[7, 2, 40, 5\]"):
        PoseWindow(archive, model, [7, 99], [])
    with pytest.raises(SelectionError, match=r"repeated: \[2\]"):
        PoseWindow(archive, model, [2, 7, 2], [])
    with pytest.raises(SelectionError, match="1 to 64 worlds"):
        PoseWindow(archive, model, [], [])
    with pytest.raises(SelectionError, match="integers"):
        PoseWindow(archive, model, ["7"], [])
    with pytest.raises(SelectionError, match="geom id 20 is out of range"):
        PoseWindow(archive, model, [7], [0, 20])
    with pytest.raises(SelectionError, match="window_chunks"):
        PoseWindow(archive, model, [7], [], window_chunks=-1)

    tiny = tmp_path / "tiny.xml"
    tiny.write_text('<mujoco><worldbody><body><joint type="slide"/><geom size=".1"/></body></worldbody></mujoco>')
    wide = tmp_path / "wide.mjarchive"
    write(wide, tiny, list(range(70)), 2)
    with mjarchive.open(wide) as many:
        tiny_model = mujoco.MjModel.from_xml_path(str(tiny))
        with pytest.raises(SelectionError, match=r"1 to 64 worlds \(MAX_VIEW_WORLDS\), got 65"):
            PoseWindow(many, tiny_model, list(range(65)), [0])
        with PoseWindow(many, tiny_model, list(range(MAX_VIEW_WORLDS)), [0]) as window:
            assert window.poses(1).geom_pos.shape == (64, 1, 3)

    window = PoseWindow(archive, model, 7, [0])  # one ID alone is a selection too
    for frame in (-1, 30, 10**12):
        with pytest.raises(SelectionError, match=r"out of range: the window knows 30 committed frames \(0\.\.29\)"):
            window.poses(frame)
    with pytest.raises(SelectionError, match="integer"):
        window.poses(1.5)
    with pytest.raises(SelectionError, match="integer"):
        window.set_playhead("3")
    with pytest.raises(SelectionError, match="not in this archive"):
        window.episode_starts(99)
    assert isinstance(SelectionError("x"), IndexError)
    window.close()
    window.close()
    with pytest.raises(ClosedError):
        window.poses(0)
    with pytest.raises(ClosedError):
        window.set_playhead(0)


def test_poses_from_s3(s3_server, s3_url, humanoid_xml, humanoid_model):
    so = s3_server.storage_options()
    write(s3_url, humanoid_xml, [10, 11], 20, chunk_frames=8, storage_options=so)
    with mjarchive.open(s3_url, storage_options=so) as archive:
        geoms = list(range(humanoid_model.ngeom))
        with PoseWindow(archive, humanoid_model, [11, 10], geoms) as window:
            window.set_playhead(12)
            for frame in (12, 19, 0):
                check_poses(window.poses(frame), expected_poses(archive, humanoid_model, [11, 10], geoms, frame),
                            frame, archive)
            assert window.refresh() == 20


# -- geometry ----------------------------------------------------------------------------------------------

def _extent(mesh: GeomMesh) -> tuple[np.ndarray, np.ndarray]:
    v = mesh.vertices.astype(np.float64)
    return v.min(0), v.max(0)


def _check_mesh_arrays(mesh: GeomMesh):
    assert mesh.vertices.dtype == np.float32 and mesh.vertices.ndim == 2 and mesh.vertices.shape[1] == 3
    assert mesh.faces.dtype == np.uint32 and mesh.faces.ndim == 2 and mesh.faces.shape[1] == 3
    assert mesh.faces.size and mesh.faces.max() < len(mesh.vertices)
    assert all(0 <= c <= 1 for c in mesh.rgba) and len(mesh.rgba) == 4 and mesh.rgba[3] > 0
    assert not mesh.vertices.flags.writeable and not mesh.faces.flags.writeable


def _outward(mesh: GeomMesh) -> np.ndarray:
    """Per face: its normal · its centroid (> 0 for a convex shape around the origin wound outwards)."""
    v = mesh.vertices.astype(np.float64)[mesh.faces.astype(np.int64)]
    normal = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    return np.einsum("ij,ij->i", normal, v.mean(1))


def _analytic_half(model, g):
    s = model.geom_size[g]
    t = model.geom_type[g]
    return {int(G.mjGEOM_SPHERE): [s[0]] * 3, int(G.mjGEOM_CAPSULE): [s[0], s[0], s[0] + s[1]],
            int(G.mjGEOM_ELLIPSOID): s, int(G.mjGEOM_CYLINDER): [s[0], s[0], s[1]], int(G.mjGEOM_BOX): s}[int(t)]


def test_primitives_match_mujoco_sizes(tmp_path):
    model = mujoco.MjModel.from_xml_string(PRIMITIVES_XML)
    meshes = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, m.geom): m for m in geom_meshes(model)}
    assert list(meshes) == ["plane", "infinite", "sphere", "capsule", "ellipsoid", "cylinder", "box", "hfield"]
    for name, mesh in meshes.items():
        _check_mesh_arrays(mesh)
        g = mesh.geom
        lo, hi = _extent(mesh)
        if model.geom_type[g] == G.mjGEOM_PLANE:
            half = [10, 10, 0] if name == "infinite" else [2, 3, 0]
            np.testing.assert_allclose(lo, -np.array(half), atol=1e-6)
            np.testing.assert_allclose(hi, half, atol=1e-6)
            assert (np.cross(*(mesh.vertices[mesh.faces[:, 1:]] - mesh.vertices[mesh.faces[:, :1]]).transpose(1, 0, 2))[:, 2] > 0).all()
            continue
        # geom_aabb: (center, half-size) of the geom in its own frame, as MuJoCo computes it.
        center, half = model.geom_aabb[g, :3], model.geom_aabb[g, 3:]
        np.testing.assert_allclose((lo + hi) / 2, center, atol=1e-6)
        np.testing.assert_allclose((hi - lo) / 2, half, rtol=1e-6, atol=1e-7)
        if name != "hfield":
            np.testing.assert_allclose(half, _analytic_half(model, g), rtol=1e-6)
            assert len(mesh.faces) <= 400
            assert (_outward(mesh) > 0).all(), name  # wound counter-clockwise seen from outside
            r = np.linalg.norm(mesh.vertices, axis=1)
            assert r.max() <= model.geom_rbound[g] * (1 + 1e-6)
        assert (len(mesh.vertices), len(mesh.faces)) == geometry.mesh_counts(model, g)  # counted before building
    assert meshes["sphere"].rgba == (1, 0, 0, 1)  # material colour: the geom's rgba is the default
    assert meshes["capsule"].rgba == (0, 1, 0, 1)  # the geom's own rgba wins over its material's
    assert meshes["box"].rgba == pytest.approx((0.5, 0.5, 0.5, 1))
    # A sphere's vertices lie on it; a cylinder's on its side or caps.
    np.testing.assert_allclose(np.linalg.norm(meshes["sphere"].vertices, axis=1), 0.3, rtol=1e-6)
    e = meshes["ellipsoid"].vertices.astype(np.float64) / model.geom_size[meshes["ellipsoid"].geom]
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1, rtol=1e-6)

    groups = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, m.geom) for m in geom_meshes(model, groups=(3,))}
    assert groups == {"hidden"}
    with pytest.raises(MjArchiveError, match="0..5"):
        geom_meshes(model, groups=(6,))


def test_hfield_surface_matches_mj_ray():
    model = mujoco.MjModel.from_xml_string(PRIMITIVES_XML)
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    mesh = next(m for m in geom_meshes(model) if model.geom_type[m.geom] == G.mjGEOM_HFIELD)
    top = mesh.vertices[: 5 * 4].astype(np.float64) + data.geom_xpos[mesh.geom]  # the grid, unrotated
    inner = top[(np.abs(top[:, 0] - 5) < 0.99) & (np.abs(top[:, 1]) < 1.99)]
    assert len(inner) == 6
    for x, y, z in inner:
        dist = mujoco.mj_rayHfield(model, data, mesh.geom, np.array([x, y, 10.0]), np.array([0, 0, -1.0]))
        assert dist == pytest.approx(10 - z, abs=1e-6)


def _ray_triangles(origin, direction, tri):
    """Nearest hit distance of a ray with triangles (T, 3, 3) (Möller–Trumbore), or -1."""
    e1, e2 = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    p = np.cross(direction, e2)
    det = np.einsum("ij,ij->i", e1, p)
    ok = np.abs(det) > 1e-15
    inv = np.where(ok, 1 / np.where(ok, det, 1), 0)
    s = origin - tri[:, 0]
    u = np.einsum("ij,ij->i", s, p) * inv
    q = np.cross(s, e1)
    v = (q @ direction) * inv
    t = np.einsum("ij,ij->i", e2, q) * inv
    hit = ok & (u >= 0) & (v >= 0) & (u + v <= 1) & (t > 0)
    return float(t[hit].min()) if hit.any() else -1.0


def test_mesh_geoms_are_posed_like_mujoco(aloha_xml):
    model = mujoco.MjModel.from_xml_path(str(aloha_xml))
    data = mujoco.MjData(model)
    data.qpos[:] = random_qpos(model, 1, 1, seed=3)[0, 0]
    mujoco.mj_kinematics(model, data)
    meshes = geom_meshes(model)
    mesh_geoms = [m for m in meshes if model.geom_type[m.geom] == G.mjGEOM_MESH]
    assert len(mesh_geoms) > 50
    rng = np.random.default_rng(0)
    checked = 0
    for mesh in mesh_geoms:
        _check_mesh_arrays(mesh)
        g = mesh.geom
        lo, hi = _extent(mesh)  # the compiled mesh is in the geom's frame: its box is the geom's aabb
        np.testing.assert_allclose((lo + hi) / 2, model.geom_aabb[g, :3], atol=1e-6)
        np.testing.assert_allclose((hi - lo) / 2, model.geom_aabb[g, 3:], atol=1e-6)
        if mesh.geom % 7:
            continue
        # Rays at the posed geom hit our posed triangles where MuJoCo's own mesh ray test says.
        world = data.geom_xpos[g] + mesh.vertices.astype(np.float64) @ data.geom_xmat[g].reshape(3, 3).T
        tri = world[mesh.faces.astype(np.int64)]
        for _ in range(4):
            d = rng.standard_normal(3)
            d /= np.linalg.norm(d)
            aim = tri[rng.integers(len(tri))].mean(0)  # a face's centre: a ray through a vertex or edge is ill-posed
            origin = aim - d * 2 * (model.geom_rbound[g] + 0.1)
            want = mujoco.mj_rayMesh(model, data, g, origin, d)
            assert want > 0
            assert _ray_triangles(origin, d, tri) == pytest.approx(want, abs=1e-6)
            checked += 1
    assert checked >= 40
    by_mesh = {}
    for m in mesh_geoms:  # geoms that share a mesh asset share its arrays
        by_mesh.setdefault(int(model.geom_dataid[m.geom]), []).append(m)
    assert any(len(ms) > 1 and all(x.vertices is ms[0].vertices for x in ms) for ms in by_mesh.values())


def test_humanoid_and_mug_meshes(humanoid_xml, mug_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    meshes = geom_meshes(model)
    assert [m.geom for m in meshes] == list(range(model.ngeom))  # all 20 are in groups 0..2
    for m in meshes:
        _check_mesh_arrays(m)
        lo, hi = _extent(m)
        if model.geom_type[m.geom] != G.mjGEOM_PLANE:
            np.testing.assert_allclose((hi - lo) / 2, model.geom_aabb[m.geom, 3:], rtol=1e-6)
    floor = meshes[0]
    assert model.geom_type[0] == G.mjGEOM_PLANE and model.geom_size[0][0] == 0
    np.testing.assert_allclose(_extent(floor)[1], [10, 10, 0])
    assert floor.rgba == tuple(float(x) for x in model.mat_rgba[model.geom_matid[0]])

    mug = mujoco.MjModel.from_xml_path(str(mug_xml))
    meshes = geom_meshes(mug)
    shown = {int(mug.geom_type[m.geom]) for m in meshes}
    assert G.mjGEOM_MESH in shown
    for m in meshes:
        _check_mesh_arrays(m)
        g, mat = m.geom, mug.geom_matid[m.geom]
        default = tuple(float(x) for x in mug.geom_rgba[g]) == (0.5, 0.5, 0.5, 1.0)
        assert m.rgba == pytest.approx(tuple(mug.mat_rgba[mat] if mat >= 0 and default else mug.geom_rgba[g]))
    textured = [m for m in meshes if mug.geom_matid[m.geom] >= 0 and mug.mat_texid[mug.geom_matid[m.geom]].max() >= 0]
    assert textured  # drawn in its material's colour: textures are not applied
    assert all(int(mug.geom_group[m.geom]) in (0, 1, 2) for m in meshes)


def test_vertex_limit_refuses_huge_models(monkeypatch, aloha_xml):
    model = mujoco.MjModel.from_xml_path(str(aloha_xml))
    total = sum(len(m.vertices) for m in geom_meshes(model))
    assert geometry.MAX_VIEW_VERTICES == 2_000_000 > total
    monkeypatch.setattr(geometry, "MAX_VIEW_VERTICES", total - 1)
    with pytest.raises(MjArchiveError, match=f"more than {total - 1:,} vertices"):
        geom_meshes(model)
    monkeypatch.setattr(geometry, "MAX_VIEW_VERTICES", total)
    assert len(geom_meshes(model)) == len(geom_meshes(model, groups=(0, 1, 2)))


# -- format 1.1: variants and overlays -----------------------------------------------------------------------

ARM_XML = """<mujoco>
  <worldbody>
    <body name="base" pos="0 0 1"><joint type="hinge" axis="0 1 0"/><geom type="box" size=".1 .1 .1"/>
      <body name="arm" pos=".3 0 0"><geom name="tip" type="box" size=".05 .02 .01" pos=".1 0 0"/></body>
    </body>
  </worldbody>
</mujoco>"""


def _variant_archive(tmp_path, n=12, change=6):
    """Worlds 4 and 9; world 9's arm moves up 0.5 m and its tip geom turns about x from frame `change` on."""
    xml = tmp_path / "arm.xml"
    xml.write_text(ARM_XML)
    model = mujoco.MjModel.from_xml_path(str(xml))
    arm, tip = model.body("arm").id, model.geom("tip").id
    moved = model.body_pos.copy()
    moved[arm] += (0.0, 0.0, 0.5)
    turned = model.geom_quat.copy()
    turned[tip] = (np.cos(0.4), np.sin(0.4), 0.0, 0.0)
    path = tmp_path / "arm.mjarchive"
    q = random_qpos(model, n, 2, seed=4)
    with mjarchive.create(path, xml, world_ids=[4, 9], chunk_frames=4,
                          variant_fields=("body_pos", "geom_quat", "geom_rgba")) as writer:
        for f in range(n):
            if f == change:
                writer.set_variant(9, body_pos=moved, geom_quat=turned)
            writer.append(0.01 * (f + 1), q[f])
    return path, model, arm, tip, moved


def test_kinematic_variants_move_a_world_from_its_change_on_and_no_other(tmp_path):
    path, model, arm, tip, moved = _variant_archive(tmp_path)
    base_pos = model.body_pos.copy()
    with mjarchive.open(path) as archive:
        shown = archive.model()
        geoms = [m.geom for m in geom_meshes(shown)]
        with PoseWindow(archive, shown, [9, 4], geoms, window_chunks=1) as window:
            assert window.variant_segments(5) == (0, 0) and window.variant_segments(6) == (1, 0)
            assert window.variant_segments(11) == (1, 0)
            np.testing.assert_array_equal(window.variant(9, 7)["body_pos"], moved)
            np.testing.assert_array_equal(window.variant(9, 5)["body_pos"], base_pos)
            np.testing.assert_array_equal(window.variant(4, 11)["body_pos"], base_pos)
            with pytest.raises(SelectionError, match="not shown"):
                window.variant(7, 0)
            for frame in (11, 0, 5, 6, 7, 3, 8):  # across chunk boundaries, both sides of the change
                p = window.poses(frame)
                # The expected poses: each world's own model at that frame, compiled and set by the archive.
                expected = []
                for w in (9, 4):
                    own = archive.model(world=w, frame=frame)
                    expected += expected_poses(archive, own, [w], geoms, frame)
                check_poses(p, expected, frame, archive)
                plain = expected_poses(archive, shown, [9, 4], geoms, frame)
                # World 9 moves from frame 6 on, world 4 never.
                np.testing.assert_allclose(p.body_pos[1], plain[1][2], atol=1e-12)
                if frame < 6:
                    np.testing.assert_allclose(p.body_pos[0], plain[0][2], atol=1e-12)
                else:
                    gap = np.linalg.norm(p.body_pos[0, arm] - plain[0][2][arm])
                    assert gap == pytest.approx(0.5, abs=1e-9)
                    column = geoms.index(tip)
                    assert not np.allclose(p.geom_quat[0, column], _quat(plain[0][1][column]), atol=1e-6)
            np.testing.assert_array_equal(shown.body_pos, base_pos)  # the caller's model is never written
            assert window.memory_bytes <= window.max_memory_bytes


def test_a_same_frame_geom_moved_by_its_world_is_posed_as_the_archive_model_poses_it(tmp_path):
    """The base box sits at its body's frame ("same frame", its geom_pos ignored by MuJoCo unless the flag is
    cleared): world 9 moves it 0.2 m along x; the window poses it as that world's own model does
    (`Archive.model`, `archive.variants.apply_variant`), and world 4's where its model's is."""
    from mjarchive.archive.variants import VARIANT_FIELDS
    from mjarchive.viewer.frames import POSE_FIELDS

    # The fields set before kinematics are the archive's kinematic ones of what the viewer draws.
    assert set(POSE_FIELDS) == {f for f, r in VARIANT_FIELDS.items() if r.kinematic and r.size in ("ngeom", "nbody")}
    xml = tmp_path / "arm.xml"
    xml.write_text(ARM_XML)
    model = mujoco.MjModel.from_xml_path(str(xml))
    box = 0
    assert model.geom_sameframe[box] != 0  # the case under test
    geom_pos = model.geom_pos.copy()
    geom_pos[box, 0] += 0.2
    path = tmp_path / "box.mjarchive"
    q = random_qpos(model, 4, 2, seed=1)
    with mjarchive.create(path, xml, world_ids=[4, 9], chunk_frames=4, variant_fields=("geom_pos",)) as writer:
        writer.set_variant(9, geom_pos=geom_pos)
        writer.append(0.01 * np.arange(1, 5), q)
    with mjarchive.open(path) as archive:
        shown = archive.model()
        geoms = [m.geom for m in geom_meshes(shown)]
        with PoseWindow(archive, shown, [9, 4], geoms, window_chunks=0, prefetch=False) as window:
            for frame in range(4):
                expected = [expected_poses(archive, archive.model(world=w, frame=frame), [w], geoms, frame)[0]
                            for w in (9, 4)]
                check_poses(window.poses(frame), expected, frame, archive)
                plain = expected_poses(archive, shown, [9], geoms, frame)[0][0]
                moved = window.poses(frame).geom_pos[0, geoms.index(box)] - plain[geoms.index(box)]
                assert np.linalg.norm(moved) == pytest.approx(0.2, abs=1e-9)


def test_one_colour_rule_for_a_geom_and_for_worlds():
    from mjarchive.viewer.geometry import _rgba, drawn_rgba

    xml = """<mujoco><asset><material name="m" rgba=".1 .2 .3 1"/></asset><worldbody>
    <geom type="sphere" size=".1" material="m"/><geom type="sphere" size=".1" material="m" rgba="1 0 0 1"/>
    <geom type="sphere" size=".1"/><geom type="sphere" size=".1" rgba="2 -1 .5 1"/></worldbody></mujoco>"""
    model = mujoco.MjModel.from_xml_string(xml)
    one = np.array([_rgba(model, g) for g in range(model.ngeom)])
    np.testing.assert_allclose(one, [[0.1, 0.2, 0.3, 1], [1, 0, 0, 1], [0.5, 0.5, 0.5, 1], [1, 0, 0.5, 1]], atol=1e-7)
    # Per world (leading axis): world 1's material is paler, and its third geom takes it.
    matid = np.stack([model.geom_matid, [0, 0, 0, -1]])
    mats = np.stack([model.mat_rgba, [[0.9, 0.9, 0.9, 1.0]]])
    rgba = drawn_rgba(np.stack([model.geom_rgba] * 2), matid, mats)
    np.testing.assert_allclose(rgba[0], one)
    np.testing.assert_allclose(rgba[1], [[0.9, 0.9, 0.9, 1], [1, 0, 0, 1], [0.9, 0.9, 0.9, 1], [1, 0, 0.5, 1]], atol=1e-7)
    # Shared materials, and a model without any.
    np.testing.assert_allclose(drawn_rgba(np.stack([model.geom_rgba] * 2), matid, model.mat_rgba)[1, 2],
                               model.mat_rgba[0], atol=1e-7)
    assert drawn_rgba(model.geom_rgba[None], np.full((1, 4), -1), np.zeros((0, 4))).shape == (1, 4, 4)


def _quat(mat9):
    q = np.empty(4)
    mujoco.mju_mat2Quat(q, mat9)
    return q


def test_a_window_without_variants_or_overlays_reads_and_computes_nothing_more(humanoid_archive, humanoid_model):
    archive = humanoid_archive
    calls = []
    for name in ("variant", "variant_changes"):
        setattr(archive, name, lambda *a, name=name: calls.append(name))
    try:
        with PoseWindow(archive, humanoid_model, [7], [0]) as window:
            window.poses(3)
            assert window.variant_segments(3) == () and window.variant(7, 3) == {}
            assert window.overlays(3) == {}
    finally:
        del archive.variant, archive.variant_changes
    assert calls == []


def test_overlay_frames_become_scene_primitives_with_the_grid_offsets(tmp_path):
    from mjarchive.replay.views.overlay_draw import row_primitives

    xml = tmp_path / "arm.xml"
    xml.write_text(ARM_XML)
    model = mujoco.MjModel.from_xml_path(str(xml))
    path = tmp_path / "overlays.mjarchive"
    overlays = {"target": mjarchive.Overlay.points(radius=0.05, max_count=3),
                "push": mjarchive.Overlay.arrows(width=0.01, max_count=2),
                "note": mjarchive.Overlay.text(max_count=2)}
    q = random_qpos(model, 6, 3, seed=2)
    with mjarchive.create(path, xml, world_ids=[5, 6, 8], chunk_frames=4, overlays=overlays) as writer:
        for f in range(6):
            writer.append(0.01 * (f + 1), q[f], overlays={
                "target": [np.full((f % 3, 3), f, float), None, [[1.0, 2.0, 3.0]]],
                "push": [[[0, 0, 0, 0, 0, 1]], [[1, 1, 1, 1, 1, 1]], None],  # world 6's has no length
                "note": [[f"f{f}"], [], [((0.5, 0.0, 0.0), "here"), "body"]]})
    offsets = np.array([[-2.0, 0, 0], [0, 0, 0], [2.0, 0, 0]])
    with mjarchive.open(path) as archive, PoseWindow(archive, archive.model(), [8, 5, 6], [0]) as window:
        # qpos per world; per frame time, and of each track the counts and the primitives drawn (xyz or
        # start and end as float64, the world, a label's text)
        assert window.chunk_bytes == 4 * (3 * model.nq * 4 + 8 + 3 * 3 * 8 + 9 * (24 + 8) + 6 * (48 + 8)
                                          + 6 * (24 + 8 + 4 * 64 + 56))
        for frame in (5, 1, 2, 4):
            tracks = window.overlays(frame)
            assert set(tracks) == {"target", "push", "note"}
            assert window.hidden_primitives(frame) == {"target": 0, "push": 0, "note": 0}
            anchors = window.poses(frame).body_pos[:, 1]
            points = row_primitives("points", tracks["target"], offsets, anchors)
            n5 = frame % 3
            want = np.concatenate([[[1.0, 2.0, 3.0]], np.full((n5, 3), frame)]) + np.repeat(offsets[:2], [1, n5], 0)
            np.testing.assert_allclose(points.positions, want)
            assert points.world.tolist() == [0] + [1] * n5 and len(points) == 1 + n5
            arrows = row_primitives("arrows", tracks["push"], offsets, anchors)
            np.testing.assert_allclose(arrows.positions, [[[0, 0, 0], [0, 0, 1]]])  # world 5's only, at offset 0
            text = row_primitives("text", tracks["note"], offsets, anchors)
            assert text.labels == ("here", "body", f"f{frame}")
            np.testing.assert_allclose(text.positions, [[-1.5, 0, 0], anchors[0] + offsets[0], anchors[1] + offsets[1]])
        assert window.memory_bytes <= window.max_memory_bytes


def test_multi_part_archive_window_follows_its_worlds_parts(tmp_path, humanoid_xml, humanoid_model):
    """A view of a multi-part archive reaches as far as the parts of the worlds it shows, and a
    refresh sees new frames of those parts and new parts (format 1.2 parts)."""
    path = tmp_path / "parts.mjarchive"
    model, geoms = humanoid_model, list(range(humanoid_model.ngeom))

    def part(name, ids, n, seed):
        w = mjarchive.create(path, humanoid_xml, part=name, world_ids=ids, chunk_frames=8)
        w.append(0.01 * np.arange(1, n + 1), random_qpos(model, n, len(ids), seed))
        w.flush()
        return w

    wa, wb = part("a", [0, 1], 20, 1), part("b", [5], 6, 2)
    with mjarchive.open(path) as archive, PoseWindow(archive, model, [5, 0], geoms, window_chunks=1) as both, \
            PoseWindow(archive, model, [1], geoms, window_chunks=1) as alone:
        assert (archive.n_frames, both.n_frames, alone.n_frames) == (6, 6, 20)
        for frame in (5, 0):
            check_poses(both.poses(frame), expected_poses(archive, model, [5, 0], geoms, frame), frame, archive)
        with pytest.raises(SelectionError):
            both.poses(6)
        wb.append(0.01 * np.arange(7, 17), random_qpos(model, 10, 1, 3))
        wb.flush()
        assert both.refresh() == 16 and alone.refresh() == 20
        got = both.poses(15)
        for w, (gpos, *_) in enumerate(expected_poses(archive, model, [5, 0], geoms, 15)):
            np.testing.assert_allclose(got.geom_pos[w], gpos, rtol=0, atol=1e-12)
        part("c", [9], 3, 4).close()
        alone.refresh()
        assert archive.parts == ("a", "b", "c") and archive.n_frames == 3 and alone.n_frames == 20
    wa.close()
    wb.close()
