"""Scene replay models: N copies of a recorded model side by side (`apply_recipe`), replay cameras,
hostile recipes, the sandboxed compile, and `ScenePlan` (grid offsets, state mapping)."""

from __future__ import annotations

import functools
import math
import pickle
import re

import mujoco
import numpy as np
import pytest

from mjarchive._errors import BundleError, MjArchiveError, SelectionError
from mjarchive.archive.bundle import sandbox
from mjarchive.archive.bundle.model_bundle import ModelBundle, QposLayout
from mjarchive.archive.bundle.compile_child import MAX_SCENE_COPIES, Refused, apply_recipe
from mjarchive.replay.views.scene import (MAX_SCENE_WORLDS, ScenePlan, build_scene_model, derived_model,
                                    with_replay_cameras)

FREE, BALL = mujoco.mjtJoint.mjJNT_FREE, mujoco.mjtJoint.mjJNT_BALL
PLANE = mujoco.mjtGeom.mjGEOM_PLANE
OFFSETS = ((0.0, 0.0, 0.0), (3.0, 0.0, 0.0), (-1.5, 2.5, 0.5), (4.0, -3.0, 0.0))

# A mocap body, a free body, a hinge-rooted arm, a ball-rooted body, static world geoms (two planes,
# one finite; a box; a capsule in a rotated frame), a directional and a spot light, a keyframe.
MOCAP_XML = """<mujoco model="mocap">
  <option timestep="0.004" impratio="3"/>
  <visual><global azimuth="120" offwidth="320"/></visual>
  <asset>
    <texture name="grid" type="2d" builtin="checker" width="64" height="64" rgb1=".1 .2 .3" rgb2=".2 .3 .4"/>
    <material name="grid" texture="grid" texrepeat="2 2"/>
  </asset>
  <worldbody>
    <light name="sun" directional="true" pos="0 0 5" dir="0 0.3 -1"/>
    <light name="lamp" pos="0 0 2" mode="targetbody" target="world"/>
    <geom name="floor" type="plane" size="2 1 .1" material="grid"/>
    <geom name="below" type="plane" size="0 0 1" pos="0 0 -1"/>
    <geom name="wall" type="box" size=".1 1 .5" pos="1.5 0 .5" rgba=".5 .5 .5 1"/>
    <frame pos="0 0 1" euler="0 0 30"><geom name="post" type="capsule" size=".05" fromto="0 0 0 .2 0 .5"/></frame>
    <body name="target" mocap="true" pos=".5 0 1"><geom name="target" type="sphere" size=".05" rgba="1 0 0 1"/></body>
    <body name="arm" pos="-.5 0 .5">
      <joint name="hinge" axis="0 1 0" range="-1 1"/>
      <geom name="link" type="capsule" size=".04" fromto="0 0 0 .4 0 0" material="grid"/>
      <body name="slider" pos=".4 0 0">
        <joint name="slide" type="slide" axis="1 0 0" range="-.1 .1"/>
        <geom name="slider" type="box" size=".05 .05 .05"/>
      </body>
    </body>
    <body name="ball" pos="0 .5 .3">
      <joint name="ball" type="ball"/><geom type="capsule" size=".03" fromto="0 0 0 0 .2 0"/>
    </body>
    <body name="box" pos="0 0 .5"><freejoint name="free"/><geom name="box" type="box" size=".1 .1 .1"/></body>
    <body name="target2" mocap="true" pos="0 -.5 1" quat="0 1 0 0"><geom type="box" size=".03 .03 .03"/></body>
  </worldbody>
  <keyframe><key name="home" time="1"/></keyframe>
</mujoco>"""


class _Models:
    """The test models, their bundles and scenes, each built once per module."""

    def __init__(self, paths):
        self.paths = paths

    @functools.cache
    def bundle(self, name: str) -> ModelBundle:
        return ModelBundle.from_xml(MOCAP_XML) if name == "mocap" else ModelBundle.from_file(self.paths[name])

    @functools.cache
    def base(self, name: str) -> mujoco.MjModel:
        return self.bundle(name).compile()

    @functools.cache
    def scene(self, name: str, offsets=OFFSETS, cameras=()) -> mujoco.MjModel:
        recipe = {"copies": [list(o) for o in offsets], "cameras": list(cameras)}
        return derived_model(self.bundle(name), recipe, trusted=True)


