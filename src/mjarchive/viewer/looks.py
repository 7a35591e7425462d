"""What a model looks like in the browser viewer, close to MuJoCo's own renderer: materials,
textures, lights and the sky.

- Colour: MuJoCo multiplies a material's texture by the geom's colour. A geom whose material has a
  2D texture is drawn textured (`Textures.mesh`) when its mesh has texture coordinates (mesh geoms
  with texcoords, and planes, mapped as MuJoCo maps them with texrepeat and texuniform); any other
  texture (cube, or 2D on a primitive) tints the colour by the texture's mean (`Textures.tint`).
  Emission adds the material's colour times emission; shininess sets the roughness.
- Lights (`add_lights`): the model's lights where they stand at qpos0 (a light that tracks a body
  stays there), its ambient, and the headlight as a directional light along the camera's view
  (`headlight_position`; one light for the page, so it follows the camera last moved).
- Sky (`sky_image`): the skybox's side face as the page's background (fixed to the screen, so it
  does not turn with the camera), or black as in MuJoCo without a skybox.

Textures come from archives made by others: each is downsampled to MAX_TEXTURE_SIDE pixels per side,
and once MAX_TEXTURE_BYTES of pixels are sent to a page (each textured geom sends its texture),
further geoms are drawn in their texture's mean colour.
"""

from __future__ import annotations

import math
from typing import Any

import mujoco
import numpy as np

from .._errors import MjArchiveError
from .geometry import GeomMesh

__all__ = ["MAX_TEXTURE_BYTES", "MAX_TEXTURE_SIDE", "Textures", "add_lights", "headlight_position", "sky_image",
           "texture_id", "texture_image"]

#: A texture is downsampled (by a whole stride) to at most this many pixels per side before it is sent.
MAX_TEXTURE_SIDE = 1024
#: Texture pixels (bytes, after downsampling) sent to a page in all; beyond, geoms take the mean colour.
MAX_TEXTURE_BYTES = 64 * 2**20
_G = mujoco.mjtGeom
_TEX_2D = int(mujoco.mjtTexture.mjTEXTURE_2D)
_TEX_SKYBOX = int(mujoco.mjtTexture.mjTEXTURE_SKYBOX)
# MuJoCo light colour -> three.js intensity. Physically, pi gives MuJoCo's diffuse term (Lambert's 1/pi), but
# the page tone-maps (ACES) what MuJoCo clips: 2 matches MuJoCo's render best (tests/viewer/test_view_looks.py).
_LIGHT_SCALE = 2.0


def texture_id(model: mujoco.MjModel, material: int) -> int:
    """The RGB texture of `material` (-1: none); mat_texid is (nmat, mjNTEXROLE) in MuJoCo >= 3.2."""
    if not 0 <= material < model.nmat:
        return -1
    ids = np.asarray(model.mat_texid[material]).reshape(-1)
    role = int(mujoco.mjtTextureRole.mjTEXROLE_RGB) if ids.size > 1 else 0
    t = int(ids[role])
    return t if 0 <= t < model.ntex else -1


def texture_image(model: mujoco.MjModel, t: int) -> np.ndarray:
    """Texture t's pixels (H, W, 3 or 4) uint8, rows as stored (a cube's six faces stacked), taken
    every k-th pixel so that no side exceeds MAX_TEXTURE_SIDE. MjArchiveError if tex_data lacks them."""
    w, h, c, adr = (int(x) for x in (model.tex_width[t], model.tex_height[t], model.tex_nchannel[t], model.tex_adr[t]))
    if w <= 0 or h <= 0 or not 1 <= c <= 4 or adr < 0 or adr + w * h * c > model.tex_data.size:
        raise MjArchiveError(f"texture {t} ({w}x{h}, {c} channels) does not fit the model's texture data; "
                             "recompile the model from its XML")
    step = math.ceil(max(w, h) / MAX_TEXTURE_SIDE)
    img = np.asarray(model.tex_data[adr:adr + w * h * c]).reshape(h, w, c)[::step, ::step]
    if c < 3:  # grey (and alpha)
        img = np.concatenate([np.repeat(img[..., :1], 3, axis=-1), img[..., 1:]], axis=-1)
    return np.ascontiguousarray(img, dtype=np.uint8)


