"""What a replay worker receives and keeps: the work unit, its result, and per-thread caches.

A work unit is plain data (archive location, one world, one camera, frames inside one stored
chunk, size, quality, backend), so any `concurrent.futures.Executor` can ship it. A worker opens
the archive itself, and keeps the last few archives, compiled models and renderers between units.
The caches are per thread: a GL context belongs to the thread that made it, and an executor may
run units on several threads of one process.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any

import mujoco
import numpy as np

from ..archive.reader import Archive
from ..archive.reader import open as open_archive

__all__ = ["RenderUnit", "UnitResult", "archive_for", "model_for", "renderer_for", "lend_archive", "cached"]

_CACHE_SIZE = 4
_LOCAL = threading.local()


@dataclasses.dataclass(frozen=True)
class RenderUnit:
    """One task: frames (all inside one stored chunk, and within one span of the world's model
    variants) of one world from one camera.

    `location` is a path or URL the worker opens itself; `model_mjb` carries a caller-supplied
    model (MJB bytes, same MuJoCo version on both sides), else the archive's bundle is used.
    """

    location: str
    storage_options: dict | None
    world_id: int
    camera: Any  # a model camera id, or a `camera.View`
    frames: tuple[int, ...]
    size: tuple[int, int]
    quality: str
    backend: str
    model_mjb: bytes | None = None
    warp_batch: int | None = None
    #: A tracking View's (lookat x, y, z, azimuth) per frame, (n, 4); see `plan.attach_paths`.
    poses: np.ndarray | None = dataclasses.field(default=None, compare=False)
    #: Episode numbers per frame, (n,), or (n, worlds) in a scene; only when labels show them.
    episodes: np.ndarray | None = dataclasses.field(default=None, compare=False)
    #: layout='scene': the worlds and their offsets (`scene.ScenePlan`); world_id is then the first.
    scene: Any = None
    #: What is drawn (`options.SceneOptions`); None: MuJoCo's defaults.
    options: Any = None
    #: JSON recipe of the replay model derived from the archive's (scene copies, Warp's cameras).
    recipe: str | None = None
    #: layout='scene': the `hud.Hud` whose per-world fields label each world in the image.
    labels: Any = None
    #: Names of the archive's overlay tracks drawn into the frames (CPU; `overlay_draw`).
    overlays: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class UnitResult:
    """Pixels of one unit: rgb (n_frames, H, W, 3) uint8, in the unit's frame order."""

    world_id: int
    camera: Any
    frames: tuple[int, ...]
    rgb: np.ndarray
    gl_renderer: str = ""


def _cache(kind: str) -> collections.OrderedDict:
    caches = getattr(_LOCAL, "caches", None)
    if caches is None:
        caches = _LOCAL.caches = {k: collections.OrderedDict() for k in ("archives", "models", "renderers")}
    return caches[kind]


def cached(kind: str, key: Any, make: Callable[[], Any]) -> Any:
    """This thread's cached value of `kind` ('archives', 'models', 'renderers') for `key`, made on a miss."""
    cache = _cache(kind)
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    while len(cache) > _CACHE_SIZE:
        _, old = cache.popitem(last=False)
        if hasattr(old, "close") and kind == "renderers":
            old.close()
    return value


def _archive_key(location: str, storage_options: dict | None) -> tuple[str, str]:
    return location, json.dumps(storage_options or {}, sort_keys=True, default=str)


def archive_for(unit: Any) -> Archive:
    """The unit's archive, opened once per thread and refreshed when the unit needs newer frames."""
    archive = cached("archives", _archive_key(unit.location, unit.storage_options),
                     lambda: open_archive(unit.location, storage_options=unit.storage_options))
    if max(unit.frames) >= archive.n_frames:  # a live archive committed more since we opened it
        archive.refresh()
    return archive


class lend_archive:
    """Context manager: units naming `location` use the caller's open `archive` in this thread."""

    def __init__(self, archive: Archive, location: str, storage_options: dict | None):
        self._key = _archive_key(location, storage_options)
        self._archive = archive

    def __enter__(self) -> None:
        _cache("archives")[self._key] = self._archive

    def __exit__(self, *exc) -> None:
        _cache("archives").pop(self._key, None)


def _model_key(unit: Any, archive: Archive) -> str:
    # Keyed by content: the hash of the bundle's verified bytes, never the manifest's claim, so a
    # second archive claiming another's hash cannot borrow its model.
    if unit.model_mjb is not None:
        return "mjb:" + hashlib.sha256(unit.model_mjb).hexdigest()
    recipe = getattr(unit, "recipe", None)
    return "bundle:" + archive.bundle.sha256 + ("" if recipe is None else ":" + recipe)


def model_for(unit: Any, archive: Archive) -> mujoco.MjModel:
    """The unit's replay model: the caller's MJB if it sent one (derived by the parent when the
    unit needs a derived model), else the archive's bundle, derived in the compile sandbox when
    the unit has a recipe. A cached model is checked against this archive's qpos layout on every
    use (a scene's model holds several copies: its builder checked their layout)."""
    if unit.model_mjb is None and getattr(unit, "recipe", None) is None:
        return bundle_model(archive)
    if unit.model_mjb is not None:
        def make():
            return mujoco.MjModel.from_binary_path("model.mjb", {"model.mjb": unit.model_mjb})
    else:
        def make():
            from .scene import derived_model

            return derived_model(archive.bundle, json.loads(unit.recipe), trusted=False)

    model = cached("models", _model_key(unit, archive), make)
    scene = getattr(unit, "scene", None)
    if scene is None:
        archive.manifest.layout.check_compatible(model)
    else:
        scene.check_model(model, archive.manifest.layout)
    return model


def bundle_model(archive: Archive) -> mujoco.MjModel:
    """The archive's own model, compiled once per bundle content and thread (shared with the units)."""
    model = cached("models", "bundle:" + archive.bundle.sha256, archive.model)
    archive.manifest.layout.check_compatible(model)
    return model


def renderer_for(unit: Any, archive: Archive, make: Callable[[], Any]) -> Any:
    """The cached renderer for the unit's model, backend, size, quality and batch; `make` builds one."""
    options = getattr(unit, "options", None)
    key = (_model_key(unit, archive), unit.backend, unit.size, unit.quality, unit.warp_batch,
           None if options is None else options.key())
    return cached("renderers", key, make)