@pytest.fixture(scope="module")
def models(humanoid_xml, aloha_xml, mug_xml):
    return _Models({"humanoid": humanoid_xml, "aloha": aloha_xml, "mug": mug_xml})


MODELS = ("humanoid", "aloha", "mug", "mocap")


def _random_state(model, rng):
    """A valid qpos (joints within range, unit quaternions) and mocap pose for `model`."""
    qpos = model.qpos0.copy()
    for j in range(model.njnt):
        adr, kind = model.jnt_qposadr[j], model.jnt_type[j]
        if kind == FREE:
            qpos[adr:adr + 3] = rng.uniform(-1, 1, 3)
            qpos[adr + 3:adr + 7] = _unit(rng.normal(size=4))
        elif kind == BALL:
            qpos[adr:adr + 4] = _unit(rng.normal(size=4))
        else:
            low, high = model.jnt_range[j] if model.jnt_limited[j] else (-1.0, 1.0)
            qpos[adr] = rng.uniform(low, high)
    mocap_quat = np.array([_unit(rng.normal(size=4)) for _ in range(model.nmocap)]).reshape(-1, 4)
    return qpos, rng.uniform(-1, 1, (model.nmocap, 3)), mocap_quat


def _unit(q):
    return q / np.linalg.norm(q)


def _copy_bodies(base, k):
    """Body ids of copy k in a scene: each copy's bodies are a contiguous block, in base order."""
    return 1 + k * (base.nbody - 1) + np.arange(base.nbody - 1)


def _copy_geoms(base, scene, k):
    """(base geom ids, scene geom ids) of the geoms on copy k's bodies."""
    ours = [(g, scene.body_geomadr[sb] + g - base.body_geomadr[b])
            for b, sb in zip(range(1, base.nbody), _copy_bodies(base, k)) for g in range(base.ngeom)
            if base.geom_bodyid[g] == b]
    return np.array([g for g, _ in ours], int), np.array([s for _, s in ours], int)


def _world_geoms(model, planes: bool):
    return [g for g in range(model.ngeom) if model.geom_bodyid[g] == 0 and (model.geom_type[g] == PLANE) == planes]


# -- (a) qpos and mocap layout ----------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_copies_lay_out_qpos_and_mocap_in_turn(models, name):
    base, scene = models.base(name), models.scene(name)
    n = len(OFFSETS)
    assert (scene.nq, scene.nv, scene.nmocap, scene.njnt) == (n * base.nq, n * base.nv, n * base.nmocap, n * base.njnt)
    np.testing.assert_array_equal(scene.jnt_type, np.tile(base.jnt_type, n))
    np.testing.assert_array_equal(scene.jnt_qposadr, np.concatenate([base.jnt_qposadr + k * base.nq for k in range(n)]))
    np.testing.assert_array_equal(scene.jnt_dofadr, np.concatenate([base.jnt_dofadr + k * base.nv for k in range(n)]))
    for k in range(n):
        bodies = _copy_bodies(base, k)
        for b, sb in zip(range(1, base.nbody), bodies):
            if base.body(b).name:
                assert scene.body(sb).name == f"scene{k}/{base.body(b).name}"
            if base.body_mocapid[b] >= 0:
                assert scene.body_mocapid[sb] == k * base.nmocap + base.body_mocapid[b]
        for j in range(base.njnt):
            if base.joint(j).name:
                assert scene.joint(k * base.njnt + j).name == f"scene{k}/{base.joint(j).name}"
    assert scene.nkey == 0


