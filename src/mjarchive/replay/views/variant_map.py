"""Per-world model variants at replay: which rows of the rendered model take each world's values.

An archive stores a world's variant values shaped like the recorded model's fields
(`Archive.variant(world, frame)`, e.g. geom_rgba (ngeom, 4)). What a unit renders is that model,
the model plus Warp's replay cameras (one body and cameras appended last, named
`mjarchive-replay*`), or a scene of N copies of it (`compile_child.apply_recipe`). `VariantLayout`
maps the worlds' values onto the rendered model's rows:

- one world: row i is row i; the appended replay body and cameras keep their own values.
- a scene: copy k's bodies, geoms, sites, lights and cameras take world k's values. The copies
  are laid out as apply_recipe lays them out (bodies copy after copy; world-body elements copy
  after copy, before all body elements; the elements of each copy's bodies copy after copy), and
  the layout is checked against the scene model (counts divide evenly, copies' element types
  agree, counts equal the archive's declared shapes). Positions of elements attached to the world
  body and of top-level bodies get the copy's grid offset added. What the scene holds once for all
  copies takes the **first world's** values: materials (mat_rgba), and the floor planes and
  directional lights of the world body, whose position, size and light position stay the scene's
  own (they span the grid); their colours, orientation, direction and material follow world 0.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from ..._errors import BackendError, LayoutMismatchError
from ...archive.variants import VARIANT_FIELDS, field_shape
from .scene import replay_elements

__all__ = ["VariantLayout", "VariantSpans", "check_replay_model", "layout_for", "KINEMATIC_FIELDS"]

#: Element kind of each MjModel size name a variant field is counted by.
_KIND = {"nbody": "body", "ngeom": "geom", "nsite": "site", "nlight": "light", "ncam": "cam", "nmat": "mat"}
_BODY_ID = {"geom": "geom_bodyid", "site": "site_bodyid", "light": "light_bodyid", "cam": "cam_bodyid"}
#: What must agree between copies, besides the (copy-relative) body.
_TYPE = {"geom": "geom_type", "site": "site_type", "light": "light_type", "cam": "cam_mode"}
#: Positions relative to the parent: a copy's world-body elements and top-level bodies move by its offset.
_POSITIONS = frozenset({"body_pos", "geom_pos", "site_pos", "light_pos"})
#: What a scene's shared floors and directional lights keep of their own (they span the whole grid).
_SHARED_OWN = frozenset({"geom_pos", "geom_size", "light_pos"})
KINEMATIC_FIELDS = frozenset(name for name, rule in VARIANT_FIELDS.items() if rule.kinematic)


def _kind(name: str) -> str:
    return _KIND[VARIANT_FIELDS[name].size]


def _count(model: mujoco.MjModel, kind: str) -> int:
    return int(getattr(model, "n" + kind))


def check_replay_model(shapes: dict[str, tuple[int, ...]], model: mujoco.MjModel) -> None:
    """Refuse a replay model (the caller's `model=`) whose variant fields differ in shape from the
    archive's declared ones: the worlds' values could not be placed on its elements."""
    for name, shape in shapes.items():
        if field_shape(model, name) != tuple(shape):
            raise LayoutMismatchError(
                f"the archive varies {name} per world with shape {tuple(shape)}, but the replay model's {name} has "
                f"shape {field_shape(model, name)}; pass a model with the recorded model's elements, or leave "
                "model= out to replay with the archive's own")


class _Rows:
    """Copy k's rows of one element kind: base rows `src` go to rendered rows `dst`; `top`: the
    element hangs on the world body (its position moves by the copy's offset); `shared`: an
    element copy 0 holds for the whole scene."""

    __slots__ = ("src", "dst", "top", "shared")

    def __init__(self, src, dst, top=None, shared=None):
        self.src, self.dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        self.top = np.zeros(len(self.src), bool) if top is None else np.asarray(top, bool)
        self.shared = np.zeros(len(self.src), bool) if shared is None else np.asarray(shared, bool)


class VariantLayout:
    """Where each world's variant values go in a rendered model.

    shapes: the archive's variant fields and their per-world shapes (`manifest.variants`).
    scene: the `scene.ScenePlan` of a scene model (its copies, in order, and their offsets), or
    None for a model of one world. Raises BackendError if the model's elements cannot be mapped.
    """

    def __init__(self, model: mujoco.MjModel, shapes: dict[str, tuple[int, ...]], scene: Any = None):
        self.shapes = {name: tuple(int(s) for s in shape) for name, shape in shapes.items()}
        self.n_copies = 1 if scene is None else len(scene.world_ids)
        self._scene_plan = scene
        self.offsets = np.zeros((1, 3)) if scene is None else np.asarray(scene.offsets, np.float64)
        declared = {_kind(name): shape[0] for name, shape in self.shapes.items()}
        self._rows: dict[str, list[_Rows]] = {}
        for kind in sorted(declared):
            rows = self._one(model, kind, declared[kind]) if scene is None else self._scene(model, kind)
            n_base = len(rows[0].src) + (1 if scene is not None and kind == "body" else 0)  # + the world body
            if n_base != declared[kind]:
                raise BackendError(
                    f"the replay model holds {n_base} {kind}s per world but the archive's variants are declared for "
                    f"{declared[kind]}; the replay model does not match the recorded one (a bug unless model= was "
                    "given: please report it)")
            self._rows[kind] = rows

    # -- one world --------------------------------------------------------------------------------
    def _one(self, model: mujoco.MjModel, kind: str, declared: int) -> list[_Rows]:
        # Warp's replay body and cameras come last and are no world's. A recorded model may end in
        # elements that look like them (`scene.replay_elements`): the archive's count decides.
        n = _count(model, kind)
        n_base = declared if n in (declared, declared + replay_elements(model, kind)) else n - replay_elements(model, kind)
        return [_Rows(np.arange(n_base), np.arange(n_base))]

    # -- a scene of copies ------------------------------------------------------------------------------
    def _scene(self, model: mujoco.MjModel, kind: str) -> list[_Rows]:
        W = self.n_copies
        if kind == "mat":  # assets are copy 0's, shared by all copies
            return [_Rows(np.arange(model.nmat), np.arange(model.nmat))] + [_Rows([], []) for _ in range(W - 1)]
        nbb = self._scene_plan.bodies_per_copy(model)
        if nbb is None:
            self._unmappable(f"its {model.nbody - 1 - replay_elements(model, 'body')} bodies do not split into "
                             f"{W} copies")
        if kind == "body":
            parent = np.asarray(model.body_parentid)
            out = []
            for k in range(W):
                dst = 1 + k * nbb + np.arange(nbb)
                out.append(_Rows(1 + np.arange(nbb), dst, top=parent[dst] == 0))
            return out
        body = np.asarray(getattr(model, _BODY_ID[kind]))
        n_own = body <= W * nbb  # not on the replay camera body
        if kind == "geom":
            shared_type = np.asarray(model.geom_type) == mujoco.mjtGeom.mjGEOM_PLANE
        elif kind == "light":
            shared_type = np.asarray(model.light_type) == mujoco.mjtLightType.mjLIGHT_DIRECTIONAL
        else:
            shared_type = np.zeros(len(body), bool)
        world = np.flatnonzero(n_own & (body == 0))
        s = int(shared_type[world].sum())
        total = len(world) + (W - 1) * s
        if total % W:
            self._unmappable(f"its {len(world)} world-body {kind}s do not split into {W} copies")
        nw = total // W
        first = world[:nw]
        if int(shared_type[first].sum()) != s:
            self._unmappable(f"world-body {kind}s shared by all copies are not all in the first copy")
        own = np.flatnonzero(~shared_type[first])  # base indices of the world elements every copy has
        on_bodies = np.flatnonzero(n_own & (body > 0))
        copy_of = (body[on_bodies] - 1) // max(nbb, 1)
        types = np.asarray(getattr(model, _TYPE[kind]))
        out = []
        for k in range(W):
            if k == 0:
                w_src, w_dst, w_shared = np.arange(nw), first, shared_type[first]
            else:
                start = nw + (k - 1) * (nw - s)
                w_src, w_dst, w_shared = own, world[start:start + nw - s], np.zeros(nw - s, bool)
            mine = on_bodies[copy_of == k]
            out.append(_Rows(np.concatenate([w_src, nw + np.arange(len(mine))]), np.concatenate([w_dst, mine]),
                             np.concatenate([np.ones(len(w_src), bool), np.zeros(len(mine), bool)]),
                             np.concatenate([w_shared, np.zeros(len(mine), bool)])))
        # Copies are one model each: the same element types on the same (copy-relative) bodies.
        ref = out[0]
        for k, rows in enumerate(out[1:], start=1):
            rel = np.where(body[rows.dst] > 0, body[rows.dst] - k * nbb, 0)
            ref_rel = np.where(body[ref.dst] > 0, body[ref.dst], 0)
            lookup = dict(zip(ref.src.tolist(), range(len(ref.src))))
            at = np.asarray([lookup[i] for i in rows.src.tolist()], np.int64)
            if len(rows.src) != len(ref.src) - s or not (np.array_equal(types[rows.dst], types[ref.dst][at])
                                                          and np.array_equal(rel, ref_rel[at])):
                self._unmappable(f"copy {k}'s {kind}s differ from copy 0's")
        return out

    def _unmappable(self, why: str):
        raise BackendError(f"cannot give each world of the scene its own model values: {why}; render the worlds "
                           "with layout='per-world' or layout='grid'")

    # -- placing values -----------------------------------------------------------------------------------
    def values(self, worlds: Sequence[dict[str, np.ndarray]], own: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The rendered model's values of every variant field: its `own` values (default_values of
        the rendered model) with each world's rows written over them. `worlds`: one values dict
        per copy, in the scene's order (`Archive.variant` of each world)."""
        if len(worlds) != self.n_copies:
            raise BackendError(f"{len(worlds)} worlds' variant values for a model of {self.n_copies} copies")
        out = {}
        for name, shape in self.shapes.items():
            target = np.array(own[name], copy=True)
            for k, (values, rows) in enumerate(zip(worlds, self._rows[_kind(name)])):
                if not len(rows.src):
                    continue
                v = np.asarray(values[name]).reshape(shape)[rows.src]
                if name in _POSITIONS and self.n_copies > 1:
                    v = v + self.offsets[k] * rows.top[:, None]
                keep = ~rows.shared if name in _SHARED_OWN else slice(None)
                target[rows.dst[keep]] = v[keep]
            out[name] = target
        return out


def layout_for(renderer: Any, shapes: dict[str, tuple[int, ...]], scene: Any = None) -> VariantLayout:
    """The renderer's VariantLayout for these shapes and scene, made once and kept in its
    `variant_layouts` (renderers are cached per thread and model, so the layout is too)."""
    key = (tuple(sorted((k, tuple(v)) for k, v in shapes.items())), scene)
    cache = renderer.variant_layouts
    if key not in cache:
        cache.clear()
        cache[key] = VariantLayout(renderer.model, shapes, scene)
    return cache[key]


#: Values kept per world of a unit: its stretches between changes (a unit sees its current one and a few more).
_SPANS_PER_WORLD = 4
#: Placed value sets kept (one per combination of the worlds' stretches a unit met).
_PLACED = 16


class VariantSpans:
    """The variant values in force for a unit's world(s), per frame, placed on a renderer's model.

    A world's values are read once per span (the frames between two of its changes) and kept per
    (world, span), so a change in one world of a scene reads only that world again; `key(frame)`
    names the span of every world at once, so a caller sets new values only where it changes.
    archive: the open Archive; worlds: the original IDs in the rendered model's order (one, or a
    scene's); renderer: a CpuRenderer or WarpRenderer (its `model`, `variant_defaults` and
    `variant_layouts`); scene: the unit's ScenePlan or None; frames: the frames the unit draws
    (only the events deciding them are read, `Archive.variant_window`).
    """

    def __init__(self, archive: Any, worlds: Sequence[int], renderer: Any, scene: Any = None, *,
                 frames: Sequence[int]):
        shapes = {name: tuple(spec.shape) for name, spec in archive.manifest.variants.items()}
        self.archive, self.worlds = archive, [int(w) for w in worlds]
        self.layout = layout_for(renderer, shapes, scene)
        self.own = renderer.variant_defaults
        self.window = archive.variant_window(self.worlds, np.asarray(frames, np.int64))
        self.changes = [self.window.changes(w) for w in self.worlds]
        self._read: collections.OrderedDict[tuple[int, int], dict[str, np.ndarray]] = collections.OrderedDict()
        self._placed: collections.OrderedDict[tuple[int, ...], dict[str, np.ndarray]] = collections.OrderedDict()

    def key(self, frame: int) -> tuple[int, ...]:
        return tuple(int(np.searchsorted(c, frame, side="right")) for c in self.changes)

    def values(self, frame: int) -> dict[str, np.ndarray]:
        """Every variant field of the rendered model at `frame` (see VariantLayout.values)."""
        key = self.key(frame)
        placed = self._placed.get(key)
        if placed is None:
            placed = self.layout.values([self._world(k, span, frame) for k, span in enumerate(key)], self.own)
            self._placed[key] = placed
            if len(self._placed) > _PLACED:
                self._placed.popitem(last=False)
        else:
            self._placed.move_to_end(key)
        return placed

    def _world(self, k: int, span: int, frame: int) -> dict[str, np.ndarray]:
        """World k's values in its span `span` (which holds `frame`), read once."""
        hit = self._read.get((k, span))
        if hit is None:
            hit = self._read[k, span] = self.window.values(self.worlds[k], int(frame))
            if len(self._read) > _SPANS_PER_WORLD * len(self.worlds):
                self._read.popitem(last=False)
        else:
            self._read.move_to_end((k, span))
        return hit

    def rows(self, frames: Sequence[int]) -> dict[str, np.ndarray]:
        """name -> (len(frames), *field shape) of the values at each frame."""
        keys = [self.key(f) for f in frames]
        distinct = {k: self.values(f) for k, f in zip(keys, frames)}
        names = list(self.layout.shapes)
        if len(distinct) == 1:
            (only,) = distinct.values()
            return {n: np.broadcast_to(only[n], (len(frames), *only[n].shape)) for n in names}
        return {n: np.stack([distinct[k][n] for k in keys]) for n in names}
