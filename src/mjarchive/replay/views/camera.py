"""Replay cameras: the `Camera` value users pass, and what replay resolves it to.

A `Camera` is a request (`free`, `track`, `auto`, or a model camera), independent of any model,
that travels as a dict or a CLI string (`track:torso,distance=3,azimuth=90`). Against a model it
resolves to a `View`: the parameters of a MuJoCo free camera (lookat, distance, azimuth,
elevation, fovy). A tracking view gets its lookat and azimuth per frame from `track_path`,
computed once, in frame order, in the process that plans the render: exponential smoothing
depends on every earlier frame of the episode, so it cannot be computed per work unit, and one
path gives both backends the same camera. The CPU backend renders a View as an `MjvCamera`; the
Warp backend as a camera added to the model whose pose is set per state from `view_pose`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import mujoco
import numpy as np

from ..._errors import MjArchiveError, SelectionError

__all__ = ["Camera", "View", "camera_label", "MAX_LABEL", "view_pose", "project", "track_path", "auto_geoms", "auto_view",
           "KINDS"]

KINDS = ("model", "free", "track", "auto")
#: Parameters each kind takes (besides `name` for model cameras and `body` for tracking ones).
_PARAMS = {
    "model": (),
    "free": ("lookat", "distance", "azimuth", "elevation", "fovy"),
    "track": ("distance", "azimuth", "elevation", "fovy", "smoothing", "yaw", "world"),
    "auto": ("azimuth", "elevation", "fovy"),
}
#: Elevation of `Camera.auto()` unless given (degrees; MuJoCo's free camera defaults to -45).
AUTO_ELEVATION = -20.0
#: Frames and worlds `Camera.auto()` samples to bound the selection's bodies.
AUTO_SAMPLE_FRAMES, AUTO_SAMPLE_WORLDS = 32, 16
#: Geom positions Camera.auto frames at most (sampled frames × worlds × geoms): a model of many
#: geoms is framed by every k-th of them (`auto_geoms`), so the samples stay a few MB.
AUTO_SAMPLE_POINTS = 1 << 18
_MAX_DISTANCE = 1e6


_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")
#: Longest camera label in a file name (names come from the archive's model: hostile input).
MAX_LABEL = 48


def camera_label(name: str | None, camera_id: int) -> str:
    """A flat, bounded, file-name-safe camera label: its name, `free` for the free camera, `camN`
    if unnamed. A name that had to be changed (characters outside [A-Za-z0-9_.+-], or longer than
    MAX_LABEL) gets a short hash of the original, so distinct names keep distinct files:
    `../../x` -> `.._.._x-1a2b3c4d`."""
    if camera_id < 0:
        return "free"
    if not name:
        return f"cam{camera_id}"
    safe = _UNSAFE.sub("_", name)
    if safe != name or len(safe) > MAX_LABEL:
        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
        safe = f"{safe[:MAX_LABEL - 9]}-{digest}"
    return safe


def _number(kind: str, key: str, value: Any, lo: float, hi: float, *, open_lo: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        x = math.nan
    if isinstance(value, bool) or not math.isfinite(x) or x > hi or x < lo or (open_lo and x == lo):
        rng = f"({lo:g}, {hi:g}]" if open_lo else f"[{lo:g}, {hi:g}]"
        raise MjArchiveError(f"Camera.{kind}: {key} must be a number in {rng}, got {value!r}")
    return x


@dataclasses.dataclass(frozen=True)
class Camera:
    """What a replay looks through. Build one with `Camera.free`, `Camera.track`, `Camera.auto`,
    `Camera.model`, or `Camera.parse` (CLI strings) / `Camera.from_dict`; unset parameters take the
    model's defaults (MuJoCo's free camera: `<visual><global azimuth elevation fovy>`, lookat the
    model's centre, distance 1.5 × its extent). Angles are degrees, distances metres."""

    kind: str
    name: str | int | None = None  # model: camera name or id
    body: str | None = None  # track: the body whose frame origin stays at the image centre
    lookat: tuple[float, float, float] | None = None
    distance: float | None = None
    azimuth: float | None = None
    elevation: float | None = None
    fovy: float | None = None
    smoothing: float = 0.0  # track: time constant (s of simulated time) of exponential smoothing
    yaw: bool = False  # track: also turn with the body's heading
    world: int | None = None  # track in layout='scene': the world whose body is tracked

    def __post_init__(self) -> None:
        kind = self.kind
        if kind not in KINDS:
            raise MjArchiveError(f"unknown camera kind {str(kind)[:32]!r}; choose one of {list(KINDS)}")
        given = {f.name for f in dataclasses.fields(self)
                 if f.name not in ("kind", "name", "body") and not _is_default(getattr(self, f.name), f.default)}
        extra = given - set(_PARAMS[kind])
        if extra:
            raise MjArchiveError(f"Camera.{kind} takes no {sorted(extra)}; it takes {list(_PARAMS[kind])}")
        if kind == "model":
            if self.name is None or isinstance(self.name, bool) or not isinstance(self.name, (str, int)) or self.name == "":
                raise MjArchiveError(f"Camera.model needs a camera name or id, got {self.name!r}")
        elif self.name is not None:
            raise MjArchiveError(f"Camera.{kind} takes no name")
        if kind == "track":
            if not isinstance(self.body, str) or not self.body:
                raise MjArchiveError(f"Camera.track needs a body name, got {self.body!r}")
        elif self.body is not None:
            raise MjArchiveError(f"Camera.{kind} takes no body")
        fix = object.__setattr__
        if self.lookat is not None:
            try:
                lookat = tuple(self.lookat)
            except TypeError:
                lookat = ()
            if len(lookat) != 3:
                raise MjArchiveError(f"Camera.free: lookat must be 3 numbers (x, y, z), got {self.lookat!r}")
            fix(self, "lookat", tuple(_number(kind, "lookat", v, -_MAX_DISTANCE, _MAX_DISTANCE) for v in lookat))
        if self.distance is not None:
            fix(self, "distance", _number(kind, "distance", self.distance, 0.0, _MAX_DISTANCE, open_lo=True))
        if self.azimuth is not None:
            fix(self, "azimuth", _number(kind, "azimuth", self.azimuth, -3600.0, 3600.0))
        if self.elevation is not None:
            fix(self, "elevation", _number(kind, "elevation", self.elevation, -90.0, 90.0))
        if self.fovy is not None:
            fix(self, "fovy", _number(kind, "fovy", self.fovy, 0.0, 179.0, open_lo=True))
        fix(self, "smoothing", _number(kind, "smoothing", self.smoothing, 0.0, 3600.0))
        if not isinstance(self.yaw, (bool, np.bool_)):
            raise MjArchiveError(f"Camera.track: yaw must be True or False, got {self.yaw!r}")
        fix(self, "yaw", bool(self.yaw))
        if self.world is not None:
            if isinstance(self.world, bool) or not isinstance(self.world, (int, np.integer)):
                raise MjArchiveError(f"Camera.track: world must be a world ID (int), got {self.world!r}")
            fix(self, "world", int(self.world))
        if isinstance(self.name, np.integer):
            fix(self, "name", int(self.name))

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def free(cls, lookat=None, distance=None, azimuth=None, elevation=None, fovy=None) -> Camera:
        """A static free camera looking at `lookat` from `distance`, `azimuth`, `elevation`."""
        return cls("free", lookat=lookat, distance=distance, azimuth=azimuth, elevation=elevation, fovy=fovy)

    @classmethod
    def track(cls, body: str, distance=None, azimuth=None, elevation=None, fovy=None, smoothing: float = 0.0,
              yaw: bool = False, world: int | None = None) -> Camera:
        """Follows `body` of the world being rendered: its frame origin stays at the image centre
        (with `yaw`, the camera also turns with the body's heading). `smoothing` seconds of
        simulated time smooth the motion exponentially; each episode starts unsmoothed. In
        layout='scene', `world` picks the world to follow (default: the first selected)."""
        return cls("track", body=body, distance=distance, azimuth=azimuth, elevation=elevation, fovy=fovy,
                   smoothing=smoothing, yaw=yaw, world=world)

    @classmethod
    def auto(cls, azimuth=None, elevation=None, fovy=None) -> Camera:
        """A static camera framing the selected worlds' bodies over the selected frames."""
        return cls("auto", azimuth=azimuth, elevation=elevation, fovy=fovy)

    @classmethod
    def model(cls, name: str | int) -> Camera:
        """A camera of the model, by name or id."""
        return cls("model", name=name)

    # -- serialization ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The parameters that differ from the defaults, with `kind`: `Camera.from_dict` inverts it."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "kind" and value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Camera:
        if not isinstance(d, Mapping) or "kind" not in d:
            raise MjArchiveError(f"a camera dict needs a 'kind' ({list(KINDS)}), got {d!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise MjArchiveError(f"unknown camera keys {sorted(map(str, unknown))}; valid: {sorted(fields)}")
        return cls(**dict(d))

    @classmethod
    def parse(cls, text: str) -> Camera:
        """A camera from its CLI form: `free`, `free:lookat=0,0,1,distance=4`, `auto`,
        `auto:elevation=-30`, `track:torso,distance=3,azimuth=90,yaw,smoothing=0.2`, or a model
        camera's name or id (`side`, `0`)."""
        if isinstance(text, Camera):
            return text
        if not isinstance(text, str) or not text.strip():
            raise MjArchiveError(f"a camera must be a non-empty string or a Camera, got {text!r}")
        head, sep, rest = text.strip().partition(":")
        if head not in ("free", "track", "auto"):
            if sep:
                raise MjArchiveError(
                    f"cannot parse camera {text!r}: a prefix must be one of free:, track:, auto: "
                    "(e.g. 'track:torso,distance=3', 'free:lookat=0,0,1,distance=4'), else give a model camera's name")
            is_id = head.isascii() and head.isdigit() and len(head) <= 9
            return cls("model", name=int(head) if is_id else head)
        kwargs: dict[str, Any] = {}
        key = None
        for token in (t.strip() for t in rest.split(",")) if rest else ():
            if "=" in token:
                key, _, value = token.partition("=")
                key = key.strip()
                if key not in _PARAMS[head]:
                    raise MjArchiveError(f"cannot parse camera {text!r}: {head} takes {list(_PARAMS[head])}, not {key!r}")
                kwargs[key] = [value] if key == "lookat" else value
            elif key == "lookat" and len(kwargs["lookat"]) < 3:
                kwargs["lookat"].append(token)
            elif head == "track" and "body" not in kwargs and not kwargs:
                kwargs["body"] = token
            elif token == "yaw" and head == "track":
                kwargs["yaw"] = "1"
            else:
                raise MjArchiveError(f"cannot parse camera {text!r} at {token!r}: expected key=value with keys "
                                     f"{list(_PARAMS[head])}")
        for k, v in list(kwargs.items()):
            if k == "yaw":
                if str(v).lower() not in ("1", "0", "true", "false", "on", "off"):
                    raise MjArchiveError(f"cannot parse camera {text!r}: yaw is on/off, got {v!r}")
                kwargs[k] = str(v).lower() in ("1", "true", "on")
            elif k == "world":
                try:
                    kwargs[k] = int(v)
                except ValueError:
                    raise MjArchiveError(f"cannot parse camera {text!r}: world must be a world ID, got {v!r}") from None
            elif k == "lookat":
                if len(v) != 3:
                    raise MjArchiveError(f"cannot parse camera {text!r}: lookat needs 3 numbers, e.g. lookat=0,0,1")
                kwargs[k] = tuple(_parse_float(text, k, x) for x in v)
            elif k != "body":
                kwargs[k] = _parse_float(text, k, v)
        if head == "track" and "body" not in kwargs:
            raise MjArchiveError(f"cannot parse camera {text!r}: name the body, e.g. 'track:torso,distance=3'")
        return cls(head, **kwargs)

    def __str__(self) -> str:
        """The CLI form (`Camera.parse(str(c)) == c`)."""
        if self.kind == "model":
            return str(self.name)
        parts = [self.body] if self.kind == "track" else []
        for key in _PARAMS[self.kind]:
            value = getattr(self, key)
            default = Camera.__dataclass_fields__[key].default
            if value == default:
                continue
            if key == "lookat":
                parts.append("lookat=" + ",".join(repr(v) for v in value))
            elif key == "yaw":
                parts.append("yaw")
            else:
                parts.append(f"{key}={value!r}")
        return self.kind + (":" + ",".join(parts) if parts else "")

    def label(self) -> str:
        """The file label: `free`, `auto`, `track-torso` (a hostile body name is made safe, see
        `camera_label`); a model camera's label comes from the model's name for it."""
        if self.kind == "model":
            raise MjArchiveError("a model camera's label depends on the model: resolve it first")
        return self.kind if self.kind != "track" else "track-" + camera_label(self.body, 0)


def _is_default(value: Any, default: Any) -> bool:
    if value is None or default is None:
        return value is default
    if isinstance(value, np.ndarray):
        return False
    return value == default


def _parse_float(text: str, key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise MjArchiveError(f"cannot parse camera {text!r}: {key} must be a number, got {value!r}") from None


@dataclasses.dataclass(frozen=True)
class View:
    """A resolved replay camera: MuJoCo free-camera parameters, plus what tracking needs.

    `lookat`/`azimuth` are the values of a static view; a tracking view (body >= 0) gets them per
    frame from its work unit. `slot`: index of its camera among those the Warp backend adds."""

    label: str
    lookat: tuple[float, float, float]
    distance: float
    azimuth: float
    elevation: float
    fovy: float
    body: int = -1
    yaw: bool = False
    smoothing: float = 0.0
    world: int | None = None
    slot: int = 0

    @property
    def tracking(self) -> bool:
        return self.body >= 0

    def key(self) -> dict[str, Any]:
        """What decides its pixels (for the resume key)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "slot"}

    def pose(self, frame_pose: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(position, orientation) it looks from; `frame_pose`: a tracking view's (x, y, z, azimuth)
        of this frame, or (n, 4) of n frames."""
        if frame_pose is None:
            return view_pose(self.lookat, self.distance, self.azimuth, self.elevation)
        frame_pose = np.asarray(frame_pose)
        return view_pose(frame_pose[..., :3], self.distance, frame_pose[..., 3], self.elevation)


def _defaults(model: mujoco.MjModel) -> dict[str, Any]:
    """MuJoCo's free-camera defaults from the model, each replaced by MuJoCo's own default value
    when the model's is out of range (the model comes from someone else's archive)."""
    g = model.vis.global_
    centre = np.asarray(model.stat.center, np.float64)
    extent = float(model.stat.extent)

    def ok(x: float, lo: float, hi: float, fallback: float) -> float:
        return float(x) if math.isfinite(x) and lo <= x <= hi and not (lo == 0 and x == 0) else fallback

    return {"lookat": tuple(float(v) for v in centre) if np.all(np.abs(centre) <= _MAX_DISTANCE) else (0.0, 0.0, 0.0),
            "distance": 1.5 * ok(extent, 0.0, _MAX_DISTANCE / 2, 1.0),
            "azimuth": ok(float(g.azimuth), -3600.0, 3600.0, 90.0),
            "elevation": ok(float(g.elevation), -90.0, 90.0, -45.0),
            "fovy": ok(float(g.fovy), 0.0, 179.0, 45.0)}


def resolve(camera: Camera, model: mujoco.MjModel, label: str, slot: int = 0) -> View:
    """The View of a free or tracking Camera on `model` (auto cameras: see `auto_view`)."""
    d = _defaults(model)
    params = {k: getattr(camera, k) for k in d if getattr(camera, k, None) is not None}
    d.update(params)
    body = -1
    if camera.kind == "track":
        body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, camera.body)
        if body < 0:
            names = [model.body(i).name for i in range(1, min(model.nbody, 41))]
            shown = ", ".join(repr(n[:40]) for n in names if n) + (" ..." if model.nbody > 41 else "")
            raise SelectionError(f"Camera.track: no body {camera.body[:64]!r} in the model; bodies: {shown or 'none'}")
        if body == 0:
            raise SelectionError("Camera.track: the world body never moves; name a body of the robot")
    return View(label, tuple(d["lookat"]), d["distance"], d["azimuth"], d["elevation"], d["fovy"], body,
                camera.yaw, camera.smoothing, None if camera.world is None else int(camera.world), slot)


# -- geometry -------------------------------------------------------------------------------------------

def view_pose(lookat: np.ndarray, distance: float, azimuth: np.ndarray, elevation: float) -> tuple[np.ndarray, np.ndarray]:
    """Position (..., 3) and orientation (..., 3, 3) (columns: the camera's x right, y up, z back)
    of MuJoCo's free camera, as `mjv_updateCamera` computes it; lookat (..., 3), azimuth (...)."""
    lookat = np.asarray(lookat, np.float64)
    az = np.deg2rad(np.asarray(azimuth, np.float64))
    el = math.radians(elevation)
    ca, sa, ce, se = np.cos(az), np.sin(az), math.cos(el), math.sin(el)
    forward = np.stack([ce * ca, ce * sa, np.full_like(ca, se)], axis=-1)
    up = np.stack([-se * ca, -se * sa, np.full_like(ca, ce)], axis=-1)
    right = np.cross(forward, up)
    pos = lookat - distance * forward
    return pos, np.stack([right, up, -forward], axis=-1)


def project(points: np.ndarray, pos: np.ndarray, xmat: np.ndarray, fovy: float,
            size: tuple[int, int]) -> np.ndarray:
    """Pixel coordinates (x right, y down; NaN behind the camera) of world points (..., 3) seen by
    a camera at `pos` with orientation `xmat` and vertical field of view `fovy`, at (H, W)."""
    h, w = size
    local = (np.asarray(points, np.float64) - pos) @ xmat  # coordinates along the camera's axes
    depth = -local[..., 2]
    f = (h / 2) / math.tan(math.radians(fovy) / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = w / 2 + f * local[..., 0] / depth
        y = h / 2 - f * local[..., 1] / depth
    out = np.stack([x, y], axis=-1)
    out[depth <= 0] = np.nan
    return out


def body_heading(xmat: np.ndarray) -> np.ndarray:
    """Heading (degrees about +z) of bodies' x axes, xmat (..., 9) row-major."""
    return np.degrees(np.arctan2(xmat[..., 3], xmat[..., 0]))


def track_path(view: View, xpos: np.ndarray, xmat: np.ndarray | None, times: np.ndarray,
               episode: np.ndarray) -> np.ndarray:
    """Per-frame (lookat x, y, z, azimuth) of a tracking view: `xpos` (n, 3) and `xmat` (n, 9) are
    the tracked body's poses at the selected frames in order, `times` (n,) their simulated times,
    `episode` (n,) their episode numbers (smoothing restarts at every change). A pose that is not
    finite (a diverged simulation) holds the camera where it was."""
    n = len(xpos)
    target = np.empty((n, 4), np.float64)
    target[:, :3] = xpos
    target[:, 3] = 0.0
    if view.yaw and xmat is not None:
        target[:, 3] = body_heading(xmat)
    bad = ~np.all(np.isfinite(target) & (np.abs(target) <= _MAX_DISTANCE), axis=1)
    starts = np.flatnonzero(np.r_[True, np.asarray(episode)[1:] != np.asarray(episode)[:-1]]) if n else []
    for s, e in zip(starts, [*starts[1:], n]):
        part = target[s:e]
        ok = np.flatnonzero(~bad[s:e])
        if not len(ok):  # no finite pose in this episode: look where the view looks by default
            part[:] = [*view.lookat, 0.0]
            continue
        held = ok[np.maximum(np.searchsorted(ok, np.arange(e - s), side="right") - 1, 0)]
        part[:] = part[held]  # each bad frame takes the last good one (or the episode's first good)
        if view.yaw:  # unwrap within the episode: a turn past 180 degrees does not spin the camera back
            part[:, 3] = np.degrees(np.unwrap(np.radians(part[:, 3])))
    target[:, 3] += view.azimuth
    if view.smoothing <= 0 or n == 0:
        return target
    out = np.empty((n, 4), np.float64)
    state = target[0].copy()
    for i in range(n):
        if i == 0 or episode[i] != episode[i - 1]:
            state = target[i].copy()
        else:
            dt = float(times[i] - times[i - 1])
            dt = dt if math.isfinite(dt) and dt > 0 else 0.0
            a = 1.0 - math.exp(-dt / view.smoothing)
            state += a * (target[i] - state)
        out[i] = state
    return out


def bounding_sphere(points: np.ndarray, radii: np.ndarray) -> tuple[np.ndarray, float] | None:
    """Centre and radius of a sphere holding balls (points (n, 3), radii (n,)); None if empty."""
    ok = np.all(np.isfinite(points) & (np.abs(points) <= _MAX_DISTANCE), axis=1) & np.isfinite(radii)
    ok &= radii <= _MAX_DISTANCE
    points, radii = points[ok], radii[ok]
    if not len(points):
        return None
    lo = (points - radii[:, None]).min(axis=0)
    hi = (points + radii[:, None]).max(axis=0)
    centre = (lo + hi) / 2
    radius = float(np.max(np.linalg.norm(points - centre, axis=1) + radii))
    return centre, max(radius, 1e-3)


def framing_geoms(model: mujoco.MjModel) -> np.ndarray:
    """Geoms `Camera.auto` frames: those of bodies that move (not welded to the world), visible
    and bounded; if the model has none, every bounded geom."""
    bounded = (model.geom_rbound > 0) & (model.geom_type != mujoco.mjtGeom.mjGEOM_PLANE)
    bounded &= model.geom_rgba[:, 3] > 0
    moving = bounded & (model.body_weldid[model.geom_bodyid] != 0)
    return np.flatnonzero(moving if moving.any() else bounded)


def auto_geoms(geoms: np.ndarray, poses: int, budget: int = AUTO_SAMPLE_POINTS) -> np.ndarray:
    """The geoms Camera.auto samples at `poses` (frame, world) states: `geoms`, or every k-th of
    them (first and last kept) when poses × len(geoms) would pass `budget` points."""
    geoms = np.asarray(geoms)
    keep = max(1, int(budget) // max(1, int(poses)))
    return geoms if len(geoms) <= keep else geoms[sample_indices(len(geoms), keep)]


def auto_view(model: mujoco.MjModel, camera: Camera, label: str, geom_xpos: np.ndarray,
              geoms: np.ndarray, size: tuple[int, int], slot: int = 0) -> View:
    """A static View framing the geoms `geoms` at the sampled positions `geom_xpos` (m, len(geoms), 3)."""
    d = _defaults(model)
    fovy = camera.fovy if camera.fovy is not None else d["fovy"]
    azimuth = camera.azimuth if camera.azimuth is not None else d["azimuth"]
    elevation = camera.elevation if camera.elevation is not None else AUTO_ELEVATION
    radii = np.broadcast_to(model.geom_rbound[geoms], geom_xpos.shape[:-1]).reshape(-1)
    sphere = bounding_sphere(geom_xpos.reshape(-1, 3), radii)
    if sphere is None:
        centre, radius = np.asarray(d["lookat"]), d["distance"] / 1.5
    else:
        centre, radius = sphere
    h, w = size
    half = min(math.radians(fovy) / 2, math.atan(math.tan(math.radians(fovy) / 2) * w / h))
    distance = min(1.1 * radius / math.sin(half), _MAX_DISTANCE)
    return View(label, tuple(float(v) for v in centre), distance, float(azimuth), float(elevation), float(fovy),
                slot=slot)


def sample_indices(n: int, k: int) -> np.ndarray:
    """At most k evenly spread indices of range(n), including the first and last."""
    if n <= k:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))


def as_cameras(cameras: Any) -> list[Camera | str | int]:
    """A user's `cameras=` as a list (a single name, id or Camera becomes a list of one)."""
    if isinstance(cameras, (str, int, Camera, np.integer)) and not isinstance(cameras, bool):
        return [cameras]
    if isinstance(cameras, Mapping):
        return [Camera.from_dict(cameras)]
    if not isinstance(cameras, Sequence) or not len(cameras):
        raise MjArchiveError(f"cameras must be a name, id, Camera or a non-empty list of them, got {cameras!r}")
    return [Camera.from_dict(c) if isinstance(c, Mapping) else c for c in cameras]
