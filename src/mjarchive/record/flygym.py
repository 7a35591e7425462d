"""flygym 2.x into mjarchive: recorders with flygym's call shape, and an importer of its `.npz` files.

Recording: `TrajectoryRecorder` and `WarpTrajectoryRecorder` take the place of flygym's own recorders
(`flygym.recording`, `flygym.warp.recording`) in a `Simulation` or `GPUSimulation`: they record the
frames flygym's `FrameClock` picks (the same times and states as flygym's recorders), stream them to
an archive that carries the simulation's model, and need no `.save()`. Importing: `import_flygym`
turns a folder of flygym `RecordedTrajectory` files (one `.npz` per world) into one archive, reading
each file as untrusted input. Neither imports flygym: they read its objects by their attributes.

Why not `mjarchive.Recorder` itself: its cadence puts frame k at step ceil(k * r) of a step grid
(r = playback_speed / (output_fps * timestep)) and stores k's time on that grid; flygym's clock records
at the first step at least r - 1/2 steps after the last frame, and stores `data.time`. Both agree when
r is a whole number (NeuroMechFly's defaults: 80), not otherwise (r = 16.7: flygym every 17th step).
These recorders keep flygym's clock and hand the frames to the Recorder's own gatherers (host blocks
for MjData, device gathers of the selected worlds for Warp) and block sink.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import itertools
import math
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
from zarr.core.sync import sync

from .._errors import ArchiveExistsError, ClosedError, MjArchiveError
from .._fs import OutputDir
from ..archive.bundle.model_bundle import ModelBundle, QposLayout
from ..archive.compact import BLOCK_BYTES
from ..archive.creation import as_bundle
from ..archive.format import LEASE_GROUP
from ..archive.joining import refuse_replacing_parts
from ..archive.opening import open as open_archive
from ..archive.storage.lease import acquire_lease
from ..archive.storage.locations import local_path, make_store, new_store
from ..archive.writer import create
from .arrays import MjDataGatherer
from .block_sink import BlockSink
from .flygym_npz import (Stream, Trajectory, check_against, common_frames, list_npz, open_npz, reserve_files,
                         world_ids_of)
from .recorder_args import as_indices

__all__ = ["FrameClock", "TrajectoryRecorder", "WarpTrajectoryRecorder", "import_flygym", "ImportResult"]

#: flygym's defaults (`Simulation.set_trajectory_recorder`).
PLAYBACK_SPEED, OUTPUT_FPS = 0.2, 25
#: The most `.npz` files one import reads (each stays open while the archive is written).
MAX_FILES = 1024
#: The most decoded bytes one import reads from all files together (qpos, mocap, time).
MAX_BYTES = 64 * 2**30
#: A killed import's temporary folder, unlocked and untouched this long (s), is deleted by the next.
STALE_S = 60


class FrameClock:
    """flygym's `flygym.rendering.FrameClock`: a frame is due when `time` has reached the last frame's
    time plus `playback_speed / output_fps`, less half a timestep (so frames follow the simulation's
    own clock, as flygym's recorders and renderers sample it)."""

    def __init__(self, playback_speed: float, output_fps: float, timestep: float):
        self.interval = playback_speed / output_fps
        self._tolerance = timestep * 0.5
        self.reset()

    def reset(self) -> None:
        self._last = -math.inf

    def tick(self, time: float) -> bool:
        if time < self._last + self.interval - self._tolerance:
            return False
        self._last = float(time)
        return True


def _sim_model(model: Any) -> tuple[Any, float | None, Any]:
    """(what `create` bundles, the simulation's timestep or None, its compiled MjModel or None) of a
    flygym `Simulation`/`GPUSimulation` (its world's MjSpec, its timestep override), a flygym world (its
    `mjcf_root` MjSpec), or anything `mjarchive.create` takes."""
    world, mj_model = getattr(model, "world", None), getattr(model, "mj_model", None)
    if world is not None and mj_model is not None:
        return world.mjcf_root, float(mj_model.opt.timestep), mj_model
    spec = getattr(model, "mjcf_root", None)
    return (spec if spec is not None else model), None, None


def _bundle(model: Any) -> tuple[ModelBundle, mujoco.MjModel, float]:
    """The bundle of `model` (see `_sim_model`), its compiled model (its qpos layout checked against the
    simulation's), and the timestep: the simulation's, else the model's."""
    source, timestep, sim_model = _sim_model(model)
    bundle = as_bundle(source)
    mj = bundle.compile()
    if sim_model is not None:
        QposLayout.from_model(mj).check_compatible(sim_model)
    return bundle, mj, timestep or float(mj.opt.timestep)


class _FlygymRecorder:
    """What both recorders share: flygym's frame clock, an archive writer created at construction,
    resets as episode starts, and the continuing time axis."""

    def __init__(self, path: Any, model: Any, n_worlds: int, worlds: Any, *, playback_speed: float,
                 output_fps: float, dtype: str, backend: str, **create_kwargs: Any):
        bundle, self._mj, timestep = _bundle(model)
        timestep = create_kwargs.pop("timestep", None) or timestep
        self.playback_speed, self.output_fps = playback_speed, output_fps
        self._clock = FrameClock(playback_speed, output_fps, timestep)
        self.n_worlds = int(n_worlds)
        if self.n_worlds < 1:
            raise MjArchiveError(f"n_worlds={n_worlds}: the simulation needs at least one world")
        self.worlds = np.arange(self.n_worlds) if worlds is None else as_indices(worlds)
        if self.worlds.min() < 0 or self.worlds.max() >= self.n_worlds:
            raise MjArchiveError(f"worlds={self.worlds.tolist()} are out of range for n_worlds={n_worlds}")
        self._writer = create(path, bundle, world_ids=self.worlds.tolist(), timestep=timestep, output_fps=output_fps,
                              playback_speed=playback_speed, dtype=dtype, backend=backend, **create_kwargs)
        self._sink = BlockSink(self._writer, None)
        self._gatherer: Any = None
        self._offset = 0.0  # added to the simulation's time after a reset: the archive's time only increases
        self._last_time = -math.inf
        self._reset = np.zeros(len(self.worlds), bool)
        self._no_reset = self._reset.copy()
        self.frames_recorded = 0
        self._closed = False

    @property
    def writer(self) -> Any:
        return self._writer

    @property
    def world_ids(self) -> tuple[int, ...]:
        return self._writer.world_ids

    def _record(self, source: Any, time: float) -> bool:
        if self._closed:
            raise ClosedError(f"this {type(self).__name__} is closed; record into a new archive with a new one")
        if not self._clock.tick(time):
            return False
        stored = time + self._offset
        self._gatherer.gather(source, stored, self._reset)
        self._reset = self._no_reset  # taken by this frame (a failed gather keeps it for the next)
        self._last_time = stored
        self.frames_recorded += 1
        self._gatherer.seal_if_full()
        return True

    def reset(self) -> None:
        """What flygym's `Simulation.reset()` calls: the next call records, as the first frame of a new
        episode of every recorded world. Frames already recorded stay (flygym's recorder drops them);
        times go on from the last frame's, one frame interval later, since the simulation's restart at 0."""
        self._clock.reset()
        if self.frames_recorded:
            self._offset = self._last_time + self._clock.interval
            self._reset = np.ones(len(self.worlds), bool)

    def flush(self) -> None:
        """Commit every recorded frame (readers see them)."""
        if self._gatherer is not None:
            self._gatherer.drain_all()
        self._writer.flush()

    def close(self) -> None:
        """Commit everything and finalize the archive (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._gatherer is not None:
                self._gatherer.drain_all()
        finally:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as refusal:  # the body's exception goes on, this one attached to it
            exc.add_note(f"while closing the {type(self).__name__} after it, {type(refusal).__name__}: {refusal}")


class TrajectoryRecorder(_FlygymRecorder):
    """flygym's `TrajectoryRecorder`, writing an archive: `record_as_needed(mj_data)` records the
    frames flygym's recorder records (its `FrameClock`: times `mj_data.time`, the same qpos and mocap
    poses), streamed to `path` in blocks; `close()` (or a `with` block) finalizes it.

    `model`: the flygym `Simulation` (its world's MjSpec is bundled, and its timestep, also one given
    to `Simulation(timestep=...)`), a flygym world, or what `mjarchive.create` takes. Stored as
    float64 (`dtype=`), as flygym keeps them, so replay is bit-exact. Further keyword arguments go to
    `mjarchive.create` (`overwrite=True`, `chunk_frames`, ...). The archive holds one world, ID 0.

    In a flygym loop, in place of `sim.set_trajectory_recorder(...)`::

        sim.recorder = mjarchive.flygym.TrajectoryRecorder("run.mjarchive", sim)
        for _ in range(n_steps):
            sim.step()
            sim.record_as_needed()
        sim.recorder.close()
    """

    def __init__(self, path: Any, model: Any, *, playback_speed: float = PLAYBACK_SPEED,
                 output_fps: float = OUTPUT_FPS, dtype: str = "float64", block_frames: int = 64, **create_kwargs: Any):
        super().__init__(path, model, 1, None, playback_speed=playback_speed, output_fps=output_fps, dtype=dtype,
                         backend="mujoco", **create_kwargs)
        self._block_frames = max(1, int(block_frames))

    def record_as_needed(self, mj_data: Any) -> bool:
        """Record the state of `mj_data` if a frame is due; returns whether it recorded."""
        if self._gatherer is None:
            fields = {"qpos": (self._mj.nq,)}
            if self._mj.nmocap:
                fields.update(mocap_pos=(self._mj.nmocap, 3), mocap_quat=(self._mj.nmocap, 4))
            self._gatherer = MjDataGatherer((mj_data,), np.zeros(1, np.intp), fields,
                                            block_frames=self._block_frames, sink=self._sink.append_block)
        return self._record((mj_data,), float(mj_data.time))


class WarpTrajectoryRecorder(_FlygymRecorder):
    """flygym's `WarpTrajectoryRecorder`, writing an archive: `record_as_needed(mjw_data)` records the
    selected `worlds` (default all `n_worlds`; stored under their indices as world IDs) at the frames
    flygym's recorder records (world 0's `time`). Only the selected worlds are gathered on the device
    and copied to the host, in blocks (mjarchive's Warp gatherer), where flygym copies every world at
    every frame. `model` as for `TrajectoryRecorder`; a `GPUSimulation` also gives `n_worlds`.

    With a flygym `GPUSimulation`::

        sim.recorder = mjarchive.flygym.WarpTrajectoryRecorder("run.mjarchive", sim, worlds=[0, 5])
    """

    def __init__(self, path: Any, model: Any, n_worlds: int | None = None, *, worlds: Any = None,
                 playback_speed: float = PLAYBACK_SPEED, output_fps: float = OUTPUT_FPS, dtype: str = "float32",
                 block_frames: int = 16, ring_buffers: int = 3, **create_kwargs: Any):
        n_worlds = getattr(model, "n_worlds", None) if n_worlds is None else n_worlds
        if n_worlds is None:
            raise MjArchiveError("pass n_worlds= (the simulation's number of worlds), or the GPUSimulation as model")
        super().__init__(path, model, n_worlds, worlds, playback_speed=playback_speed, output_fps=output_fps,
                         dtype=dtype, backend="mujoco_warp", **create_kwargs)
        self._block_args = dict(block_frames=max(1, int(block_frames)), ring_buffers=max(2, int(ring_buffers)))

    def record_as_needed(self, mjw_data: Any) -> bool:
        """Record the selected worlds of `mjw_data` if a frame is due; returns whether it recorded."""
        if self._gatherer is None:
            from .warp import WarpGatherer

            if int(mjw_data.nworld) != self.n_worlds:
                raise MjArchiveError(f"the Data has {int(mjw_data.nworld)} worlds; this recorder was made for "
                                     f"n_worlds={self.n_worlds}")
            self._gatherer = WarpGatherer(mjw_data, self.worlds, nq=self._mj.nq, nmocap=self._mj.nmocap, tracks={},
                                          sink=self._sink.append_block, **self._block_args)
        return self._record(mjw_data, self._gatherer.read_time(mjw_data))  # flygym's clock: world 0's time


# -- import ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ImportResult:
    """What `import_flygym` wrote: the archive's location, its world IDs (in file order) with the
    file each came from, and its frame count."""

    location: Any
    world_ids: tuple[int, ...]
    files: tuple[str, ...]
    n_frames: int


def _progress(progress: Any, total: int) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(update(done), close()) of `progress`: True, a tqdm bar (when tqdm is installed); a callable,
    called as progress(done, total); False or None, nothing."""
    if callable(progress):
        return (lambda done: progress(done, total)), (lambda: None)
    if progress:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # tqdm comes with the video extra; importing works without it
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=total, unit="frame", desc="mjarchive import flygym")
            return (lambda done: bar.update(done - bar.n)), bar.close
    return (lambda done: None), (lambda: None)


