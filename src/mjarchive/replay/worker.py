"""What a replay worker receives and keeps: the work unit, its result, and per-thread caches.

A work unit is plain data (archive location, one world, one camera, frames inside one stored
chunk, size, quality, backend), so any `concurrent.futures.Executor` can ship it. A worker opens
the archive itself, and keeps the last few archives, compiled models and renderers between units.
The caches are per thread: a GL context belongs to the thread that made it, and an executor may
run units on several threads of one process.
"""

from __future__ import annotations

import atexit
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
from ..archive.opening import open as open_archive
from ..archive.parted_reader import open_part

__all__ = ["RenderUnit", "UnitResult", "archive_for", "model_for", "renderer_for", "lend_archive", "cached", "warm_up"]

_CACHE_SIZE = 4
_LOCAL = threading.local()
_RENDERER_CACHES: list[collections.OrderedDict] = []  # every thread's, closed at exit (`_close_renderers`)
_CLOSE_AT_EXIT_REGISTERED = False


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
    camera: Any  # a model camera id, or a `views.camera.View`
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
    #: layout='scene': the worlds and their offsets (`views.scene.ScenePlan`); world_id is then the first.
    scene: Any = None
    #: What is drawn (`views.options.SceneOptions`); None: MuJoCo's defaults.
    options: Any = None
    #: JSON recipe of the replay model derived from the archive's (scene copies, Warp's cameras).
    recipe: str | None = None
    #: layout='scene': the `views.hud.Hud` whose per-world fields label each world in the image.
    labels: Any = None
    #: Names of the archive's overlay tracks drawn into the frames (CPU; `overlay_draw`).
    overlays: tuple[str, ...] = ()
    #: The render call this unit belongs to: a warm worker opens the archive again for each call
    #: (the file at `location` may have been rewritten since), keeping compiled models and renderers.
    session: str | None = None
    #: The part of a multi-part archive holding `world_id` (per-world videos): a worker opens that part
    #: only, not every part's documents.
    archive_part: str | None = None


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
        _RENDERER_CACHES.append(caches["renderers"])
    return caches[kind]


def cached(kind: str, key: Any, make: Callable[[], Any]) -> Any:
    """This thread's cached value of `kind` ('archives', 'models', 'renderers') for `key`, made on a miss."""
    cache = _cache(kind)
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    global _CLOSE_AT_EXIT_REGISTERED
    if kind == "renderers" and not _CLOSE_AT_EXIT_REGISTERED:
        # Registered after the first renderer made its GL context, so it runs before MuJoCo's own
        # exit hook tears EGL down (atexit runs last-in first-out); freed later, a context whose
        # display another renderer released meanwhile fails noisily at interpreter exit.
        atexit.register(_close_renderers)
        _CLOSE_AT_EXIT_REGISTERED = True
    while len(cache) > _CACHE_SIZE:
        old_key, old = cache.popitem(last=False)
        if kind == "renderers" and hasattr(old, "close"):
            old.close()
        elif kind == "archives":
            _close_archive(old_key, old)
    return value


def _close_renderers() -> None:
    """Close every cached renderer (at interpreter exit)."""
    for cache in _RENDERER_CACHES:
        while cache:
            renderer = cache.popitem()[1]
            try:
                if hasattr(renderer, "close"):
                    renderer.close()
            except Exception:  # exiting: nothing left to tell
                pass


def _lent() -> dict:
    """This thread's archives lent by a caller (`lend_archive`), by key: never closed here."""
    lent = getattr(_LOCAL, "lent", None)
    if lent is None:
        lent = _LOCAL.lent = {}
    return lent


def _close_archive(key: Any, archive: Any) -> None:
    """Close an archive this thread opened and no longer caches (never a lent one)."""
    if _lent().get(key) is archive:
        return
    try:
        archive.close()
    except Exception:  # an eviction must not fail the unit that caused it
        pass


def _archive_key(location: str, storage_options: dict | None, session: str | None = None) -> tuple[str, str, str]:
    return location, json.dumps(storage_options or {}, sort_keys=True, default=str), session or ""


def _open(location: str, storage_options: dict | None, session: str | None, part: str | None = None) -> Archive:
    key = _archive_key(location, storage_options, session)
    cache = _cache("archives")
    if key not in cache:  # a new render call: the archives of earlier calls at this location are stale
        for old_key in [k for k in cache if k[:2] == key[:2] and k[2] != key[2]]:
            _close_archive(old_key, cache.pop(old_key))
        if part is not None:  # one part of a multi-part archive is all this unit reads: open only it
            return cached("archives", (*key, part), lambda: open_part(location, part, storage_options=storage_options))
    return cached("archives", key, lambda: open_archive(location, storage_options=storage_options))


def archive_for(unit: Any) -> Archive:
    """The unit's archive, opened once per thread (and render call) and refreshed when the unit
    needs newer frames."""
    archive = _open(unit.location, unit.storage_options, getattr(unit, "session", None),
                    getattr(unit, "archive_part", None))
    # The worlds it draws: one, a scene's, or a packed Warp task's segments'.
    worlds = ([w for w, _ in unit.segments] if hasattr(unit, "segments") else
              list(unit.scene.world_ids) if unit.scene is not None else [unit.world_id])
    # A live archive committed more since we opened it (each part of a multi-part archive its own).
    if max(unit.frames) >= archive.frames_of(worlds):
        archive.refresh()
    return archive


def warm_up(location: str, storage_options: dict | None, session: str | None, compile_model: bool) -> None:
    """A pool worker's first task of a render call: open the archive and compile its model (cached
    for the units), while the parent plans. Errors are left to the units, which raise them."""
    try:
        archive = _open(location, storage_options, session)
        if compile_model:
            bundle_model(archive)
    except Exception:
        pass


class lend_archive:
    """Context manager: units naming `location` (and `session`) use the caller's open `archive` in
    this thread."""

    def __init__(self, archive: Archive, location: str, storage_options: dict | None, session: str | None = None):
        self._key = _archive_key(location, storage_options, session)
        self._archive = archive

    def __enter__(self) -> None:
        cache = _cache("archives")
        old = cache.get(self._key)
        if old is not None and old is not self._archive:
            _close_archive(self._key, old)
        cache[self._key] = self._archive
        _lent()[self._key] = self._archive

    def __exit__(self, *exc) -> None:
        if _lent().get(self._key) is self._archive:
            del _lent()[self._key]
        cache = _cache("archives")
        if cache.get(self._key) is self._archive:
            del cache[self._key]


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
            from .views.scene import derived_model

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
