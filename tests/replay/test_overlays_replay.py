"""Recorded overlays drawn at replay (format 1.1): points, arrows and labels land where their world
coordinates project, in their colour, only on the frames that hold them; a frame without any is
the render without overlays; the scene layout offsets each world's; Warp refuses them clearly."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from conftest import requires_warp_replay

import mjarchive
from mjarchive import Camera, Overlay
from mjarchive.replay.views.camera import project, view_pose
from mjarchive.replay.views.scene import ScenePlan

SIZE = (96, 128)
WORLDS = [2, 8]
N = 5
GREEN = (0.0, 1.0, 0.0, 1.0)
MAGENTA = (1.0, 0.0, 1.0, 1.0)
#: Points per frame in world 2: frame 2 has none (None), frame 3 none ([]).
COUNTS = [1, 2, 0, 0, 1]
VIEW = dict(lookat=(0.0, 0.0, 1.1), distance=3.0, azimuth=90.0, elevation=-10.0)


def _body_positions(model, qpos, names):
    d = mujoco.MjData(model)
    out = np.empty((*qpos.shape[:2], len(names), 3))
    for f in range(qpos.shape[0]):
        for w in range(qpos.shape[1]):
            d.qpos[:] = qpos[f, w]
            mujoco.mj_kinematics(model, d)
            out[f, w] = [d.xpos[model.body(n).id] for n in names]
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    rng = np.random.default_rng(5)
    qpos = np.tile(model.qpos0, (N, len(WORLDS), 1))
    qpos[:, :, 2] = 1.3
    qpos[:, :, 7:] = rng.uniform(-0.3, 0.3, (N, len(WORLDS), model.nq - 7))
    qpos[:, 1, 0] += 0.6  # world 8 stands to the side
    pos = _body_positions(model, qpos, ["torso", "head", "pelvis"])  # (N, W, 3 bodies, 3)
    # Points are drawn as lit geoms, hidden inside whatever encloses them: these spheres (0.12 m)
    # are larger than the torso and head they mark.
    path = tmp_path_factory.mktemp("overlays") / "humanoid.mjarchive"
    overlays = {"target": Overlay.points(radius=0.12, rgba=GREEN, max_count=4),
                "push": Overlay.arrows(width=0.03, rgba=MAGENTA, max_count=2),
                "note": Overlay.text(rgba=(1, 1, 1, 1), max_count=2, max_chars=200)}
    with mjarchive.create(path, humanoid_xml, world_ids=WORLDS, dtype="float64", chunk_frames=4,
                          overlays=overlays) as w:
        for f in range(N):
            mine = None if f == 2 else [] if f == 3 else pos[f, 0, :COUNTS[f]]
            points = [mine, pos[f, 1, :1]]
            pelvis = pos[f, 0, 2]
            arrows = [np.concatenate([pelvis, pelvis + [0.5, 0.0, 0.0]])[None] if f == 1 else None, None]
            notes = [["x" * 150] if f == 4 else None, None]  # longer than MuJoCo's 99-byte label
            w.append(0.02 * f, qpos[f], overlays={"target": points, "push": arrows, "note": notes})
    return path, model, qpos, pos


def _frames(path, **kw):
    return np.stack([rgb for _, _, rgb in mjarchive.iter_frames(path, size=SIZE, quality="fast",
                                                                camera=Camera.free(**VIEW), **kw)])


def _pixel(model, points):
    pos, xmat = view_pose(np.asarray(VIEW["lookat"]), VIEW["distance"], VIEW["azimuth"], VIEW["elevation"])
    return project(np.asarray(points), pos, xmat, float(model.vis.global_.fovy), SIZE)


def _near(rgb, xy, colour, r=2):
    """True if a pixel within r of xy has the (emissive, so exact) overlay colour."""
    x, y = (int(v) for v in np.floor(xy))
    window = rgb[max(0, y - r):y + r + 1, max(0, x - r):x + r + 1].astype(int)
    target = np.asarray(colour[:3]) * 255
    return bool((np.abs(window - target).max(axis=-1) <= 8).any())


def test_points_land_on_their_bodies_in_their_colour_on_the_frames_that_hold_them(run):
    path, model, qpos, pos = run
    plain = _frames(path, worlds=[2], overlays=())
    drawn = _frames(path, worlds=[2], overlays=["target"])
    for f in range(N):
        torso, head = _pixel(model, pos[f, 0, :2])
        assert _near(drawn[f], torso, GREEN) == (COUNTS[f] >= 1), f"frame {f}: torso"
        assert _near(drawn[f], head, GREEN) == (COUNTS[f] >= 2), f"frame {f}: head"
        assert not _near(plain[f], torso, GREEN)
        if COUNTS[f] == 0:  # None and [] both draw nothing: the render without overlays
            np.testing.assert_array_equal(drawn[f], plain[f], err_msg=f"frame {f}")
        else:
            assert (drawn[f] != plain[f]).any(axis=-1).sum() > 10
    # World 8's point is its own (at its torso, moved aside), not world 2's.
    other = _frames(path, worlds=[8], overlays=["target"])
    for f in range(N):
        assert _near(other[f], _pixel(model, pos[f, 1, 0]), GREEN)
        assert not _near(other[f], _pixel(model, pos[f, 0, 0]), GREEN, r=1)


def test_arrows_and_labels(run):
    path, model, qpos, pos = run
    plain = _frames(path, worlds=[2], overlays=())
    drawn = _frames(path, worlds=[2], overlays=("push", "note"))
    pelvis = pos[1, 0, 2]
    # The arrow reaches from the pelvis to 0.5 m beside it: its head ends there, and not further.
    assert _near(drawn[1], _pixel(model, pelvis + [0.3, 0.0, 0.0]), MAGENTA), "the shaft"
    assert _near(drawn[1], _pixel(model, pelvis + [0.47, 0.0, 0.0]), MAGENTA, r=1), "the head"
    assert not _near(drawn[1], _pixel(model, pelvis + [0.6, 0.0, 0.0]), MAGENTA), "beyond the end"
    np.testing.assert_array_equal(drawn[0], plain[0])
    # A label without a position stands at the world's first body (the torso): MuJoCo writes it
    # rightwards from there, just above; white text.
    ys, xs = np.nonzero((drawn[4] != plain[4]).any(axis=-1))
    assert len(xs) > 20
    torso = _pixel(model, pos[4, 0, 0])
    assert abs(xs.min() + 0.5 - torso[0]) < 3 and torso[1] - 25 < ys.min() and ys.max() < torso[1]
    assert (drawn[4].astype(int).min(axis=-1) > 200).sum() > (plain[4].astype(int).min(axis=-1) > 200).sum()


def test_labels_are_cut_to_what_mujoco_holds_never_inside_a_character():
    from mjarchive.replay.views.overlay_draw import LABEL_BYTES, _label

    assert _label("x" * 150) == "x" * LABEL_BYTES
    cut = _label("é" * 60)  # two bytes each: 49 fit
    assert cut == "é" * 49 and len(cut.encode()) <= LABEL_BYTES


def test_none_draws_all_and_unknown_names_are_refused(run):
    path, model, qpos, pos = run
    every = _frames(path, worlds=[2], frames=[1])
    named = _frames(path, worlds=[2], frames=[1], overlays=("target", "push", "note"))
    np.testing.assert_array_equal(every, named)
    with pytest.raises(mjarchive.SelectionError, match=r"'velocity'.*\['target', 'push', 'note'\]"):
        next(mjarchive.iter_frames(path, overlays=["velocity"], size=SIZE))


def test_scene_overlays_follow_each_worlds_offset(run, tmp_path):
    path, model, qpos, pos = run
    plan = ScenePlan.grid(WORLDS, 2.0)
    lookat = np.array([0.0, 0.0, 1.1])
    cam = Camera.free(lookat=tuple(lookat), distance=6.0, azimuth=90.0, elevation=-10.0)
    captured = []
    mjarchive.render(path, tmp_path, layout="scene", spacing=2.0, cameras=[cam], size=SIZE, quality="fast",
                     workers=1, progress=False, hud=None, overlays=["target"],
                     on_frame=lambda w, f, rgb: captured.append(rgb.copy()))
    cam_pos, xmat = view_pose(lookat, 6.0, 90.0, -10.0)
    for f in (0, 4):
        for k in range(len(WORLDS)):
            xy = project(pos[f, k, 0] + np.asarray(plan.offsets[k]), cam_pos, xmat, float(model.vis.global_.fovy),
                         SIZE)
            assert _near(captured[f], xy, GREEN), (f, k)


def test_warp_refuses_overlays_and_renders_without_them(run, tmp_path):
    requires_warp_replay()
    path, *_ = run
    with pytest.raises(mjarchive.BackendError, match=r"backend 'warp' cannot draw overlays.*overlays=\(\)"):
        mjarchive.render(path, tmp_path, backend="warp:cpu", size=SIZE, progress=False)
    with pytest.raises(mjarchive.BackendError, match="overlays"):
        next(mjarchive.iter_frames(path, backend="warp:cpu", size=SIZE, overlays=["note"]))
    _, _, rgb = next(mjarchive.iter_frames(path, backend="warp:cpu", size=SIZE, quality="fast", overlays=(),
                                           worlds=[2], frames=[0], camera=Camera.free(**VIEW)))
    assert rgb.std() > 5


def test_overlays_are_part_of_the_resume_key(run, tmp_path):
    path, *_ = run
    kw = dict(worlds=[2], frames=[0, 1], cameras=[Camera.free(**VIEW)], size=SIZE, quality="fast", workers=1,
              progress=False)
    (first,) = mjarchive.render(path, tmp_path, overlays=(), **kw)
    before = first.read_bytes()
    (again,) = mjarchive.render(path, tmp_path, **kw)  # all overlays: another request, rendered again
    assert again == first and again.read_bytes() != before


def test_cli_overlays_option(run):
    from mjarchive.cli.main import build_parser

    parser = build_parser()
    parse = lambda *extra: parser.parse_args(["render", str(run[0]), "--out", "o", *extra]).overlays
    assert parse() is None
    assert parse("--overlays", "none") == ()
    assert parse("--overlays", "target,push") == ("target", "push")
    with pytest.raises(SystemExit):
        parse("--overlays", "target,,push")


# -- the rule shared with the viewer, in a scene -------------------------------------------------------

BODILESS_XML = """<mujoco><worldbody><light pos="0 0 3"/><geom type="plane" size="2 2 .1"/>
<geom type="box" size=".1 .1 .1" pos="0 0 .5"/></worldbody></mujoco>"""


def _painted(path, spec, plan, recipe_cameras=()):
    """What OverlayPainter adds to a scene of `plan` (copies of `spec`) at frame 0: the geoms' positions (n, 3)
    and labels, and the scene model and data it drew them for."""
    from mjarchive.archive.bundle.compile_child import apply_recipe
    from mjarchive.replay.views.overlay_draw import OverlayPainter

    scene = apply_recipe(spec, plan.recipe(recipe_cameras)).compile()
    d = mujoco.MjData(scene)
    with mjarchive.open(path) as archive:
        sel = archive.select(worlds=list(plan.world_ids), frames=slice(0, 1))
        q, _, _ = plan.combine(archive.manifest.layout, sel.qpos)
        d.qpos[:] = q[0]
        mujoco.mj_kinematics(scene, d)
        scn = mujoco.MjvScene(scene, maxgeom=50)
        OverlayPainter(archive, list(archive.overlays), sel, plan, scene).draw(0, scn, d)
    geoms = [scn.geoms[i] for i in range(scn.ngeom)]
    return np.array([g.pos for g in geoms]), [g.label for g in geoms], scene, d


def test_scene_labels_without_position_stand_at_each_copys_first_body(run, tmp_path, humanoid_xml):
    path, model, qpos, pos = run
    plan = ScenePlan.grid(WORLDS, 2.0)
    one = tmp_path / "labels.mjarchive"
    with mjarchive.create(one, humanoid_xml, world_ids=WORLDS, dtype="float64",
                          overlays={"note": Overlay.text(max_count=2)}) as w:
        w.append(0.0, qpos[0], overlays={"note": [["first", ((0.1, 0.2, 0.3), "placed")], ["second"]]})
    # A replay camera's body appended to the scene (as Warp's replay model has), which is no world's.
    positions, labels, scene, d = _painted(one, mujoco.MjSpec.from_file(str(humanoid_xml)), plan, [40.0])
    assert labels == ["first", "placed", "second"]
    torso = [d.xpos[scene.body(f"scene{k}/torso").id] for k in range(len(WORLDS))]
    np.testing.assert_allclose(positions[0], torso[0], atol=1e-12)
    np.testing.assert_allclose(positions[1], np.add((0.1, 0.2, 0.3), plan.offsets[0]), atol=1e-12)
    np.testing.assert_allclose(positions[2], torso[1], atol=1e-12)
    assert np.linalg.norm(torso[1] - torso[0]) > 1.0  # each world's own copy, not the first's


def test_scene_labels_of_a_model_without_bodies_stand_at_each_worlds_cell(tmp_path):
    xml = tmp_path / "bodiless.xml"
    xml.write_text(BODILESS_XML)
    path = tmp_path / "bodiless.mjarchive"
    with mjarchive.create(path, xml, world_ids=[0, 1, 2], overlays={"note": Overlay.text(max_count=1)}) as w:
        w.append(0.0, np.zeros((3, 0)), overlays={"note": [["a"], ["b"], ["c"]]})
    plan = ScenePlan.grid([0, 1, 2], 3.0)
    positions, labels, _, _ = _painted(path, mujoco.MjSpec.from_string(BODILESS_XML), plan)
    assert labels == ["a", "b", "c"]
    # At each world's origin in the scene (its grid offset), as the viewer draws them; not all at the
    # scene's origin.
    np.testing.assert_allclose(positions, np.asarray(plan.offsets), atol=1e-12)


# -- the resume key of archives without overlays or variants ------------------------------------------

def _planned(archive, drawn=()):
    from pathlib import Path

    from mjarchive.replay.plan import plan_units

    return plan_units(archive, location=str(archive.location), storage_options=None, worlds=None, frames=None,
                      cameras=[(1, "side")], size=SIZE, quality="fast", backend="cpu", layout="per-world",
                      split_episodes=False, model_mjb=None, out_dir=Path("."), model=archive.model(), overlays=drawn)


def _key_before_1_1(archive, outputs, fps, encoder):
    """request_key as it was before format 1.1."""
    import hashlib
    import json

    from mjarchive.replay import resume

    man, h = archive.manifest, hashlib.sha256()
    h.update(json.dumps({"format": resume._FORMAT, "version": resume._VERSION,
                         "archive": {"model_sha256": man.model_sha256, "n_frames": int(archive.n_frames),
                                     "world_ids": [int(w) for w in archive.world_ids], "created": man.created},
                         "fps": float(fps), "encoder": encoder, "extra": {}}, sort_keys=True).encode())
    for o in outputs:
        first = o.units[0]
        h.update(json.dumps({
            "name": o.path.name, "camera": resume._camera_key(o.camera), "world_ids": [int(w) for w in o.world_ids],
            "n_frames": int(o.n_frames), "grid_block": int(o.grid_block), "size": list(first.size),
            "quality": first.quality, "backend": first.backend, "model": None, "recipe": first.recipe,
        }, sort_keys=True).encode())
        for u in o.units:
            h.update(np.asarray([u.world_id, len(u.frames)], np.int64).tobytes())
            h.update(np.asarray(u.frames, np.int64).tobytes())
    return h.hexdigest()


def test_a_format_1_0_archives_resume_key_is_unchanged(tmp_path, humanoid_xml):
    """Variant event counts and overlays enter the key only for archives that use them: a render of a
    format 1.0 archive started before the upgrade resumes after it."""
    from mjarchive.replay import resume

    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    kw = dict(fps=30.0, encoder={"codec": "h264"})
    plain = tmp_path / "plain.mjarchive"
    with mjarchive.create(plain, humanoid_xml, n_worlds=2, chunk_frames=4) as w:
        w.append(np.arange(6) * 0.02, np.tile(model.qpos0, (6, 2, 1)))
    with mjarchive.open(plain) as archive:
        assert archive.variant_fields == () and archive.overlays == {}
        outputs = _planned(archive)
        assert "variants" not in resume.request_head(archive, **kw)["archive"]
        assert all("overlays" not in resume.output_entry(o, False) for o in outputs)
        assert resume.request_key(archive, outputs, **kw) == _key_before_1_1(archive, outputs, **kw)
    # An archive with variants has its event counts in the key, one with overlays which are drawn.
    varied = tmp_path / "varied.mjarchive"
    with mjarchive.create(varied, humanoid_xml, n_worlds=1, variant_fields=("geom_rgba",),
                          overlays={"note": Overlay.text(max_count=1)}) as w:
        w.append(0.0, model.qpos0[None], overlays={"note": [["x"]]})
    with mjarchive.open(varied) as archive:
        assert resume.request_head(archive, **kw)["archive"]["variants"] == {"geom_rgba": 0}
        keys = {resume.request_key(archive, _planned(archive, drawn), **kw) for drawn in ((), ("note",))}
        assert len(keys) == 2 and _key_before_1_1(archive, _planned(archive), **kw) not in keys


def test_the_cpu_painter_reads_what_the_scene_holds_after_the_models_geoms(humanoid_xml):
    from types import SimpleNamespace

    from mjarchive.replay.backends.cpu import CpuRenderer

    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    renderer = CpuRenderer(model, (32, 32))
    try:
        assert renderer.overlay_capacity == renderer.renderer.scene.maxgeom - model.ngeom > 0
    finally:
        renderer.close()
    crowded = SimpleNamespace(renderer=SimpleNamespace(scene=SimpleNamespace(maxgeom=5)),
                              model=SimpleNamespace(ngeom=9))
    assert CpuRenderer.overlay_capacity.fget(crowded) == 0  # a model that fills the scene leaves none
