"""The viewer looks like MuJoCo's own render: a page's screenshot against `mujoco.Renderer`.

A one-world humanoid archive is viewed in Debian's Chromium (headless, SwiftShader, as in
test_view_browser.py); the CPU render uses a free camera placed where the page's camera is (look-at,
distance, azimuth, elevation, vertical fov) at the same size. Compared over the robot's pixels (a
segmentation render's geoms not on the world body, eroded by 2 px, in both images' common area),
the mean absolute colour difference must stay within ROBOT_BOUND; the old look (the material's
pale beige drawn flat, no texture) is at least 1.6 times as far. Measured with viser 1.1.1:
26 for the page, 51 for the old look; what is left is mostly the page's tone mapping (ACES), which
desaturates the orange, and MuJoCo's floor reflection. The floor must
show the checker (two clearly distinct colours) and the background must not be plain white.
Set MJARCHIVE_SAVE_SCREENSHOT=1 to write docs/images/viewer-vs-render.png (viewer | render).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import mujoco
import numpy as np
import pytest

import mjarchive

pytest.importorskip("viser", reason="the viewer needs viser (pip install 'mjarchive[view]')")

from mjarchive.viewer.geometry import geom_meshes  # noqa: E402
from mjarchive.viewer.looks import (MAX_TEXTURE_BYTES, Textures, add_lights, headlight_position,  # noqa: E402
                                    sky_image, texture_image)
from test_view_browser import _canvas, _wait_status, browser  # noqa: E402,F401  (a fixture)

#: Mean absolute difference (0..255, over RGB) between the page and the CPU render on the robot.
ROBOT_BOUND = 30.0
SIZE = {"width": 480, "height": 360}  # CSS pixels; screenshots at device scale 1


def _free_camera(position, look_at) -> mujoco.MjvCamera:
    cam = mujoco.MjvCamera()
    cam.type = mujoco.mjtCamera.mjCAMERA_FREE
    forward = np.asarray(look_at, float) - np.asarray(position, float)
    cam.distance = float(np.linalg.norm(forward))
    forward /= cam.distance
    cam.lookat[:] = look_at
    cam.azimuth = math.degrees(math.atan2(forward[1], forward[0]))
    cam.elevation = math.degrees(math.asin(forward[2]))
    return cam


def _eroded(mask: np.ndarray, px: int = 2) -> np.ndarray:
    out = mask.copy()
    for _ in range(px):
        inner = out.copy()
        inner[1:] &= out[:-1]
        inner[:-1] &= out[1:]
        inner[:, 1:] &= out[:, :-1]
        inner[:, :-1] &= out[:, 1:]
        out = inner
    return out


def test_the_page_matches_mujocos_render_of_the_same_view(browser, tmp_path, humanoid_xml):  # noqa: F811
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    path = tmp_path / "one.mjarchive"
    with mjarchive.create(path, humanoid_xml, world_ids=[0], dtype="float64") as w:
        w.append(np.zeros(1), model.qpos0[None, None])
    with mjarchive.view(path, port=0, block=False) as v:
        page = browser.new_page(viewport=SIZE, device_scale_factor=1)
        try:
            page.goto(v.url)
            _wait_status(page, 0, 1)
            deadline = time.monotonic() + 10
            while not v._server.get_clients() and time.monotonic() < deadline:
                time.sleep(0.05)
            (client,) = v._server.get_clients().values()
            shot = _canvas(page)
            cam = client.camera
            position, look_at, fov = np.asarray(cam.position), np.asarray(cam.look_at), float(cam.fov)
            assert np.allclose(v._headlight.position, headlight_position(position, look_at), atol=1e-4)
            page.mouse.move(100, 200)  # orbit, as a user drags: the headlight moves with the page's camera
            page.mouse.down()
            page.mouse.move(300, 200, steps=8)
            page.mouse.up()
            deadline = time.monotonic() + 10
            while True:
                now = headlight_position(cam.position, cam.look_at)
                first = headlight_position(position, look_at)
                if np.allclose(v._headlight.position, now, atol=1e-3) and not np.allclose(now, first, atol=0.1):
                    break
                assert time.monotonic() < deadline, f"the headlight stayed at {v._headlight.position}"
                time.sleep(0.05)
        finally:
            page.close()
    assert np.allclose(cam.up_direction, (0, 0, 1), atol=1e-6)
    h, w = shot.shape[:2]
    model.vis.global_.fovy = math.degrees(fov)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    camera = _free_camera(position, look_at)
    with mujoco.Renderer(model, h, w) as renderer:
        renderer.update_scene(data, camera)
        render = renderer.render()
        renderer.enable_segmentation_rendering()
        renderer.update_scene(data, camera)
        seg = renderer.render()
    geom = (seg[..., 1] == mujoco.mjtObj.mjOBJ_GEOM) & (seg[..., 0] >= 0)
    body = np.where(geom, model.geom_bodyid[np.clip(seg[..., 0], 0, None)], -1)
    robot = _eroded(geom & (body > 0))
    floor = _eroded(geom & (seg[..., 0] == model.geom("floor").id), 3)
    floor[: h // 2] = False  # the near floor: far away the checker blurs into one colour
    floor[-h // 8:] = False  # and clear of the page's bottom (viser's notification area)
    if os.environ.get("MJARCHIVE_SAVE_SCREENSHOT") == "1":
        from PIL import Image

        docs = Path(__file__).resolve().parents[2] / "docs" / "images"
        docs.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.concatenate([shot, np.full((h, 8, 3), 255, np.uint8), render], axis=1)).save(
            docs / "viewer-vs-render.png")

    assert robot.sum() > 1000 and floor.sum() > 2000, "the camera does not see the robot and the floor"

    page_px, render_px = shot[robot].astype(float), render[robot].astype(float)
    robot_diff = float(np.abs(page_px - render_px).mean())
    beige = 255 * model.mat_rgba[model.material("body").id, :3]  # the old look: the material's colour, flat
    old_diff = float(np.abs(beige - render_px).mean())
    print(f"robot: mean |page - render| = {robot_diff:.1f} (bound {ROBOT_BOUND}); old look {old_diff:.1f}")
    assert robot_diff <= ROBOT_BOUND
    assert old_diff >= 1.6 * ROBOT_BOUND, "the bound would let the old flat colour pass"

    # The floor shows two checker colours, both near the render's.
    tiles = shot[floor].astype(float)
    lum = tiles.mean(axis=1)
    dark, light = tiles[lum < np.median(lum)].mean(axis=0), tiles[lum >= np.median(lum)].mean(axis=0)
    assert np.abs(light - dark).sum() > 25, f"one colour on the floor: {dark} vs {light}"
    assert float(np.abs(tiles.mean(axis=0) - render[floor].astype(float).mean(axis=0)).mean()) < 40
    # The sky: not viser's plain white background.
    sky = shot[: h // 8].reshape(-1, 3).astype(float)
    assert sky.mean() < 200 and sky[:, 2].mean() > sky[:, 0].mean(), f"the background is not a sky: {sky.mean(0)}"


# -- without a browser -------------------------------------------------------------------------------
def test_textures_are_drawn_where_they_have_coordinates_and_tint_the_rest(mug_xml, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(mug_xml))
    (g,) = [g for g in range(model.ngeom) if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH]
    (mesh,) = [m for m in geom_meshes(model, groups=(0, 1)) if m.geom == g]
    textures = Textures(model)
    assert textures.drawable(g) and not textures.drawable(0)  # the floor's material has no texture
    glb = textures.mesh(mesh)
    mid = model.geom_dataid[g]
    assert len(glb.faces) == model.mesh_facenum[mid] and glb.visual.uv.shape == (len(glb.vertices), 2)
    # Each corner keeps its vertex and its own texture coordinate (seams split a vertex in two).
    corners = glb.vertices[glb.faces.reshape(-1)]
    face = model.mesh_face[model.mesh_faceadr[mid]:][:model.mesh_facenum[mid]].reshape(-1)
    np.testing.assert_allclose(corners, mesh.vertices[face], atol=1e-6)
    uv = model.mesh_texcoord[model.mesh_texcoordadr[mid]:][model.mesh_facetexcoord[model.mesh_faceadr[mid]:][
        :model.mesh_facenum[mid]].reshape(-1)]
    np.testing.assert_allclose(glb.visual.uv[glb.faces.reshape(-1)], np.c_[uv[:, 0], 1 - uv[:, 1]], atol=1e-6)
    assert glb.visual.material.baseColorTexture.size == (1024, 1024)

    humanoid = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    textures = Textures(humanoid)
    floor, torso = humanoid.geom("floor").id, humanoid.geom("torso").id
    assert textures.drawable(floor) and not textures.drawable(torso)  # a cube texture: its mean colour
    np.testing.assert_allclose(textures.tint(torso), (0.8, 0.6, 0.4), atol=0.02)
    np.testing.assert_allclose(textures.tint(torso, textured=True), 1.0)
    # The plane repeats its checker every 2 / texrepeat metres, as MuJoCo draws it (texuniform).
    plane = [m for m in geom_meshes(humanoid) if m.geom == floor][0]
    uv = textures.mesh(plane).visual.uv
    np.testing.assert_allclose(uv[:, 0], plane.vertices[:, 0] / 2, atol=1e-6)


def test_hostile_textures_are_downsampled_bounded_or_refused():
    planes = "".join(f'<geom type="plane" size="1 1 .1" pos="{3 * i} 0 0" material="m{i}"/>' for i in range(22))
    assets = "".join(f'<texture name="t{i}" type="2d" builtin="checker" width="1024" height="1024"/>'
                     f'<material name="m{i}" texture="t{i}"/>' for i in range(22))
    model = mujoco.MjModel.from_xml_string(f"""<mujoco><asset>{assets}
      <texture name="big" type="2d" builtin="checker" width="3000" height="1500"/></asset>
      <worldbody>{planes}</worldbody></mujoco>""")
    big = model.ntex - 1
    assert texture_image(model, big).shape == (500, 1000, 3)  # every 3rd pixel: at most 1024 a side
    textures = Textures(model)
    drawn = [textures.mesh(m) is not None for m in geom_meshes(model)]
    n = MAX_TEXTURE_BYTES // (1024 * 1024 * 3)
    assert drawn == [True] * n + [False] * (22 - n)  # then in the texture's mean colour
    assert textures.mesh(geom_meshes(model)[0]) is not None  # drawn again (a rebuilt part): counted once
    model.tex_adr[big] = model.tex_data.size - 10
    with pytest.raises(mjarchive.MjArchiveError, match="does not fit"):
        texture_image(model, big)


def test_the_models_lights_replace_visers(humanoid_xml):
    import viser

    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    server = viser.ViserServer(port=0, verbose=False)
    try:
        lights = add_lights(server.scene, model, np.array([0.0, -4.0, 2.0]), np.zeros(3))
    finally:
        server.stop()
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    assert len(lights) == 2 + model.nlight  # ambient, headlight, each light
    np.testing.assert_allclose(lights[2].position, data.light_xpos[0], atol=1e-6)
    np.testing.assert_allclose(lights[1].position, np.array([0.0, -4.0, 2.0]) / np.sqrt(20), atol=1e-6)
    assert sky_image(model).shape == (32, 32, 3)