class Textures:
    """Textured meshes for geoms whose texture can be drawn, with the bytes sent bounded."""

    def __init__(self, model: mujoco.MjModel):
        self._model = model
        self._images: dict[int, Any] = {}  # texture id -> PIL image
        self._means: dict[int, np.ndarray] = {}  # texture id -> mean colour (3,) in 0..1
        self._meshes: dict[tuple, Any] = {}  # (geom, scale) -> what `mesh` gave: rebuilt parts send no more
        self._sent = 0

    def tint(self, g: int, *, textured: bool = False) -> np.ndarray:
        """(3,) factor on geom g's drawn colour (`geometry.drawn_rgba`, MuJoCo's material rule): its
        texture's mean colour unless `textured` (the texture is drawn), times 1 + its emission."""
        m = self._model
        mat = int(m.geom_matid[g])
        t = texture_id(m, mat)
        out = np.ones(3)
        if t >= 0 and not textured:
            if t not in self._means:
                self._means[t] = texture_image(m, t)[..., :3].reshape(-1, 3).mean(axis=0) / 255.0
            out = out * self._means[t]
        return out * (1.0 + float(m.mat_emission[mat])) if 0 <= mat < m.nmat else out

    def drawable(self, g: int) -> bool:
        """Whether geom g has a 2D texture and texture coordinates to draw it with."""
        m = self._model
        t = texture_id(m, int(m.geom_matid[g]))
        if t < 0 or int(m.tex_type[t]) != _TEX_2D:
            return False
        kind = int(m.geom_type[g])
        if kind == _G.mjGEOM_PLANE:
            return True
        mid = int(m.geom_dataid[g])
        return kind == _G.mjGEOM_MESH and 0 <= mid < m.nmesh and int(m.mesh_texcoordadr[mid]) >= 0

    def mesh(self, mesh: GeomMesh, *, scale: np.ndarray | None = None) -> Any | None:
        """A trimesh.Trimesh of `mesh` with its texture and material, or None (draw it untextured):
        not `drawable`, or MAX_TEXTURE_BYTES already sent. `scale` (3,): the instance's scale (a
        floor grown to cover the grid keeps MuJoCo's texture size in metres). The same geom and
        scale give the same mesh, counted once."""
        key = (mesh.geom, None if scale is None else tuple(np.asarray(scale, np.float64).tolist()))
        if key not in self._meshes:
            self._meshes[key] = self._build(mesh, scale) if self.drawable(mesh.geom) else None
        return self._meshes[key]

    def _build(self, mesh: GeomMesh, scale: np.ndarray | None) -> Any | None:
        import trimesh
        from PIL import Image

        m, g = self._model, mesh.geom
        t = texture_id(m, int(m.geom_matid[g]))
        if t not in self._images:
            self._images[t] = Image.fromarray(texture_image(m, t))
        image = self._images[t]
        size = image.width * image.height * len(image.getbands())
        if self._sent + size > MAX_TEXTURE_BYTES:  # each geom's glTF carries its own copy
            return None
        self._sent += size
        vertices, faces = np.asarray(mesh.vertices, np.float64), np.asarray(mesh.faces, np.int64)
        if int(m.geom_type[g]) == _G.mjGEOM_PLANE:
            uv = self._plane_uv(g, vertices * (1.0 if scale is None else np.asarray(scale)))
        else:
            vertices, faces, uv = _mesh_uv(m, int(m.geom_dataid[g]), vertices)
        mat = int(m.geom_matid[g])
        rgba = np.asarray(mesh.rgba, np.float64)
        rgba = np.clip(np.r_[rgba[:3] * self.tint(g, textured=True), rgba[3]], 0.0, 1.0)
        material = trimesh.visual.material.PBRMaterial(
            baseColorTexture=image, baseColorFactor=np.round(rgba * 255).astype(np.uint8),
            metallicFactor=0.0, roughnessFactor=_roughness(m, mat), alphaMode="BLEND" if rgba[3] < 1 else None)
        # trimesh's uv has v up (OBJ); glTF, as MuJoCo's texture rows, has it down.
        visual = trimesh.visual.TextureVisuals(uv=np.c_[uv[:, 0], 1.0 - uv[:, 1]], material=material)
        return trimesh.Trimesh(vertices, faces, visual=visual, process=False)

    def _plane_uv(self, g: int, vertices: np.ndarray) -> np.ndarray:
        # MuJoCo: texuniform repeats the texture every 2/texrepeat metres; otherwise texrepeat times over the plane.
        m = self._model
        mat = int(m.geom_matid[g])
        repeat = np.asarray(m.mat_texrepeat[mat], np.float64)
        if bool(m.mat_texuniform[mat]):
            return vertices[:, :2] * repeat / 2.0
        half = np.maximum(np.abs(vertices[:, :2]).max(axis=0), 1e-9)
        return (vertices[:, :2] / (2.0 * half) + 0.5) * repeat


def _mesh_uv(model: mujoco.MjModel, mid: int, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vertices, faces, uv): mesh mid's corners, one vertex per distinct (vertex, texcoord) pair."""
    fa, fn = int(model.mesh_faceadr[mid]), int(model.mesh_facenum[mid])
    ta, tn = int(model.mesh_texcoordadr[mid]), int(model.mesh_texcoordnum[mid])
    corners = np.asarray(model.mesh_face[fa:fa + fn], np.int64).reshape(-1)
    tex = np.asarray(model.mesh_facetexcoord[fa:fa + fn], np.int64).reshape(-1)
    if tex.size and (tex.min() < 0 or tex.max() >= tn or ta + tn > len(model.mesh_texcoord)):
        raise MjArchiveError(f"mesh {mid}'s face texture coordinates lie outside its {tn}; recompile the model")
    pairs, inverse = np.unique(np.stack([corners, tex], axis=1), axis=0, return_inverse=True)
    uv = np.asarray(model.mesh_texcoord[ta:ta + tn], np.float64)[pairs[:, 1]]
    return vertices[pairs[:, 0]], inverse.reshape(-1, 3), uv


