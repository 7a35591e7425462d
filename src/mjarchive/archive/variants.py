"""Per-world model variants (format 1.1): which MjModel fields may vary, their shapes, and checks.

A variant event says: from frame f on, world w draws with these values of one model field. Only
fields that change what is drawn or where are allowed, never the qpos layout (spec/README.md,
"Model variants"). Values read from an archive are hostile until `check_values` passed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import mujoco
import numpy as np

from .._errors import AppendError, FormatError, LayoutMismatchError

__all__ = ["FieldRule", "VARIANT_FIELDS", "VariantSpec", "field_shape", "check_values", "apply_variant",
           "default_values", "chunk_events_for", "needs_model", "variant_rows", "window_events"]

#: |value| bound of positions and sizes, in metres (a hostile 1e300 would break cameras and BVHs).
MAX_ABS_COORD = 1e6
MAX_LIGHT = 1e3  # light colour components
QUAT_NORM_TOLERANCE = 1e-3
MAX_VARIANT_EVENTS = 1 << 24  # per field
MAX_EVENT_CHUNK = 1 << 12
EVENT_CHUNK_BYTES = 1 << 20  # writers aim for chunks of about this size


@dataclasses.dataclass(frozen=True)
class FieldRule:
    """An allowed field: its count (an MjModel size name), trailing shape, dtype and value rule."""

    size: str
    tail: tuple[int, ...]
    dtype: str
    rule: str  # unit | nonneg | coord | quat | direction | light | fovy | matid | dataid
    kinematic: bool = False  # applies before kinematics (poses)


VARIANT_FIELDS: dict[str, FieldRule] = {
    "geom_rgba": FieldRule("ngeom", (4,), "float32", "unit"),
    "geom_size": FieldRule("ngeom", (3,), "float64", "nonneg"),
    "geom_pos": FieldRule("ngeom", (3,), "float64", "coord", True),
    "geom_quat": FieldRule("ngeom", (4,), "float64", "quat", True),
    "geom_matid": FieldRule("ngeom", (), "int32", "matid"),
    "geom_dataid": FieldRule("ngeom", (), "int32", "dataid"),
    "mat_rgba": FieldRule("nmat", (4,), "float32", "unit"),
    "body_pos": FieldRule("nbody", (3,), "float64", "coord", True),
    "body_quat": FieldRule("nbody", (4,), "float64", "quat", True),
    "site_rgba": FieldRule("nsite", (4,), "float32", "unit"),
    "site_size": FieldRule("nsite", (3,), "float64", "nonneg"),
    "site_pos": FieldRule("nsite", (3,), "float64", "coord", True),
    "site_quat": FieldRule("nsite", (4,), "float64", "quat", True),
    "light_pos": FieldRule("nlight", (3,), "float64", "coord", True),
    "light_dir": FieldRule("nlight", (3,), "float64", "direction", True),
    "light_diffuse": FieldRule("nlight", (3,), "float32", "light"),
    "light_ambient": FieldRule("nlight", (3,), "float32", "light"),
    "light_specular": FieldRule("nlight", (3,), "float32", "light"),
    "cam_fovy": FieldRule("ncam", (), "float64", "fovy"),
}
MAX_FIELD_COUNT = 1 << 20  # ngeom, nbody, ... as an archive may declare them


@dataclasses.dataclass(frozen=True)
class VariantSpec:
    """A declared variant field: its per-world shape (from the model), dtype and event chunk length."""

    shape: tuple[int, ...]
    dtype: str
    chunk_events: int

    def to_dict(self, n_events: int) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "chunk_events": self.chunk_events,
                "n_events": n_events}

    @property
    def row_bytes(self) -> int:
        return max(1, math.prod(self.shape)) * np.dtype(self.dtype).itemsize


def check_field_name(name: Any) -> FieldRule:
    if type(name) is not str or name not in VARIANT_FIELDS:
        raise FormatError(f"{name!r:.80} is not a field that may vary per world; allowed: {sorted(VARIANT_FIELDS)}")
    return VARIANT_FIELDS[name]


def field_shape(model: mujoco.MjModel, name: str) -> tuple[int, ...]:
    """The per-world shape of an allowed field for this model, e.g. (ngeom, 4) for geom_rgba."""
    rule = check_field_name(name)
    return (int(getattr(model, rule.size)), *rule.tail)


def chunk_events_for(shape: tuple[int, ...], dtype: str) -> int:
    """Events per chunk a writer uses: about 1 MiB of values, a power of two in [1, 4096]."""
    row = max(1, math.prod(shape)) * np.dtype(dtype).itemsize
    n = max(1, min(MAX_EVENT_CHUNK, EVENT_CHUNK_BYTES // row))
    return 1 << (n.bit_length() - 1)


def check_model_shapes(model: mujoco.MjModel, variants: dict[str, VariantSpec]) -> None:
    """The declared shapes must be this model's (LayoutMismatchError otherwise)."""
    for name, spec in variants.items():
        if field_shape(model, name) != tuple(spec.shape):
            raise LayoutMismatchError(f"variant field {name!r} is declared with shape {tuple(spec.shape)}, but the "
                                      f"model's is {field_shape(model, name)}")