# -- (b) kinematics -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_each_copy_moves_like_the_base_plus_its_offset(models, name):
    base, scene = models.base(name), models.scene(name)
    offsets = np.array(OFFSETS)
    rng = np.random.default_rng(7)
    data0, data = mujoco.MjData(base), mujoco.MjData(scene)
    states = [_random_state(base, rng) for _ in OFFSETS]
    free = base.jnt_qposadr[base.jnt_type == FREE]
    for k, (qpos, mocap_pos, mocap_quat) in enumerate(states):
        qpos = qpos.copy()
        for adr in free:
            qpos[adr:adr + 3] += offsets[k]
        data.qpos[k * base.nq:(k + 1) * base.nq] = qpos
        data.mocap_pos[k * base.nmocap:(k + 1) * base.nmocap] = mocap_pos + offsets[k]
        data.mocap_quat[k * base.nmocap:(k + 1) * base.nmocap] = mocap_quat
    mujoco.mj_kinematics(scene, data)
    for k, (qpos, mocap_pos, mocap_quat) in enumerate(states):
        data0.qpos[:], data0.mocap_pos[:], data0.mocap_quat[:] = qpos, mocap_pos, mocap_quat
        mujoco.mj_kinematics(base, data0)
        ours, theirs = _copy_geoms(base, scene, k)
        assert len(ours) == base.ngeom - (base.geom_bodyid == 0).sum()
        np.testing.assert_allclose(data.geom_xpos[theirs], data0.geom_xpos[ours] + offsets[k], atol=1e-12)
        np.testing.assert_allclose(data.geom_xmat[theirs], data0.geom_xmat[ours], atol=1e-12)
        bodies = _copy_bodies(base, k)
        np.testing.assert_allclose(data.xpos[bodies], data0.xpos[1:] + offsets[k], atol=1e-12)


@pytest.mark.parametrize("name", MODELS)
def test_static_world_geoms_are_copied_with_the_offset(models, name):
    base, scene = models.base(name), models.scene(name)
    ours = _world_geoms(base, planes=False)
    theirs = _world_geoms(scene, planes=False)
    assert len(theirs) == len(OFFSETS) * len(ours)
    for k, offset in enumerate(OFFSETS):
        block = theirs[k * len(ours):(k + 1) * len(ours)]
        np.testing.assert_allclose(scene.geom_pos[block], base.geom_pos[ours] + offset, atol=1e-12)
        np.testing.assert_allclose(scene.geom_quat[block], base.geom_quat[ours], atol=1e-12)
        np.testing.assert_array_equal(scene.geom_size[block], base.geom_size[ours])
        np.testing.assert_array_equal(scene.geom_rgba[block], base.geom_rgba[ours])


# -- (c) appearance, shared assets ---------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_copies_look_like_the_base_and_share_its_assets(models, name):
    base, scene = models.base(name), models.scene(name)
    assert (scene.nmesh, scene.ntex, scene.nmat, scene.nhfield) == (base.nmesh, base.ntex, base.nmat, base.nhfield)
    np.testing.assert_array_equal(scene.mesh_vert, base.mesh_vert)
    np.testing.assert_array_equal(scene.tex_data, base.tex_data)
    np.testing.assert_array_equal(scene.mat_texid, base.mat_texid)
    np.testing.assert_array_equal(scene.mat_rgba, base.mat_rgba)
    for k in range(len(OFFSETS)):
        ours, theirs = _copy_geoms(base, scene, k)
        for field in ("geom_type", "geom_size", "geom_rgba", "geom_matid", "geom_dataid", "geom_group"):
            np.testing.assert_array_equal(getattr(scene, field)[theirs], getattr(base, field)[ours], err_msg=field)


def test_aloha_meshes_stay_shared_at_sixteen_copies(models):
    base = models.base("aloha")
    scene = models.scene("aloha", tuple((float(i), 0.0, 0.0) for i in range(16)))
    assert scene.nq == 16 * base.nq and scene.nmesh == base.nmesh == 134
    assert scene.ngeom == 16 * base.ngeom - 15  # one floor


# -- (d) planes and lights ------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_world_planes_appear_once_covering_the_grid(models, name):
    base, scene = models.base(name), models.scene(name)
    offsets = np.array(OFFSETS)
    mean, spread = offsets.mean(0), np.abs(offsets - offsets.mean(0)).max(0)
    ours, theirs = _world_geoms(base, planes=True), _world_geoms(scene, planes=True)
    assert len(ours) == len(theirs) >= 1
    for g, s in zip(ours, theirs):
        np.testing.assert_allclose(scene.geom_pos[s], base.geom_pos[g] + mean, atol=1e-12)
        np.testing.assert_allclose(scene.geom_quat[s], base.geom_quat[g], atol=1e-12)
        for i in range(2):
            expected = base.geom_size[g, i] + spread[i] if base.geom_size[g, i] > 0 else 0.0  # infinite stays
            assert scene.geom_size[s, i] == pytest.approx(expected)
        assert scene.geom_size[s, 2] == base.geom_size[g, 2]
        assert (scene.geom_matid[s], tuple(scene.geom_rgba[s])) == (base.geom_matid[g], tuple(base.geom_rgba[g]))


