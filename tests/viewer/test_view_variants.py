"""`mjarchive view` of format 1.1 archives: each world drawn with its variant values in force, overlays.

Server-side checks of what the page is sent (colours, scales, per-shape meshes, overlay primitives at
each world's grid offset, nothing extra for an archive without either), and one page in Debian's
Chromium (headless, via playwright, as `test_view_browser.py`) that must redraw when a world's looks
change and when an overlay is hidden.
"""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest

import mjarchive

pytest.importorskip("viser", reason="the viewer needs viser (pip install 'mjarchive[view]')")

from mjarchive.replay.views.scene import ScenePlan  # noqa: E402
from test_view_browser import _canvas, _changed, _input, _open, _save, _wait_status, browser, run  # noqa: E402,F401


# -- what the page is sent (no browser) -----------------------------------------------------------------
LOOKS_XML = """<mujoco>
  <asset><material name="grey" rgba=".2 .2 .2 1"/></asset>
  <worldbody>
    <light pos="0 0 3"/>
    <geom name="floor" type="plane" size="1 1 .1" rgba=".8 .8 .8 1"/>
    <body name="thing" pos="0 0 .5"><joint type="slide" axis="1 0 0"/>
      <geom name="ball" type="sphere" size=".1" rgba="1 0 0 1"/>
      <geom name="rod" type="capsule" size=".03 .1" pos=".25 0 0" rgba="0 1 0 1"/>
      <geom name="crate" type="box" size=".05 .05 .05" pos="-.25 0 0" material="grey"/>
      <geom name="ghost" type="box" size=".05 .05 .05" pos="0 .25 0" rgba="1 1 1 0"/>
      <site name="mark" size=".02"/>
    </body>
  </worldbody>
</mujoco>"""
LOOKS_N, LOOKS_CHANGE = 8, 4


@pytest.fixture(scope="module")
def looks_run(tmp_path_factory) -> Path:
    """Worlds 0 and 1; from frame 4 world 1's ball turns blue, its rod is longer, its crate twice the size,
    the material paler, its ghost box shows and it stands 0.3 m higher. Overlays: a target point per
    world (world 0 has a second from frame 4), an arrow for world 1, a label at world 0's body."""
    tmp = tmp_path_factory.mktemp("looks")
    xml = tmp / "looks.xml"
    xml.write_text(LOOKS_XML)
    model = mujoco.MjModel.from_xml_path(str(xml))
    rgba, size, body_pos = model.geom_rgba.copy(), model.geom_size.copy(), model.body_pos.copy()
    rgba[model.geom("ball").id] = (0, 0, 1, 1)
    rgba[model.geom("ghost").id] = (1, 1, 0, 0.5)
    size[model.geom("rod").id, 1] = 0.2
    size[model.geom("crate").id] *= 2
    body_pos[model.body("thing").id, 2] += 0.3
    path = tmp / "looks.mjarchive"
    overlays = {"target": mjarchive.Overlay.points(radius=0.05, max_count=2),
                "push": mjarchive.Overlay.arrows(width=0.02, max_count=1),
                "note": mjarchive.Overlay.text(max_count=1)}
    qpos = np.tile(model.qpos0, (LOOKS_N, 2, 1))
    with mjarchive.create(path, xml, world_ids=[0, 1], dtype="float64", chunk_frames=4, overlays=overlays,
                          variant_fields=("geom_rgba", "geom_size", "mat_rgba", "body_pos", "site_rgba",
                                          "light_diffuse")) as w:
        for f in range(LOOKS_N):
            if f == LOOKS_CHANGE:
                w.set_variant(1, geom_rgba=rgba, geom_size=size, body_pos=body_pos,
                              mat_rgba=np.array([[0.9, 0.9, 0.9, 1.0]], np.float32))
            w.append(0.1 * (f + 1), qpos[f], overlays={
                "target": [[[0.0, 0.0, 1.0 + 0.1 * f]] + ([[0.3, 0.0, 1.0]] if f >= LOOKS_CHANGE else []),
                           [[0.0, 0.0, 1.5]]],
                "push": [None, [[0, 0, 1, 0.5, 0, 1]]],
                "note": [["hello"], None]})
    return path


def _part(v, name, world=None):
    g = v._model.geom(name).id
    parts = [p for p in v._drawn if p.geom == g]
    if world is None:
        (part,) = parts
        return part, 0
    for p in parts:
        rows = list(range(len(v.world_ids)))[p.rows] if isinstance(p.rows, slice) else list(p.rows)
        if world in rows:
            return p, rows.index(world)
    raise AssertionError(f"world {world} draws no {name}")