def check_values(name: str, values: np.ndarray, model: mujoco.MjModel | None = None, *, what: str = "") -> None:
    """Refuse values of `name` that MuJoCo could not draw safely; `values` has shape (k, *field shape).

    Index fields and cam_fovy need the model (how many materials and meshes exist; which cameras
    are orthographic); without it only the model-independent part of their rule is checked.
    """
    with np.errstate(all="ignore"):  # a hostile 1e300 overflows the norms: refused below, never a warning
        _check_values(name, values, model, what)


def _check_values(name: str, values: np.ndarray, model: mujoco.MjModel | None, what: str) -> None:
    rule = VARIANT_FIELDS[name]
    where = f"variant {name}{what}"
    v = values
    if rule.dtype != "int32" and not np.isfinite(v).all():
        raise FormatError(f"{where} holds non-finite values")
    if rule.rule == "unit" and ((v < 0) | (v > 1)).any():
        raise FormatError(f"{where}: colours must lie in [0, 1]")
    elif rule.rule == "nonneg" and ((v < 0) | (v > MAX_ABS_COORD)).any():
        raise FormatError(f"{where}: sizes must lie in [0, {MAX_ABS_COORD:g}] m")
    elif rule.rule == "coord" and (np.abs(v) > MAX_ABS_COORD).any():
        raise FormatError(f"{where}: positions must lie within ±{MAX_ABS_COORD:g} m")
    elif rule.rule == "quat" and v.size:
        norm = np.linalg.norm(v, axis=-1)
        if (np.abs(norm - 1) > QUAT_NORM_TOLERANCE).any():
            raise FormatError(f"{where}: quaternions must have unit norm (±{QUAT_NORM_TOLERANCE:g}); normalize them")
    elif rule.rule == "direction" and v.size:
        norm = np.linalg.norm(v, axis=-1)
        if ((norm < 1e-6) | (norm > MAX_ABS_COORD)).any():
            raise FormatError(f"{where}: light directions must be non-zero and bounded")
    elif rule.rule == "light" and ((v < 0) | (v > MAX_LIGHT)).any():
        raise FormatError(f"{where}: light colours must lie in [0, {MAX_LIGHT:g}]")
    elif rule.rule == "fovy":
        # Perspective cameras: degrees; orthographic ones: the view's height in metres.
        ortho = (np.ones(v.shape[-1], bool) if model is None else
                 np.asarray(model.cam_projection) == mujoco.mjtProjection.mjPROJ_ORTHOGRAPHIC)
        if ((v <= 0) | (v >= np.where(ortho, MAX_ABS_COORD, 180))).any():
            raise FormatError(f"{where}: camera fields of view must lie in (0, 180) degrees (orthographic "
                              f"cameras: (0, {MAX_ABS_COORD:g}) m)")
    elif rule.rule == "matid" and model is not None and ((v < -1) | (v >= model.nmat)).any():
        raise FormatError(f"{where}: material ids must be -1 or in [0, {model.nmat})")
    elif rule.rule == "dataid" and model is not None:
        _check_dataid(v, model, where)


def needs_model(name: str) -> bool:
    """Whether `check_values` of this field needs the model (ids; which cameras are orthographic)."""
    return VARIANT_FIELDS[name].rule in ("matid", "dataid", "fovy")