def test_plane_sizes_for_the_mocap_model_by_hand(models):
    scene = models.scene("mocap")
    floor, below = scene.geom("scene0/floor"), scene.geom("scene0/below")
    # x: -1.5..4 about 1.375, y: -3..2.5 about -0.125, so the grid's half-extent is 2.875 both ways
    np.testing.assert_allclose(floor.size, [2 + 2.875, 1 + 2.875, 0.1])
    np.testing.assert_allclose(below.size, [0, 0, 1])
    np.testing.assert_allclose(floor.pos, [1.375, -0.125, 0.125])
    for k in range(1, len(OFFSETS)):
        with pytest.raises(KeyError):
            scene.geom(f"scene{k}/floor")


@pytest.mark.parametrize("name", MODELS)
def test_directional_lights_once_others_per_copy(models, name):
    base, scene = models.base(name), models.scene(name)
    directional = int((base.light_type == mujoco.mjtLightType.mjLIGHT_DIRECTIONAL).sum())
    assert scene.nlight == directional + len(OFFSETS) * (base.nlight - directional)
    if name == "mocap":
        assert scene.light("scene0/sun").type == mujoco.mjtLightType.mjLIGHT_DIRECTIONAL
        np.testing.assert_allclose(scene.light("scene0/sun").dir, base.light("sun").dir)
        with pytest.raises(KeyError):
            scene.light("scene1/sun")
        for k in range(len(OFFSETS)):  # a target "world" stays the world
            assert scene.light_targetbodyid[scene.light(f"scene{k}/lamp").id] == 0


# -- (e) statistic and globals ---------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_scene_keeps_the_base_statistic_and_settings(models, name):
    base, scene = models.base(name), models.scene(name)
    assert scene.stat.extent == base.stat.extent
    np.testing.assert_allclose(scene.stat.center, base.stat.center + np.mean(OFFSETS, axis=0))
    assert scene.stat.meansize == base.stat.meansize
    for get in (lambda m: m.opt.timestep, lambda m: m.opt.impratio, lambda m: m.opt.cone,
                lambda m: m.vis.global_.offwidth, lambda m: m.vis.global_.azimuth,
                lambda m: m.vis.quality.shadowsize, lambda m: tuple(m.vis.headlight.ambient),
                lambda m: tuple(m.vis.rgba.haze), lambda m: m.vis.map.znear):
        assert get(scene) == get(base)


# -- replay cameras ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["humanoid", "aloha"])  # both have cameras on moving bodies
def test_replay_cameras_come_last_and_keep_the_layout(models, name):
    base = models.base(name)
    fovys = (30.0, 45.5, 120.0)
    model = with_replay_cameras(models.bundle(name), fovys, trusted=True)
    QposLayout.from_model(base).check_compatible(model)
    assert (model.nq, model.nmocap, model.nkey) == (base.nq, base.nmocap, base.nkey)
    assert model.ncam == base.ncam + 3
    for j, fovy in enumerate(fovys):
        cam = model.ncam - len(fovys) + j
        assert model.camera(cam).name == f"mjarchive-replay-{j}"
        assert model.cam_fovy[cam] == fovy and model.cam_mode[cam] == mujoco.mjtCamLight.mjCAMLIGHT_FIXED
        assert model.body_weldid[model.cam_bodyid[cam]] == 0  # static
    scene = models.scene(name, cameras=fovys)
    assert scene.nq == len(OFFSETS) * base.nq
    assert [scene.camera(scene.ncam - 3 + j).name for j in range(3)] == [f"mjarchive-replay-{j}" for j in range(3)]


def test_replay_cameras_survive_fusestatic(models):
    spec = models.bundle("humanoid").spec()
    spec.compiler.fusestatic = True
    model = apply_recipe(spec, {"cameras": [50]}).compile()
    assert model.camera(model.ncam - 1).name == "mjarchive-replay-0"


