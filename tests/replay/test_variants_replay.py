"""Per-world model variants at replay (format 1.1): each (world, frame) renders with the values in
force for that world at that frame, on the CPU (pixel-identical to a direct render), on Warp and
in a scene of several worlds; nothing leaks across a reset, into another world or another unit."""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import pytest

from conftest import requires_warp_replay

import mjarchive
from mjarchive import Camera
from mjarchive.replay.backends.warp import unavailable as warp_unavailable
from mjarchive.replay.plan import split

SIZE = (48, 64)
WORLDS = [4, 11]
N = 6
RESET = 3  # world 11 resets here and draws with new values
TRUNK = [1, 2, 4, 5, 6, 10]  # humanoid geoms: torso, waist, butt, thighs
HEAD = 3
MAGENTA = np.array([1.0, 0.1, 1.0, 1.0], np.float32)  # none of the humanoid's orange, nor the floor's blue
BLUE = np.array([0.1, 0.2, 1.0, 1.0], np.float32)
GREEN = np.array([0.1, 1.0, 0.1, 1.0], np.float32)
CAMERA = 1  # "side": a trackcom camera


def _values(model):
    """(rgba, size) of each world, before and after world 11's reset: {world: [(from_frame, values)]}."""
    rgba_4 = model.geom_rgba.copy()
    rgba_4[TRUNK] = MAGENTA
    size_4 = model.geom_size.copy()
    rgba_11 = model.geom_rgba.copy()
    rgba_11[TRUNK] = BLUE
    rgba_11[HEAD] = MAGENTA
    size_11 = model.geom_size.copy()
    size_11[HEAD] *= 1.8  # a bigger head until the reset
    rgba_11b = model.geom_rgba.copy()
    rgba_11b[TRUNK] = GREEN
    rgba_11b[HEAD] = MAGENTA
    return {4: [(0, {"geom_rgba": rgba_4, "geom_size": size_4})],
            11: [(0, {"geom_rgba": rgba_11, "geom_size": size_11}),
                 (RESET, {"geom_rgba": rgba_11b, "geom_size": model.geom_size.copy()})]}


@pytest.fixture(scope="module")
def run(tmp_path_factory, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    rng = np.random.default_rng(7)
    qpos = np.tile(model.qpos0, (N, len(WORLDS), 1))
    qpos[:, :, 2] = 1.3
    qpos[:, :, 7:] = rng.uniform(-0.3, 0.3, (N, len(WORLDS), model.nq - 7))
    reset = np.zeros((N, len(WORLDS)), bool)
    reset[RESET, 1] = True
    values = _values(model)
    path = tmp_path_factory.mktemp("variants") / "humanoid.mjarchive"
    with mjarchive.create(path, humanoid_xml, world_ids=WORLDS, dtype="float64", chunk_frames=4,
                          variant_fields=("geom_rgba", "geom_size")) as w:
        for f in range(N):
            for wid, events in values.items():
                for start, v in events:
                    if start == f:
                        w.set_variant(wid, **v)
            w.append(0.02 * f, qpos[f], reset=reset[f])
    return path, model, qpos, values


def _in_force(values, wid, f):
    return [v for start, v in values[wid] if start <= f][-1]


def _direct(model, qpos, values, wid, frames, camera=CAMERA, worlds=WORLDS):
    """What each frame must look like: a plain mujoco.Renderer of a model with the values set."""
    m = copy.copy(model)
    m.vis.quality.offsamples = 0
    d = mujoco.MjData(m)
    out = []
    with mujoco.Renderer(m, *SIZE) as r:
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                     mujoco.mjtRndFlag.mjRND_SKYBOX):
            r.scene.flags[flag] = 0
        for k, f in enumerate(frames):
            for name, v in _in_force(values, wid, f).items():
                getattr(m, name)[:] = v
            d.qpos[:] = qpos[f, worlds.index(wid)]
            mujoco.mj_forward(m, d)
            r.update_scene(d, camera=camera)
            if k == 0:  # warm-up frame, discarded (as the replay renderer does)
                r.render()
                r.update_scene(d, camera=camera)
            out.append(r.render().copy())
    return np.stack(out)