def variant_rows(name: str, value: Any, shape: tuple[int, ...], ids: np.ndarray,
                 model: mujoco.MjModel | None = None) -> np.ndarray:
    """A `set_variant` value (one world's shape, or one row per world of `ids`) as stored rows
    (len(ids), *shape), a copy; AppendError naming the world and rule on bad input."""
    dtype, v, k = VARIANT_FIELDS[name].dtype, np.asarray(value), len(ids)
    if v.dtype.kind not in ("iu" if dtype == "int32" else "fiu"):
        raise AppendError(f"variant {name} must be {'integer' if dtype == 'int32' else 'numeric'}, got dtype {v.dtype}")
    if v.shape == tuple(shape):
        v = np.broadcast_to(v, (k, *shape))
    elif v.shape != (k, *shape):
        raise AppendError(f"variant {name} has shape {v.shape}; expected {tuple(shape)} or {(k, *shape)}")
    rows = np.array(v, dtype=dtype)
    if dtype == "int32" and not np.array_equal(rows, v):
        raise AppendError(f"variant {name} holds values outside int32")
    try:
        check_values(name, rows, model)
    except FormatError:  # name the first world refused
        for i in range(k):
            try:
                check_values(name, rows[i:i + 1], model, what=f" of world {int(ids[i])}")
            except FormatError as exc:
                raise AppendError(str(exc)) from None
    return rows


def _check_dataid(v: np.ndarray, model: mujoco.MjModel, where: str) -> None:
    """A geom draws the mesh or height field its dataid names: it must exist and fit the geom's type."""
    gt = mujoco.mjtGeom
    types = np.asarray(model.geom_type)
    mesh = (types == gt.mjGEOM_MESH) | (types == gt.mjGEOM_SDF)
    hfield = types == gt.mjGEOM_HFIELD
    other = ~(mesh | hfield)
    ok = ((~mesh | ((v >= 0) & (v < model.nmesh))) & (~hfield | ((v >= 0) & (v < model.nhfield)))
          & (~other | (v == -1)))
    if not ok.all():
        raise FormatError(f"{where}: a mesh geom needs a mesh id in [0, {model.nmesh}), a height field geom an id in "
                          f"[0, {model.nhfield}), and other geoms -1")


def default_values(model: mujoco.MjModel, names: Any) -> dict[str, np.ndarray]:
    """The model's own values of these fields (copies), shaped like the stored rows."""
    return {n: np.array(getattr(model, n), dtype=VARIANT_FIELDS[n].dtype).reshape(field_shape(model, n))
            for n in names}


def apply_variant(model: mujoco.MjModel, values: dict[str, np.ndarray]) -> None:
    """Set variant values into `model` in place (checked against it first)."""
    for name, value in values.items():
        value = np.asarray(value)
        shape = field_shape(model, name)
        if value.shape != shape:
            raise LayoutMismatchError(f"variant {name} has shape {value.shape}; this model's is {shape}")
        check_values(name, value[None], model)
        target = getattr(model, name)
        if name in _SAMEFRAME:
            # MuJoCo places a geom or site flagged "same frame" at its body's (or inertia's) frame and
            # ignores its own pos/quat: those whose pose changes must be placed from pos/quat again.
            flags = getattr(model, _SAMEFRAME[name])
            moved = (target.reshape(value.shape) != value).reshape(len(flags), -1).any(axis=1)
            flags[moved] = 0
        target[...] = value.reshape(target.shape)


_SAMEFRAME = {"geom_pos": "geom_sameframe", "geom_quat": "geom_sameframe",
              "site_pos": "site_sameframe", "site_quat": "site_sameframe"}


#: Events of one field read at a time by `window_events` (frame and world columns: 12 bytes each).
WINDOW_BLOCK_EVENTS = 1 << 16


def _corrupt(name: str) -> FormatError:
    return FormatError(f"variant events of {name!r} must start at committed frames in nondecreasing order; "
                       "the archive is corrupt")


