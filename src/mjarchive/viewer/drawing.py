"""The shown worlds' geoms as viser batched meshes, each world's look (format 1.1 variants), and
the "world <id>" label under each grid cell.

Every drawn geom is one batched mesh with an instance per world; a world-body plane (a floor) is
one instance for the whole grid, as in `render(layout='scene')`, and like the scene render takes
the first shown world's colour and keeps its own size. With variants, a world's colours
(geom_rgba, geom_matid, mat_rgba through MuJoCo's material rule) are per-instance colours and
opacities (alpha 0 hides the instance), and primitive sizes per-instance scales of the mesh built
at the model's size. Shapes a scale cannot make (capsules, primitives whose model size is 0, mesh
and height field geoms drawing another asset) get one batched mesh per distinct shape among the
worlds, rebuilt when the values in force change.

Materials as `looks` draws them: a geom with a drawable 2D texture (`Textures.drawable`) is a
textured batched mesh (a glTF with the texture, and the model's colour); other geoms are coloured,
tinted by their texture's mean colour and emission. When the archive declares a colour variant
(COLOUR_FIELDS), every geom takes the untextured path, whose colours can differ per world.

    layer = GeomLayer(server.scene, model, geom_meshes(model), offsets, variant_fields=archive.variant_fields)
    layer.update(pos, quat)                         # every frame: (W, G, 3) and (W, G, 4) wxyz
    layer.set_looks(world_looks(model, layer.geoms, [window.variant(w, f) for w in worlds]), pos, quat)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import mujoco
import numpy as np

from . import geometry
from .geometry import GeomMesh, geom_mesh
from .looks import Textures

__all__ = ["COLOUR_FIELDS", "SHOWN_FIELDS", "GeomLayer", "Looks", "Part", "not_shown", "world_labels", "world_looks"]

#: Variant fields the viewer draws; the others (sites, lights, cameras) only `mjarchive render` draws.
SHOWN_FIELDS = frozenset({"geom_rgba", "geom_size", "geom_pos", "geom_quat", "geom_matid", "geom_dataid",
                          "mat_rgba", "body_pos", "body_quat"})
#: Fields a geom's colour depends on (MuJoCo's rule: a material's rgba where the geom's is the default).
COLOUR_FIELDS = frozenset({"geom_rgba", "geom_matid", "mat_rgba"})
_LOOK_FIELDS = COLOUR_FIELDS | {"geom_size", "geom_dataid"}
_G = mujoco.mjtGeom
_SCALED = {int(_G.mjGEOM_SPHERE), int(_G.mjGEOM_ELLIPSOID), int(_G.mjGEOM_BOX), int(_G.mjGEOM_CYLINDER),
           int(_G.mjGEOM_PLANE)}
_ASSET = {int(_G.mjGEOM_MESH), int(_G.mjGEOM_HFIELD)}
_MESH_CACHE = 256  # meshes built for per-world shapes, kept to switch back without rebuilding


def not_shown(fields: Iterable[str]) -> tuple[str, ...]:
    """The variant fields among `fields` the viewer cannot draw, in their order."""
    return tuple(f for f in fields if f not in SHOWN_FIELDS)


def world_labels(scene: Any, world_ids: Sequence[int], positions: np.ndarray) -> list[Any]:
    """A label "world <id>" per shown world at `positions` (W, 3) metres (below its grid cell)."""
    out = []
    for world, position in zip(world_ids, np.asarray(positions, np.float64)):
        name, text, at = f"/labels/world_{world}", f"world {world}", tuple(map(float, position))
        try:
            out.append(scene.add_label(name, text, position=at, anchor="top-center"))
        except TypeError:  # viser < 1.1 has no anchor
            out.append(scene.add_label(name, text, position=at))
    return out


@dataclasses.dataclass(frozen=True)
class Looks:
    """What each shown world's drawn geoms look like: `rgba` (W, C, 4) in 0..1 after the material
    rule, `size` (W, C, 3) and `dataid` (W, C), for the C geoms given to `world_looks`."""

    rgba: np.ndarray
    size: np.ndarray
    dataid: np.ndarray


def world_looks(model: mujoco.MjModel, geoms: Sequence[int], values: Sequence[dict[str, np.ndarray]]) -> Looks:
    """Looks of `geoms` for each world from its variant values in force (`Archive.variant`); a field a
    world's dict lacks has the model's value."""
    g = np.asarray(geoms, np.int64)
    W = len(values)

    def stacked(name: str) -> np.ndarray:
        base = np.asarray(getattr(model, name))
        if not any(name in v for v in values):
            return np.broadcast_to(base, (W, *base.shape))
        return np.stack([np.asarray(v[name]).reshape(base.shape) if name in v else base for v in values])

    rgba = geometry.drawn_rgba(stacked("geom_rgba")[:, g], stacked("geom_matid")[:, g], stacked("mat_rgba"))
    return Looks(rgba=rgba, size=np.asarray(stacked("geom_size")[:, g], np.float64),
                 dataid=np.asarray(stacked("geom_dataid")[:, g], np.int64))


class Part(NamedTuple):
    """One batched mesh: geom `geom` (column `column` of the poses) for the worlds `rows` (a slice
    or world positions), or a world-body plane drawn once (`shared`). `key`: the shape it was
    built for (None: the model's)."""

    column: int
    geom: int
    handle: Any
    shared: bool
    rows: Any
    key: Any
    mesh: GeomMesh


class GeomLayer:
    """The batched meshes of `meshes` (one per drawn geom, `geometry.geom_meshes`) for worlds at
    grid `offsets` (W, 3); `variant_fields`: the archive's (those that change looks are applied by
    `set_looks`). Call from one thread; the caller groups the calls in one atomic viser update."""

    def __init__(self, scene: Any, model: mujoco.MjModel, meshes: Sequence[GeomMesh], offsets: np.ndarray, *,
                 variant_fields: Iterable[str] = ()):
        self._scene, self._model, self._meshes = scene, model, list(meshes)
        self._offsets = np.asarray(offsets, np.float64)
        self._fields = frozenset(variant_fields) & _LOOK_FIELDS
        self._columns: list[list[Part]] = []
        self._built_meshes: dict[tuple[int, Any], GeomMesh | None] = {}
        self._moving_floor = "geom_quat" in frozenset(variant_fields)
        self._textures = Textures(model)
        self._tints = [self._textures.tint(m.geom) for m in self._meshes]  # (3,) per column

    @property
    def geoms(self) -> list[int]:
        return [m.geom for m in self._meshes]

    @property
    def parts(self) -> list[Part]:
        return [p for parts in self._columns for p in parts]

    @property
    def varies(self) -> bool:
        """Whether some declared variant field changes what this layer draws."""
        return bool(self._fields)

    def remove(self) -> None:
        for part in self.parts:
            part.handle.remove()
        self._columns = []

    # -- every frame ------------------------------------------------------------------------------------
    def update(self, pos: np.ndarray, quat: np.ndarray) -> None:
        """Pose every instance: pos (W, G, 3) with the grid offsets added, quat (W, G, 4) wxyz."""
        if not self._columns:
            self._build(pos, quat)
            return
        for parts in self._columns:
            for p in parts:
                if p.shared:
                    if self._moving_floor:
                        p.handle.batched_wxyzs = quat[:1, p.column]
                    continue  # world-body planes do not move
                p.handle.batched_positions = pos[p.rows, p.column]
                p.handle.batched_wxyzs = quat[p.rows, p.column]

    def _build(self, pos: np.ndarray, quat: np.ndarray) -> None:
        model = self._model
        colours = bool(self._fields & COLOUR_FIELDS)  # then set_looks sets colours and opacities per instance
        for column, mesh in enumerate(self._meshes):
            g = mesh.geom
            shared = bool(model.geom_bodyid[g] == 0 and model.geom_type[g] == _G.mjGEOM_PLANE)
            opacity = float(mesh.rgba[3]) if mesh.rgba[3] < 1.0 and not colours else None
            if shared:  # once, centred on the grid and grown to cover it, as in the scene render
                positions, wxyzs = pos[:1, column] - self._offsets[:1] + self._offsets.mean(axis=0), quat[:1, column]
                scales = self._floor_scale(mesh)
            else:
                positions, wxyzs, scales = pos[:, column], quat[:, column], None
            handle = self._add(f"/worlds/geom_{g}", mesh, positions, wxyzs, scales, opacity, shared,
                               self._tints[column], textured=True)
            self._columns.append([Part(column, g, handle, shared, slice(None), None, mesh)])

    def _add(self, name: str, mesh: GeomMesh, positions, wxyzs, scales, opacity, shared: bool,
             tint: np.ndarray, *, textured: bool = False) -> Any:
        """`mesh`'s batched mesh; with its texture where `textured` (the model's shape) allows it and
        no colour varies per world, else in its colour times `tint` (its column's `Textures.tint`)."""
        if textured and not self._fields & COLOUR_FIELDS:
            textured_mesh = self._textures.mesh(mesh, scale=None if scales is None else scales[0])
            if textured_mesh is not None:
                return self._scene.add_batched_meshes_trimesh(
                    name, textured_mesh, batched_wxyzs=wxyzs, batched_positions=positions, batched_scales=scales,
                    lod="off", cast_shadow=not shared, receive_shadow=True)
        rgb = tuple(int(round(255 * min(1.0, c * k))) for c, k in zip(mesh.rgba[:3], tint))
        return self._scene.add_batched_meshes_simple(
            name, mesh.vertices, mesh.faces, batched_wxyzs=wxyzs, batched_positions=positions,
            batched_scales=scales, batched_colors=rgb, opacity=opacity, lod="off",
            cast_shadow=not shared, receive_shadow=True)

    def _floor_scale(self, mesh: GeomMesh) -> np.ndarray:
        half = np.abs(mesh.vertices[:, :2]).max(axis=0).astype(np.float64)
        spread = np.abs(self._offsets - self._offsets.mean(axis=0))[:, :2].max(axis=0)
        scales = np.ones((1, 3))
        scales[0, :2] = (half + spread) / np.maximum(half, 1e-9)
        return scales

    # -- when the values in force change ---------------------------------------------------------------------
    def set_looks(self, looks: Looks, pos: np.ndarray, quat: np.ndarray,
                  groups: dict[int, list[tuple[Any, Any]]] | None = None) -> None:
        """Apply the worlds' looks (`world_looks` of `geoms`); meshes whose shapes differ between
        worlds are rebuilt here, posed at pos/quat. `groups`: what `check_looks(looks)` returned,
        where the caller checked already; otherwise it is checked here: raises MjArchiveError,
        counted from the model's sizes before a mesh is built or sent, when the meshes would exceed
        the limits of `geometry.check_drawn` (vertices, triangles, batched meshes)."""
        if groups is None:
            groups = self.check_looks(looks)
        if not self._columns:
            self._build(pos, quat)
        colours = bool(self._fields & COLOUR_FIELDS)
        for column, parts in enumerate(self._columns):
            if parts and parts[0].shared:
                p = parts[0]
                rgba = looks.rgba[:1, column]
                if colours:
                    self._colour(p, rgba, self._tints[column])
                p.handle.batched_scales = self._floor_scale(p.mesh) * (rgba[:, 3:] > 0)
                continue
            if [(p.key, _rows_key(p.rows)) for p in parts] != [(k, _rows_key(r)) for k, r in groups[column]]:
                parts = self._rebuild(column, groups[column], pos, quat)
            for p in parts:
                rgba = looks.rgba[p.rows, column]
                if colours:
                    self._colour(p, rgba, self._tints[column])
                p.handle.batched_scales = self._scales(p, looks, rgba)

    def check_looks(self, looks: Looks) -> dict[int, list[tuple[Any, Any]]]:
        """Count the batched meshes, vertices and triangles the worlds' looks need (their distinct
        shapes per geom), from the model's sizes, and refuse (MjArchiveError) beyond the limits of
        `geometry.check_drawn` before anything is built or sent; returns the shapes per column.
        Counted geom by geom, so a hostile archive is refused as soon as it passes a limit."""
        groups: dict[int, list[tuple[Any, Any]]] = {}
        meshes = vertices = faces = 0
        for column, mesh in enumerate(self._meshes):
            groups[column] = self._groups(column, looks)
            g = mesh.geom
            shared = bool(self._model.geom_bodyid[g] == 0 and self._model.geom_type[g] == _G.mjGEOM_PLANE)
            for key, _ in ([(None, None)] if shared else groups[column]):
                if key is None:
                    counts = (len(mesh.vertices), len(mesh.faces))
                else:  # a size (a primitive: the same counts) or another mesh or height field id
                    counts = geometry.mesh_counts(self._model, g, dataid=None if isinstance(key, tuple) else key)
                if counts is not None:
                    meshes, vertices, faces = meshes + 1, vertices + counts[0], faces + counts[1]
            geometry.check_drawn(meshes, vertices, faces, f"the {len(self._offsets)} worlds' differing geom shapes",
                                 "show fewer worlds at once (e.g. --worlds 0:4)")
        return groups

    @staticmethod
    def _colour(p: Part, rgba: np.ndarray, tint: np.ndarray) -> None:
        """Per-world colours (n, 4) times the model's texture tint (3,) of the geom."""
        p.handle.batched_colors = np.round(np.clip(rgba[:, :3] * tint, 0.0, 1.0) * 255).astype(np.uint8)
        alpha = rgba[:, 3]
        # Per-instance opacities make the whole mesh transparent (sorted, no depth writes): only when needed.
        translucent = ((alpha > 0) & (alpha < 1)).any()
        p.handle.batched_opacities = alpha.astype(np.float32) if translucent else None

    def _scales(self, p: Part, looks: Looks, rgba: np.ndarray) -> np.ndarray | None:
        visible = rgba[:, 3] > 0
        t = int(self._model.geom_type[p.geom])
        scale = None
        if "geom_size" in self._fields and p.key is None and t in _SCALED:
            built = _axes(t, np.asarray(self._model.geom_size[p.geom], np.float64)[None])
            scale = _axes(t, looks.size[p.rows, p.column]) / built
        if visible.all():
            return None if scale is None or np.allclose(scale, 1.0, rtol=0, atol=1e-12) else scale
        scale = np.ones((len(rgba), 3)) if scale is None else scale
        scale[~visible] = 0.0  # alpha 0: not drawn (an opacity of 0 would still cast a shadow)
        return scale

    def _groups(self, column: int, looks: Looks) -> list[tuple[Any, Any]]:
        """(shape key, world rows) per distinct shape among the worlds; one group (None, all) when
        every world draws the model's shape or the shape is scaled."""
        g = self._meshes[column].geom
        t = int(self._model.geom_type[g])
        if t in _ASSET and "geom_dataid" in self._fields:
            keys = [int(d) for d in looks.dataid[:, column]]
            base = int(self._model.geom_dataid[g])
        elif "geom_size" in self._fields and (t == _G.mjGEOM_CAPSULE or (
                t in _SCALED and (_axes(t, np.asarray(self._model.geom_size[g], np.float64)[None]) <= 0).any())):
            keys = [tuple(float(x) for x in s) for s in looks.size[:, column]]
            base = tuple(float(x) for x in self._model.geom_size[g])
        else:
            return [(None, slice(None))]
        keys = [None if k == base else k for k in keys]
        if len(set(keys)) == 1:
            return [(keys[0], slice(None))]
        order = list(dict.fromkeys(keys))
        return [(k, np.array([w for w, kw in enumerate(keys) if kw == k], np.int64)) for k in order]

    def _rebuild(self, column: int, groups: list[tuple[Any, Any]], pos: np.ndarray, quat: np.ndarray) -> list[Part]:
        for p in self._columns[column]:
            p.handle.remove()
        base = self._meshes[column]
        g = base.geom
        opacity = float(base.rgba[3]) if base.rgba[3] < 1.0 and not self._fields & COLOUR_FIELDS else None
        parts = []
        for i, (key, rows) in enumerate(groups):
            mesh = base if key is None else self._shape(g, key)
            if mesh is None:
                continue  # an asset without a drawable surface here: those worlds draw nothing for this geom
            name = f"/worlds/geom_{g}" if len(groups) == 1 else f"/worlds/geom_{g}_{i}"
            handle = self._add(name, mesh, pos[rows, column], quat[rows, column], None, opacity, False,
                               self._tints[column], textured=key is None)
            parts.append(Part(column, g, handle, False, rows, key, mesh))
        self._columns[column] = parts
        return parts

    def _shape(self, g: int, key: Any) -> GeomMesh | None:
        cache = self._built_meshes
        if (g, key) not in cache:
            if len(cache) >= _MESH_CACHE:
                cache.clear()
            if isinstance(key, tuple):
                cache[(g, key)] = geom_mesh(self._model, g, size=np.asarray(key))
            else:
                cache[(g, key)] = geom_mesh(self._model, g, dataid=key)
        return cache[(g, key)]


def _rows_key(rows: Any) -> Any:
    return "all" if isinstance(rows, slice) else tuple(rows.tolist())


def _axes(t: int, size: np.ndarray) -> np.ndarray:
    """(n, 3) half extents along the geom's x, y, z of the mesh `geometry` builds for sizes (n, 3)."""
    s = np.asarray(size, np.float64)
    if t == _G.mjGEOM_SPHERE:
        return np.repeat(s[:, :1], 3, axis=1)
    if t == _G.mjGEOM_CYLINDER:
        return s[:, [0, 0, 1]]
    if t == _G.mjGEOM_PLANE:  # size 0: an infinite plane, drawn 20 m wide; it has no thickness
        out = np.where(s > 0, s, geometry._INFINITE_PLANE_HALF)
        out[:, 2] = 1.0
        return out
    return s.copy()  # ellipsoid, box: the half sizes