# -- hostile recipes --------------------------------------------------------------------------------
HOSTILE = {
    "not a dict": [[0, 0, 0]],
    "unknown key": {"copies": [[0, 0, 0]], "exec": "rm -rf"},
    "nan offset": {"copies": [[0, float("nan"), 0]]},
    "inf offset": {"copies": [[float("inf"), 0, 0]]},
    "huge int offset": {"copies": [[10**400, 0, 0]]},
    "far offset": {"copies": [[1e7, 0, 0]]},
    "65 copies": {"copies": [[i, 0, 0] for i in range(65)]},
    "no copies": {"copies": []},
    "two coordinates": {"copies": [[0, 0]]},
    "string offset": {"copies": [["1", 0, 0]]},
    "bool offset": {"copies": [[True, 0, 0]]},
    "copies as string": {"copies": "0 0 0"},
    "fovy 0": {"cameras": [0]},
    "fovy 180": {"cameras": [180]},
    "fovy 200": {"cameras": [200]},
    "fovy nan": {"cameras": [float("nan")]},
    "fovy string": {"cameras": ["45"]},
    "17 cameras": {"cameras": [45] * 17},
    "cameras as dict": {"cameras": {"a": 45}},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_recipes_are_refused(models, case):
    spec = mujoco.MjSpec.from_string(MOCAP_XML)
    with pytest.raises(Refused):
        apply_recipe(spec, HOSTILE[case])
    with pytest.raises(BundleError, match="replay"):
        derived_model(models.bundle("mocap"), HOSTILE[case], trusted=True)


@pytest.mark.parametrize("case", ["nan offset", "65 copies", "fovy 200"])
def test_hostile_recipes_are_refused_in_the_child(models, case):
    with pytest.raises(BundleError, match="cannot be compiled safely: the replay recipe"):
        sandbox.compile_untrusted(models.bundle("mocap"), HOSTILE[case])


def test_recipe_must_be_json(models):
    with pytest.raises(BundleError, match="plain JSON"):
        sandbox.compile_untrusted(models.bundle("mocap"), {"copies": [[object(), 0, 0]]})


# -- the sandboxed compile --------------------------------------------------------------------------
FIELDS = ("nq", "nv", "nmocap", "nbody", "ngeom", "nlight", "ncam", "nmesh", "ntex", "nmat", "nkey",
          "jnt_qposadr", "jnt_type", "body_pos", "body_quat", "body_mocapid", "geom_pos", "geom_quat",
          "geom_size", "geom_rgba", "geom_matid", "geom_dataid", "cam_fovy", "cam_bodyid", "light_pos",
          "light_type", "qpos0", "mesh_vert", "tex_data", "names")


@pytest.mark.parametrize("name", ["humanoid", "aloha", "mug"])
def test_sandbox_compiles_the_same_scene_as_in_process(models, name):
    plan = ScenePlan.grid([5, 1, 3], spacing=2.0)
    local = build_scene_model(models.bundle(name), plan, (40.0,), trusted=True)
    child = build_scene_model(models.bundle(name), plan, (40.0,), trusted=False)
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(child, field), getattr(local, field), err_msg=field)
    assert child.stat.extent == local.stat.extent
    np.testing.assert_array_equal(child.stat.center, local.stat.center)
    # cached per (bundle, recipe): the plain model and a different recipe are other entries
    assert sandbox.compile_untrusted(models.bundle(name)).nq == models.base(name).nq
    assert with_replay_cameras(models.bundle(name), (40.0,), trusted=False).nq == models.base(name).nq