def _frames(path, **kw):
    got = {}
    for wid, f, rgb in mjarchive.iter_frames(path, size=SIZE, quality="fast", camera=CAMERA, **kw):
        got.setdefault(wid, []).append((f, rgb))
    return {wid: (np.array([f for f, _ in v]), np.stack([x for _, x in v])) for wid, v in got.items()}


def _share(rgb, colour):
    """Fraction of the image's pixels of that colour's hue (see _mask)."""
    return float(_mask(rgb, colour).mean())


def test_split_ends_units_before_each_change():
    frames = np.arange(10)
    assert split(frames, 4, 32, np.array([3, 9])) == [(0, 1, 2), (3,), (4, 5, 6, 7), (8,), (9,)]
    assert split(np.array([0, 2, 5, 6]), 100, 32, np.array([4])) == [(0, 2), (5, 6)]
    assert split(frames, 4, 32, np.zeros(0, np.int64)) == split(frames, 4, 32)


def test_cpu_frames_equal_a_direct_render_with_the_values_in_force(run):
    path, model, qpos, values = run
    got = _frames(path)
    for wid in WORLDS:
        frames, rgb = got[wid]
        np.testing.assert_array_equal(frames, np.arange(N))
        np.testing.assert_array_equal(rgb, _direct(model, qpos, values, wid, range(N)), err_msg=f"world {wid}")
    # The variants are visible: a magenta trunk in world 4, blue then green in world 11.
    assert min(_share(x, MAGENTA) for x in got[4][1]) > 0.005
    assert max(_share(x, c) for x in got[4][1] for c in (BLUE, GREEN)) < 0.001
    assert min(_share(x, BLUE) for x in got[11][1][:RESET]) > 0.005
    assert max(_share(x, GREEN) for x in got[11][1][:RESET]) < 0.001
    assert max(_share(x, BLUE) for x in got[11][1][RESET:]) < 0.001
    assert min(_share(x, GREEN) for x in got[11][1][RESET:]) > 0.005
    # World 11's (magenta) head is 1.8 times as large until its reset.
    head = [_mask(x, MAGENTA).sum() for x in got[11][1]]
    assert min(head[:RESET]) > 2 * max(head[RESET:]) > 0, head


def test_nothing_leaks_into_the_next_world_or_a_later_render(run):
    path, model, qpos, values = run
    # World 11 after its reset, then world 4 in the same process (cached renderers): world 4 draws
    # its own values, and a frame of world 11 before the reset draws the big head again.
    after = _frames(path, worlds=[11], frames=[RESET + 1])[11][1]
    np.testing.assert_array_equal(after, _direct(model, qpos, values, 11, [RESET + 1]))
    np.testing.assert_array_equal(_frames(path, worlds=[4], frames=[RESET + 1])[4][1],
                                  _direct(model, qpos, values, 4, [RESET + 1]))
    np.testing.assert_array_equal(_frames(path, worlds=[11], frames=[1])[11][1],
                                  _direct(model, qpos, values, 11, [1]))


def _units(path, layout):
    from pathlib import Path

    from mjarchive.replay.plan import plan_units

    with mjarchive.open(path) as archive:
        outputs = plan_units(archive, location=str(path), storage_options=None, worlds=None, frames=None,
                             cameras=[(CAMERA, "side")], size=SIZE, quality="fast", backend="cpu", layout=layout,
                             split_episodes=False, model_mjb=None, out_dir=Path("."), model=archive.model())
    return [(u.world_id, u.frames) for o in outputs for u in o.units]


