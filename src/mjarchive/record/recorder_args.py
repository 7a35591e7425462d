"""What a `Recorder` is given, checked and put in the form it works with.

The constructor's `worlds` and `tracks` (and, when it is given an open writer, that archive's
tracks and worlds they must match), and `record()`'s named arrays and `time`. Refusals name the
argument and what it takes.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from .._errors import AppendError, FormatError, MjArchiveError
from ..archive.manifest import Manifest, TrackSpec

__all__ = ["WarpFields", "as_indices", "check_first_shapes", "match_writer", "ordered_fields", "scalar_time",
           "track_specs"]


def as_indices(worlds: Any) -> np.ndarray:
    sel = np.atleast_1d(np.asarray(worlds))
    if sel.ndim != 1 or sel.size == 0 or sel.dtype.kind not in "iu" or len(set(sel.tolist())) != sel.size:
        raise MjArchiveError(f"worlds must be a non-empty list of distinct world indices, got {worlds!r}")
    return sel.astype(np.int64)


def track_specs(model: mujoco.MjModel, tracks: dict[str, Any], dtype: str) -> dict[str, TrackSpec]:
    """Each track's TrackSpec: given explicitly (a shape, or (shape, dtype)), else the per-world shape
    of the MjData field of that name (qvel → (nv,), xpos → (nbody, 3)) in the recorder's dtype."""
    data = mujoco.MjData(model)
    specs = {}
    for name, spec in tracks.items():
        if name in ("qpos", "mocap_pos", "mocap_quat", "time", "reset"):
            raise MjArchiveError(f"{name!r} cannot be a track: qpos, mocap, time and reset are always recorded")
        if spec is not None:
            try:
                specs[name] = TrackSpec.parse(spec)
            except (FormatError, TypeError, ValueError) as exc:
                raise MjArchiveError(f"track {name!r}: {exc}; give a shape such as () or (3,), or (shape, dtype)") from None
            continue
        if not hasattr(data, name):
            raise MjArchiveError(f"track {name!r} is not an MjData array field that can be recorded as a track; try "
                                 "e.g. 'qvel', 'ctrl', 'act', 'sensordata', or give its shape: tracks={'reward': ()}")
        value = getattr(data, name)
        if not isinstance(value, np.ndarray) or value.size == 0:
            raise MjArchiveError(f"track {name!r} is empty or not an array for this model (size 0); "
                                 "drop it from tracks")
        specs[name] = TrackSpec(tuple(value.shape), dtype)
    return specs


def match_writer(man: Manifest, tracks: tuple[str, ...], worlds: np.ndarray | None
                 ) -> tuple[tuple[str, ...], np.ndarray]:
    """The tracks and batch indices recorded into an open writer's archive: those given, checked
    against the archive's, or by default all of its tracks and its world IDs."""
    if not tracks:
        tracks = tuple(man.tracks)  # every frame needs all of them
    missing = [t for t in tracks if t not in man.tracks]
    if missing:
        raise MjArchiveError(f"tracks {missing} are not declared in the writer's archive "
                             f"(it has {sorted(man.tracks)}); create it with tracks={{...}}")
    unnamed = sorted(set(man.tracks) - set(tracks))
    if unnamed:
        raise MjArchiveError(f"the writer's archive also has tracks {unnamed}, which every frame needs; "
                             f"pass tracks={sorted(man.tracks)} (or no tracks= to record all of them)")
    if worlds is None:
        worlds = np.asarray(man.world_ids, dtype=np.int64)
    elif len(worlds) != len(man.world_ids):
        raise MjArchiveError(f"worlds={worlds.tolist()} names {len(worlds)} worlds, but "
                             f"the writer's archive has {len(man.world_ids)} ({list(man.world_ids)})")
    return tracks, worlds


def ordered_fields(arrays: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """`record()`'s named arrays in storage order, refused when one is unknown or missing."""
    unknown = sorted(arrays.keys() - shapes.keys())
    if unknown:
        raise AppendError(f"unknown fields {unknown}: record() takes {sorted(shapes)} (declare tracks when "
                          "creating the Recorder: tracks=(...))")
    missing = [name for name in shapes if arrays.get(name) is None]
    if missing:
        raise AppendError(f"record() needs {missing} for every frame, each of shape (nworld, ...); "
                          f"per-world shapes: { {n: shapes[n] for n in missing} }")
    return {name: arrays[name] for name in shapes}


def check_first_shapes(arrays: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> int:
    nworld = int(arrays["qpos"].shape[0]) if len(arrays["qpos"].shape) else 0
    for name, shape in shapes.items():
        got = tuple(arrays[name].shape)
        if got != (nworld, *shape):
            raise AppendError(f"{name} has shape {got}; expected (nworld, {', '.join(map(str, shape))}) "
                              f"= {(nworld, *shape)} for this model")
    if nworld < 1:
        raise AppendError("qpos has no worlds (its leading dimension is 0)")
    return nworld


class WarpFields:
    """Named Warp arrays seen as the mujoco_warp Data the Warp gatherer reads."""

    def __init__(self, arrays: dict[str, Any]):
        self.__dict__.update(arrays)
        self.nworld = int(arrays["qpos"].shape[0])


def scalar_time(time: Any) -> float:
    """The batch time: a number, or world 0's entry of a per-world time array of any library."""
    if type(time) is float:
        return time
    if getattr(time, "ndim", 0):
        time = time[0]
    try:
        return float(time)
    except (TypeError, ValueError):
        raise AppendError(f"time must be a number of seconds (or a per-world array), got {type(time).__name__}") from None
