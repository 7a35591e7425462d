"""Triangle meshes of a model's drawn geoms, in each geom's own frame, for a browser viewer.

`geom_meshes(model)` gives one `GeomMesh` per geom MuJoCo would draw with the given groups
visible: primitives are tessellated here (at most 384 triangles each), mesh geoms use the
compiled model's vertices and faces (already in the geom's frame: MuJoCo's compiler moves a
mesh's vertices into its own frame and folds that offset into geom_pos/geom_quat), height fields
become a grid. Pose a mesh with the geom's world position and orientation (`viewer.frames`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import mujoco
import numpy as np

from .._errors import MjArchiveError

__all__ = ["GeomMesh", "MAX_VIEW_FACES", "MAX_VIEW_MESHES", "MAX_VIEW_VERTICES", "MAX_HFIELD_SAMPLES", "check_drawn",
           "drawn_rgba", "geom_mesh", "geom_meshes", "mesh_counts", "unit_sphere"]

#: Vertices summed over every mesh sent to a page (each drawn geom's, and each per-world shape's);
#: a model or archive beyond it (hostile or huge) is refused before anything is built or sent.
MAX_VIEW_VERTICES = 2_000_000
#: Triangles summed the same way.
MAX_VIEW_FACES = 4_000_000
#: Batched meshes (scene nodes: one per drawn geom, and one per distinct per-world shape); viser
#: sends each as its own message (about 3 ms each: 4096 take some 12 s to a first frame).
MAX_VIEW_MESHES = 4096
#: A height field is subsampled to at most this many samples along each axis.
MAX_HFIELD_SAMPLES = 256

_SEGMENTS = 16  # around a revolved primitive's axis: a multiple of 4, so the extremes lie on vertices
_RINGS = 6  # latitude steps per quarter circle (15°): the equator is a ring, so the bounding box is exact
_DEFAULT_RGBA = np.array([0.5, 0.5, 0.5, 1.0])  # MuJoCo's geom rgba: a geom with a material and it draws the material's
_INFINITE_PLANE_HALF = 10.0  # an infinite plane (size 0) is drawn as a 20 m square


@dataclasses.dataclass(frozen=True)
class GeomMesh:
    """A drawn geom as a triangle mesh.

    `vertices` (V, 3) float32 in metres and in the geom's own frame; `faces` (F, 3) uint32 vertex
    indices, counter-clockwise seen from outside; `rgba` in 0..1. Arrays are read-only and may be
    shared between geoms that use the same mesh asset or primitive shape.
    """

    geom: int
    vertices: np.ndarray
    faces: np.ndarray
    rgba: tuple[float, float, float, float]


def geom_meshes(model: mujoco.MjModel, groups: Iterable[int] = (0, 1, 2), *,
                keep_clear: bool = False) -> list[GeomMesh]:
    """One GeomMesh per drawn geom, in geom id order.

    A geom is drawn when its group is in `groups` (MuJoCo's geom groups 0..5), its colour's alpha
    is > 0 (or `keep_clear`: a per-world colour may make it visible) and its type has a surface
    here: plane, sphere, capsule, ellipsoid, cylinder, box, mesh, height field. SDF geoms (a
    plugin's implicit surface) are skipped. Colour follows MuJoCo's rule: a geom with a material
    and the default rgba (0.5 0.5 0.5 1) takes the material's rgba; textures are not applied.
    Raises MjArchiveError, from the model's sizes before anything is built, beyond MAX_VIEW_MESHES
    geoms, MAX_VIEW_VERTICES vertices or MAX_VIEW_FACES triangles in all.
    """
    visible = _parse_groups(groups)
    chosen: list[tuple[int, tuple[float, float, float, float]]] = []
    vertices = faces = 0
    # Counted from the compiled model's sizes before anything is built: a hostile model allocates nothing.
    colours = drawn_rgba(model.geom_rgba, model.geom_matid, model.mat_rgba)  # (ngeom, 4), one pass
    shown = np.isin(np.asarray(model.geom_group), sorted(visible)) & ((colours[:, 3] > 0) | keep_clear)
    for g in np.flatnonzero(shown).tolist():
        rgba = tuple(float(x) for x in colours[g])
        counts = mesh_counts(model, g)
        if counts is None:
            continue
        vertices, faces = vertices + counts[0], faces + counts[1]
        chosen.append((g, rgba))
        check_drawn(len(chosen), vertices, faces, "the model's drawn geoms",
                    "hide geom groups (groups=...) or simplify the model's meshes")
    shared: dict = {}  # mesh id or primitive shape -> arrays, for geoms sharing them
    out = []
    for g, rgba in chosen:
        built = _build(model, g, shared)
        if built is not None:
            v, f = built
            out.append(GeomMesh(geom=g, vertices=v, faces=f, rgba=rgba))
    return out


def geom_mesh(model: mujoco.MjModel, g: int, *, size: np.ndarray | None = None,
              dataid: int | None = None) -> GeomMesh | None:
    """Geom g's mesh as `geom_meshes` builds it, but with another `size` (primitives) or mesh or
    height field id `dataid` than the model's (a world's variant values); None if not drawable.
    Raises MjArchiveError beyond MAX_VIEW_VERTICES vertices or MAX_VIEW_FACES triangles."""
    counts = mesh_counts(model, g, dataid)
    if counts is None:
        return None
    check_drawn(1, *counts, f"geom {g}'s mesh", "simplify the mesh")
    built = _build(model, g, {}, size=size, dataid=dataid)
    return None if built is None else GeomMesh(geom=g, vertices=built[0], faces=built[1], rgba=_rgba(model, g))


def check_drawn(meshes: int, vertices: int, faces: int, what: str, fix: str) -> None:
    """Refuse (MjArchiveError) `meshes` batched meshes of `vertices` and `faces` in all beyond
    MAX_VIEW_MESHES, MAX_VIEW_VERTICES or MAX_VIEW_FACES; `what` names them, `fix` says what to do."""
    for n, limit, noun, name in ((meshes, MAX_VIEW_MESHES, "meshes", "MAX_VIEW_MESHES"),
                                 (vertices, MAX_VIEW_VERTICES, "vertices", "MAX_VIEW_VERTICES"),
                                 (faces, MAX_VIEW_FACES, "triangles", "MAX_VIEW_FACES")):
        if n > limit:
            raise MjArchiveError(f"{what} need more than {limit:,} {noun} ({name}), too many to show in a browser; "
                                 f"{fix}, or render them with mjarchive render")


def unit_sphere() -> tuple[np.ndarray, np.ndarray]:
    """(vertices, faces) of a sphere of radius 1 at the origin (a point overlay's marker)."""
    return _frozen(*_revolve(_arc(-math.pi / 2, math.pi / 2, 2 * _RINGS)))


# -- selection and colour ------------------------------------------------------------------------

def _parse_groups(groups: Iterable[int]) -> frozenset[int]:
    try:
        out = frozenset(int(g) for g in groups)
    except (TypeError, ValueError):
        raise MjArchiveError(f"groups must be geom group numbers 0..{mujoco.mjNGROUP - 1}, got {groups!r}") from None
    bad = sorted(g for g in out if not 0 <= g < mujoco.mjNGROUP)
    if bad:
        raise MjArchiveError(f"geom groups are 0..{mujoco.mjNGROUP - 1}; got {bad}")
    return out


def drawn_rgba(rgba: np.ndarray, matid: np.ndarray, mat_rgba: np.ndarray) -> np.ndarray:
    """The colours geoms draw in, by MuJoCo's rule: a geom with a material (matid >= 0) and the
    default rgba (0.5 0.5 0.5 1) takes the material's rgba; clipped to [0, 1], float64.

    rgba (..., C, 4) and matid (..., C) of C geoms; mat_rgba (..., nmat, 4) or (nmat, 4), the
    materials (per leading index, e.g. per world, or shared)."""
    rgba = np.asarray(rgba, np.float64)
    matid = np.asarray(matid, np.int64)
    mat = np.asarray(mat_rgba, np.float64)
    if mat.shape[-2]:
        mat = np.broadcast_to(mat, (*rgba.shape[:-2], *mat.shape[-2:]))
        use = (matid >= 0) & np.all(np.abs(rgba - _DEFAULT_RGBA) <= 1e-7, axis=-1)
        from_mat = np.take_along_axis(mat, np.clip(matid, 0, mat.shape[-2] - 1)[..., None], axis=-2)
        rgba = np.where(use[..., None], from_mat, rgba)
    return np.clip(rgba, 0.0, 1.0)


def _rgba(model: mujoco.MjModel, g: int) -> tuple[float, float, float, float]:
    rgba = drawn_rgba(model.geom_rgba[g:g + 1], model.geom_matid[g:g + 1], model.mat_rgba)[0]
    return tuple(float(x) for x in rgba)  # type: ignore[return-value]


def _hfield_steps(model: mujoco.MjModel, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices kept of height field h (the last row and column always)."""
    nrow, ncol = int(model.hfield_nrow[h]), int(model.hfield_ncol[h])

    def keep(n: int) -> np.ndarray:
        step = max(1, math.ceil(n / MAX_HFIELD_SAMPLES))
        return np.unique(np.r_[np.arange(0, n, step), n - 1])

    return keep(nrow), keep(ncol)


def mesh_counts(model: mujoco.MjModel, g: int, dataid: int | None = None) -> tuple[int, int] | None:
    """(vertices, faces) the geom's mesh will have (`geom_mesh` with this mesh or height field id),
    from the compiled model's sizes alone: nothing is built. None for a geom that is not drawn here."""
    t = int(model.geom_type[g])
    data = int(model.geom_dataid[g]) if dataid is None else int(dataid)
    G = mujoco.mjtGeom
    if t in _PRIMITIVE_COUNTS:
        return _PRIMITIVE_COUNTS[t]
    if t == G.mjGEOM_MESH:
        return (int(model.mesh_vertnum[data]), int(model.mesh_facenum[data])) if 0 <= data < model.nmesh else None
    if t == G.mjGEOM_HFIELD:
        h = data
        if not 0 <= h < model.nhfield or model.hfield_nrow[h] < 2 or model.hfield_ncol[h] < 2:
            return None
        rows, cols = _hfield_steps(model, h)
        R, C = len(rows), len(cols)
        ring = 2 * (R - 1) + 2 * (C - 1)
        return R * C + ring + 4, 2 * (R - 1) * (C - 1) + 2 * ring + 2
    return None  # SDF (an implicit surface from a plugin), or a type added after this module



# -- building ----------------------------------------------------------------------------------------

def _build(model: mujoco.MjModel, g: int, shared: dict, size: np.ndarray | None = None,
           dataid: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    t = int(model.geom_type[g])
    size = np.asarray(model.geom_size[g] if size is None else size, dtype=np.float64)
    data = int(model.geom_dataid[g]) if dataid is None else int(dataid)
    G = mujoco.mjtGeom
    if t == G.mjGEOM_MESH:
        mid = data
        if mid not in shared:
            shared[mid] = _frozen(*_mesh(model, mid))
        return shared[mid]
    key = ("hfield", data) if t == G.mjGEOM_HFIELD else (t, size.tobytes())  # geoms of one shape share arrays
    if key in shared:
        return shared[key]
    if t == G.mjGEOM_PLANE:
        v, f = _plane(size)
    elif t == G.mjGEOM_SPHERE:
        v, f = _revolve(_arc(-math.pi / 2, math.pi / 2, 2 * _RINGS) * size[0])
    elif t == G.mjGEOM_ELLIPSOID:
        v, f = _revolve(_arc(-math.pi / 2, math.pi / 2, 2 * _RINGS))
        v = v * size[:3]
    elif t == G.mjGEOM_CAPSULE:
        r, h = size[0], size[1]
        lower = _arc(-math.pi / 2, 0.0, _RINGS) * r - [0.0, h]
        upper = _arc(0.0, math.pi / 2, _RINGS) * r + [0.0, h]
        v, f = _revolve(np.concatenate([lower, upper]))
    elif t == G.mjGEOM_CYLINDER:
        v, f = _cylinder(size[0], size[1])
    elif t == G.mjGEOM_BOX:
        v, f = _box(size[:3])
    elif t == G.mjGEOM_HFIELD:
        v, f = _hfield(model, data)
    else:
        return None
    shared[key] = _frozen(v, f)
    return shared[key]


def _frozen(v: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.ascontiguousarray(v, dtype=np.float32)
    f = np.ascontiguousarray(f, dtype=np.uint32)
    v.flags.writeable = False
    f.flags.writeable = False
    return v, f


def _mesh(model: mujoco.MjModel, mid: int) -> tuple[np.ndarray, np.ndarray]:
    va, vn = int(model.mesh_vertadr[mid]), int(model.mesh_vertnum[mid])
    fa, fn = int(model.mesh_faceadr[mid]), int(model.mesh_facenum[mid])
    v = np.array(model.mesh_vert[va:va + vn], dtype=np.float32)
    f = np.array(model.mesh_face[fa:fa + fn], dtype=np.int64)  # indices local to the mesh's vertices
    if f.size and (f.min() < 0 or f.max() >= vn):
        raise MjArchiveError(f"mesh {mid} has face indices outside its {vn} vertices")
    return v, f


def _arc(a0: float, a1: float, steps: int) -> np.ndarray:
    """(steps + 1, 2) points (rho, z) on the unit circle from angle a0 to a1 (latitude)."""
    a = np.linspace(a0, a1, steps + 1)
    pts = np.stack([np.cos(a), np.sin(a)], axis=1)
    pts[np.isclose(pts[:, 0], 0.0, atol=1e-12), 0] = 0.0  # poles exactly on the axis
    return pts


def _revolve(profile: np.ndarray, segments: int = _SEGMENTS) -> tuple[np.ndarray, np.ndarray]:
    """Revolve a (rho, z) profile, bottom to top, about z; a point with rho 0 is one vertex (a pole)."""
    phi = np.linspace(0.0, 2 * math.pi, segments, endpoint=False)
    c, s = np.cos(phi), np.sin(phi)
    verts: list[np.ndarray] = []
    rings: list[np.ndarray] = []  # per profile point: vertex index per segment
    n = 0
    for rho, z in profile:
        if rho == 0.0:
            verts.append(np.array([[0.0, 0.0, z]]))
            rings.append(np.full(segments, n))
            n += 1
        else:
            verts.append(np.stack([rho * c, rho * s, np.full(segments, z)], axis=1))
            rings.append(np.arange(n, n + segments))
            n += segments
    faces = []
    for lo, hi in zip(rings, rings[1:]):
        a, b = lo, np.roll(lo, -1)
        d, cc = hi, np.roll(hi, -1)
        faces.append(np.stack([a, b, cc], axis=1))
        faces.append(np.stack([a, cc, d], axis=1))
    f = np.concatenate(faces)
    f = f[(f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 0] != f[:, 2])]  # drop the collapsed pole halves
    return np.concatenate(verts), f


def _disk(r: float, z: float, up: bool, offset: int, segments: int = _SEGMENTS) -> tuple[np.ndarray, np.ndarray]:
    phi = np.linspace(0.0, 2 * math.pi, segments, endpoint=False)
    v = np.concatenate([[[0.0, 0.0, z]], np.stack([r * np.cos(phi), r * np.sin(phi), np.full(segments, z)], 1)])
    ring = np.arange(1, segments + 1)
    nxt = np.roll(ring, -1)
    f = np.stack([np.zeros(segments, int), ring, nxt] if up else [np.zeros(segments, int), nxt, ring], axis=1)
    return v, f + offset


def _cylinder(r: float, h: float) -> tuple[np.ndarray, np.ndarray]:
    # Side and caps do not share vertices, so a renderer's vertex normals keep the rim sharp.
    side_v, side_f = _revolve(np.array([[r, -h], [r, h]]))
    bot_v, bot_f = _disk(r, -h, False, len(side_v))
    top_v, top_f = _disk(r, h, True, len(side_v) + len(bot_v))
    return np.concatenate([side_v, bot_v, top_v]), np.concatenate([side_f, bot_f, top_f])


def _box(half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    verts, faces = [], []
    eye = np.eye(3)
    for axis in range(3):
        for sign in (1.0, -1.0):
            u, w = eye[(axis + 1) % 3], eye[(axis + 2) % 3]
            if sign < 0:
                u, w = w, u  # u × w is the outward normal
            center = sign * eye[axis] * half
            corners = [center + (su * u + sw * w) * half for su, sw in ((-1, -1), (1, -1), (1, 1), (-1, 1))]
            k = len(verts) * 4
            verts.append(np.array(corners))
            faces += [[k, k + 1, k + 2], [k, k + 2, k + 3]]
    return np.concatenate(verts), np.array(faces)


def _plane(size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sx = size[0] if size[0] > 0 else _INFINITE_PLANE_HALF
    sy = size[1] if size[1] > 0 else _INFINITE_PLANE_HALF
    v = np.array([[-sx, -sy, 0.0], [sx, -sy, 0.0], [sx, sy, 0.0], [-sx, sy, 0.0]])
    return v, np.array([[0, 1, 2], [0, 2, 3]])


def _hfield(model: mujoco.MjModel, h: int) -> tuple[np.ndarray, np.ndarray]:
    """The top surface as a grid, walls down to the base at -size[3], and the base."""
    nrow, ncol = int(model.hfield_nrow[h]), int(model.hfield_ncol[h])
    sx, sy, sz, base = (float(x) for x in model.hfield_size[h])
    adr = int(model.hfield_adr[h])
    data = np.asarray(model.hfield_data[adr:adr + nrow * ncol], dtype=np.float64).reshape(nrow, ncol)
    rows, cols = _hfield_steps(model, h)
    # MuJoCo's layout: row r at y = -sy + 2 sy r / (nrow - 1), column c at x = -sx + 2 sx c / (ncol - 1).
    y = -sy + 2 * sy * rows / (nrow - 1)
    x = -sx + 2 * sx * cols / (ncol - 1)
    z = data[np.ix_(rows, cols)] * sz
    R, C = len(rows), len(cols)
    X, Y = np.meshgrid(x, y)
    top = np.stack([X, Y, z], axis=-1).reshape(-1, 3)
    idx = np.arange(R * C).reshape(R, C)
    a, b, c, d = idx[:-1, :-1], idx[:-1, 1:], idx[1:, 1:], idx[1:, :-1]
    faces = [np.stack([a, b, c], -1).reshape(-1, 3), np.stack([a, c, d], -1).reshape(-1, 3)]
    # The perimeter, counter-clockwise seen from above, and a wall from it down to the base.
    ring = np.concatenate([idx[0, :-1], idx[:-1, -1], idx[-1, :0:-1], idx[:0:-1, 0]])
    n = len(top)
    low = top[ring] * [1.0, 1.0, 0.0] - [0.0, 0.0, base]
    lo = n + np.arange(len(ring))
    hi = ring
    lo2, hi2 = np.roll(lo, -1), np.roll(hi, -1)
    faces += [np.stack([lo, lo2, hi2], 1), np.stack([lo, hi2, hi], 1)]
    corners = np.array([[-sx, -sy, -base], [sx, -sy, -base], [sx, sy, -base], [-sx, sy, -base]])
    k = n + len(ring)
    faces.append(np.array([[k, k + 2, k + 1], [k, k + 3, k + 2]]))  # facing down
    return np.concatenate([top, low, corners]), np.concatenate(faces)


def _primitive_counts() -> dict[int, tuple[int, int]]:
    """(vertices, faces) of each primitive's mesh: the same whatever its size."""
    G = mujoco.mjtGeom
    one = np.ones(3)
    shapes = {G.mjGEOM_PLANE: _plane(one), G.mjGEOM_SPHERE: _revolve(_arc(-math.pi / 2, math.pi / 2, 2 * _RINGS)),
              G.mjGEOM_CAPSULE: _revolve(np.concatenate([_arc(-math.pi / 2, 0.0, _RINGS),
                                                         _arc(0.0, math.pi / 2, _RINGS)])),
              G.mjGEOM_CYLINDER: _cylinder(1.0, 1.0), G.mjGEOM_BOX: _box(one)}
    shapes[G.mjGEOM_ELLIPSOID] = shapes[G.mjGEOM_SPHERE]
    return {int(t): (len(v), len(f)) for t, (v, f) in shapes.items()}


_PRIMITIVE_COUNTS = _primitive_counts()