def test_per_world_units_end_at_changes_grid_units_span_them(run, tmp_path):
    path, model, qpos, values = run
    # Stored chunks hold frames 0-3 and 4-5; world 11 changes at frame 3.
    assert _units(path, "per-world") == [(4, (0, 1, 2, 3)), (4, (4, 5)), (11, (0, 1, 2)), (11, (3,)), (11, (4, 5))]
    assert _units(path, "grid") == [(4, (0, 1, 2, 3)), (11, (0, 1, 2, 3)), (4, (4, 5)), (11, (4, 5))]
    # A grid unit straddling world 11's change still draws each frame with the values then in force.
    from mjarchive.replay.video import GridComposer

    captured = []
    mjarchive.render(path, tmp_path, layout="grid", cameras=[CAMERA], size=SIZE, quality="fast", workers=1,
                     progress=False, hud=None, on_frame=lambda w, f, rgb: captured.append(rgb.copy()))
    composer = GridComposer(WORLDS, SIZE)
    expected = composer.canvas(N)
    for wid in WORLDS:
        composer.paste(expected, wid, _direct(model, qpos, values, wid, range(N)))
    np.testing.assert_array_equal(np.stack(captured), expected)


def test_warp_draws_each_world_with_its_values_packed_in_one_launch(run):
    requires_warp_replay()
    path, model, qpos, values = run
    cpu = _frames(path)
    packed = _frames(path, backend="warp:cpu", warp_batch=8)  # both worlds' states share launches
    one = _frames(path, backend="warp:cpu", warp_batch=1)
    for wid in WORLDS:
        np.testing.assert_array_equal(packed[wid][1], one[wid][1], err_msg=f"world {wid}: packing changed pixels")
        for f in range(N):
            a, b = packed[wid][1][f], cpu[wid][1][f]
            for colour in (MAGENTA, BLUE, GREEN):
                ma, mb = _mask(a, colour), _mask(b, colour)
                if mb.sum() < 10:
                    # Absent (or a few pixels) on the CPU: the same on Warp (nothing leaked from another slot
                    # or world).
                    assert abs(int(ma.sum()) - int(mb.sum())) <= 3, (wid, f, colour, ma.sum(), mb.sum())
                    continue
                # The ray tracer shades differently from OpenGL (test_render_warp.py compares silhouettes):
                # the dark blue's thresholded area differs most, measured 18-35 px against 20-34 on the
                # CPU, centroids within 0.8 px; magenta and green within 2 px and 0.2 px.
                assert 0.5 <= ma.sum() / mb.sum() <= 2.0, (wid, f, colour, ma.sum(), mb.sum())
                assert np.linalg.norm(_centroid(ma) - _centroid(mb)) < 1.5, (wid, f, colour)
    # World 11's head is 1.8 times as large until its reset on Warp too (its BVH refit reads sizes per world).
    head = [_mask(x, MAGENTA).sum() for x in packed[11][1]]
    assert min(head[:RESET]) > 2 * max(head[RESET:]) > 0, head


def _centroid(mask):
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()])


def _mask(rgb, colour, tol=60):
    """Pixels of that colour's hue: its bright channels (> 0.5) all well above the others (the
    lights are warm, so magenta draws as about (205, 20, 105))."""
    on = np.asarray(colour[:3]) > 0.5
    px = rgb.astype(int)
    return px[..., on].min(axis=-1) - px[..., ~on].max(axis=-1) > tol