def _roughness(model: mujoco.MjModel, mat: int) -> float:
    """MuJoCo's shininess (0..1, a Phong exponent up to 128) as a PBR roughness."""
    shininess = float(model.mat_shininess[mat]) if 0 <= mat < model.nmat else 0.5
    return float(np.clip(1.0 - 0.6 * shininess, 0.2, 1.0))


def sky_image(model: mujoco.MjModel) -> np.ndarray:
    """The background (H, W, 3) uint8 standing for the model's skybox: a side face of its cube,
    zenith-side row first, so the horizon falls mid-screen; black, as MuJoCo's, without a skybox."""
    sky = [t for t in range(model.ntex) if int(model.tex_type[t]) == _TEX_SKYBOX]
    if not sky:
        return np.zeros((1, 1, 3), np.uint8)
    img = texture_image(model, sky[0])[..., :3]
    side = img.shape[1]
    return np.ascontiguousarray(img[:side] if img.shape[0] >= 6 * side else img)


def add_lights(scene: Any, model: mujoco.MjModel, eye: np.ndarray, target: np.ndarray) -> list[Any]:
    """Light the scene as MuJoCo would, instead of viser's default lights and environment map: an
    ambient light (the headlight's and the lights' ambient), the headlight as a directional light
    along the camera's first view from `eye` to `target` (metres), and each active model light
    (spot, point or directional) where it stands at qpos0. Returns the light handles."""
    scene.configure_default_lights(enabled=False)
    try:
        scene.configure_environment_map(hdri=None)
    except (TypeError, ValueError, AssertionError):  # a viser that wants a preset: keep it, unlit
        scene.configure_environment_map(environment_intensity=0.0)
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    mujoco.mj_comPos(model, data)
    mujoco.mj_camlight(model, data)
    active = np.asarray(model.light_active, bool) if hasattr(model, "light_active") else np.ones(model.nlight, bool)
    head = model.vis.headlight
    ambient = np.asarray(model.light_ambient, np.float64)[active].sum(axis=0) if active.any() else np.zeros(3)
    on = bool(head.active)
    if on:
        ambient = ambient + np.asarray(head.ambient, np.float64)
    out = [scene.add_light_ambient("/lights/ambient", **_colour(ambient))]
    if on and np.any(head.diffuse):
        out.append(scene.add_light_directional("/lights/headlight", position=headlight_position(eye, target),
                                               **_colour(np.asarray(head.diffuse))))
    kinds = np.asarray(model.light_type if hasattr(model, "light_type") else
                       np.where(model.light_directional, 1, 0), np.int64)
    for i in np.flatnonzero(active).tolist():
        pos, direction = data.light_xpos[i].copy(), data.light_xdir[i].copy()
        colour = _colour(np.asarray(model.light_diffuse[i]))
        shadow = bool(model.light_castshadow[i])
        name = f"/lights/light_{i}"
        if kinds[i] == int(mujoco.mjtLightType.mjLIGHT_DIRECTIONAL):  # shines from its position to the origin
            out.append(scene.add_light_directional(name, position=tuple(-direction), **colour))
        elif kinds[i] == int(mujoco.mjtLightType.mjLIGHT_SPOT):
            angle = math.radians(min(float(model.light_cutoff[i]), 89.0))
            out.append(scene.add_light_spot(name, position=tuple(pos), direction=tuple(direction), angle=angle,
                                            penumbra=0.6, decay=0.0, cast_shadow=shadow, **colour))
        else:  # point (and image-based lights, drawn as points)
            out.append(scene.add_light_point(name, position=tuple(pos), decay=0.0, cast_shadow=shadow, **colour))
    return out


def headlight_position(eye: Any, target: Any) -> tuple[float, float, float]:
    """Where the headlight (a three.js directional light, shining from its position to the origin)
    stands for a camera at `eye` looking at `target` (metres): the unit vector from target to eye."""
    view = np.asarray(eye, np.float64) - np.asarray(target, np.float64)
    norm = float(np.linalg.norm(view))
    return tuple(float(x) for x in (view / norm if np.isfinite(norm) and norm > 0 else (0.0, 0.0, 1.0)))


def _colour(rgb: np.ndarray) -> dict[str, Any]:
    """A MuJoCo light colour (3,), components possibly above 1, as viser's colour and intensity."""
    rgb = np.clip(np.asarray(rgb, np.float64), 0.0, None)
    peak = float(rgb.max())
    if peak <= 0:
        return {"color": (255, 255, 255), "intensity": 0.0}
    return {"color": tuple(int(round(255 * c / peak)) for c in rgb), "intensity": _LIGHT_SCALE * peak}