def import_flygym(folder: str | os.PathLike, model: Any, out: Any, *, overwrite: bool = False,
                  progress: Any = True, storage_options: dict | None = None, world_ids: str = "file",
                  shortest: bool = False, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES,
                  **create_kwargs: Any) -> ImportResult:
    """One archive at `out` from a folder of flygym `RecordedTrajectory` files (`.npz`, one per world).

    `folder`: every `*.npz` file in it (not in subfolders; other names are skipped; a link or other
    non-file named `*.npz` is refused, never followed), at most `max_files`, read in name order.
    `model`: the model they were recorded with: an MJCF path (e.g. written by flygym's
    `world.save_xml_with_assets`), a flygym world or `Simulation`, an MjSpec or a ModelBundle; its nq
    and mocap count must match every file's. The archive's timestep is the model's (a `Simulation`'s
    own), its `output_fps` and `playback_speed` the files' (which must agree).

    World IDs: each file's `world_id` (`world_ids="file"`, the default), which must differ between
    files; flygym's CPU `Simulation` saves 0 in every file, so several of those are refused unless
    `world_ids="order"`: the files numbered 0..N-1 in name order (`ImportResult.files` says which is
    which). Frames: every file must have the same frames at the same times (else SelectionError naming
    both files); `shortest=True` takes the first frames common to all. Values are stored in float64
    when a file holds float64 (flygym's CPU files: replay is bit-exact), else float32 (its Warp files),
    unless `dtype=` says otherwise; further keyword arguments go to `mjarchive.create` (`precision`,
    `chunk_frames`).

    Every file is untrusted: it is opened without following links, its members and their `.npy`
    headers (names, dtypes, shapes, sizes) are checked before anything is decompressed, at most
    `max_bytes` decoded bytes in all and `flygym_npz.MAX_FRAMES` frames a file; pickled arrays are never
    loaded. Any problem raises an
    MjArchiveError naming the file. Every file is checked before anything is written; then the frames
    are streamed in blocks of every world (bounded memory), each checked for finiteness. Nothing
    half-written is left: a local archive is written in a hidden sibling folder, verified, and renamed
    into place only when complete (with `overwrite=True`, replacing the archive there, unless another
    writer holds it; a folder that holds no archive, or holds `folder`, is never replaced); a killed
    import's hidden folder is deleted by the next import to the same place. A URL is written in place
    and deleted if the import fails.
    `progress`: True for a progress bar, a callable `progress(frames_done, frames_total)`, or False.
    """
    bundle, mj, timestep = _bundle(model)
    root = Path(folder)
    if not root.is_dir():
        raise MjArchiveError(f"{str(root)!r} is not a folder; pass the folder of flygym .npz files")
    _check_out(out, overwrite, storage_options)
    path, inside = local_path(out), Path(os.path.realpath(root))
    if path is not None and Path(os.path.realpath(path)) in (inside, *inside.parents):  # (an archive around it)
        raise ArchiveExistsError(f"{str(path)!r} holds the folder of .npz files being imported; write the archive "
                                 "elsewhere")
    trajs: list[Trajectory] = []
    try:
        with OutputDir(root, create=False) as src:
            budget, names = max_bytes, list_npz(src, max_files)
            reserve_files(len(names))
            for name in names:
                trajs.append(open_npz(src, name, mj.nq, mj.nmocap, budget))
                budget -= sum(m.nbytes for m in trajs[-1].members.values())
                if len(trajs) > 1:
                    check_against(trajs[0], trajs[-1], shortest)
        n = common_frames(trajs)
        ids = world_ids_of(trajs, world_ids)
        stored = "float64" if any(t.members["qpos"].dtype.itemsize == 8 for t in trajs) else "float32"
        settings = dict(world_ids=ids, timestep=create_kwargs.pop("timestep", None) or timestep, backend="flygym-npz",
                        output_fps=trajs[0].output_fps, playback_speed=trajs[0].playback_speed,
                        dtype=create_kwargs.pop("dtype", None) or stored, **create_kwargs)
        _publish(out, overwrite, storage_options, lambda target, created: _write(
            target, bundle, settings, trajs, n, mj.nmocap, progress, storage_options, created))
    finally:
        for t in trajs:
            t.close()
    return ImportResult(out, tuple(ids), tuple(t.name for t in trajs), n)