def test_each_world_is_drawn_with_its_variant_values_in_force(looks_run):
    with mjarchive.view(looks_run, port=0, block=False) as v:
        assert v._layer.varies and v.world_ids == (0, 1)
        status = v._status.content
        assert "not shown in the viewer: site\\_rgba, light\\_diffuse; mjarchive render draws them" in status
        before = {name: np.array(_part(v, name)[0].handle.batched_positions) for name in ("ball", "crate")}
        ball, _ = _part(v, "ball")
        np.testing.assert_array_equal(ball.handle.batched_colors, [[255, 0, 0], [255, 0, 0]])
        ghost, _ = _part(v, "ghost")
        np.testing.assert_array_equal(ghost.handle.batched_scales, np.zeros((2, 3)))  # clear in both worlds
        crate, _ = _part(v, "crate")
        np.testing.assert_array_equal(crate.handle.batched_colors, [[51, 51, 51]] * 2)  # its material's colour
        assert crate.handle.batched_scales is None

        v.seek(LOOKS_CHANGE)
        np.testing.assert_array_equal(ball.handle.batched_colors, [[255, 0, 0], [0, 0, 255]])
        np.testing.assert_array_equal(crate.handle.batched_colors, [[51, 51, 51], [229, 229, 229]])
        np.testing.assert_allclose(crate.handle.batched_scales, [[1, 1, 1], [2, 2, 2]])
        np.testing.assert_allclose(ghost.handle.batched_scales, [[0, 0, 0], [1, 1, 1]])
        np.testing.assert_allclose(ghost.handle.batched_opacities, [0.0, 0.5])
        rods = [p for p in v._drawn if p.geom == v._model.geom("rod").id]
        assert len(rods) == 2  # a capsule cannot be scaled: one mesh per shape
        (long_rod,) = [p for p in rods if p.key is not None]
        assert list(long_rod.rows) == [1] and np.ptp(long_rod.mesh.vertices[:, 2]) == pytest.approx(2 * 0.23, abs=1e-6)
        for name in ("ball", "crate"):  # world 1 stands 0.3 m higher from the change on, world 0 does not
            now = np.asarray(_part(v, name)[0].handle.batched_positions)
            np.testing.assert_allclose(now - before[name], [[0, 0, 0], [0, 0, 0.3]], atol=1e-6)

        v.seek(LOOKS_CHANGE - 1)  # back: the model's values again
        np.testing.assert_array_equal(ball.handle.batched_colors, [[255, 0, 0], [255, 0, 0]])
        assert crate.handle.batched_scales is None and ghost.handle.batched_opacities is None
        (rod,) = [p for p in v._drawn if p.geom == v._model.geom("rod").id]
        assert rod.key is None and isinstance(rod.rows, slice)

        v.show_worlds([1])
        v.seek(LOOKS_CHANGE)
        ball, _ = _part(v, "ball")
        np.testing.assert_array_equal(ball.handle.batched_colors, [[0, 0, 255]])
        (rod,) = [p for p in v._drawn if p.geom == v._model.geom("rod").id]
        assert rod.key == (0.03, 0.2, 0.0) and isinstance(rod.rows, slice)


def test_the_looks_are_counted_once_per_change(looks_run, monkeypatch):
    from mjarchive.viewer.drawing import GeomLayer

    counted = []
    real = GeomLayer.check_looks
    monkeypatch.setattr(GeomLayer, "check_looks", lambda self, looks: counted.append(1) or real(self, looks))
    with mjarchive.view(looks_run, port=0, block=False) as v:
        assert len(counted) == 1  # the first frame's looks: checked before anything is sent, not again
        v.seek(LOOKS_CHANGE)
        v.seek(LOOKS_CHANGE + 1)  # the same values in force: nothing to count
        v.seek(LOOKS_CHANGE - 1)
        assert len(counted) == 3


def test_overlays_are_drawn_at_each_world_offset_and_can_be_hidden(looks_run):
    with mjarchive.view(looks_run, port=0, block=False) as v:
        layer = v._overlays
        offsets = np.asarray(ScenePlan.grid([0, 1], 2.0).offsets)
        for k in (0, 5):
            v.seek(k)
            target = layer._nodes["target"]
            want = [[0, 0, 1 + 0.1 * k] + offsets[0]] + ([[0.3, 0, 1] + offsets[0]] if k >= LOOKS_CHANGE else [])
            np.testing.assert_allclose(target.batched_positions, want + [[0, 0, 1.5] + offsets[1]], atol=1e-6)
            assert target.batched_wxyzs.shape == (len(want) + 1, 4)
            push = [[[0, 0, 1] + offsets[1], [0.5, 0, 1] + offsets[1]]]
            np.testing.assert_allclose(layer._nodes["push"].points, push, atol=1e-6)
            (label,) = layer._labels["note"]
            body = v._window.poses(k).body_pos[0, 1]
            assert label.text == "hello" and label.visible
            np.testing.assert_allclose(label.position, body + offsets[0], atol=1e-6)
        v._on_overlay("note", False)
        v._on_overlay("target", False)
        assert not label.visible and not layer._nodes["target"].visible and layer._nodes["push"].visible
        v.seek(2)  # hidden tracks stay hidden and are not updated
        assert not label.visible and not layer._nodes["target"].visible
        np.testing.assert_allclose(layer._nodes["target"].batched_positions[0], [0, 0, 1.5] + offsets[0], atol=1e-6)
        assert len(layer._nodes["target"].batched_positions) == 3  # frame 5's
        v._on_overlay("target", True)
        assert layer._nodes["target"].visible
        np.testing.assert_allclose(layer._nodes["target"].batched_positions[0], [0, 0, 1.2] + offsets[0], atol=1e-6)