def window_events(name: str, n_events: int, chunk_events: int, read: Any, frames: np.ndarray,
                  positions: np.ndarray, n_frames: int, n_worlds: int) -> dict[int, tuple[np.ndarray, ...]]:
    """The events of one field that decide what `positions` (world positions) draw at `frames`
    (stored frame indices, sorted, distinct): world position -> (slot, event index, event frame),
    each (k,) int64 in event order, where the event holds from drawn frame `frames[slot]` on (the
    last event at or before that frame; slot 0 also stands for every frame before it).

    Events are sorted by frame: a binary search over chunks finds the last event at or before the
    last drawn frame, and the frame and world columns are read `read(column, lo, hi)` a block at a
    time backwards from there, until every drawn world's value at the first drawn frame is known.
    What is read is bounded by what is drawn where every drawn world has an event at or before the
    first drawn frame. A drawn world with none (it draws the model's own values there) is settled
    only by reaching event 0: then every event up to the last drawn frame is read, so the reads are
    bounded by the field's event count (at most MAX_VARIANT_EVENTS), not by the selection. What is
    kept is bounded either way: of each block only the last event per (world, drawn frame), at most
    len(positions) × len(frames). The rows read are checked as the spec asks (frames in
    [0, n_frames) and nondecreasing, worlds in range)."""
    frames = np.asarray(frames, np.int64)
    positions = np.unique(np.asarray(positions, np.int64))
    out = {int(p): (np.zeros(0, np.int64),) * 3 for p in positions.tolist()}
    if not len(frames) or not n_events or not len(positions):
        return out
    ce = max(1, int(chunk_events))
    block = max(1, WINDOW_BLOCK_EVENTS // ce) * ce

    def rows(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        f = np.asarray(read("frame", lo, hi)).astype(np.int64)
        w = np.asarray(read("world", lo, hi)).astype(np.int64)
        # Compared, not subtracted: np.diff wraps around on hostile int64 extremes.
        if len(f) != hi - lo or len(w) != hi - lo or f[0] < 0 or (f[1:] < f[:-1]).any() or f[-1] >= n_frames:
            raise _corrupt(name)
        if w.min() < 0 or w.max() >= n_worlds:
            raise FormatError(f"a variant event of {name!r} names a world position outside [0, {n_worlds})")
        return f, w

    # The end: events [0, end) start at or before the last drawn frame (one chunk per probe).
    lo_c, hi_c = 0, -(-n_events // ce)  # the chunk holding the end is in [lo_c, hi_c)
    end = n_events
    while lo_c < hi_c:
        mid = (lo_c + hi_c) // 2
        f, _ = rows(mid * ce, min(n_events, (mid + 1) * ce))
        if f[0] > frames[-1]:
            hi_c, end = mid, mid * ce
        elif f[-1] <= frames[-1]:
            lo_c = mid + 1
        else:
            end = mid * ce + int(np.searchsorted(f, frames[-1], side="right"))
            break
    slots = len(frames) + 1
    best: dict[int, tuple[int, int]] = {}
    open_worlds = set(positions.tolist())  # drawn worlds whose value at the first drawn frame is unknown
    hi, after = end, None  # `after`: the first frame of the block read before (later events)
    while hi > 0 and open_worlds:
        lo = max(0, ((hi - 1) // block) * block)
        f, w = rows(lo, hi)
        if after is not None and f[-1] > after:
            raise _corrupt(name)
        after = int(f[0])
        slot = np.searchsorted(frames, f, side="left")
        at = np.minimum(np.searchsorted(positions, w), len(positions) - 1)
        mine = positions[at] == w
        if mine.any():
            keys = at[mine] * slots + slot[mine]
            index = lo + np.flatnonzero(mine)
            unique, last = np.unique(keys[::-1], return_index=True)  # the last event of each key
            for key, i, fr in zip(unique.tolist(), index[::-1][last].tolist(), f[mine][::-1][last].tolist()):
                best.setdefault(key, (i, fr))  # a later block's event wins
                if key % slots == 0:  # earlier events of this world only hold before the first drawn frame
                    open_worlds.discard(int(positions[key // slots]))
        hi = lo
    keys = np.asarray(sorted(best), np.int64)
    found = np.asarray([best[k] for k in keys.tolist()], np.int64).reshape(-1, 2)
    for k, p in enumerate(positions.tolist()):
        mine = keys // slots == k
        out[p] = (keys[mine] % slots, found[mine, 0], found[mine, 1])
    return out