def _write(target: Any, bundle: ModelBundle, settings: dict, trajs: list[Trajectory], n: int, nmocap: int,
           progress: Any, storage_options: dict | None, created: list) -> None:
    """Stream every file's frames into a new archive at `target` (appending True to `created` once it
    exists), a block of frames of every world at a time, then verify it."""
    keys = ["qpos", *(("mocap_pos", "mocap_quat") if nmocap else ())]
    streams = {key: [Stream(t, key) for t in trajs] for key in keys}
    row = sum(math.prod(ss[0].row) * 8 for ss in streams.values()) * len(trajs)  # decoded bytes per frame
    block = max(1, min(n, BLOCK_BYTES // max(1, row)))
    update, close_bar = _progress(progress, n)
    try:
        with create(target, bundle, storage_options=storage_options, **settings) as writer:
            created.append(True)
            for lo in range(0, n, block):
                k = min(block, n - lo)
                values = {key: np.stack([s.read(k, lo) for s in ss], axis=1) for key, ss in streams.items()}
                writer.append(trajs[0].time[lo:lo + k], **values)
                update(lo + k)
    finally:
        close_bar()
        for ss in streams.values():
            for s in ss:
                s.fp.close()
    with open_archive(target, storage_options=storage_options) as archive:
        report = archive.verify()
    if not report.ok:
        raise MjArchiveError(f"the imported archive does not verify: {report}")


def _check_out(out: Any, overwrite: bool, storage_options: dict | None) -> None:
    """Refuse, before any work, an output that exists (without `overwrite`), is not a folder, or (even
    with `overwrite`) is a folder of other things than an archive."""
    path = local_path(out)
    if path is not None and (path.is_symlink() or path.exists() and not path.is_dir()):
        raise ArchiveExistsError(f"{str(path)!r} is a file or a link, not an archive's folder; remove it or choose "
                                 "another location")
    store = new_store(out, overwrite=overwrite, storage_options=storage_options)  # ArchiveExistsError
    if path is not None and path.exists() and not os.path.lexists(path / "zarr.json"):
        with os.scandir(path) as entries:
            if any(e.name != LEASE_GROUP for e in entries):
                raise ArchiveExistsError(f"{str(path)!r} is a folder that holds no archive; overwrite=True replaces "
                                         "only an archive: choose another location, or empty the folder first")
    if overwrite and (path is None or path.exists()):  # (its check would make a local folder)
        refuse_replacing_parts(out, store)  # as create(overwrite=True): parts have writers of their own


def _publish(out: Any, overwrite: bool, storage_options: dict | None, write: Callable[[Any, list], None]) -> None:
    """Run `write(target, created)` so that `out` holds only a complete archive: locally a hidden sibling
    folder, renamed into place when `write` returns (an archive at `out`, with `overwrite`, is replaced
    once its writer lease is ours); a URL is written in place and deleted if `write` fails after it
    created the archive (`created` not empty: what someone else made there meanwhile is kept)."""
    path = local_path(out)
    if path is None:
        created: list = []
        try:
            write(out, created)
        except BaseException:
            if created:
                try:
                    sync(make_store(out, read_only=False, storage_options=storage_options).delete_dir(""))
                except Exception:  # the import's own error is the one to see
                    pass
            raise
        return
    path = Path(os.path.abspath(path))  # "." has no name to put a sibling beside
    prefix = f".{path.name[:50]}.importing-"  # (cut: the folder's name stays within NAME_MAX)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep(path.parent, prefix)
    # Made here, never found: no one else's folder is written into; locked while the import runs.
    # (mkdir inside the try: a Ctrl-C or SIGTERM right after it still finds the folder to delete.)
    work, lock = path.parent / f"{prefix}{secrets.token_hex(6)}", None
    tmp = work / "archive"
    try:
        try:
            os.mkdir(work, 0o700)
        except FileExistsError:
            work = None  # not ours
            raise
        lock = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a file system without locks: the sweep cannot lock it either, and keeps it
            pass
        write(tmp, [])
        _check_out(out, overwrite, None)  # again: something may have appeared there meanwhile
        if not path.exists():
            try:
                os.rename(tmp, path)  # (an empty folder made there meanwhile is replaced; a full one refused)
                return
            except OSError as exc:  # another import got there first, after our check
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
                _check_out(out, overwrite, None)
        lease = acquire_lease(make_store(path, read_only=False), where=repr(str(path)), creating=True)
        aside = path.parent / f".{path.name[:50]}.replaced-{secrets.token_hex(6)}"
        try:
            os.mkdir(aside, 0o700)
            old = aside / "archive"
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(old, path)
                raise
        finally:
            lease.release()
            try:
                os.rmdir(aside)  # empty unless the old archive could not be put back: then it stays
            except OSError:
                pass
        shutil.rmtree(aside, ignore_errors=True)
    finally:
        if work is not None:
            _remove(work, failed=sys.exc_info()[0] is not None)
        if lock is not None:
            os.close(lock)


def _remove(folder: Path, failed: bool, seconds: float = 10.0) -> None:
    """Delete `folder` (the import's own temporary folder). After a failure or an interrupt, a write
    the import had started may still land there (zarr finishes a write on its own thread when the
    caller is interrupted): deleted again until it stays gone for a moment, for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        shutil.rmtree(folder, ignore_errors=True)
        if not failed and not os.path.lexists(folder):
            return
        time.sleep(0.25)
        if not os.path.lexists(folder) or time.monotonic() > deadline:
            return


def _sweep(parent: Path, prefix: str, limit: int = 100_000) -> None:
    """Delete the temporary folders of imports to the same output that were killed (SIGKILL, a crash):
    ours, as an import leaves them (nothing but its `archive`), untouched for STALE_S (a folder is locked
    just after it is made), and locked by no live import."""
    try:
        with os.scandir(parent) as entries:
            found = [e.name for e in itertools.islice(entries, limit) if e.name.startswith(prefix)]
    except OSError:
        return
    for name in found:
        try:
            fd = os.open(parent / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # not a folder, a link, gone
            continue
        try:
            st = os.fstat(fd)
            if (time.time() - st.st_mtime < STALE_S or st.st_uid != os.geteuid()
                    or not set(os.listdir(fd)) <= {"archive"}):
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(parent / name, ignore_errors=True)  # (rmtree never follows a link)
        except OSError:  # locked: an import is running
            pass
        finally:
            os.close(fd)