def test_worlds_that_draw_another_mesh_get_their_own_batched_mesh(tmp_path):
    xml = tmp_path / "meshes.xml"
    xml.write_text("""<mujoco><asset>
      <mesh name="tet" vertex="0 0 0  .1 0 0  0 .1 0  0 0 .1"/>
      <mesh name="cube" vertex="-.1 -.1 -.1 .1 -.1 -.1 .1 .1 -.1 -.1 .1 -.1 -.1 -.1 .1 .1 -.1 .1 .1 .1 .1 -.1 .1 .1"/>
    </asset><worldbody><body pos="0 0 .5"><joint type="slide"/><geom type="mesh" mesh="tet"/></body></worldbody>
    </mujoco>""")
    path = tmp_path / "meshes.mjarchive"
    with mjarchive.create(path, xml, world_ids=[0, 1, 2], variant_fields=("geom_dataid",)) as w:
        for f in range(4):
            if f == 2:
                w.set_variant([1, 2], geom_dataid=np.array([1], np.int32))
            w.append(0.1 * (f + 1), np.zeros((3, 1)))
    with mjarchive.view(path, port=0, block=False) as v:
        assert [len(p.mesh.vertices) for p in v._drawn] == [4]
        v.seek(2)
        tet, cube = v._drawn
        assert tet.key is None and list(tet.rows) == [0] and cube.key == 1 and list(cube.rows) == [1, 2]
        assert len(cube.mesh.vertices) == 8 and len(cube.handle.batched_positions) == 2
        offsets = np.asarray(ScenePlan.grid([0, 1, 2], 2.0).offsets)
        at = np.tile(tet.handle.batched_positions - offsets[:1], (2, 1))
        np.testing.assert_allclose(cube.handle.batched_positions - offsets[1:], at, atol=1e-6)  # the geom's pose
        v.seek(1)
        (back,) = v._drawn
        assert back.key is None and len(back.handle.batched_positions) == 3


def test_an_archive_without_variants_or_overlays_does_no_extra_work(run, monkeypatch):
    from mjarchive.viewer.drawing import GeomLayer

    calls = []
    monkeypatch.setattr(GeomLayer, "set_looks", lambda *a, **k: calls.append("set_looks"))
    with mjarchive.view(run, port=0, block=False) as v:
        assert not v._layer.varies and v._overlays is None
        monkeypatch.setattr(v._window, "variant_segments", lambda *a: calls.append("segments"))
        monkeypatch.setattr(v._window, "overlays", lambda *a: calls.append("overlays"))
        for k in (3, 9, 0):
            v.seek(k)
        assert "not shown" not in v._status.content
    assert calls == []


# -- the browser -----------------------------------------------------------------------------------------
def test_the_page_redraws_when_a_world_changes_its_looks_and_when_an_overlay_is_hidden(browser, looks_run, tmp_path):
    with mjarchive.view(looks_run, port=0, block=False, frame=LOOKS_CHANGE - 1) as v:
        page = _open(browser, v.url)
        errors = []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            _wait_status(page, LOOKS_CHANGE - 1, LOOKS_N)
            page.get_by_text("not shown in the viewer").first.wait_for(timeout=10_000)
            before = _canvas(page)
            _save(tmp_path, "looks-before", before)
            v.seek(LOOKS_CHANGE)
            _wait_status(page, LOOKS_CHANGE, LOOKS_N)
            after = _canvas(page)
            _save(tmp_path, "looks-after", after)
            assert _changed(before, after) > 0.002, "world 1's new colours and sizes were not drawn"
            blue = (after[..., 2].astype(int) - after[..., :2].astype(int).max(axis=-1)) > 80
            assert blue.mean() > 0.0005, "world 1's blue ball is not on the page"
            _input(page, "target").uncheck()
            _input(page, "push").uncheck()
            page.wait_for_function("() => true")
            hidden = _canvas(page)
            _save(tmp_path, "looks-overlays-hidden", hidden)
            assert _changed(after, hidden) > 0.0005, "hiding the overlays did not redraw the scene"
            assert not errors, errors
        finally:
            page.close()
