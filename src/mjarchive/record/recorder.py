"""Live recorders: MuJoCo (CPU) and MuJoCo Warp data in, frames at the replay cadence out.

The cadence rule, on the integer step grid (so nothing drifts however long the run):

* The recorder keeps a monotonic step clock ``n``. At the first call ``n = round(t / timestep)``
  where ``t`` is the batch time (the time of world 0 of the data, or the ``time=`` argument).
  At each later call with step index ``m = round(t / timestep)``, ``n`` advances by ``m - m_prev``
  or, when the time went backwards (world 0 was reset), by ``m`` (its steps since the reset).
* ``r = playback_speed / (output_fps * timestep)`` steps per frame, as an exact fraction
  (denominator at most 10**6, so e.g. 1/(30 * 0.002) is exactly 50/3).
* Frame ``k`` is due at step ``n0 + ceil(k * r)`` (``n0``: the clock at the first call, so the
  first call always records). A call records when its clock has reached the next due step; the
  next due step is then the first ``n0 + ceil(k * r)`` strictly after the current clock, so a
  caller that skips several render points gets one frame, never duplicates.
* The stored time of a frame is ``n * timestep`` (float64).

MuJoCo Warp keeps ``Data.time`` per world in float32 and accumulates it by ``+= timestep``; after
minutes of simulated time without a reset, that clock itself drifts from ``steps * timestep`` by
whole steps. The recorder follows the simulator's clock; pass ``record(d, time=steps * timestep)``
from a host-side step counter for an exact grid (this also avoids the per-call device read).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import mujoco
import numpy as np

from .._errors import AppendError, BackendError, ClosedError, MjArchiveError
from ..archive.writer import ArchiveWriter, as_bundle, create
from .arrays import ArrayGatherer, MjDataGatherer, is_mjx_data, library_of, on_host, refuse_traced
from .block_sink import BlockSink
from .cadence import Cadence
from .overlay_frames import select_overlays
from . import rollout
from .recorder_args import (WarpFields, as_indices, check_first_shapes, match_writer, ordered_fields, scalar_time,
                            track_specs)
from .variants_capture import RecorderVariants, sim_model_kind

__all__ = ["Recorder"]


def _is_warp_data(data: Any) -> bool:
    return type(data).__module__.startswith("mujoco_warp")


class Recorder:
    """Record a running simulation into an archive at the replay cadence.

    `path_or_writer` is a location (a new archive is created on the first `record()` call, when the
    number of worlds is known, or at once when `n_worlds` is given) or an open `ArchiveWriter`
    (then `model` may be None, `worlds` are the batch indices feeding the writer's worlds in order,
    by default its world IDs, and `close()` flushes the writer without closing it). `model` is what
    `mjarchive.create` accepts. `worlds` are indices into the simulated batch (default: all); they
    are stored as the archive's world IDs. `tracks` names further Data fields to keep (e.g.
    `("qvel", "ctrl", "sensordata")`); their per-world shapes come from the model. A mapping also
    declares tracks that are no Data field, recorded from arrays: `{"qvel": None, "reward": ()}`
    (None: the Data field's shape; else a shape or `(shape, dtype)`). Further keyword arguments go
    to `mjarchive.create` (chunk_frames, precision, overwrite, backend, `variant_fields`,
    `overlays`, ...).

    Model variants (domain randomization): with `variant_fields=("geom_rgba", ...)` and `sim_model`
    (the simulator's model: a mujoco_warp Model, or a list of one MjModel per simulated world), the
    recorder reads the selected worlds' values of those fields at the first recorded frame and, at
    every later recorded frame, those of the worlds reset since the previous one (the `reset`
    masks, also of calls that recorded nothing), and records them as variant events from that
    frame on; values equal to the world's last recorded ones are not written again. A Warp Model
    field of leading dimension n gives world w row w % n (as mujoco_warp reads it); rows of
    resetting worlds only are gathered on the device. Timing assumption: the values in force for a
    frame are the model's when `record()` is called for it, so randomize a world's model at its
    reset, before the `record(d, reset=...)` call whose state comes from it (and queued on the same
    stream on CUDA); changes made outside resets are not seen: record those with `set_variant`.

    Many processes, one archive: with `part="rank3"` (passed on to `mjarchive.create`) each process
    records its own part of one multi-part archive; `world_ids` are the IDs its recorded worlds are
    stored under (one per recorded world, in the order of `worlds`; default: the batch indices), e.g.
    `world_ids=rank * n_local + np.arange(n_local)` so that no two parts share a world.

    Overlays: `record(d, overlays={"target": ...})` adds debug primitives to a recorded frame
    (declared with `overlays={"target": mjarchive.Overlay.points()}`; see `mjarchive.Overlay`).

    Blocks: `block_frames` recorded frames are gathered into one block (on the data's device for Warp
    Data and device arrays) and handed to the writer together, which validates, casts and checks them
    for finiteness once per block. Such a refusal (a NaN, say) is therefore raised by the call that
    seals or hands the block over, or by `flush()`/`close()`, not by the call that gave the bad frame:
    its message names the archive frame and world, and says that it was detected when the block was
    checked (the block's other frames are kept). Refusals of a call's own arguments (shapes, types,
    fields that change size) are raised by that call. Default 16 frames on a GPU, 64 in host memory
    (MjData, Warp's "cpu" device, NumPy and CPU arrays; fewer when a block would pass 4 MiB).
    `ring_buffers` such buffers exist for Warp Data and arrays (pinned host memory on CUDA), so host
    memory for in-flight frames is `ring_buffers * block_frames * len(worlds) * row_bytes`; MjData
    needs one block, except with `variant_fields`: then each MjData frame is appended at its call,
    with the variant events read from the worlds' models for it.

    Example::

        with mjarchive.Recorder("run.mjarchive", "humanoid.xml", worlds=[3, 7]) as rec:
            for _ in range(n_steps):
                mjw.step(m, d)
                rec.record(d, reset=done)
    """

    def __init__(self, path_or_writer: Any, model: Any = None, *, worlds: Any = None, n_worlds: int | None = None,
                 output_fps: float = 30.0, playback_speed: float = 1.0, tracks: Sequence[str] | Mapping = (),
                 dtype: str = "float32", block_frames: int | None = None, ring_buffers: int = 3, sim_model: Any = None,
                 world_ids: Any = None, **create_kwargs: Any):
        if isinstance(tracks, str):
            tracks = (tracks,)
        self._tracks = tuple(tracks)
        self._track_args = dict(tracks) if isinstance(tracks, Mapping) else dict.fromkeys(tracks)
        self._worlds_arg = None if worlds is None else as_indices(worlds)
        # The IDs the recorded worlds are stored under (default: their batch indices), e.g. global IDs
        # when each rank of a multi-GPU run records its own part (create(part=...)) of one archive.
        self._world_ids_arg = None if world_ids is None else _id_list(world_ids)
        if self._world_ids_arg is not None and isinstance(path_or_writer, ArchiveWriter):
            raise MjArchiveError("world_ids= names the worlds of an archive the Recorder creates; a writer already "
                                 "has its world IDs")
        self._block_frames = None if block_frames is None else max(1, int(block_frames))
        self._ring_buffers = max(2, int(ring_buffers))
        self._closed = False
        self._gatherer: Any = None  # block gatherer (MjData, Warp Data or arrays), created on the first call
        self._last_data: Any = None  # the MjData, sequence of them or Warp Data of the last call, checked then
        self._mj_batch: Sequence[mujoco.MjData] | None = None  # its MjData (None: Warp Data)
        self._gatherer_fields: set[str] | None = None
        self._shapes: dict[str, tuple[int, ...]] | None = None
        self._nworld: int | None = None
        self._reset_acc: np.ndarray | None = None
        self.frames_recorded = 0
        self._rollout_bytes = 0
        self._rollout_signature: list | None = None  # the last rollout's array types, shapes and dtypes
        self._rollout_kind: tuple[str, int] | None = None  # its library and row bytes
        self._backend_unknown = False
        self._sim_kind = sim_model_kind(sim_model)
        declared = (path_or_writer.manifest.variants if isinstance(path_or_writer, ArchiveWriter)
                    else create_kwargs.get("variant_fields"))
        if self._sim_kind is not None and not declared:
            raise MjArchiveError("sim_model= only serves model variants: declare the fields that vary, e.g. "
                                 "variant_fields=('geom_rgba',)")
        self._sim_model = sim_model
        self._variants: RecorderVariants | None = None
        self._sink: BlockSink | None = None  # gatherer paths: hands their blocks to the writer
        if isinstance(path_or_writer, ArchiveWriter):
            self._writer: ArchiveWriter | None = path_or_writer
            self._owns_writer = False
            man = path_or_writer.manifest
            self._location = path_or_writer.location
            self._tracks, self._worlds_arg = match_writer(man, self._tracks, self._worlds_arg)
            self._nq, self._nmocap = man.layout.nq, man.layout.nmocap
            self._track_shapes = {t: man.tracks[t].shape for t in self._tracks}
            self._cadence = Cadence(man.output_fps or output_fps, man.playback_speed, man.timestep)
            if man.variants:  # its earlier events are unknown here: the first captured values are all written
                self._variants = RecorderVariants(sim_model, self._sim_kind, None)
            self._sink = BlockSink(path_or_writer, None if self._variants is None else self._variants.log)
        else:
            self._writer = None
            self._owns_writer = True
            self._backend = create_kwargs.pop("backend", None)
            self._location = path_or_writer
            self._bundle = as_bundle(model)
            mj_model = self._bundle.compile()
            self._nq, self._nmocap = mj_model.nq, mj_model.nmocap
            self._track_specs = track_specs(mj_model, self._track_args, dtype)
            self._track_shapes = {t: spec.shape for t, spec in self._track_specs.items()}
            timestep = create_kwargs.pop("timestep", None) or mj_model.opt.timestep
            self._create_kwargs = dict(create_kwargs, output_fps=output_fps, playback_speed=playback_speed,
                                       dtype=dtype, timestep=timestep)
            self._cadence = Cadence(output_fps, playback_speed, timestep)
            if create_kwargs.get("variant_fields"):  # the baseline is set when the archive is created
                self._variants = RecorderVariants(sim_model, self._sim_kind, mj_model, create_kwargs["variant_fields"])
            if n_worlds is not None:
                self._create(int(n_worlds), "unknown")
                self._backend_unknown = self._backend is None

    # -- public API ------------------------------------------------------------------------------
    @property
    def writer(self) -> ArchiveWriter | None:
        """The archive writer (None until the first `record()` call creates the archive)."""
        return self._writer

    @property
    def world_ids(self) -> tuple[int, ...] | None:
        return None if self._writer is None else self._writer.world_ids

    @property
    def row_bytes(self) -> int:
        """Host bytes of one world's state per frame: (nq + 7·nmocap + tracks) × itemsize (float32)."""
        row = self._nq + 7 * self._nmocap + sum(math.prod(s) for s in self._track_shapes.values())
        return row * 4

    @property
    def bytes_copied(self) -> int:
        """Warp and array paths: state bytes gathered and copied to the host so far (0 for MjData)."""
        return self._rollout_bytes + (0 if self._gatherer is None else self._gatherer.bytes_copied)

    def record(self, data: Any = None, *, reset: Any = None, time: Any = None, overlays: Mapping | None = None,
               **arrays: Any) -> bool:
        """Record a frame if the next render time point is reached; returns whether it recorded.

        `data`: an MjData (one world), a sequence of MjData (one per world), a mujoco_warp Data or an
        MJX Data batched over worlds (`jax.vmap`); or no `data` and the arrays themselves:
        `record(qpos=..., mocap_pos=..., mocap_quat=..., time=..., **tracks)`, each of shape
        (nworld, ...), as NumPy, JAX, torch (CPU or CUDA), CuPy or Warp arrays (one library per
        Recorder). The selected worlds are gathered on the arrays' device with their own library
        and only those rows are copied to the host (see `mjarchive.record.arrays`).

        `reset`: boolean mask over all worlds, shape (nworld,), NumPy or of the data's library;
        True marks worlds reset since the previous call (masks of calls that record nothing are
        accumulated). `time`: the batch's simulation time in seconds, required with arrays; default:
        world 0's `data.time` (on a device, reading it costs one small device→host copy per call;
        pass `time` from a host-side step counter to avoid that synchronization).

        `overlays`: this frame's debug primitives per declared overlay name (dropped when no frame is
        recorded): per world, an array (nworld, n, 3|6) or a list of nworld per-world values (see
        `mjarchive.Overlay`), indexed by `worlds`; values with one entry per recorded world, when
        `len(worlds) < nworld`, are taken as they are (in `worlds` order). Host data (NumPy, lists):
        device frames keep a copy until their block reaches the writer.
        """
        if data is self._last_data and data is not None and not arrays:  # the Data of the last call, checked then
            batch = self._mj_batch
            if batch is None:
                return self._record_warp_frame(data, reset, time, overlays)
            if len(batch) == self._nworld and isinstance(batch[0], mujoco.MjData):
                return self._record_mjdata(batch, reset, time, overlays)
        if self._closed:
            raise ClosedError("this Recorder is closed; create a new one (or append with mjarchive.open(path, 'a'))")
        if arrays or data is None or is_mjx_data(data):
            return self._record_arrays(data, arrays, reset, time, overlays)
        if _is_warp_data(data):
            return self._record_warp(data, reset, time, overlays)
        if isinstance(data, mujoco.MjData):
            batch: Sequence[mujoco.MjData] = (data,)
        elif isinstance(data, Sequence) and data and all(isinstance(d, mujoco.MjData) for d in data):
            batch = data
        else:
            hint = " (pass arrays by name: record(qpos=..., time=...))" if library_of(data) else ""
            raise AppendError(f"record() takes an MjData, a non-empty sequence of MjData, a mujoco_warp Data, "
                              f"an MJX Data or named arrays, got {type(data).__name__}{hint}")
        self._start(len(batch), "mujoco")
        if self._gatherer is None and self._variants is None:
            self._gatherer = MjDataGatherer(batch, self._sel, self._field_shapes(), block_frames=self._block(True),
                                            sink=self._sink.append_block)
        self._last_data, self._mj_batch = data, batch
        return self._record_mjdata(batch, reset, time, overlays)

    def _record_mjdata(self, batch: Sequence[mujoco.MjData], reset: Any, time: Any, overlays: Any) -> bool:
        if reset is not None:
            self._accumulate_reset(reset)
        t = float(batch[0].time if time is None else time)
        if self._gatherer is not None:  # blocks: one copy per field and frame here, the writer's checks per block
            return self._gather_if_due(batch, t, overlays)
        # Model variants: their values are read from each world's MjModel at the frame's call, and the
        # events reach the writer with it, so each frame is appended at once.
        if not self._cadence.advance(t):
            return False
        sel = [batch[int(i)] for i in self._sel]
        fields: dict[str, Any] = {"qpos": np.stack([d.qpos for d in sel])}
        if self._nmocap:
            fields["mocap_pos"] = np.stack([d.mocap_pos for d in sel])
            fields["mocap_quat"] = np.stack([d.mocap_quat for d in sel])
        for name, shape in self._track_shapes.items():
            if not hasattr(sel[0], name):
                raise AppendError(f"track {name!r} is not an MjData field; record it with the arrays: "
                                  f"record(qpos=..., {name}=..., time=...)")
            fields[name] = np.stack([np.reshape(getattr(d, name), shape) for d in sel])
        reset_sel = self._reset_acc[self._sel]
        self._reset_acc[:] = False
        if overlays:
            overlays = select_overlays(overlays, self._writer.manifest.overlays, self._sel, self._nworld, copy=False)
        refused = None
        if self._variants is not None:  # a refused event does not cost the frame: raised after it
            refused = self._variants.frame_events(self._writer, batch, self._sel, reset_sel, self.frames_recorded)
        self._writer.append(self._cadence.time, reset=reset_sel, overlays=overlays, **fields)
        self.frames_recorded += 1
        if refused is not None:
            raise refused
        return True

    def record_rollout(self, states: Any = None, *, time: Any = None, reset: Any = None, **arrays: Any) -> int:
        """Record a rollout of many steps at once (`jax.lax.scan`, Playground, MJX, Brax); returns
        the number of frames recorded.

        `states`: the stacked states, leading dimensions (steps, nworld): an MJX Data, or a State with
        `.data` (Playground) or `.pipeline_state` (Brax's MJX backend), whose `.done` is the reset mask
        unless `reset` is given (right behind an auto-reset wrapper, whose done worlds hold their reset
        state), with tracks it does not hold named (`record_rollout(states, reward=states.reward)`);
        or no `states` and the arrays by name: `record_rollout(qpos=(T, W, nq), time=...,
        reset=..., mocap_pos=..., mocap_quat=..., **tracks)`, NumPy, JAX, torch or CuPy (one library).

        The frames are the steps a `record()` call per step would keep (the same cadence, continued
        across calls, so a training loop can hand over one scanned chunk after another). `time`: each
        step's simulation time in seconds, (steps,) or (steps, nworld) (world 0's column is the
        clock); default `data.time`. `reset` (steps, nworld): True where a world's state at that step
        is the first of a new episode (e.g. Playground's auto-reset `done`); a frame starts an
        episode if its world reset at any step since the previous frame.

        Only the time column and the selected worlds' reset mask are read before the gather; then the
        frames' steps × the selected worlds of every field are gathered on the arrays' device by their
        library, one operation per 64 MiB of rows, and only those rows are copied to the host
        (`bytes_copied` grows by frames × worlds × a row's bytes in the arrays' own dtypes: `row_bytes`
        for float32) and handed to the writer, a block per such part. A frame the writer refuses (a NaN,
        say) is left out: the rollout's other frames are kept and the refusal is raised after them, as is
        one of a frame from earlier `record()` calls, handed over first. A gather that fails (out of
        device memory, say) raises an AppendError: in a rollout's first part it changes nothing, so the
        same call can be made again; in a later one it says which steps were recorded.
        """
        if self._closed:
            raise ClosedError("this Recorder is closed; create a new one (or append with mjarchive.open(path, 'a'))")
        if self._sim_kind is not None:
            raise BackendError("sim_model captures variants at record() calls, one step at a time; record a "
                               "rollout's variant values with rec.set_variant(world_ids, field=...)")
        shapes = self._field_shapes()
        arrays, time, reset, backend = rollout.rollout_arrays(states, arrays, time, reset, shapes)
        given = {**arrays, "time": time, "reset": reset}
        refuse_traced(given)  # a call inside the jitted rollout itself
        rollout.refuse_capture(given)  # before anything is copied (blocks of earlier record() calls too)
        if arrays.keys() != shapes.keys():
            arrays = ordered_fields(arrays, shapes)
        signature = [(type(a), tuple(getattr(a, "shape", ())), getattr(a, "dtype", None)) for a in arrays.values()]
        if signature != self._rollout_signature:  # checked once per kind of rollout
            library, steps, nworld = rollout.check_rollout(arrays, shapes)
            row_bytes = sum(rollout.row_itemsize(n, a) * math.prod(shapes[n]) for n, a in arrays.items())
            self._rollout_signature, self._rollout_kind = signature, (library, row_bytes)
        library, row_bytes = self._rollout_kind
        steps, nworld = signature[0][1][:2]
        if self._gatherer is not None and not isinstance(self._gatherer, ArrayGatherer):
            raise AppendError(f"this Recorder records {self._kind} data step by step; record rollouts with a "
                              "Recorder of their own")
        self._start(nworld, backend or library)
        times = rollout.step_times(time, steps)  # checked before any state changes
        mask = rollout.selected_resets(reset, steps, nworld, self._sel)
        refused = None  # a writer refusal: raised once every frame of the rollout is handed over
        if self._gatherer is not None:  # frames of earlier record() calls reach the writer first
            self._gatherer.take_device_resets(self._reset_acc)
            try:
                self._gatherer.drain_all()
            except AppendError as exc:
                refused = exc
        before = vars(self._cadence).copy(), self._reset_acc.copy()  # device resets taken in
        due, stamps = self._cadence.advance_many(times)
        pending = self._reset_acc[self._sel]
        rows, tail = rollout.frame_resets(mask, due, pending, len(self._sel))
        self._reset_acc[:] = False
        self._reset_acc[self._sel] = tail
        self._reset_pending = bool(tail.any())
        per_part = max(1, rollout.MAX_BLOCK_BYTES // max(1, len(self._sel) * row_bytes))
        for a in range(0, len(due), per_part):
            part = slice(a, a + per_part)
            try:
                fields = rollout.gather_rows(library, arrays, due[part], self._sel)
            except (RuntimeError, TypeError, ValueError, IndexError, MemoryError) as exc:  # out of device memory, say
                error = self._rollout_gather_failed(exc, a, due, rows, before, refused)
                if error is exc:
                    raise
                raise error from exc
            self._rollout_bytes += len(due[part]) * len(self._sel) * row_bytes
            self.frames_recorded += len(due[part])
            try:  # a refused frame (a NaN, say) costs neither its part's other frames nor later parts
                self._sink.append_block(stamps[part], fields, rows[part])
            except AppendError as exc:
                refused = refused or exc
        if refused is not None:
            raise refused
        return len(due)

    def _rollout_gather_failed(self, exc: Exception, done: int, due: np.ndarray, rows: np.ndarray, before: tuple,
                               refused: AppendError | None) -> AppendError:
        """The error for a rollout whose gather failed after `done` of its frames were handed over; with
        none handed over, the cadence and pending resets go back to what they were before the call;
        otherwise the resets of the frames not recorded start the next recorded frame's episodes."""
        earlier = f"; a frame before it was refused too: {refused}" if refused else ""
        hint = "if the device ran out of memory, hand over fewer steps per call"
        if done:
            self._reset_acc[self._sel] |= rows[done:].any(axis=0)
            self._reset_pending = bool(self._reset_acc.any())
            return AppendError(f"gathering the rollout's frames failed at its step {int(due[done])}: its {done} "
                               f"frames before that step were recorded, the {len(due) - done} from it on were not "
                               f"({exc}); {hint}{earlier}")
        vars(self._cadence).update(before[0])
        self._reset_acc[:] = before[1]
        self._reset_pending = bool(before[1].any())
        if isinstance(exc, AppendError) and not refused:
            return exc
        return AppendError(f"gathering the rollout's frames failed; nothing of it was recorded, so the same call can "
                           f"be made again ({exc}); {hint}{earlier}")

    def set_variant(self, world_ids: Any, frame: int | None = None, **fields: Any) -> None:
        """Record values of declared `variant_fields` for recorded worlds, in force from `frame` on.

        `world_ids`: world IDs as stored (the Recorder's `world_ids=`, else the batch indices in
        `worlds`), one or a sequence. `frame`: an archive frame index, default the next frame this recorder records.
        Each value has the field's per-world shape (e.g. (ngeom, 4) for geom_rgba: the same for all
        listed worlds) or (len(world_ids), *shape). Values are checked now (AppendError naming the
        field and world); events reach the writer with their frame.
        """
        if self._closed:
            raise ClosedError("this Recorder is closed")
        if self._variants is None:
            raise MjArchiveError("this archive declares no variant fields; create the Recorder with "
                                 "variant_fields=('geom_rgba', ...)")
        known = self.world_ids if self._writer is not None else (
            tuple(self._world_ids_arg) if self._world_ids_arg is not None else
            None if self._worlds_arg is None else tuple(self._worlds_arg.tolist()))
        appended = self.frames_recorded if self._gatherer is None else self._sink.appended
        self._variants.set_variant(self._writer, known, world_ids, frame, fields, appended=appended,
                                   recorded=self.frames_recorded)

    def flush(self) -> None:
        """Hand every recorded frame to the writer and commit it."""
        if self._closed:
            raise ClosedError("this Recorder is closed")
        if self._gatherer is not None:
            self._gatherer.drain_all()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Commit everything; closes the writer only if this recorder created it."""
        if self._closed:
            return
        try:
            if self._gatherer is not None:
                self._gatherer.drain_all()
            if self._variants is not None and self._writer is not None:  # events set for frames never recorded
                appended = self.frames_recorded if self._gatherer is None else self._sink.appended
                self._variants.log.emit(self._writer, appended, None)
        finally:
            self._closed = True
            self._last_data = None
            if self._writer is not None:
                if self._owns_writer:
                    self._writer.close()
                else:
                    self._writer.flush()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()  # a refusal of the last block is raised
            return
        try:
            self.close()
        except Exception as refusal:  # the body's exception goes on; this one is attached to it
            note = f"while closing the Recorder after it, {type(refusal).__name__}: {refusal}"
            exc.add_note(note)
            warnings.warn(f"mjarchive.Recorder: {note}", RuntimeWarning, stacklevel=2)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<mjarchive.Recorder {self._location!s} worlds={self.world_ids} frames={self.frames_recorded} {state}>"

    # -- internals ---------------------------------------------------------------------------------
    def _start(self, nworld: int, backend: str) -> None:
        """On the first call: fix the batch size, choose worlds, create the archive if needed."""
        if getattr(self, "_kind", backend) != backend:
            raise AppendError(f"this Recorder records {self._kind} data; use one Recorder per backend")
        self._kind = backend
        if self._nworld is None:
            if self._writer is None:
                self._create(nworld, backend)
            else:
                self._init_selection(nworld)
        if nworld != self._nworld:
            given = "n_worlds=" if self._backend_unknown else "earlier calls had "
            raise AppendError(f"record() got {nworld} worlds, but {given}{self._nworld}")
        if self._backend_unknown:  # created at construction (n_worlds=...) before any data was seen
            self._backend_unknown = False
            self._writer.set_backend(backend)

    def _block(self, host: bool) -> int:
        """Frames per block: as given, else 16 on a device (pinned memory) and 64 in host memory, where
        the writer's per-block work is what a frame costs beyond its copy (at most 4 MiB a block)."""
        if self._block_frames is not None:
            return self._block_frames
        if not host:
            return 16
        return max(16, min(64, (4 << 20) // max(1, len(self._sel) * self.row_bytes * 2)))

    def _init_selection(self, nworld: int) -> None:
        sel = np.arange(nworld) if self._worlds_arg is None else self._worlds_arg
        if sel.size and (sel.min() < 0 or sel.max() >= nworld):
            raise MjArchiveError(f"worlds={sel.tolist()} are out of range for a batch of {nworld} worlds")
        self._sel = sel
        self._nworld = nworld
        self._reset_acc = np.zeros(nworld, bool)
        self._reset_pending = False
        self._no_reset = np.zeros(len(sel), bool)

    def _create(self, nworld: int, backend: str) -> None:
        self._init_selection(nworld)
        ids = self._sel.tolist() if self._world_ids_arg is None else self._world_ids_arg
        if len(ids) != len(self._sel):
            raise MjArchiveError(f"world_ids= has {len(ids)} IDs for {len(self._sel)} recorded worlds; pass one ID "
                                 "per recorded world (in the order of worlds=)")
        self._writer = create(self._location, self._bundle, world_ids=ids,
                              backend=self._backend or backend,
                              tracks=self._track_specs, **self._create_kwargs)
        if self._variants is not None:
            self._variants.created(self._writer)
        self._sink = BlockSink(self._writer, None if self._variants is None else self._variants.log)

    def _accumulate_reset(self, reset: Any) -> None:
        if reset is None:
            return
        mask = np.asarray(reset)
        if mask.shape != (self._nworld,) or mask.dtype.kind not in "biu":
            raise AppendError(f"reset must be a boolean mask over all {self._nworld} worlds, shape "
                              f"({self._nworld},); got shape {mask.shape} dtype {mask.dtype}")
        if mask.any():  # a mask with no resets (every step of a vector env) changes nothing
            self._reset_acc |= mask if mask.dtype == bool else mask != 0
            self._reset_pending = True

    def _record_warp(self, data: Any, reset: Any, time: Any, overlays: Any = None,
                     backend: str = "mujoco_warp") -> bool:
        self._start(int(data.nworld), backend)
        if self._gatherer is None:
            from .warp import WarpGatherer

            if self._sim_kind == "models":
                raise BackendError("sim_model is a list of MjModel, but record() got Warp data; pass the "
                                   "mujoco_warp Model (sim_model=m) to capture variants on the device")
            captures = self._variants is not None and self._sim_kind == "warp"
            self._gatherer = WarpGatherer(data, self._sel, nq=self._nq, nmocap=self._nmocap,
                                          tracks=self._track_shapes,
                                          block_frames=self._block(not data.qpos.device.is_cuda),
                                          ring_buffers=self._ring_buffers, sink=self._sink.append_block,
                                          variant_model=self._sim_model if captures else None,
                                          variant_shapes=self._variants.shapes(self._writer) if captures else None)
            if self._gatherer.variants_missing:  # set_variant can record them: warned once, not refused
                warnings.warn(self._gatherer.variants_missing, stacklevel=3 if backend == "mujoco_warp" else 4)
        if backend == "mujoco_warp":
            self._last_data, self._mj_batch = data, None
        return self._record_warp_frame(data, reset, time, overlays)

    def _record_warp_frame(self, data: Any, reset: Any, time: Any, overlays: Any) -> bool:
        if reset is not None:
            if library_of(reset) == "warp":
                self._gatherer.accumulate_reset(reset)
            else:
                self._accumulate_reset(reset)
        t = self._gatherer.read_time(data) if time is None else scalar_time(time)
        return self._gather_if_due(data, t, overlays)

    def _record_arrays(self, data: Any, arrays: dict[str, Any], reset: Any, time: Any, overlays: Any) -> bool:
        """Named per-world arrays (or an MJX Data's fields): gathered on their device by their library."""
        backend = None
        if data is not None:
            if not is_mjx_data(data) or arrays:
                raise AppendError("pass either a Data object or named arrays (record(qpos=..., time=...)), not both")
            arrays = {name: getattr(data, name) for name in self._field_shapes() if hasattr(data, name)}
            time = data.time if time is None else time
            backend = "mjx"
        arrays = self._ordered_fields(arrays)
        if time is None:
            raise AppendError("pass time=... (the batch's simulation time in seconds, e.g. steps * timestep): "
                              "arrays carry no clock")
        gatherer = self._gatherer
        if gatherer is None or not isinstance(gatherer, ArrayGatherer):
            refuse_traced({**arrays, "reset": reset, "time": time})
            library = library_of(arrays["qpos"])
            if library is None:
                raise AppendError(f"qpos is a {type(arrays['qpos']).__module__}.{type(arrays['qpos']).__name__}; "
                                  "record() takes NumPy, JAX, torch, CuPy or Warp arrays")
            if library == "warp":  # Warp arrays go through the mujoco_warp gatherer (kernels, pinned ring)
                return self._record_warp(WarpFields(arrays), reset, time, overlays, backend or "warp")
            if self._sim_kind is not None:
                raise BackendError(f"sim_model captures variants from MjData or mujoco_warp Data, not {library} "
                                   "arrays; record the values with rec.set_variant(world_ids, field=...)")
            if gatherer is not None:  # a Warp gatherer: _start names the mismatch
                self._start(self._nworld, backend or library)
            self._start(check_first_shapes(arrays, self._field_shapes()), backend or library)
            gatherer = self._gatherer = ArrayGatherer(
                library, arrays, self._sel, block_frames=self._block(on_host(library, arrays)),
                ring_buffers=self._ring_buffers,
                sink=self._sink.append_block)
            self._gatherer_fields = set(arrays)
        elif (backend or gatherer.library) != self._kind:
            self._start(self._nworld, backend or gatherer.library)  # raises: one kind of data per Recorder
        gatherer.check(arrays)
        if reset is not None:
            if gatherer.library != "numpy" and library_of(reset) == gatherer.library:
                gatherer.accumulate_reset(reset)
            else:
                self._accumulate_reset(reset)
        return self._gather_if_due(arrays, scalar_time(time), overlays)

    def _gather_if_due(self, source: Any, t: float, overlays: Any) -> bool:
        if not self._cadence.advance(t):
            return False
        seq = self.frames_recorded
        if overlays:
            self._sink.keep_overlays(overlays, self._sel, self._nworld, seq)
        host_reset = self._reset_acc[self._sel] if self._reset_pending else self._no_reset
        try:
            self._gatherer.gather(source, self._cadence.time, host_reset)
        except BaseException:  # a refused frame costs only itself: its overlays go, pending resets stay
            self._sink.drop_overlays(seq)
            raise
        if self._reset_pending:
            self._reset_acc[:] = False
            self._reset_pending = False
        self.frames_recorded += 1
        self._gatherer.seal_if_full()  # a full block moves on; a refusal of an earlier frame is raised here
        return True

    def _field_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every field a frame needs and its per-world shape, in storage order."""
        if self._shapes is None:
            self._shapes = {"qpos": (self._nq,)}
            if self._nmocap:
                self._shapes.update(mocap_pos=(self._nmocap, 3), mocap_quat=(self._nmocap, 4))
            self._shapes.update(self._track_shapes)
        return self._shapes

    def _ordered_fields(self, arrays: dict[str, Any]) -> dict[str, Any]:
        if arrays.keys() == self._gatherer_fields:
            return arrays  # the gatherer checks types, shapes and dtypes
        return ordered_fields(arrays, self._field_shapes())


def _id_list(world_ids: Any) -> list[int]:
    """`world_ids=` as a list of ints: a 1-D sequence of integers, nothing rounded or flattened."""
    ids = np.asarray(world_ids)
    if ids.ndim != 1 or not ids.size or ids.dtype.kind not in "iu":
        raise MjArchiveError(f"world_ids must be a non-empty 1-D sequence of integers (one per recorded world), got "
                             f"{world_ids!r:.80}")
    return ids.tolist()