# -- ScenePlan ------------------------------------------------------------------------------------
def test_grid_offsets():
    assert ScenePlan.grid([7], 2.0).offsets == ((0.0, 0.0, 0.0),)
    plan = ScenePlan.grid([4, 2, 9, 0], 2.0)
    assert plan.world_ids == (4, 2, 9, 0) and plan.spacing == 2.0
    assert plan.offsets == ((-1.0, 1.0, 0.0), (1.0, 1.0, 0.0), (-1.0, -1.0, 0.0), (1.0, -1.0, 0.0))
    five = ScenePlan.grid(range(5), 1.5)  # 3 columns, 2 rows, the last row part-filled
    assert five.offsets == ((-1.5, 0.75, 0.0), (0.0, 0.75, 0.0), (1.5, 0.75, 0.0),
                            (-1.5, -0.75, 0.0), (0.0, -0.75, 0.0))
    many = ScenePlan.grid(range(MAX_SCENE_WORLDS), 1.0)
    xy = np.array(many.offsets)[:, :2]
    assert len(set(map(tuple, xy))) == 64 and np.allclose(xy.mean(0), 0)
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert plan.recipe((45,)) == {"copies": [list(o) for o in plan.offsets], "cameras": [45.0]}
    assert MAX_SCENE_WORLDS == MAX_SCENE_COPIES == 64
    with pytest.raises(MjArchiveError, match="one offset per world"):
        ScenePlan((1, 2), 1.0, ((0.0, 0.0, 0.0),))


@pytest.mark.parametrize("worlds, spacing, error, match", [
    (range(65), 1.0, SelectionError,
     "at most 64 worlds in one scene; select fewer with worlds=... or use layout='grid'"),
    ([1, 2, 1], 1.0, SelectionError, "once"),
    ([], 1.0, SelectionError, "at least one"),
    ([0], 0.0, MjArchiveError, "spacing"),
    ([0], -1.0, MjArchiveError, "spacing"),
    ([0], math.nan, MjArchiveError, "spacing"),
    ([0], math.inf, MjArchiveError, "spacing"),
    ([0], "2", MjArchiveError, "spacing"),
    ([0], True, MjArchiveError, "spacing"),
])
def test_grid_errors(worlds, spacing, error, match):
    with pytest.raises(error, match=re.escape(match)):
        ScenePlan.grid(worlds, spacing)


@pytest.mark.parametrize("name", ["humanoid", "mocap"])
def test_combine_maps_archived_states_onto_the_scene(models, name):
    base = models.base(name)
    plan = ScenePlan.grid([3, 0, 2, 1], spacing=2.5)
    scene = build_scene_model(models.bundle(name), plan, trusted=True)
    rng = np.random.default_rng(11)
    n_frames, n_worlds = 3, len(plan.world_ids)
    states = [[_random_state(base, rng) for _ in range(n_worlds)] for _ in range(n_frames)]
    qpos = np.array([[s[0] for s in frame] for frame in states])  # (n, W, nq)
    mocap_pos = np.array([[s[1] for s in frame] for frame in states])  # (n, W, nmocap, 3)
    mocap_quat = np.array([[s[2] for s in frame] for frame in states])
    q, mp, mq = plan.combine(base, qpos, mocap_pos, mocap_quat)
    assert q.shape == (n_frames, n_worlds * base.nq) and q.dtype == np.float64
    assert mp.shape == mq.shape[:2] + (3,) == (n_frames, n_worlds * base.nmocap, 3)
    data0, data = mujoco.MjData(base), mujoco.MjData(scene)
    for t in range(n_frames):
        data.qpos[:], data.mocap_pos[:], data.mocap_quat[:] = q[t], mp[t], mq[t]
        mujoco.mj_kinematics(scene, data)
        for k, offset in enumerate(plan.offsets):
            data0.qpos[:], data0.mocap_pos[:], data0.mocap_quat[:] = qpos[t, k], mocap_pos[t, k], mocap_quat[t, k]
            mujoco.mj_kinematics(base, data0)
            ours, theirs = _copy_geoms(base, scene, k)
            np.testing.assert_allclose(data.geom_xpos[theirs], data0.geom_xpos[ours] + offset, atol=1e-12)
            np.testing.assert_allclose(data.geom_xmat[theirs], data0.geom_xmat[ours], atol=1e-12)
    assert plan.combine(base, qpos)[1:] == (None, None)
    np.testing.assert_array_equal(qpos, np.array([[s[0] for s in frame] for frame in states]))  # input untouched


def test_combine_checks_shapes(models):
    base = models.base("mocap")
    plan = ScenePlan.grid([0, 1], 1.0)
    with pytest.raises(MjArchiveError, match="qpos"):
        plan.combine(base, np.zeros((2, 3, base.nq)))
    with pytest.raises(MjArchiveError, match="mocap_pos"):
        plan.combine(base, np.zeros((2, 2, base.nq)), np.zeros((2, 2, base.nmocap, 4)))
