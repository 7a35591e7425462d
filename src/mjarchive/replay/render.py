"""Replay: plan work units, render them (in-process, in a process pool or on any Executor), and
stream the pixels in order into mp4 files.

A work unit is plain data (archive location, one world, one camera, frames inside one stored
chunk, size, quality, backend). `render_unit` is a top-level function, so any
`concurrent.futures.Executor` can run it; each worker process opens the archive itself, reads only
its unit's slice and caches model and renderer (`worker.py`). The parent keeps at most a window of units in
flight and consumes results in order, so memory does not grow with video length. How units run is
the backend's (`backends/`): the Warp backend packs the (world, frame) states of consecutive units
into full batches (`backends.warp.PackedUnit`) and cuts the pixels back into per-unit pieces, in order.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import multiprocessing
import os
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from .._errors import BackendError, BundleError, MjArchiveError
from .._fs import OutputDir
from ..archive.reader import Archive
from ..archive.opening import open as open_archive
from . import pool
from .backends.base import QUALITIES
from .backends.registry import backend_for
from .views.camera import Camera, View
from .views.hud import Hud, HudText
from .views.options import SceneOptions
from .views.overlay_draw import select_overlays
from .plan import LAYOUTS, Output, attach_paths, plan_units, resolve_cameras, selected_frames
from .resume import RenderLedger, is_partial_of, partial_prefix, request_key
from ..archive.storage.locations import is_url, local_path
from .unit import render_unit
from .views.variant_map import check_replay_model
from .video import GridComposer, VideoWriter
from .worker import RenderUnit, UnitResult, bundle_model, lend_archive, warm_up

__all__ = ["render", "iter_frames", "close_pool", "RenderUnit", "UnitResult", "render_unit", "plan_units"]

#: Shut down the worker processes `render` keeps warm between calls (also done at exit).
close_pool = pool.close

#: Encoder settings of every video (part of the resume key: other settings, other files).
VIDEO_ENCODER = {"codec": "libx264", "pix_fmt": "yuv420p", "crf": 23}


# -- planning -----------------------------------------------------------------------------------

def _check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise MjArchiveError(f"unknown {name} {value!r}; choose one of {list(choices)}")
    return value


# -- orchestration ----------------------------------------------------------------------------

def _run_ordered(units: Iterable[Any], executor: Executor | None, window: int, fn=render_unit,
                 ready: Callable[[], bool] | None = None) -> Iterator[Any]:
    """`fn(unit)` results in unit order, with at most `window` units submitted but not yet consumed.
    With `ready`, units are rendered in this process until `ready()` (the pool's workers are up):
    a short render never waits for workers to start."""
    if executor is None:
        for u in units:
            yield fn(u)
        return
    pending: collections.deque = collections.deque()  # Futures, and units kept for this process

    def hand_over() -> None:
        if ready is None or ready():
            for k, item in enumerate(pending):
                if not isinstance(item, Future):
                    pending[k] = executor.submit(fn, item)

    def take() -> Any:
        item = pending.popleft()
        return item.result() if isinstance(item, Future) else fn(item)

    try:
        for u in units:
            pending.append(u)
            hand_over()
            if len(pending) >= window:
                yield take()
        while pending:
            hand_over()
            yield take()
    finally:
        for f in pending:
            if isinstance(f, Future):
                f.cancel()


def _unit_results(units: Sequence[RenderUnit], executor: Executor | None, window: int,
                  ready: Callable[[], bool] | None = None) -> Iterator[UnitResult]:
    """Results of `units` in order (`ready`: see `_run_ordered`), run as their backend runs them
    (Warp packs the states of consecutive units into full launches)."""
    if not units:
        return

    def run(tasks: Iterable[Any], fn=render_unit) -> Iterator[Any]:
        return _run_ordered(tasks, executor, window, fn=fn, ready=ready)

    yield from backend_for(units[0].backend).unit_results(list(units), run, in_process=executor is None)


def _variant_shapes(archive: Archive) -> dict[str, tuple[int, ...]]:
    return {name: tuple(spec.shape) for name, spec in archive.manifest.variants.items()}


def _open_archive(archive: Any, storage_options: dict | None) -> tuple[Archive, bool]:
    if isinstance(archive, Archive):
        archive._check_open()
        return archive, False
    return open_archive(archive, storage_options=storage_options), True


def _shareable_location(archive: Archive) -> str | None:
    """A location string another process can open, or None (in-memory or store objects)."""
    loc = archive.location
    if isinstance(loc, str) and is_url(loc):
        return None if loc.startswith("memory://") else loc
    path = local_path(loc)
    return None if path is None else str(path.resolve())


def _base_model(archive: Archive, model: Any) -> tuple[mujoco.MjModel, Any]:
    """The replay model before any recipe (layout-checked), and the caller's bundle if they gave one."""
    if model is None:  # compiled once per bundle hash and thread, like the workers do
        return bundle_model(archive), None
    bundle = None
    if not isinstance(model, mujoco.MjModel):
        from ..archive.creation import as_bundle

        bundle = as_bundle(model)
        model = bundle.compile()
    archive.manifest.layout.check_compatible(model)
    return model, bundle


def _check_derived(archive: Archive, model: Any, recipe: dict | None, scene: Any) -> None:
    """Build the archive's derived replay model here first (in the compile sandbox, cached for
    this process): a scene that cannot be built fails once, clearly, before any worker starts."""
    if model is not None or recipe is None:
        return
    from .views.scene import derived_model

    what = (f"the scene of {len(scene.world_ids)} copies of the archive's model" if scene is not None
            else "the archive's model with replay cameras")
    try:
        derived = derived_model(archive.bundle, recipe, trusted=False)
    except BundleError as exc:
        hint = "; select fewer worlds or use layout='grid'" if scene is not None else ""
        raise BundleError(f"cannot build {what}: {exc}{hint}") from None
    if scene is not None:
        scene.check_model(derived, archive.manifest.layout)


def _caller_mjb(archive: Archive, model: Any, base: mujoco.MjModel, bundle: Any, recipe: dict | None) -> bytes | None:
    """MJB bytes of what workers render when the caller supplied the model: it, or the model
    `recipe` derives from it (which needs its XML). None for the archive's own model: each worker
    derives that one itself, in the compile sandbox."""
    if model is None:
        return None
    rendered = base
    if recipe is not None:
        if bundle is None:
            raise MjArchiveError("this render needs a replay model derived from yours (a scene of several worlds, or "
                                 "Warp's replay cameras), and an MjModel no longer knows its XML: pass model= as an "
                                 "MJCF path, an MjSpec or a ModelBundle")
        from .views.scene import derived_model

        rendered = derived_model(bundle, recipe, trusted=True)
    buf = np.empty(mujoco.mj_sizeModel(rendered), np.uint8)
    mujoco.mj_saveModel(rendered, None, buf)
    return buf.tobytes()


def _recipe(backend: Any, cams: list[tuple[int | View, str]], scene: Any) -> dict | None:
    """How the rendered model derives from the archive's: a scene's copies, and one added camera
    per View where the backend renders Views as model cameras (Warp; the CPU renders them as
    MuJoCo free cameras)."""
    fovys = [c.fovy for c, _ in cams if isinstance(c, View)] if backend.views_as_model_cameras else []
    if scene is not None:
        return scene.recipe(fovys)
    return {"cameras": fovys} if fovys else None


#: Values per world a track may have to be shown in the HUD (it shows the first few).
HUD_TRACK_VALUES = 16


def _parse_hud(hud: Any, layout: str, archive: Archive) -> tuple[Hud | None, Hud | None]:
    """(corner text, per-world labels of a scene); default: world IDs in grid and scene layouts."""
    if isinstance(hud, str) and hud == "default":
        hud = ("world",) if layout in ("grid", "scene") else None
    parsed = Hud.parse(hud, tuple(archive.tracks))
    for name in parsed.fields if parsed is not None else ():
        spec = archive.tracks.get(name)
        if spec is not None and int(np.prod(spec.shape, dtype=np.int64)) > HUD_TRACK_VALUES:
            raise MjArchiveError(f"track {name!r} has {int(np.prod(spec.shape))} values per world; the HUD shows "
                                 f"tracks of at most {HUD_TRACK_VALUES} (use on_frame= to draw larger ones)")
    if parsed is None or layout != "scene":
        return parsed, None
    corner = tuple(f for f in parsed.fields if f in ("frame", "time"))
    per_world = tuple(f for f in parsed.fields if f not in ("frame", "time"))
    return (Hud(corner, parsed.corner) if corner else None), (Hud(per_world, parsed.corner) if per_world else None)


_NO_MAIN_GUARD = ("worker processes could not start: a script that calls mjarchive.render() at module level "
                  "needs `if __name__ == '__main__':` around it (spawned workers import the script again), "
                  "or pass workers=1")


def _refuse_in_spawning_worker() -> None:
    """A spawned worker re-runs the caller's script while it starts; a render() reached there
    (the script has no main guard) must not render or start a pool of its own. Exit that worker
    quietly: the parent sees its pool break and raises one clear BackendError (_pool_broken)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # the flag spawn's own check uses
        raise SystemExit(1)


def _pool_broken(started: Any) -> BackendError:
    main = sys.modules.get("__main__")
    if started is not None and started.value == 0 and getattr(main, "__file__", None):
        return BackendError(_NO_MAIN_GUARD)
    return BackendError("a render worker process died (killed, out of memory, or a crash in the GL driver); "
                        "rerun with workers=1 to see the error in this process")


def _software_gl_hint(gl: str) -> None:
    if "llvmpipe" in gl.lower() or "softpipe" in gl.lower() or "swrast" in gl.lower():
        print(f"mjarchive: OpenGL renders in software ({gl.split('(')[0].strip()}); "
              "quality='fast' renders 10-45x faster here", file=sys.stderr)


def render(archive: Any, out_dir: str | os.PathLike, *, worlds: Any = None, frames: Any = None,
           cameras: Any = None, size: tuple[int, int] = (480, 640), backend: str = "cpu",
           workers: int | None = None, quality: str = "full", layout: str = "per-world",
           fps: float | None = None, executor: Executor | None = None, progress: bool = True,
           split_episodes: bool = False, model: Any = None, storage_options: dict | None = None,
           resume: bool = True, warp_batch: int | None = None, spacing: float = 2.0, hud: Any = "default",
           on_frame: Callable[[int | None, int, np.ndarray], np.ndarray | None] | None = None,
           scene: Any = None, overlays: Any = None) -> list[Path]:
    """Render selected worlds and frames of an archive to mp4 files in `out_dir`; returns their paths.

    archive: an `Archive`, a path or a URL (with `storage_options`). worlds: original world IDs
    (int, list or slice; default all). frames: int, slice or index array (default all committed).
    cameras: any mix of model camera names or ids, `mjarchive.Camera` values and their CLI forms
    ('free', 'auto', 'track:torso,distance=3'); default: every named camera, else Camera.auto().
    size: (height, width) pixels. backend: 'cpu' or 'warp' ('warp:cpu', 'warp:cuda:0').
    workers: processes for the CPU backend (None: up to one per core when the render is long
    enough to pay for starting them, else 1; 1: in this process); the Warp
    backend renders in this process unless `executor` is given. quality: 'full' (the model's
    visual settings) or 'fast' (no shadows, reflections, skybox or multisampling). layout:
    'per-world' (`world-0042_cam-back.mp4`), 'grid' (`grid_cam-back.mp4`, worlds tiled) or
    'scene' (`scene_cam-auto.mp4`: the worlds side by side in one 3D scene, `spacing` metres
    apart on a grid; at most 64). fps: default the archive's output_fps. executor: any
    concurrent.futures.Executor to run the work units on. split_episodes: one file per episode
    (`..._ep-003.mp4`). model: a replay model (MjModel, ModelBundle, MJCF path or MjSpec),
    layout-checked. resume: skip videos that the same request already finished in `out_dir`
    (recorded in `out_dir/.mjarchive-render.json`; each video is written under a temporary name
    and renamed when complete); False renders them again. All paths are returned either way.
    warp_batch: (world, frame) states per Warp launch, packed across worlds (default: what the
    device's memory budget allows); the pixels do not depend on it.
    hud: values burned into each frame: names from ('world', 'episode', 'frame', 'time') and the
    archive's tracks, plus optionally a corner ('top-left', ...); default: the world ID in grid
    and scene layouts, nothing per world; None: nothing. In a scene, per-world values label
    each world where it stands. on_frame(world_id, frame_index, rgb) -> rgb | None: called in
    this process once per frame of each video, in order, before encoding (world_id is None for
    grid and scene videos); a returned array (same shape, uint8) is what is encoded. With
    on_frame, every video is rendered again (resume cannot know what the callable does).
    scene: what is drawn, e.g. {"geomgroup": [1, 1, 0], "sites": True, "frames": "body"} or
    'sites,frames=body,geomgroup=110' (MuJoCo's visual and render flags by name).
    overlays: the archive's recorded overlay tracks drawn into the frames: None = all, () = none,
    or names (CPU only: on Warp pass overlays=() for an archive that has some).
    Per-world model variants (format 1.1) are always applied: each (world, frame) renders with
    the values in force for that world at that frame.
    """
    _refuse_in_spawning_worker()
    be = backend_for(backend)
    _check_choice("quality", quality, QUALITIES)
    _check_choice("layout", layout, LAYOUTS)
    if layout != "per-world" and split_episodes:
        raise MjArchiveError(f"split_episodes=True needs layout='per-world': in layout={layout!r} worlds reset at "
                             "different frames")
    if on_frame is not None and not callable(on_frame):
        raise MjArchiveError(f"on_frame must be a callable (world_id, frame_index, rgb) -> rgb or None, got {on_frame!r}")
    size = _check_size(size)
    options = SceneOptions.parse(scene)
    be.check_options(options)  # refuse what the backend cannot draw before any work
    arch, owned = _open_archive(archive, storage_options)
    folder = lease = None
    try:
        storage_options = storage_options if owned else arch._storage_options
        drawn = select_overlays(arch, overlays)
        be.check_overlays(drawn)
        corner_hud, label_hud = _parse_hud(hud, layout, arch)
        sel = arch.select(worlds=worlds, frames=frames)
        world_ids = list(sel.world_ids)
        frame_idx = selected_frames(arch, sel, frames)
        plan = None
        if layout == "scene":
            from .views.scene import ScenePlan

            plan = ScenePlan.grid(world_ids, spacing)
        replay_model, bundle = _base_model(arch, model)
        check_replay_model(_variant_shapes(arch), replay_model)
        cams = resolve_cameras(arch, replay_model, cameras, world_ids=world_ids, frame_idx=frame_idx, size=size,
                               scene=plan)
        recipe = _recipe(be, cams, plan)
        mjb = _caller_mjb(arch, model, replay_model, bundle, recipe)
        location = _shareable_location(arch)
        if location is None:
            if executor is not None:
                raise MjArchiveError("an in-memory archive cannot be rendered on another process; write it to a path or URL")
            location = f"object:{id(arch)}"
            workers = 1
        # Pooled units of this call open the archive afresh in a warm worker (see RenderUnit.session).
        session = uuid.uuid4().hex if be.pooled else None
        explicit = workers is not None
        if executor is None and be.pooled and workers != 1:
            # Size the pool by the work and start it now: its workers start while this process plans.
            cf = arch.manifest.chunk_frames
            per_video = -(-len(frame_idx) // min(be.unit_frames or cf, cf))
            n_videos = len(cams) * (1 if plan is not None else len(world_ids))
            n_work = len(cams) * len(frame_idx) * (1 if plan is not None else len(world_ids))
            workers = (min(max(1, int(workers)), per_video * n_videos) if explicit else
                       pool.choose_workers(n_work, size, per_video * n_videos))
            if workers > 1:
                lease = pool.lease(workers, functools.partial(warm_up, location, storage_options, session,
                                                              mjb is None and recipe is None))
        _check_derived(arch, model, recipe, plan)
        out = Path(out_dir)
        outputs = plan_units(arch, location=location, storage_options=storage_options, worlds=worlds,
                             frames=frames, cameras=cams, size=size, quality=quality, backend=backend,
                             layout=layout, split_episodes=split_episodes, model_mjb=mjb, out_dir=out,
                             model=replay_model, warp_batch=warp_batch, scene=plan,
                             options=None if options.is_default else options,
                             recipe=None if recipe is None or mjb is not None else json.dumps(recipe, sort_keys=True),
                             labels=label_hud, overlays=drawn, session=session)
        # The folder path may be a link (the user's choice); what is inside it is not trusted. A
        # directory at a video's name is refused before any rendering; links, FIFOs and files at
        # the names are replaced by the finished videos (never written through).
        folder = OutputDir(out)
        for o in outputs:
            folder.check_writable(o.path.name)
        fps = float(fps or arch.output_fps or 30.0)
        extra = {"hud": None if corner_hud is None else corner_hud.key(),
                 "labels": None if label_hud is None else label_hud.key(), "scene": options.key(),
                 "spacing": None if plan is None else plan.spacing,
                 "on_frame": None if on_frame is None else getattr(on_frame, "__qualname__", repr(on_frame))}
        ledger = RenderLedger(folder, request_key(arch, outputs, fps=fps, encoder=VIDEO_ENCODER, extra=extra), {
            "archive": str(arch.location), "worlds": [int(w) for w in sorted({w for o in outputs for w in o.world_ids})],
            "cameras": [label for _, label in cams], "size": list(size), "quality": quality, "backend": backend,
            "layout": layout, "fps": fps})
        all_paths = [o.path for o in outputs]
        if resume and on_frame is None:  # the ledger cannot know what a callable did to the frames
            todo = [o for o in outputs if not ledger.is_done(o.path)]
            if len(todo) < len(outputs):
                print(f"mjarchive: skipped {len(outputs) - len(todo)} of {len(outputs)} outputs already rendered "
                      f"in {out} (resume=False / --no-resume renders them again)", file=sys.stderr)
            outputs = todo
        if not outputs:
            return all_paths
        if be.pooled:
            _quick_start(outputs[0])
        attach_paths(arch, replay_model, outputs,
                     episodes=any("episode" in h.fields for h in (corner_hud, label_hud) if h is not None))
        if be.packs_videos:  # camera by camera: one camera per launch, so consecutive worlds pack together
            order = {label: k for k, (_, label) in enumerate(cams)}
            outputs = sorted(outputs, key=lambda o: order[o.label])
        n_units = sum(len(o.units) for o in outputs)
        if workers is None and executor is not None:
            from .cluster import executor_slots

            workers = executor_slots(executor)
        workers = max(1, min(int(workers or 1), max(1, n_units)))
        ready, window = None, 2 * workers + 1 if lease else 2 * max(1, workers) + 2
        if lease is not None:
            executor, ready = lease.executor, lease.ready
        # Units rendered in this thread use the caller's open Archive instead of opening it again.
        lent = lend_archive(arch, location, storage_options, session) if executor is None or lease else \
            contextlib.nullcontext()
        try:
            with lent:
                _write_outputs(outputs, executor, window, folder=folder, fps=fps, size=size, progress=progress,
                               hint=(quality == "full"), on_done=ledger.mark_done,
                               hud=None if corner_hud is None else HudText(arch, corner_hud), on_frame=on_frame,
                               ready=ready,
                               # workers=N asked for a pool: a script that cannot start one fails, always,
                               # and before any video is in place
                               gate=lease.wait_answered if lease is not None and explicit else None)
            return all_paths
        except BrokenProcessPool:
            if lease is None:
                raise
            raise _pool_broken(lease.started) from None
        finally:
            ledger.flush()  # also when interrupted: what finished stays finished
    finally:
        if lease is not None:
            lease.release()
        if folder is not None:
            folder.close()
        if owned:
            arch.close()


#: Frames of the first unit of a CPU render: the first frame reaches the encoder after these.
FIRST_UNIT_FRAMES = 4


def _quick_start(output: Output) -> None:
    """Cut the first unit of `output` after FIRST_UNIT_FRAMES frames, so encoding (and a pool's
    hand-over) starts early. Grid units stay whole: a canvas block needs every world's unit."""
    if output.grid_block or not output.units or len(output.units[0].frames) <= 2 * FIRST_UNIT_FRAMES:
        return
    u = output.units[0]
    output.units[:1] = [dataclasses.replace(u, frames=u.frames[:FIRST_UNIT_FRAMES]),
                        dataclasses.replace(u, frames=u.frames[FIRST_UNIT_FRAMES:])]


def _check_frame(out: Any, frame: np.ndarray) -> np.ndarray:
    if out is None:
        return frame
    if not isinstance(out, np.ndarray) or out.shape != frame.shape or out.dtype != np.uint8:
        raise MjArchiveError(f"on_frame must return None or a uint8 array of shape {frame.shape}, got "
                             f"{type(out).__name__} {getattr(out, 'shape', '')} {getattr(out, 'dtype', '')}")
    return out


def _check_size(size: Any) -> tuple[int, int]:
    try:
        h, w = (int(s) for s in size)
    except (TypeError, ValueError):
        raise MjArchiveError(f"size must be (height, width) in pixels, got {size!r}") from None
    if not (1 <= h <= 8192 and 1 <= w <= 8192):
        raise MjArchiveError(f"size {size!r} is outside 1..8192 pixels per side")
    return h, w


def _write_outputs(outputs: list[Output], executor: Executor | None, window: int, *, folder: OutputDir,
                   fps: float, size: tuple[int, int], progress: bool, hint: bool, on_done=None,
                   hud: HudText | None = None, on_frame=None, ready=None, gate=None) -> list[Path]:
    """Consume unit results in order, burn in the HUD, call `on_frame`, and encode each output; a
    video is written to a fresh temporary file in `folder` and renamed over its name when
    complete, then reported to `on_done(path, n_frames, sha256, size)`."""
    from tqdm.auto import tqdm

    total = sum(len(u.frames) for o in outputs for u in o.units)
    units = [u for o in outputs for u in o.units]
    # Temporary files a killed render left behind, removed once their video is written again;
    # only those older than this run (a concurrent render's file is being written right now).
    start_ns = time.time_ns()
    leftovers: dict[str, list[str]] = collections.defaultdict(list)  # by video stem
    for n in folder.names():
        if n.startswith(".") and ".partial" in n:
            leftovers[n[1:n.rindex(".partial")]].append(n)
    unit_results = _unit_results(units, executor, window, ready)
    results = zip(units, unit_results)
    paths: list[Path] = []
    hinted = not (hint and progress)

    def frames_of(o: Output, one_world: bool):
        """(unit, result) of each unit of `o`, with the HUD burned in."""
        for _ in o.units:
            u, r = next(results)
            if hud is not None:
                hud.draw(r.world_id if one_world else None, u, r.rgb)
            yield u, r

    try:
        with tqdm(total=total, unit="frame", desc="mjarchive render", disable=not progress) as bar:
            for o in outputs:
                # A fresh file under a random name, made by us with O_EXCL | O_NOFOLLOW (nothing
                # planted can be there); ffmpeg opens it through our descriptor.
                part = folder.create_temp(partial_prefix(o.path), o.path.suffix)
                tmp = part.open_path  # the file itself, not its name: see TempFile.open_path
                scene = bool(o.units) and o.units[0].scene is not None
                try:
                    if o.grid_block:  # grid outputs only; the others have grid_block 0
                        composer = GridComposer(o.world_ids, size)
                        with VideoWriter(tmp, composer.out_size, fps, crf=VIDEO_ENCODER["crf"]) as video:
                            canvas, filled, first = None, 0, None
                            for u, r in frames_of(o, one_world=True):
                                if canvas is None:
                                    canvas, filled, first = composer.canvas(len(r.frames)), 0, r.frames
                                composer.paste(canvas, r.world_id, r.rgb)
                                filled += 1
                                bar.update(len(r.frames))
                                hinted = hinted or _hint_once(r)
                                if filled == len(o.world_ids):
                                    for f, frame in zip(first, canvas):
                                        video.write(frame if on_frame is None else
                                                    _check_frame(on_frame(None, int(f), frame), frame))
                                    canvas = None
                    else:
                        with VideoWriter(tmp, size, fps, crf=VIDEO_ENCODER["crf"]) as video:
                            world = None if scene else o.world_ids[0]
                            for u, r in frames_of(o, one_world=not scene):
                                for f, frame in zip(r.frames, r.rgb):
                                    video.write(frame if on_frame is None else
                                                _check_frame(on_frame(world, int(f), frame), frame))
                                bar.update(len(r.frames))
                                hinted = hinted or _hint_once(r)
                    sha256, n_bytes = part.digest()  # through our descriptor: the file we made
                    if gate is not None:
                        gate()
                    part.commit(o.path.name)
                finally:
                    part.discard()  # no-op once committed
                _remove_leftovers(folder, o.path, leftovers.pop(o.path.stem, ()), start_ns)
                if on_done is not None:
                    on_done(o.path, o.n_frames, sha256, n_bytes)
                paths.append(o.path)
    finally:
        unit_results.close()  # cancels units still in flight when encoding stopped early
    return paths


def _remove_leftovers(folder: OutputDir, path: Path, names: list[str], before_ns: int) -> None:
    """Unlink what sits at temporary names of `path` from before `before_ns` (a killed run's file,
    or anything planted there but a directory; unlink removes a link itself, never its target)."""
    for name in names:
        if is_partial_of(name, path):
            st = folder.lstat(name)
            if st is not None and not stat.S_ISDIR(st.st_mode) and st.st_mtime_ns < before_ns:
                folder.unlink(name)


def _hint_once(result: UnitResult) -> bool:
    if result.gl_renderer:
        _software_gl_hint(result.gl_renderer)
        return True
    return False


def iter_frames(archive: Any, *, worlds: Any = None, frames: Any = None, camera: Any = None,
                size: tuple[int, int] = (480, 640), backend: str = "cpu", quality: str = "full",
                model: Any = None, storage_options: dict | None = None,
                warp_batch: int | None = None, scene: Any = None,
                overlays: Any = None) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (world_id, frame_index, rgb (H, W, 3) uint8) for the selection, world by world, in this
    process. camera: a model camera's name or id, a `mjarchive.Camera` or its CLI form ('free',
    'auto', 'track:torso'); default: the first named camera, else Camera.auto(). scene: what is
    drawn (see `render`). warp_batch: states per Warp launch, packed across worlds (default: from
    a memory budget). overlays: recorded overlay tracks drawn (see `render`; default all)."""
    be = backend_for(backend)
    _check_choice("quality", quality, QUALITIES)
    size = _check_size(size)
    options = SceneOptions.parse(scene)
    be.check_options(options)
    arch, owned = _open_archive(archive, storage_options)
    try:
        storage_options = storage_options if owned else arch._storage_options
        drawn = select_overlays(arch, overlays)
        be.check_overlays(drawn)
        sel = arch.select(worlds=worlds, frames=frames)
        frame_idx = selected_frames(arch, sel, frames)
        replay_model, bundle = _base_model(arch, model)
        check_replay_model(_variant_shapes(arch), replay_model)
        if isinstance(camera, dict):
            camera = Camera.from_dict(camera)
        if camera is not None and not isinstance(camera, (str, int, np.integer, Camera)):
            raise MjArchiveError(f"camera must be one name, id or Camera, got {camera!r}")
        cam = resolve_cameras(arch, replay_model, camera, world_ids=list(sel.world_ids), frame_idx=frame_idx,
                              size=size)[:1]
        recipe = _recipe(be, cam, None)
        mjb = _caller_mjb(arch, model, replay_model, bundle, recipe)
        location = f"object:{id(arch)}"
        with lend_archive(arch, location, storage_options):
            outputs = plan_units(arch, location=location, storage_options=storage_options, worlds=worlds,
                                 frames=frames, cameras=cam, size=size, quality=quality, backend=backend,
                                 layout="per-world", split_episodes=False, model_mjb=mjb, out_dir=Path("."),
                                 model=replay_model, warp_batch=warp_batch,
                                 options=None if options.is_default else options,
                                 recipe=None if recipe is None or mjb is not None else json.dumps(recipe, sort_keys=True),
                                 overlays=drawn)
            attach_paths(arch, replay_model, outputs)
            results = _unit_results([u for o in outputs for u in o.units], None, 1)
            try:
                for r in results:
                    for f, rgb in zip(r.frames, r.rgb):
                        yield r.world_id, f, rgb
            finally:
                results.close()
    finally:
        if owned:
            arch.close()
