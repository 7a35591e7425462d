"""Replay: plan work units, render them (in-process, in a process pool or on any Executor), and
stream the pixels in order into mp4 files.

A work unit is plain data (archive location, one world, one camera, frames inside one stored
chunk, size, quality, backend). `render_unit` is a top-level function, so any
`concurrent.futures.Executor` can run it; each worker process opens the archive itself, reads only
its unit's slice and caches model and renderer (`worker.py`). The parent keeps at most a window of units in
flight and consumes results in order, so memory does not grow with video length. On the Warp
backend the parent packs the (world, frame) states of consecutive units into full batches
(`warp.PackedUnit`) and cuts the pixels back into per-unit pieces, in order.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import multiprocessing
import os
import stat
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from .._errors import BackendError, MjArchiveError, SelectionError
from .._fs import OutputDir
from ..archive.reader import Archive
from ..archive.reader import open as open_archive
from . import cpu, warp
from .cpu import FREE_CAMERA, QUALITIES, gl_renderer_name
from .resume import RenderLedger, is_partial_of, partial_prefix, request_key
from ..archive.store import is_url, local_path
from .video import GridComposer, VideoWriter, camera_label, grid_shape, video_name
from .worker import RenderUnit, UnitResult, archive_for, bundle_model, lend_archive, model_for

__all__ = ["render", "iter_frames", "RenderUnit", "UnitResult", "render_unit", "plan_units"]

LAYOUTS = ("per-world", "grid")
#: Pixel bytes one unit returns at most (bounds the parent's reorder buffer: window × this).
UNIT_BYTES = {"cpu": 32 * 2**20, "warp": 256 * 2**20}
#: Frames one CPU unit holds at most: small units balance workers; each costs one chunk read.
CPU_UNIT_FRAMES = 32
_CACHE_SIZE = 4
#: Encoder settings of every video (part of the resume key: other settings, other files).
VIDEO_ENCODER = {"codec": "libx264", "pix_fmt": "yuv420p", "crf": 23}


def render_unit(unit: RenderUnit) -> UnitResult:
    """Render one unit (runs in any process): read its slice, pose, render; returns the pixels."""
    archive = archive_for(unit)
    model = model_for(unit, archive)
    frames = np.asarray(unit.frames, dtype=np.int64)
    contiguous = bool(np.all(np.diff(frames) == 1))
    sel = archive.select(worlds=[unit.world_id],
                         frames=slice(int(frames[0]), int(frames[-1]) + 1) if contiguous else frames)
    qpos = sel.qpos[:, 0]
    mocap_pos = sel.mocap_pos[:, 0] if model.nmocap else None
    mocap_quat = sel.mocap_quat[:, 0] if model.nmocap else None
    renderer = (cpu if unit.backend == "cpu" else warp).renderer_for(unit, archive, model)
    h, w = unit.size
    n = len(frames)
    rgb = np.empty((n, h, w, 3), np.uint8)
    gl = ""
    if unit.backend == "cpu":
        for i in range(n):
            renderer.set_state(qpos[i], None if mocap_pos is None else mocap_pos[i],
                               None if mocap_quat is None else mocap_quat[i])
            rgb[i] = renderer.render(unit.camera)
        gl = gl_renderer_name()
    else:
        for s in range(0, n, renderer.nworld):
            e = min(n, s + renderer.nworld)
            rgb[s:e] = renderer.render_batch(qpos[s:e], None if mocap_pos is None else mocap_pos[s:e],
                                             None if mocap_quat is None else mocap_quat[s:e], unit.camera)
    return UnitResult(unit.world_id, unit.camera, unit.frames, rgb, gl)


# -- planning -----------------------------------------------------------------------------------

def _check_backend(backend: str) -> str:
    if isinstance(backend, str) and (backend in ("cpu", "warp") or (backend.startswith("warp:") and len(backend) > 5)):
        return backend
    raise MjArchiveError(
        f"unknown backend {backend!r}; choose 'cpu' (MuJoCo's OpenGL renderer) or 'warp' "
        "(MuJoCo Warp; 'warp:cpu' or 'warp:cuda:0' to pick the Warp device)"
    )


def _check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise MjArchiveError(f"unknown {name} {value!r}; choose one of {list(choices)}")
    return value


def _resolve_cameras(model: mujoco.MjModel, cameras: Any) -> list[tuple[int, str]]:
    """(camera id, file label) pairs; default: all named cameras, else the free camera."""
    names = [model.camera(i).name for i in range(model.ncam)]
    if cameras is None:
        ids = [i for i, n in enumerate(names) if n] or [FREE_CAMERA]
    else:
        if isinstance(cameras, (str, int)):
            cameras = [cameras]
        ids = []
        for cam in cameras:
            if isinstance(cam, str) and cam in names:
                ids.append(names.index(cam))
            elif (isinstance(cam, str) and cam == "free") or cam == FREE_CAMERA:
                ids.append(FREE_CAMERA)
            elif isinstance(cam, (int, np.integer)) and not isinstance(cam, bool) and 0 <= cam < model.ncam:
                ids.append(int(cam))
            else:
                raise SelectionError(
                    f"no camera {cam!r} in the model; choose from {[n for n in names if n]} "
                    f"(or ids 0..{model.ncam - 1}), or 'free' for MuJoCo's free camera"
                )
    out: list[tuple[int, str]] = []
    used: set[str] = set()
    for i in dict.fromkeys(ids):
        label = camera_label(names[i] if i >= 0 else None, i)
        k = 0
        while label in used:  # names crafted to collide after sanitizing: still one file each
            k += 1
            label = f"cam{i}" if k == 1 else f"cam{i}-{k}"
        used.add(label)
        out.append((i, label))
    return out


def _split(frames: np.ndarray, chunk_frames: int, max_frames: int) -> list[tuple[int, ...]]:
    """Split frame indices into runs that never cross a stored chunk and hold <= max_frames."""
    out: list[tuple[int, ...]] = []
    if not len(frames):
        return out
    chunk = frames // chunk_frames
    bounds = np.flatnonzero(np.diff(chunk)) + 1
    for part in np.split(frames, bounds):
        for s in range(0, len(part), max_frames):
            out.append(tuple(int(f) for f in part[s:s + max_frames]))
    return out


@dataclasses.dataclass
class _Output:
    path: Path
    camera: int
    world_ids: list[int]
    units: list[RenderUnit]
    n_frames: int
    grid_block: int = 0  # grid: frames per canvas block


def plan_units(archive: Archive, *, location: str, storage_options: dict | None, worlds: Any, frames: Any,
               cameras: list[tuple[int, str]], size: tuple[int, int], quality: str, backend: str,
               layout: str, split_episodes: bool, model_mjb: bytes | None, out_dir: Path,
               model: mujoco.MjModel, unit_bytes: int | None = None,
               warp_batch: int | None = None) -> list[_Output]:
    """Every output video with its ordered work units. warp_batch: states per Warp launch
    (default: what the device's memory budget allows, capped by the selection's size)."""
    sel = archive.select(worlds=worlds, frames=frames)
    world_ids = list(sel.world_ids)
    frame_idx = np.asarray(sel.frame_indices, dtype=np.int64)
    if not len(frame_idx):
        raise SelectionError(
            f"the frame selection {frames!r} holds no frames (the archive has {archive.n_frames} committed "
            "frames; a live archive shows frames once the writer commits them)"
        )
    cf = archive.manifest.chunk_frames
    h, w = size
    budget = unit_bytes or UNIT_BYTES["cpu" if backend == "cpu" else "warp"]

    if backend == "cpu":
        warp_batch = None
    elif warp_batch is not None:
        if isinstance(warp_batch, bool) or not isinstance(warp_batch, (int, np.integer)) or warp_batch < 1:
            raise MjArchiveError(f"warp_batch must be a positive number of states per launch, got {warp_batch!r}")
        warp_batch = int(warp_batch)
    else:  # Warp renders all nworld slots per launch, packed across worlds: no more than the selection
        device = backend.partition(":")[2] or warp.default_device()
        warp_batch = min(warp.batch_size(model, size, device), max(1, budget // (h * w * 3)),
                         max(1, len(frame_idx) * len(world_ids)))

    def unit(world_id: int, camera: int, part: tuple[int, ...]) -> RenderUnit:
        return RenderUnit(location, storage_options, int(world_id), camera, part, size, quality, backend, model_mjb,
                          warp_batch)

    outputs: list[_Output] = []
    if layout == "grid":
        rows, cols = grid_shape(len(world_ids))  # the canvas GridComposer will paste into
        block = max(1, budget // (rows * h * cols * w * 3))
        if backend == "cpu":
            block = min(block, CPU_UNIT_FRAMES)
        for cam, label in cameras:
            units = [unit(wid, cam, part) for part in _split(frame_idx, cf, block) for wid in world_ids]
            outputs.append(_Output(out_dir / video_name(None, label), cam, world_ids, units, len(frame_idx), block))
        return outputs
    per_unit = max(1, budget // (h * w * 3))
    if backend == "cpu":
        per_unit = min(per_unit, CPU_UNIT_FRAMES)
    for wid in world_ids:
        if split_episodes:
            pieces = [(k, frame_idx[(frame_idx >= ep.start) & (frame_idx < ep.stop)])
                      for k, ep in enumerate(archive.episodes(wid))]
            pieces = [(k, p) for k, p in pieces if len(p)]
        else:
            pieces = [(None, frame_idx)]
        for cam, label in cameras:
            for episode, idx in pieces:
                units = [unit(wid, cam, part) for part in _split(idx, cf, per_unit)]
                outputs.append(_Output(out_dir / video_name(wid, label, episode), cam, [wid], units, len(idx)))
    return outputs


# -- orchestration ----------------------------------------------------------------------------

def _run_ordered(units: Iterable[Any], executor: Executor | None, window: int, fn=render_unit) -> Iterator[Any]:
    """`fn(unit)` results in unit order, with at most `window` units submitted but not yet consumed."""
    if executor is None:
        for u in units:
            yield fn(u)
        return
    pending: collections.deque = collections.deque()
    try:
        for u in units:
            pending.append(executor.submit(fn, u))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


def _unit_results(units: Sequence[RenderUnit], executor: Executor | None, window: int) -> Iterator[UnitResult]:
    """Results of `units` in order. Warp: their states are packed into full batches across units
    (several worlds per launch), rendered as PackedUnits and cut back into per-unit results."""
    if not units or units[0].backend == "cpu" or units[0].warp_batch is None:
        yield from _run_ordered(units, executor, window)
        return
    batch = units[0].warp_batch
    h, w = units[0].size
    # In this process: many launches per task (fewer, larger reads); on an executor: one launch per
    # task, so several workers share the work.
    per_task = batch if executor is not None else batch * max(1, UNIT_BYTES["warp"] // (h * w * 3) // batch)
    packed = _run_ordered(warp.pack(units, per_task), executor, window, fn=warp.render_packed)
    try:
        for u, rgb in warp.unpack(units, packed):
            yield UnitResult(u.world_id, u.camera, u.frames, rgb)
    finally:
        packed.close()


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


def _prepare_model(archive: Archive, model: Any) -> tuple[mujoco.MjModel, bytes | None]:
    """The replay model and, when the caller supplied it, its MJB bytes for the workers."""
    if model is None:  # compiled once per bundle hash and thread, like the workers do
        return bundle_model(archive), None
    if not isinstance(model, mujoco.MjModel):
        from ..archive.writer import as_bundle

        model = as_bundle(model).compile()
    archive.manifest.layout.check_compatible(model)
    buf = np.empty(mujoco.mj_sizeModel(model), np.uint8)
    mujoco.mj_saveModel(model, None, buf)
    return model, buf.tobytes()


def _init_worker(gl_threads: int, started: Any = None) -> None:
    """Pool worker set-up: software GL (Mesa llvmpipe) would start one raster thread per core in
    every worker; share the cores instead. No effect on GPU drivers or when the user set it.
    `started` (a shared counter) tells the parent that this worker got past start-up."""
    os.environ.setdefault("LP_NUM_THREADS", str(gl_threads))
    if started is not None:
        with started.get_lock():
            started.value += 1


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
           resume: bool = True, warp_batch: int | None = None) -> list[Path]:
    """Render selected worlds and frames of an archive to mp4 files in `out_dir`; returns their paths.

    archive: an `Archive`, a path or a URL (with `storage_options`). worlds: original world IDs
    (int, list or slice; default all). frames: int, slice or index array (default all committed).
    cameras: names, ids or 'free' (default: every named camera, else the free camera).
    size: (height, width) pixels. backend: 'cpu' or 'warp' ('warp:cpu', 'warp:cuda:0').
    workers: processes for the CPU backend (None: one per core; 1: in this process); the Warp
    backend renders in this process unless `executor` is given. quality: 'full' (the model's
    visual settings) or 'fast' (no shadows, reflections, skybox or multisampling). layout:
    'per-world' (`world-0042_cam-back.mp4`) or 'grid' (`grid_cam-back.mp4`, worlds tiled and
    labelled). fps: default the archive's output_fps. executor: any concurrent.futures.Executor
    to run the work units on. split_episodes: one file per episode (`..._ep-003.mp4`).
    model: a replay model (MjModel, ModelBundle, MJCF path or MjSpec), layout-checked.
    resume: skip videos that the same request already finished in `out_dir` (recorded in
    `out_dir/.mjarchive-render.json`; each video is written under a temporary name and renamed
    when complete); False renders them again. All paths are returned either way.
    warp_batch: (world, frame) states per Warp launch, packed across worlds (default: what the
    device's memory budget allows); the pixels do not depend on it.
    """
    _refuse_in_spawning_worker()
    backend = _check_backend(backend)
    _check_choice("quality", quality, QUALITIES)
    _check_choice("layout", layout, LAYOUTS)
    if layout == "grid" and split_episodes:
        raise MjArchiveError("split_episodes=True needs layout='per-world': worlds reset at different frames")
    size = _check_size(size)
    arch, owned = _open_archive(archive, storage_options)
    folder = None
    try:
        storage_options = storage_options if owned else arch._storage_options
        replay_model, mjb = _prepare_model(arch, model)
        cams = _resolve_cameras(replay_model, cameras)
        location = _shareable_location(arch)
        if location is None:
            if executor is not None:
                raise MjArchiveError("an in-memory archive cannot be rendered on another process; write it to a path or URL")
            location = f"object:{id(arch)}"
            workers = 1
        out = Path(out_dir)
        outputs = plan_units(arch, location=location, storage_options=storage_options, worlds=worlds,
                             frames=frames, cameras=cams, size=size, quality=quality, backend=backend,
                             layout=layout, split_episodes=split_episodes, model_mjb=mjb, out_dir=out,
                             model=replay_model, warp_batch=warp_batch)
        # The folder path may be a link (the user's choice); what is inside it is not trusted. A
        # directory at a video's name is refused before any rendering; links, FIFOs and files at
        # the names are replaced by the finished videos (never written through).
        folder = OutputDir(out)
        for o in outputs:
            folder.check_writable(o.path.name)
        fps = float(fps or arch.output_fps or 30.0)
        ledger = RenderLedger(folder, request_key(arch, outputs, fps=fps, encoder=VIDEO_ENCODER), {
            "archive": str(arch.location), "worlds": [int(w) for w in sorted({w for o in outputs for w in o.world_ids})],
            "cameras": [label for _, label in cams], "size": list(size), "quality": quality, "backend": backend,
            "layout": layout, "fps": fps})
        all_paths = [o.path for o in outputs]
        if resume:
            todo = [o for o in outputs if not ledger.is_done(o.path)]
            if len(todo) < len(outputs):
                print(f"mjarchive: skipped {len(outputs) - len(todo)} of {len(outputs)} outputs already rendered "
                      f"in {out} (resume=False / --no-resume renders them again)", file=sys.stderr)
            outputs = todo
        if not outputs:
            return all_paths
        if backend != "cpu":  # camera by camera: one camera per launch, so consecutive worlds pack together
            order = {cam: k for k, (cam, _) in enumerate(cams)}
            outputs = sorted(outputs, key=lambda o: order[o.camera])
        n_units = sum(len(o.units) for o in outputs)
        if workers is None and executor is not None:
            from .cluster import executor_slots

            workers = executor_slots(executor)
        if workers is None:
            workers = (os.cpu_count() or 1) if backend == "cpu" else 1
        workers = max(1, min(int(workers), max(1, n_units)))
        own_pool = started = None
        if executor is None and workers > 1:
            ctx = multiprocessing.get_context("spawn")
            started = ctx.Value("i", 0)  # workers that got past start-up (see _pool_broken)
            own_pool = executor = ProcessPoolExecutor(
                workers, mp_context=ctx, initializer=_init_worker,
                initargs=(max(1, (os.cpu_count() or 1) // workers), started),
            )
        # In this process, units use the caller's open Archive instead of opening it again.
        lent = lend_archive(arch, location, storage_options) if executor is None else contextlib.nullcontext()
        try:
            with lent:
                _write_outputs(outputs, executor, 2 * workers + 1 if own_pool else 2 * max(1, workers) + 2,
                               folder=folder, fps=fps, size=size, progress=progress,
                               hint=(backend == "cpu" and quality == "full"), on_done=ledger.mark_done)
            return all_paths
        except BrokenProcessPool:
            if own_pool is None:
                raise
            raise _pool_broken(started) from None
        finally:
            ledger.flush()  # also when interrupted: what finished stays finished
            if own_pool is not None:
                own_pool.shutdown(wait=True, cancel_futures=True)
    finally:
        if folder is not None:
            folder.close()
        if owned:
            arch.close()


def _check_size(size: Any) -> tuple[int, int]:
    try:
        h, w = (int(s) for s in size)
    except (TypeError, ValueError):
        raise MjArchiveError(f"size must be (height, width) in pixels, got {size!r}") from None
    if not (1 <= h <= 8192 and 1 <= w <= 8192):
        raise MjArchiveError(f"size {size!r} is outside 1..8192 pixels per side")
    return h, w


def _write_outputs(outputs: list[_Output], executor: Executor | None, window: int, *, folder: OutputDir,
                   fps: float, size: tuple[int, int], progress: bool, hint: bool, on_done=None) -> list[Path]:
    """Consume unit results in order and encode each output; a video is written to a fresh
    temporary file in `folder` and renamed over its name when complete, then reported to
    `on_done(path, n_frames, sha256, size)`."""
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
    results = _unit_results(units, executor, window)
    paths: list[Path] = []
    hinted = not (hint and progress)
    try:
        with tqdm(total=total, unit="frame", desc="mjarchive render", disable=not progress) as bar:
            for o in outputs:
                # A fresh file under a random name, made by us with O_EXCL | O_NOFOLLOW (nothing
                # planted can be there); ffmpeg opens it through our descriptor.
                part = folder.create_temp(partial_prefix(o.path), o.path.suffix)
                tmp = part.open_path  # the file itself, not its name: see TempFile.open_path
                try:
                    if o.grid_block:  # grid outputs only; per-world ones have grid_block 0
                        composer = GridComposer(o.world_ids, size)
                        with VideoWriter(tmp, composer.out_size, fps, crf=VIDEO_ENCODER["crf"]) as video:
                            canvas, filled = None, 0
                            for _ in o.units:
                                r = next(results)
                                if canvas is None:
                                    canvas, filled = composer.canvas(len(r.frames)), 0
                                composer.paste(canvas, r.world_id, r.rgb)
                                filled += 1
                                bar.update(len(r.frames))
                                hinted = hinted or _hint_once(r)
                                if filled == len(o.world_ids):
                                    for frame in canvas:
                                        video.write(frame)
                                    canvas = None
                    else:
                        with VideoWriter(tmp, size, fps, crf=VIDEO_ENCODER["crf"]) as video:
                            for _ in o.units:
                                r = next(results)
                                for frame in r.rgb:
                                    video.write(frame)
                                bar.update(len(r.frames))
                                hinted = hinted or _hint_once(r)
                    sha256, n_bytes = part.digest()  # through our descriptor: the file we made
                    part.commit(o.path.name)
                finally:
                    part.discard()  # no-op once committed
                _remove_leftovers(folder, o.path, leftovers.pop(o.path.stem, ()), start_ns)
                if on_done is not None:
                    on_done(o.path, o.n_frames, sha256, n_bytes)
                paths.append(o.path)
    finally:
        results.close()  # cancels units still in flight when encoding stopped early
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
                warp_batch: int | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (world_id, frame_index, rgb (H, W, 3) uint8) for the selection, world by world, in this
    process. camera: a name, id or 'free' (default: the first named camera, else the free camera).
    warp_batch: states per Warp launch, packed across worlds (default: from a memory budget)."""
    backend = _check_backend(backend)
    _check_choice("quality", quality, QUALITIES)
    size = _check_size(size)
    arch, owned = _open_archive(archive, storage_options)
    try:
        storage_options = storage_options if owned else arch._storage_options
        replay_model, mjb = _prepare_model(arch, model)
        cam = _resolve_cameras(replay_model, camera)[0]
        location = f"object:{id(arch)}"
        with lend_archive(arch, location, storage_options):
            outputs = plan_units(arch, location=location, storage_options=storage_options, worlds=worlds,
                                 frames=frames, cameras=[cam], size=size, quality=quality, backend=backend,
                                 layout="per-world", split_episodes=False, model_mjb=mjb, out_dir=Path("."),
                                 model=replay_model, warp_batch=warp_batch)
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
