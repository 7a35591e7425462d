"""Planning a render: which videos, seen through which cameras, made of which work units.

Runs in the process that encodes. It resolves the requested cameras against the replay model
(`views.camera.View`s for free, tracking and auto cameras), cuts each video's frames into units that
never cross a stored chunk (nor, in per-world videos, a change of the world's model variants),
and, for tracking cameras, computes the camera path of every video in frame order
(`attach_paths`, posed with the variants in force), so smoothing never depends on how the work is
split.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from .._errors import MjArchiveError, SelectionError
from ..archive.reader import Archive
from ..archive.variants import apply_variant
from .backends.registry import backend_for
from .views.camera import (AUTO_SAMPLE_FRAMES, AUTO_SAMPLE_WORLDS, Camera, View, as_cameras, auto_geoms, auto_view,
                           camera_label, framing_geoms, resolve, sample_indices, track_path)
from .views.variant_map import KINEMATIC_FIELDS
from .video import grid_shape, video_name
from .worker import RenderUnit

__all__ = ["LAYOUTS", "Output", "plan_units", "resolve_cameras", "attach_paths", "unit_frames"]

LAYOUTS = ("per-world", "grid", "scene")


@dataclasses.dataclass
class Output:
    """One video: its path, camera, worlds and ordered work units."""

    path: Path
    camera: int | View
    label: str
    world_ids: list[int]
    units: list[RenderUnit]
    n_frames: int
    grid_block: int = 0  # grid: frames per canvas block


# -- cameras ------------------------------------------------------------------------------------------

def _model_camera(model: mujoco.MjModel, cam: Any) -> int:
    names = [model.camera(i).name for i in range(model.ncam)]
    if isinstance(cam, Camera):
        cam = cam.name
    if isinstance(cam, str) and cam in names:
        return names.index(cam)
    if isinstance(cam, (int, np.integer)) and not isinstance(cam, bool) and 0 <= cam < model.ncam:
        return int(cam)
    named = [n[:40] for n in names if n][:40]
    ids = f" (or ids 0..{model.ncam - 1})" if model.ncam else ""
    raise SelectionError(
        f"no camera {str(cam)[:64]!r} in the model; choose from {named}{ids}, 'free', 'auto', 'track:BODY' "
        "(e.g. 'track:torso,distance=3'), or a mjarchive.Camera"
    )


def resolve_cameras(archive: Archive, model: mujoco.MjModel, cameras: Any, *, world_ids: list[int],
                    frame_idx: np.ndarray, size: tuple[int, int], scene: Any = None) -> list[tuple[int | View, str]]:
    """(camera, file label) pairs: a model camera id or a View. Default: every named camera of
    the model, else `Camera.auto()` (in layout='scene' always auto: model cameras see one world).
    Strings are model camera names first, then CLI camera forms (`Camera.parse`)."""
    names = [model.camera(i).name for i in range(model.ncam)]
    if cameras is None:
        named = [i for i, n in enumerate(names) if n]
        requested: list[Any] = named if named and scene is None else [Camera.auto()]
    else:
        requested = as_cameras(cameras)
    out: list[tuple[int | View, str]] = []
    used: set[str] = set()  # file labels
    seen: set[Any] = set()  # cameras already resolved: a model camera's id, a View's key
    slot = 0
    for cam in requested:
        if isinstance(cam, (int, np.integer)) and not isinstance(cam, bool) and cam == -1:
            cam = Camera.free()  # the id MuJoCo gives its default free camera
        if isinstance(cam, str) and cam in names:
            cam = names.index(cam)
        elif isinstance(cam, str):
            cam = Camera.parse(cam)
        if isinstance(cam, Camera) and cam.kind != "model":
            if cam.world is not None and scene is None:
                raise MjArchiveError("Camera.track(world=...) picks the tracked world in layout='scene'; in other "
                                     "layouts every world's video tracks its own body")
            label = cam.label()
            if cam.kind == "auto":
                view = _auto(archive, model, cam, label, world_ids, frame_idx, size, scene, slot)
            else:
                view = resolve(cam, model, label, slot)
            if view.world is not None and view.world not in world_ids:
                raise SelectionError(f"Camera.track: world {view.world} is not among the selected worlds {world_ids[:16]}")
            key = json.dumps(view.key(), sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            resolved: int | View = view
            slot += 1
        else:
            resolved = _model_camera(model, cam)
            if resolved in seen:
                continue
            seen.add(resolved)
            label = camera_label(names[resolved], resolved)
        base, k = label, 1
        while label in used:  # names crafted to collide after sanitizing, or two views of one body
            k += 1
            label = f"{base}-{k}"
        used.add(label)
        if isinstance(resolved, View):
            resolved = dataclasses.replace(resolved, label=label)
        out.append((resolved, label))
    return out


def _auto(archive: Archive, model: mujoco.MjModel, cam: Camera, label: str, world_ids: list[int],
          frame_idx: np.ndarray, size: tuple[int, int], scene: Any, slot: int) -> View:
    """Camera.auto(): bound the moving geoms of a sample of the selected worlds and frames."""
    if scene is not None:  # every world's offset matters for the scene's extent (at most 64 worlds)
        worlds = list(world_ids)
    else:
        worlds = [world_ids[i] for i in sample_indices(len(world_ids), AUTO_SAMPLE_WORLDS)]
    frames = frame_idx[sample_indices(len(frame_idx), AUTO_SAMPLE_FRAMES)]
    # Bounded before any pose: at most AUTO_SAMPLE_POINTS positions, whatever the model's geom count.
    geoms = auto_geoms(framing_geoms(model), len(frames) * len(worlds))
    sel = archive.select(worlds=worlds, frames=frames)
    qpos = sel.qpos
    mpos, mquat = (sel.mocap_pos, sel.mocap_quat) if model.nmocap else (None, None)
    data = mujoco.MjData(model)
    pts = np.empty((len(frames), len(worlds), len(geoms), 3))
    for i in range(len(frames)):
        for j in range(len(worlds)):
            _pose(model, data, qpos[i, j], None if mpos is None else mpos[i, j], None if mquat is None else mquat[i, j])
            pts[i, j] = data.geom_xpos[geoms]
    if scene is not None:
        pts += np.asarray([scene.offsets[scene.world_ids.index(w)] for w in worlds])[None, :, None, :]
    return auto_view(model, cam, label, pts, geoms, size, slot)


def _pose(model, data, qpos, mocap_pos, mocap_quat) -> None:
    data.qpos[:] = qpos
    if mocap_pos is not None:
        data.mocap_pos[:] = mocap_pos
        data.mocap_quat[:] = mocap_quat
    mujoco.mj_kinematics(model, data)


# -- units ----------------------------------------------------------------------------------------------

def split(frames: np.ndarray, chunk_frames: int, max_frames: int,
          changes: np.ndarray | None = None) -> list[tuple[int, ...]]:
    """Split frame indices into runs that never cross a stored chunk and hold <= max_frames;
    `changes` (sorted frame indices): a run also ends before each of them (model variants)."""
    out: list[tuple[int, ...]] = []
    if not len(frames):
        return out
    chunk = frames // chunk_frames
    new = np.diff(chunk) != 0
    if changes is not None and len(changes):
        new |= np.diff(np.searchsorted(np.asarray(changes, np.int64), frames, side="right")) != 0
    bounds = np.flatnonzero(new) + 1
    for part in np.split(frames, bounds):
        for s in range(0, len(part), max_frames):
            out.append(tuple(int(f) for f in part[s:s + max_frames]))
    return out


def plan_units(archive: Archive, *, location: str, storage_options: dict | None, worlds: Any, frames: Any,
               cameras: list[tuple[int | View, str]], size: tuple[int, int], quality: str, backend: str,
               layout: str, split_episodes: bool, model_mjb: bytes | None, out_dir: Path,
               model: mujoco.MjModel, unit_bytes: int | None = None, warp_batch: int | None = None,
               scene: Any = None, options: Any = None, recipe: str | None = None,
               labels: Any = None, overlays: tuple[str, ...] = (), session: str | None = None) -> list[Output]:
    """Every output video with its ordered work units. warp_batch: states per Warp launch
    (default: what the device's memory budget allows, capped by the selection's size).
    overlays: names of the overlay tracks drawn (CPU). session: see `RenderUnit.session`."""
    sel = archive.select(worlds=worlds, frames=frames)
    world_ids = list(sel.world_ids)
    frame_idx = selected_frames(archive, sel, frames)
    cf = archive.manifest.chunk_frames
    h, w = size
    be = backend_for(backend)
    budget = unit_bytes or be.unit_bytes
    n_states = len(frame_idx) * (1 if scene is not None else len(world_ids))
    warp_batch = be.states_per_launch(backend, model, size, requested=warp_batch,
                                      copies=len(world_ids) if scene is not None else 1, n_states=n_states,
                                      budget=budget)

    def unit(world_id: int, camera: int | View, part: tuple[int, ...], *, one_world: bool = False) -> RenderUnit:
        return RenderUnit(location, storage_options, int(world_id), camera, part, size, quality, backend, model_mjb,
                          warp_batch, scene=scene, options=options, recipe=recipe, labels=labels,
                          overlays=tuple(overlays), session=session,
                          archive_part=archive.part_of(world_id) if one_world and len(archive.parts) > 1 else None)

    # Read once for the selection: only the events that decide the drawn frames of the drawn worlds.
    window = archive.variant_window(world_ids, frame_idx) if archive.variant_fields and layout == "per-world" else None

    def changes(world_id: int) -> np.ndarray | None:
        """Frames at which a world's model variants change: no per-world unit straddles one."""
        return None if window is None else window.changes(world_id)

    outputs: list[Output] = []
    per_unit = unit_frames(be, budget // (h * w * 3))
    if layout == "scene":
        for cam, label in cameras:
            # Scene and grid units cover every world's same frames, so they are not cut at each
            # world's changes (64 worlds' resets would leave units of a few frames): the worker
            # sets new values wherever they change within a unit (unit.render_unit).
            units = [unit(world_ids[0], cam, part) for part in split(frame_idx, cf, per_unit)]
            outputs.append(Output(out_dir / video_name(None, label, head="scene"), cam, label, world_ids, units,
                                  len(frame_idx)))
        return outputs
    if layout == "grid":
        rows, cols = grid_shape(len(world_ids))  # the canvas GridComposer will paste into
        block = unit_frames(be, budget // (rows * h * cols * w * 3))
        for cam, label in cameras:
            units = [unit(wid, cam, part) for part in split(frame_idx, cf, block) for wid in world_ids]
            outputs.append(Output(out_dir / video_name(None, label), cam, label, world_ids, units, len(frame_idx),
                                  block))
        return outputs
    for wid in world_ids:
        if split_episodes:
            pieces = [(k, frame_idx[(frame_idx >= ep.start) & (frame_idx < ep.stop)])
                      for k, ep in enumerate(archive.episodes(wid))]
            pieces = [(k, p) for k, p in pieces if len(p)]
        else:
            pieces = [(None, frame_idx)]
        for cam, label in cameras:
            for episode, idx in pieces:
                units = [unit(wid, cam, part, one_world=True) for part in split(idx, cf, per_unit, changes(wid))]
                outputs.append(Output(out_dir / video_name(wid, label, episode), cam, label, [wid], units, len(idx)))
    return outputs


def unit_frames(backend, fit: int) -> int:
    """Frames per unit: `fit` (what the pixel budget holds), at least 1, at most the backend's cap."""
    fit = max(1, fit)
    return fit if backend.unit_frames is None else min(fit, backend.unit_frames)


#: Frames one render call draws at most (38 hours at 30 fps): the plan holds an index entry per
#: frame, so a larger selection is refused before anything of its length is allocated.
MAX_RENDER_FRAMES = 1 << 22


def selected_frames(archive: Archive, sel: Any, frames: Any) -> np.ndarray:
    """The selection's frame indices, (n,) int64, checked before they are built: at least one, at
    most MAX_RENDER_FRAMES, and the stored chunks of the first and last present (a committed
    frame count that no chunk backs is refused here, not after planning its length)."""
    n = int(sel.shape[0])  # from the selection's slice or array: nothing of the archive's length
    if not n:
        raise SelectionError(
            f"the frame selection {frames!r} holds no frames (the archive has {archive.n_frames} committed "
            "frames; a live archive shows frames once the writer commits them)"
        )
    if n > MAX_RENDER_FRAMES:
        raise SelectionError(f"the frame selection holds {n} frames (of {archive.n_frames} committed); one render "
                             f"draws at most {MAX_RENDER_FRAMES}: select a range, e.g. frames=slice(0, 100000) "
                             "(CLI --frames 0:100000), and render the rest in further calls")
    frame_idx = np.asarray(sel.frame_indices, dtype=np.int64)
    ends = np.unique(frame_idx[[0, -1]])
    archive.select(worlds=list(sel.world_ids), frames=ends).time  # refuses chunks that are not there
    return frame_idx


# -- per-frame data a unit carries ------------------------------------------------------------------------

def episode_numbers(archive: Archive, world_id: int, frames: np.ndarray, cache: dict) -> np.ndarray:
    """The episode number of each of `frames` of one world (0 from frame 0, +1 at every reset), read
    from the episode index and the reset markers of the frames' chunks only."""
    frames = np.asarray(frames, np.int64)
    key = (world_id, frames.tobytes())
    if key not in cache:
        cache[key] = archive.episode_numbers(world_id, frames)
    return cache[key]


def attach_paths(archive: Archive, model: mujoco.MjModel, outputs: list[Output], *, episodes: bool = False) -> None:
    """Give each unit what it needs per frame: the camera path of a tracking view (computed per
    world over the whole video, in frame order) and, with `episodes`, episode numbers."""
    cache: dict = {}
    data = mujoco.MjData(model)
    kinematic = [f for f in archive.variant_fields if f in KINEMATIC_FIELDS]
    varied = copy.copy(model) if kinematic else None  # never the caller's or the cached model itself

    def path(view: View, world_id: int, frames: np.ndarray) -> np.ndarray:
        xpos, xmat = _body_poses(archive, model, data, world_id, frames, view.body, varied, kinematic)
        eps = episode_numbers(archive, world_id, frames, cache)
        return track_path(view, xpos, xmat, archive.select(worlds=[world_id], frames=frames).time, eps)

    for o in outputs:
        view = o.camera if isinstance(o.camera, View) and o.camera.tracking else None
        if not o.units or (view is None and not episodes):
            continue
        scene = o.units[0].scene
        if scene is not None:  # every unit holds all the scene's worlds
            frames = np.asarray([f for u in o.units for f in u.frames], np.int64)
            poses = eps = None
            if view is not None:
                tracked = view.world if view.world is not None else scene.world_ids[0]
                poses = path(view, tracked, frames)
                poses[:, :3] += scene.offsets[scene.world_ids.index(tracked)]
            if episodes:
                eps = np.stack([episode_numbers(archive, w, frames, cache) for w in scene.world_ids], axis=1)
            start = 0
            for k, u in enumerate(o.units):
                part = slice(start, start + len(u.frames))
                start = part.stop
                o.units[k] = dataclasses.replace(u, poses=None if poses is None else poses[part],
                                                 episodes=None if eps is None else eps[part])
            continue
        per_world: dict[int, list] = {}
        for wid in o.world_ids:  # grid units interleave worlds: each world's frames in order
            frames = np.asarray([f for u in o.units if u.world_id == wid for f in u.frames], np.int64)
            per_world[wid] = [None if view is None else path(view, wid, frames),
                              episode_numbers(archive, wid, frames, cache) if episodes else None, 0]
        for k, u in enumerate(o.units):
            poses, eps, start = per_world[u.world_id]
            part = slice(start, start + len(u.frames))
            per_world[u.world_id][2] = part.stop
            o.units[k] = dataclasses.replace(u, poses=None if poses is None else poses[part],
                                             episodes=None if eps is None else eps[part])


def _body_poses(archive: Archive, model: mujoco.MjModel, data: mujoco.MjData, world_id: int, frames: np.ndarray,
                body: int, varied: mujoco.MjModel | None = None,
                kinematic: list[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """xpos (n, 3) and xmat (n, 9) of `body` at `frames` of one world, read chunk by chunk;
    with `kinematic` variant fields, posed by `varied` (a copy of `model`) with the world's
    values in force."""
    cf = archive.manifest.chunk_frames
    xpos = np.empty((len(frames), 3))
    xmat = np.empty((len(frames), 9))
    i = 0
    window = archive.variant_window([world_id], frames) if kinematic else None
    for part in split(frames, cf, cf, None if window is None else window.changes(world_id)):
        if kinematic:
            values = window.values(world_id, part[0])
            apply_variant(varied, {f: values[f] for f in kinematic})
            model = varied
        sel = archive.select(worlds=[world_id], frames=np.asarray(part))
        q = sel.qpos[:, 0]
        mp, mq = (sel.mocap_pos[:, 0], sel.mocap_quat[:, 0]) if model.nmocap else (None, None)
        for j in range(len(part)):
            _pose(model, data, q[j], None if mp is None else mp[j], None if mq is None else mq[j])
            xpos[i] = data.xpos[body]
            xmat[i] = data.xmat[body]
            i += 1
    return xpos, xmat