def test_scene_copies_take_their_worlds_values(run, tmp_path, humanoid_xml):
    path, model, qpos, values = run
    from mjarchive.archive.bundle.compile_child import apply_recipe
    from mjarchive.replay.views.scene import ScenePlan

    plan = ScenePlan.grid(WORLDS, 2.0)
    cam = Camera.free(lookat=(0.0, 0.0, 1.0), distance=6.0, azimuth=90.0, elevation=-20.0)
    captured = []
    mjarchive.render(path, tmp_path, layout="scene", spacing=2.0, cameras=[cam], size=SIZE, quality="fast",
                     workers=1, progress=False, hud=None, on_frame=lambda w, f, rgb: captured.append(rgb.copy()))
    scene = apply_recipe(mujoco.MjSpec.from_file(str(humanoid_xml)), plan.recipe()).compile()
    scene.vis.quality.offsamples = 0
    d = mujoco.MjData(scene)
    free = mujoco.MjvCamera()
    free.type = mujoco.mjtCamera.mjCAMERA_FREE
    free.lookat[:], free.distance, free.azimuth, free.elevation = (0.0, 0.0, 1.0), 6.0, 90.0, -20.0
    names = [model.geom(i).name for i in range(model.ngeom)]
    with mujoco.Renderer(scene, *SIZE) as r:
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                     mujoco.mjtRndFlag.mjRND_SKYBOX):
            r.scene.flags[flag] = 0
        for f in range(N):
            for k, wid in enumerate(WORLDS):
                for name, v in _in_force(values, wid, f).items():
                    for i, geom in enumerate(names):
                        if geom == "floor":
                            continue  # the floor is shared by the copies: world 4's (its own here)
                        getattr(scene, name)[scene.geom(f"scene{k}/{geom}").id] = v[i]
            q, _, _ = plan.combine(model, qpos[f:f + 1])
            d.qpos[:] = q[0]
            mujoco.mj_forward(scene, d)
            r.update_scene(d, camera=free)
            if f == 0:
                r.render()
                r.update_scene(d, camera=free)
            np.testing.assert_array_equal(captured[f], r.render(), err_msg=f"frame {f}")
    # Each world's colours show (small at 48x64: a few pixels each), world 11's green after its reset.
    count = lambda x, c: int(_mask(x, c).sum())
    assert count(captured[0], MAGENTA) >= 5 and count(captured[0], BLUE) >= 3 and count(captured[0], GREEN) == 0
    assert count(captured[-1], BLUE) == 0 and count(captured[-1], GREEN) >= 3


def test_a_replay_model_of_other_elements_is_refused(run, humanoid_xml):
    path, *_ = run
    spec = mujoco.MjSpec.from_file(str(humanoid_xml))
    spec.body("torso").add_geom(type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[0.1, 0, 0])
    with pytest.raises(mjarchive.LayoutMismatchError, match="geom_rgba.*model="):
        next(mjarchive.iter_frames(path, model=spec, size=SIZE, camera=CAMERA))


def test_warp_scene_copies_take_their_worlds_values(run, tmp_path):
    requires_warp_replay()
    path, *_ = run
    cam = Camera.free(lookat=(0.0, 0.0, 1.0), distance=6.0, azimuth=90.0, elevation=-20.0)
    frames = {}
    for backend in ("cpu", "warp:cpu"):
        captured = []
        mjarchive.render(path, tmp_path / backend, layout="scene", spacing=2.0, cameras=[cam], size=SIZE,
                         quality="fast", backend=backend, workers=1, progress=False, hud=None, frames=[0, 5],
                         on_frame=lambda w, f, rgb: captured.append(rgb.copy()))
        frames[backend] = captured
    for k in range(2):
        for colour in (MAGENTA, BLUE, GREEN):
            a, b = int(_mask(frames["warp:cpu"][k], colour).sum()), int(_mask(frames["cpu"][k], colour).sum())
            # A few pixels per world at 48x64, and the shading differs (see the per-world Warp test): dark
            # blue thresholds to 10 pixels on Warp against 5 on the CPU, magenta and green within 2.
            assert a <= 2.5 * b + 3 and b <= 2.5 * a + 3, (k, colour, a, b)
            assert (a == 0) == (b == 0), (k, colour, a, b)


# -- kinematic, light, material and camera fields -------------------------------------------------------

FIELDS = ("body_pos", "light_diffuse", "mat_rgba", "cam_fovy")
HEAD_BODY = 2
LIFT = 0.4  # world 6 draws its head this far above the torso


@pytest.fixture(scope="module")
def fields_run(tmp_path_factory, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    qpos = np.tile(model.qpos0, (3, 2, 1))
    qpos[:, :, 2] = 1.3
    qpos[:, 1, 0] = [0.0, 0.3, 0.6]  # world 6 walks along x
    body_pos = model.body_pos.copy()
    body_pos[HEAD_BODY, 2] += LIFT
    mat_rgba = model.mat_rgba.copy()
    mat_rgba[0] = (0.2, 0.9, 0.9, 1.0)  # the body's material, every limb
    light = model.light_diffuse * 0.5
    fovy = model.cam_fovy.copy()
    fovy[CAMERA] = 30.0
    values = {1: [(0, default_of(model))],
              6: [(0, {"body_pos": body_pos, "light_diffuse": light, "mat_rgba": mat_rgba, "cam_fovy": fovy})]}
    path = tmp_path_factory.mktemp("fields") / "humanoid.mjarchive"
    with mjarchive.create(path, humanoid_xml, world_ids=[1, 6], dtype="float64", variant_fields=FIELDS) as w:
        w.set_variant(6, **values[6][0][1])
        w.append(np.arange(3) * 0.02, qpos)
    return path, model, qpos, values


def default_of(model):
    return {name: np.array(getattr(model, name)) for name in FIELDS}


def test_kinematic_light_material_and_camera_fields_on_the_cpu(fields_run):
    path, model, qpos, values = fields_run
    got = _frames(path)
    for wid in (1, 6):
        np.testing.assert_array_equal(got[wid][1], _direct(model, qpos, values, wid, range(3), worlds=[1, 6]),
                                      err_msg=f"world {wid}")
    assert (got[1][1] != got[6][1]).any()


def test_tracking_paths_follow_a_moved_body(fields_run):
    path, model, qpos, values = fields_run
    # Tracking world 6's head, raised by its body_pos variant, keeps it at the image centre.
    cam = Camera.track("head", distance=2.0, azimuth=90.0, elevation=0.0)
    frames = [rgb for _, _, rgb in mjarchive.iter_frames(path, worlds=[6], size=SIZE, quality="fast", camera=cam)]
    for rgb in frames:
        px = rgb.astype(int)
        # World 6's material is teal; under its halved, warm light it draws green-blue.
        teal = (px[..., 1] > 60) & (px[..., 1] - np.maximum(px[..., 0], px[..., 2]) > 20)
        ys, xs = np.nonzero(teal[:SIZE[0] // 2 + 4])  # the head floats above the torso
        centre = np.array([xs.mean() + 0.5, ys.mean() + 0.5])
        # Measured within 0.4 px; a path posed without the variant aims LIFT lower, and the head lands
        # 7 px above the centre.
        assert np.abs(centre - [SIZE[1] / 2, SIZE[0] / 2]).max() < 1.5, centre


def test_warp_takes_light_material_camera_and_kinematic_fields_per_world(fields_run):
    requires_warp_replay()
    path, model, qpos, values = fields_run
    warp = _frames(path, backend="warp:cpu", warp_batch=8)
    cpu = _frames(path)
    for wid in (1, 6):
        for f in range(3):
            a, b = (_body(x[f]) for x in (warp[wid][1], cpu[wid][1]))
            iou = (a & b).sum() / (a | b).sum()
            assert iou >= 0.85, (wid, f, iou)  # test_render_warp.py: >= 0.9 at 48x64, full body
    # World 6 draws in its material's teal (green-blue under its warm, halved light), world 1 in orange,
    # in the same launch.
    teal = lambda rgb: ((rgb[..., 1].astype(int) - np.maximum(rgb[..., 0], rgb[..., 2])) > 20).sum()
    assert teal(warp[6][1][0]) > 30 and teal(warp[1][1][0]) == 0


def _body(rgb):
    """The humanoid (orange or teal) against the blue floor and dark sky: well above the floor's brightness in
    red or green."""
    px = rgb.astype(int)
    return (np.maximum(px[..., 0], px[..., 1]) - px[..., 2] > 25) | (px[..., 1] - px[..., 0] > 60)


# -- the scene's element map, on a model with world-body geoms, sites, lights and cameras ----------------

_PARTS = """<mujoco><asset><material name="m1" rgba="1 0 0 1"/></asset><worldbody>
<light name="sun" directional="true" dir="0 0 -1"/><light name="lamp" pos="0 0 3"/>
<geom name="wbox" type="box" size=".1 .1 .1" pos="1 0 0"/><geom name="floor" type="plane" size="3 3 .1"/>
<site name="wsite" pos="0 1 0"/><camera name="wcam" pos="0 -3 1"/>
<body name="a" pos="0 0 1"><freejoint/><geom name="ball" size=".2" material="m1"/>
  <light name="alamp" pos="0 0 1"/><camera name="acam" pos="0 -1 0"/><site name="asite"/>
  <body name="b" pos="0 0 .5"><joint type="hinge"/><geom name="stick" type="capsule" size=".05 .2"/></body></body>
<body name="c" pos="2 0 1"><geom name="pebble" size=".1"/></body></worldbody></mujoco>"""
_NAMED = {"geom": ("wbox", "ball", "stick", "pebble"), "site": ("wsite", "asite"), "light": ("lamp", "alamp"),
          "cam": ("wcam", "acam"), "body": ("a", "b", "c")}


def test_scene_layout_maps_every_copys_elements_by_name():
    from mjarchive.archive.bundle.compile_child import apply_recipe
    from mjarchive.archive.variants import VARIANT_FIELDS, default_values, field_shape
    from mjarchive.replay.views.scene import ScenePlan
    from mjarchive.replay.views.variant_map import VariantLayout

    base = mujoco.MjModel.from_xml_string(_PARTS)
    plan = ScenePlan.grid([10, 20, 30], 3.0)
    scene = apply_recipe(mujoco.MjSpec.from_string(_PARTS), plan.recipe([40.0])).compile()  # + a replay camera
    names = [n for n in VARIANT_FIELDS if n not in ("geom_dataid",)]
    shapes = {n: field_shape(base, n) for n in names}
    layout = VariantLayout(scene, shapes, plan)
    rng = np.random.default_rng(0)
    own = default_values(base, names)
    worlds = []
    for _ in plan.world_ids:
        v = {}
        for n in names:
            x = own[n].copy()
            if VARIANT_FIELDS[n].dtype == "int32":
                x[:] = rng.integers(-1, base.nmat, x.shape)
            elif VARIANT_FIELDS[n].rule in ("quat", "direction"):
                x = x + rng.normal(scale=0.1, size=x.shape)
                x /= np.linalg.norm(x, axis=-1, keepdims=True)
            else:
                x = x + rng.uniform(0.05, 0.2, x.shape).astype(x.dtype)
            v[n] = np.clip(x, 0, 1) if VARIANT_FIELDS[n].rule == "unit" else x
        worlds.append(v)
    placed = layout.values(worlds, default_values(scene, names))
    obj = {"geom": mujoco.mjtObj.mjOBJ_GEOM, "site": mujoco.mjtObj.mjOBJ_SITE, "light": mujoco.mjtObj.mjOBJ_LIGHT,
           "cam": mujoco.mjtObj.mjOBJ_CAMERA, "body": mujoco.mjtObj.mjOBJ_BODY}
    checked = 0
    for n in names:
        kind = {"ngeom": "geom", "nsite": "site", "nlight": "light", "ncam": "cam", "nbody": "body"}.get(
            VARIANT_FIELDS[n].size)
        if kind is None:  # materials: copy 0's, shared: the first world's values
            np.testing.assert_array_equal(placed[n], worlds[0][n])
            continue
        for k, offset in enumerate(plan.offsets):
            for el in _NAMED[kind]:
                i = mujoco.mj_name2id(base, obj[kind], el)
                j = mujoco.mj_name2id(scene, obj[kind], f"scene{k}/{el}")
                want = np.array(worlds[k][n][i], np.float64)
                on_world = (base.body_parentid[i] == 0) if kind == "body" else (
                    getattr(base, f"{kind}_bodyid")[i] == 0)
                if n.endswith("_pos") and on_world:
                    want = want + offset  # hangs on copy k's frame
                np.testing.assert_allclose(placed[n][j], want, rtol=0, atol=1e-12, err_msg=f"{n} scene{k}/{el}")
                checked += 1
    assert checked > 100
    # The floor and the sun appear once (copy 0's): world 0's colour and direction, the scene's own
    # placement and size (they span the grid).
    floor = mujoco.mj_name2id(scene, mujoco.mjtObj.mjOBJ_GEOM, "scene0/floor")
    sun = mujoco.mj_name2id(scene, mujoco.mjtObj.mjOBJ_LIGHT, "scene0/sun")
    np.testing.assert_array_equal(placed["geom_rgba"][floor], worlds[0]["geom_rgba"][base.geom("floor").id])
    np.testing.assert_array_equal(placed["geom_size"][floor], scene.geom_size[floor])
    np.testing.assert_array_equal(placed["geom_pos"][floor], scene.geom_pos[floor])
    np.testing.assert_array_equal(placed["light_dir"][sun], worlds[0]["light_dir"][base.light("sun").id])
    np.testing.assert_array_equal(placed["light_pos"][sun], scene.light_pos[sun])
    # The replay camera is no world's: it keeps its own field of view.
    replay = mujoco.mj_name2id(scene, mujoco.mjtObj.mjOBJ_CAMERA, "mjarchive-replay-0")
    assert placed["cam_fovy"][replay] == 40.0
    # A model that is not the plan's copies is refused, naming the layouts that work.
    with pytest.raises(mjarchive.BackendError, match="layout='per-world'"):
        VariantLayout(scene, shapes, ScenePlan.grid([10, 20], 3.0))


# -- values read once per world and span; labels placed with the values in force -------------------------

class _Renderer:
    """What VariantSpans needs of a renderer."""

    def __init__(self, model):
        from mjarchive.archive.variants import VARIANT_FIELDS, default_values

        self.model = model
        self.variant_defaults = default_values(model, VARIANT_FIELDS)
        self.variant_layouts = {}


def test_scene_spans_read_each_worlds_values_once_per_span(run, humanoid_xml):
    from mjarchive.archive.bundle.compile_child import apply_recipe
    from mjarchive.replay.views.scene import ScenePlan
    from mjarchive.replay.views.variant_map import VariantSpans

    path, model, qpos, values = run
    plan = ScenePlan.grid(WORLDS, 2.0)
    scene = apply_recipe(mujoco.MjSpec.from_file(str(humanoid_xml)), plan.recipe()).compile()
    renderer = _Renderer(scene)
    with mjarchive.open(path) as archive:
        reads = []
        real = archive.variant_window

        def window(worlds, frames):  # counts the values the spans read
            win = real(worlds, frames)
            values = win.values
            win.values = lambda w, f: reads.append((w, f)) or values(w, f)
            return win

        archive.variant_window = window
        try:
            spans = VariantSpans(archive, WORLDS, renderer, plan, frames=range(N))
            placed = [spans.values(f) for f in range(N)]
            spans.rows(list(range(N)))
        finally:
            del archive.variant_window
    # World 11 changes at frame 3: world 4's values are read once, not again with world 11's.
    assert reads == [(4, 0), (11, 0), (11, RESET)]
    assert len(renderer.variant_layouts) == 1  # the layout is kept on the renderer, made once
    torso = scene.geom("scene1/torso").id
    for f in range(N):
        np.testing.assert_array_equal(placed[f]["geom_rgba"][torso], _in_force(values, 11, f)["geom_rgba"][1])


def test_scene_labels_are_placed_with_the_values_in_force_on_both_backends(tmp_path, humanoid_xml, monkeypatch):
    """The labels of a scene project through the model camera as rendered: with its world's field of view
    and body placement (the trackcom camera follows the centre of mass the lifted head moves), on the CPU
    (whose renderer's model holds the values) and on Warp (whose renderer keeps the model's own)."""
    import importlib.util

    from mjarchive.archive.bundle.compile_child import apply_recipe
    from mjarchive.replay.views.labels import SceneLabels
    from mjarchive.replay.views.scene import ScenePlan

    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    fovy = model.cam_fovy.copy()
    fovy[CAMERA] = 25.0
    body_pos = model.body_pos.copy()
    body_pos[HEAD_BODY, 2] += LIFT
    path = tmp_path / "fovy.mjarchive"
    qpos = np.tile(model.qpos0, (2, 2, 1))
    qpos[:, :, 2] = 1.3
    with mjarchive.create(path, humanoid_xml, world_ids=[0, 1], dtype="float64",
                          variant_fields=("cam_fovy", "body_pos")) as w:
        w.set_variant(0, cam_fovy=fovy, body_pos=body_pos)  # the scene's first copy: its cameras are the views
        w.append(np.arange(2) * 0.02, qpos)
    poses = {}
    draw = SceneLabels.draw

    def record(self, rgb, i, q, camera_pose):
        poses.setdefault(self.unit.backend, []).append(camera_pose)
        return draw(self, rgb, i, q, camera_pose)

    monkeypatch.setattr(SceneLabels, "draw", record)
    backends = ["cpu"] + (["warp:cpu"] if importlib.util.find_spec("mujoco_warp") and not warp_unavailable() else [])
    for backend in backends:
        mjarchive.render(path, tmp_path / backend, layout="scene", cameras=[CAMERA], size=SIZE, quality="fast",
                         backend=backend, workers=1, progress=False)
    # Where the camera is: the scene model with world 0's values, posed in full.
    plan = ScenePlan.grid([0, 1], 2.0)
    scene = apply_recipe(mujoco.MjSpec.from_file(str(humanoid_xml)), plan.recipe()).compile()
    cam = scene.camera(f"scene0/{model.camera(CAMERA).name}").id
    scene.cam_fovy[cam] = 25.0
    scene.body_pos[scene.body(f"scene0/{model.body(HEAD_BODY).name}").id] = body_pos[HEAD_BODY]
    d = mujoco.MjData(scene)
    d.qpos[:] = plan.combine(model, qpos[:1])[0][0]
    mujoco.mj_forward(scene, d)
    for backend in backends:
        assert len(poses[backend]) == 2, backend
        for pos, xmat, fov in poses[backend]:
            assert fov == 25.0, backend
            np.testing.assert_allclose(pos, d.cam_xpos[cam], rtol=0, atol=1e-12, err_msg=backend)
            np.testing.assert_allclose(xmat.ravel(), d.cam_xmat[cam], rtol=0, atol=1e-12, err_msg=backend)


def test_a_same_frame_geom_moved_by_its_world_renders_as_directly_moved(tmp_path, humanoid_xml):
    """The head sphere sits at its body's frame ("same frame"): MuJoCo ignores its geom_pos unless the flag is
    cleared. A world that moves it draws it moved, pixel for pixel as a direct render of a model moved so."""
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    assert model.geom_sameframe[HEAD] != 0  # the case under test
    geom_pos = model.geom_pos.copy()
    geom_pos[HEAD, 2] += 0.25
    qpos = np.tile(model.qpos0, (2, 2, 1))
    qpos[:, :, 2] = 1.3
    path = tmp_path / "head.mjarchive"
    with mjarchive.create(path, humanoid_xml, world_ids=[0, 1], dtype="float64", variant_fields=("geom_pos",)) as w:
        w.set_variant(1, geom_pos=geom_pos)
        w.append(np.arange(2) * 0.02, qpos)
    got = _frames(path)
    moved = copy.copy(model)
    moved.geom_sameframe[HEAD] = 0
    values = {0: [(0, {})], 1: [(0, {"geom_pos": geom_pos})]}
    np.testing.assert_array_equal(got[0][1], _direct(model, qpos, values, 0, range(2), worlds=[0, 1]))
    np.testing.assert_array_equal(got[1][1], _direct(moved, qpos, values, 1, range(2), worlds=[0, 1]))
    assert (got[0][1] != got[1][1]).any()
