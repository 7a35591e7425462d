"""The MuJoCo Warp side of the recorder: gather selected worlds on the device, copy only their bytes.

Imported only when a mujoco_warp Data is recorded, so CPU-only code never imports Warp.

Per recorded frame, one small kernel per field writes the selected worlds' rows into a packed
device block ``(block_frames, k_sel, row)`` (row = nq + 3·nmocap + 4·nmocap + tracks, float32); when
the block fills, one asynchronous copy moves its ``frames × k_sel × row`` floats into the matching
pinned host block (on CUDA; on Warp's "cpu" device the kernel writes straight into the host block,
since device memory is host memory there). Kernel launches are recorded once and replayed (`wp.Launch`), which
keeps the per-frame Python cost low. A block is
handed to the writer (one `append` of ``block_frames`` frames) only when its ring slot is needed
again, after waiting on the event recorded when the block filled, so the training thread
synchronizes once per ``block_frames * (ring_buffers - 1)`` frames rather than per frame. On CUDA a
block's gathers, its copy and its event run on the stream current at the `record()` calls that filled
it (a later frame's stream first waits for an earlier one's), so recording inside `wp.ScopedStream` and
closing outside it loses nothing. `record()` refuses to run inside a graph capture.

Model variants (`WarpVariants`): at the first recorded frame and at each later frame where selected
worlds may have reset, a small kernel lists those that did into the ring slot (an atomic counter,
so only resetting worlds take room) and one kernel per declared Model field, one thread per
selected world, copies just their rows next to it; the count travels to the host with the block
and, when it is not zero, those rows follow once per block. A world that did not reset costs a
read of its flag: the cost is O(selected worlds + resetting worlds × field size) per frame, and
frames with only NumPy masks and no resets launch nothing.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import warp as wp

from .._errors import AppendError, BackendError
from .arrays import drain_all

__all__ = ["WarpGatherer"]

#: On Warp's "cpu" device, device arrays are host memory: gather with NumPy through zero-copy views
#: (a few µs) rather than a Warp CPU kernel (~100 µs per launch). Tests set this to exercise kernels.
CPU_NUMPY_GATHER = True


@wp.kernel(enable_backward=False)
def _gather_rows(src: wp.array2d(dtype=wp.float32), idx: wp.array(dtype=wp.int32),
                 dst: wp.array3d(dtype=wp.float32), frame: int, col0: int):
    i, j = wp.tid()
    dst[frame, i, col0 + j] = src[idx[i], j]


@wp.kernel(enable_backward=False)
def _accumulate_bool(mask: wp.array(dtype=wp.bool), idx: wp.array(dtype=wp.int32), acc: wp.array(dtype=wp.uint8)):
    i = wp.tid()
    if mask[idx[i]]:
        acc[i] = wp.uint8(1)


@wp.kernel(enable_backward=False)
def _accumulate_int(mask: wp.array(dtype=wp.int32), idx: wp.array(dtype=wp.int32), acc: wp.array(dtype=wp.uint8)):
    i = wp.tid()
    if mask[idx[i]] != 0:
        acc[i] = wp.uint8(1)


@wp.kernel(enable_backward=False)
def _take_reset(acc: wp.array(dtype=wp.uint8), dst: wp.array2d(dtype=wp.uint8), frame: int):
    i = wp.tid()
    dst[frame, i] = acc[i]
    acc[i] = wp.uint8(0)


@wp.kernel(enable_backward=False)
def _list_captures(acc: wp.array(dtype=wp.uint8), host: wp.array(dtype=wp.uint8), count: wp.array(dtype=wp.int32),
                   pos: wp.array(dtype=wp.int32), who: wp.array(dtype=wp.int32), frame: int, k: int):
    i = wp.tid()
    pos[i] = -1
    if acc[i] != wp.uint8(0) or host[i] != wp.uint8(0):
        p = wp.atomic_add(count, 0, 1)
        pos[i] = p
        who[p] = frame * k + i


@wp.kernel(enable_backward=False)
def _capture_rows(src: wp.array2d(dtype=Any), idx: wp.array(dtype=wp.int32), pos: wp.array(dtype=wp.int32),
                  dst: wp.array2d(dtype=Any)):
    # One thread per selected world: a world that did not reset costs one read, one that did its row.
    i = wp.tid()
    p = pos[i]
    if p >= 0:
        r = idx[i]
        for e in range(dst.shape[1]):
            dst[p, e] = src[r, e]


def refuse_capture(device: Any) -> None:
    """AppendError while `device` captures a graph (CUDA, or Warp's CPU capture): whatever the recorder
    launched or allocated would only happen at the graph's replays, long after its bookkeeping."""
    if device.is_capturing:
        raise AppendError(
            "record() cannot run inside a graph capture (wp.ScopedCapture): its copies and bookkeeping happen "
            "at the call, not at each replay of the graph; call it between replays, outside the capture"
        )


def _rows(array: Any, nworld: int, name: str) -> Any:
    """A zero-copy (nworld, row) float32 view of a per-world Data field (vec3/quat rows flattened)."""
    if array.shape[0] != nworld or not array.is_contiguous:
        raise BackendError(f"Data.{name} is not a contiguous per-world array of {nworld} worlds")
    if getattr(array.dtype, "_wp_scalar_type_", array.dtype) is not wp.float32:
        raise AppendError(f"Data.{name} has dtype {array.dtype.__name__}; only float32 fields can be recorded")
    flat = array.view(wp.float32) if array.dtype is not wp.float32 else array
    return flat.reshape((nworld, -1)) if flat.ndim != 2 else flat


class WarpGatherer:
    """Device-side gather, ring of pinned host blocks, amortized synchronization (see module doc)."""

    def __init__(self, data: Any, sel: np.ndarray, *, nq: int, nmocap: int, tracks: dict[str, tuple[int, ...]],
                 block_frames: int, ring_buffers: int, sink: Callable[..., None],
                 variant_model: Any = None, variant_shapes: dict[str, tuple[int, ...]] | None = None):
        self.device = data.qpos.device
        refuse_capture(self.device)  # before anything is allocated
        self.nworld = int(data.nworld)
        self.k = len(sel)
        self.block = block_frames
        self._sink = sink
        cuda = self.device.is_cuda
        # (name, Data field, host shape per world, column offset, width)
        self.fields: list[tuple[str, str, tuple[int, ...], int, int]] = []
        col = 0
        specs = [("qpos", "qpos", (nq,))]
        if nmocap:
            specs += [("mocap_pos", "mocap_pos", (nmocap, 3)), ("mocap_quat", "mocap_quat", (nmocap, 4))]
        specs += [(name, name, shape) for name, shape in tracks.items()]
        for name, attr, shape in specs:
            if not hasattr(data, attr):
                raise AppendError(f"mujoco_warp Data has no field {attr!r}; drop it from tracks")
            rows = _rows(getattr(data, attr), self.nworld, attr)
            width = int(np.prod(shape))
            if rows.shape[1] != width:
                raise AppendError(f"Data.{attr} has {rows.shape[1]} values per world; the model says {width}")
            self.fields.append((name, attr, shape, col, width))
            col += width
        self.row = col
        shape = (block_frames, self.k, self.row)
        host = dict(device="cpu", pinned=cuda)
        self._host = [wp.zeros(shape, dtype=wp.float32, **host) for _ in range(ring_buffers)]
        self._host_reset = [wp.zeros((block_frames, self.k), dtype=wp.uint8, **host) for _ in range(ring_buffers)]
        with wp.ScopedDevice(self.device):
            self._idx = wp.array(np.asarray(sel, dtype=np.int32), dtype=wp.int32)
            self._acc = wp.zeros(self.k, dtype=wp.uint8)
            if cuda:
                self._dev = [wp.zeros(shape, dtype=wp.float32) for _ in range(ring_buffers)]
                self._dev_reset = [wp.zeros((block_frames, self.k), dtype=wp.uint8) for _ in range(ring_buffers)]
            else:  # device memory is host memory: gather straight into the host blocks
                self._dev, self._dev_reset = self._host, self._host_reset
        self._block_stream: Any = None  # CUDA: the stream of the recorder's latest work (see _follow_stream)
        self._host_np = [h.numpy() for h in self._host]
        self._sel_np = np.asarray(sel, dtype=np.intp)
        self._numpy_views: list[np.ndarray] | None = None
        # Each frame row's column slice per field, made once (slicing costs about 0.3 µs per call).
        self._numpy_outs = [[[h[j][:, col:col + width] for _n, _a, _s, col, width in self.fields]
                             for j in range(block_frames)] for h in self._host_np] if not cuda else None
        attrs = [attr for _n, attr, _s, _c, _w in self.fields]
        get = operator.attrgetter(*attrs)
        self._fields_of = (lambda d: (get(d),)) if len(attrs) == 1 else get
        self._time_view: tuple[Any, np.ndarray] | None = None
        self._launch_key: tuple | None = None
        self._launches: list[list[Any]] = []
        self._host_reset_np = [h.numpy() for h in self._host_reset]
        self._time_host: Any = None
        self._host_kwargs = host
        self._ring = ring_buffers
        self._slot = 0
        self._fill = 0
        self._times = np.zeros(block_frames, np.float64)
        self._host_reset_rows = np.zeros((block_frames, self.k), bool)
        self._device_reset_used = False
        self._pending: deque = deque()  # (slot, event or None, times, host resets, device resets used, n)
        self.bytes_copied = 0
        self._variants = None if variant_model is None or not variant_shapes else WarpVariants(
            variant_model, variant_shapes, sel, self.nworld, self.device, block_frames, ring_buffers)
        missing = [] if self._variants is None else self._variants.missing
        #: A warning for the recorder to give when declared variant fields cannot be captured, else "".
        self.variants_missing = "" if not missing else (
            f"the mujoco_warp Model has no {', '.join(missing)}, so the recorder cannot capture "
            f"{'it' if len(missing) == 1 else 'them'}; record the values with rec.set_variant(world_ids, "
            f"{missing[0]}=...)")
        if self._variants is not None and not self._variants.shapes:
            self._variants = None  # nothing to capture

    # -- per call: what launches or copies refuses a graph capture first; a call that does neither (a
    # frame not due, its time given) costs nothing more ----------------------------------------------
    def read_time(self, data: Any) -> float:
        """World 0's time: one scalar device→host copy (a synchronization point on CUDA)."""
        if not self.device.is_cuda:  # host memory: read through a zero-copy view, kept per array
            times = data.time
            if self._time_view is None or self._time_view[0] is not times:
                self._time_view = (times, times.numpy())
            return float(self._time_view[1][0])
        refuse_capture(self.device)
        if self._time_host is None:
            self._time_host = wp.zeros(1, dtype=data.time.dtype, **self._host_kwargs)
        stream = self.device.stream  # the simulation's, whose kernels wrote the time
        wp.copy(self._time_host, data.time, count=1, stream=stream)
        wp.synchronize_stream(stream)
        return float(self._time_host.numpy()[0])

    def accumulate_reset(self, mask: Any) -> None:
        """OR a Warp (nworld,) bool/int32 mask into the per-selected-world accumulator, on the device."""
        if mask.shape != (self.nworld,):
            raise AppendError(f"reset must have shape ({self.nworld},), got {mask.shape}")
        if mask.dtype is wp.bool:
            kernel = _accumulate_bool
        elif mask.dtype is wp.int32:
            kernel = _accumulate_int
        else:
            raise AppendError(f"a Warp reset mask must be bool or int32, got {mask.dtype.__name__}")
        if mask.device != self.device:
            raise AppendError(f"reset mask is on {mask.device}, the Data on {self.device}")
        refuse_capture(self.device)
        if self.device.is_cuda:
            self._follow_stream()  # ordered with the frames' uses of the accumulator
        wp.launch(kernel, dim=self.k, inputs=[mask, self._idx, self._acc], device=self.device)
        self._device_reset_used = True

    def gather(self, data: Any, time: float, host_reset: np.ndarray) -> None:
        """Gather one frame of the selected worlds into the ring (`seal_if_full` then moves a full block on)."""
        slot, j = self._slot, self._fill
        refuse_capture(self.device)  # before anything is launched or counted (a refused frame costs only itself)
        if self.device.is_cuda:
            self._follow_stream()
        key = self._fields_of(data)  # the field arrays themselves: the same objects keep their memory
        if key != self._launch_key:  # identity comparisons (Warp arrays define no __eq__)
            self._record_launches(data, key)
        if self._numpy_views is not None:
            idx = self._sel_np
            for src, out in zip(self._numpy_views, self._numpy_outs[slot][j]):
                src.take(idx, 0, out, "clip")  # the method: np.take's Python wrapper costs more than the copy
        else:
            for cmd in self._launches[slot]:
                cmd.set_param_at_index(3, j)
                cmd.launch()
        # On CUDA the rows stay in the device block; _seal() copies the whole block to the host at once.
        self.bytes_copied += self.k * self.row * 4
        if self._variants is not None:  # before _take_reset clears the accumulator it reads
            self._variants.capture(slot, j, host_reset, self._acc if self._device_reset_used else None)
        if self._device_reset_used:
            wp.launch(_take_reset, dim=self.k, inputs=[self._acc, self._dev_reset[slot], j], device=self.device)
        self._times[j] = time
        self._host_reset_rows[j] = host_reset
        self._fill += 1

    def _follow_stream(self) -> None:
        """CUDA: the recorder's work goes on the stream current now; if its previous work (a gather, a
        reset accumulated, this block's or the last one's) ran on another, this one waits for it first,
        so a block's copy and event (on its last frame's stream) cover every frame, and the device scratch
        shared by all frames (reset accumulator, capture positions, mask) is used in call order."""
        current = self.device.stream
        if self._block_stream is not None and current is not self._block_stream:
            current.wait_stream(self._block_stream)
        self._block_stream = current

    def seal_if_full(self) -> None:
        """After a gather: a full block starts its copy; may hand the oldest block to the sink."""
        if self._fill == self.block:
            self._seal()

    def _record_launches(self, data: Any, key: tuple) -> None:
        """One recorded gather launch per (ring slot, field); replayed with the frame row set."""
        if not self.device.is_cuda and CPU_NUMPY_GATHER:
            self._numpy_views = [_rows(getattr(data, attr), self.nworld, attr).numpy()
                                 for _n, attr, _s, _c, _w in self.fields]
            self._launch_key = key
            return
        self._launches = [
            [wp.launch(_gather_rows, dim=(self.k, width), device=self.device, record_cmd=True,
                       inputs=[_rows(getattr(data, attr), self.nworld, attr), self._idx, self._dev[slot], 0, col])
             for _name, attr, _shape, col, width in self.fields]
            for slot in range(self._ring)
        ]
        self._launch_key = key

    # -- ring management ---------------------------------------------------------------------------
    def _seal(self) -> None:
        """Close the current block: record its completion event, move to the next free slot."""
        if not self._fill:
            return
        event = None
        if self._dev is not self._host:  # one asynchronous device→pinned-host copy per block
            slot, stream = self._slot, self._block_stream
            wp.copy(self._host[slot], self._dev[slot], count=self._fill * self.k * self.row, stream=stream)
            if self._device_reset_used:
                wp.copy(self._host_reset[slot], self._dev_reset[slot], count=self._fill * self.k, stream=stream)
            if self._variants is not None:
                self._variants.seal(slot, stream)
            event = stream.record_event()
        self._pending.append((self._slot, event, self._times[: self._fill].copy(),
                              self._host_reset_rows[: self._fill].copy(), self._device_reset_used, self._fill))
        self._slot = (self._slot + 1) % self._ring
        self._fill = 0
        if len(self._pending) >= self._ring:
            self._drain_one()

    def _drain_one(self) -> None:
        slot, event, times, host_reset, device_reset, n = self._pending.popleft()
        if event is not None:
            wp.synchronize_event(event)
        block = self._host_np[slot][:n]
        fields = {name: block[:, :, col:col + width].reshape(n, self.k, *shape)
                  for name, _attr, shape, col, width in self.fields}
        reset = host_reset
        if device_reset:
            reset = reset | self._host_reset_np[slot][:n].astype(bool)
            self._host_reset_np[slot][:n] = 0
        captured = () if self._variants is None else self._variants.collect(slot)
        self._sink(times, fields, reset, captured)  # the writer copies before returning, so the slot is free

    def drain_all(self) -> None:
        """Seal the partial block and hand every pending block to the sink, oldest first."""
        drain_all(self)


class WarpVariants:
    """Rows of declared mujoco_warp Model fields for selected worlds, captured on the device.

    A Model field's leading dimension ``n`` (1 when it has none, as ``site_size``) holds the rows
    world ``w`` uses at ``w % n``, as mujoco_warp indexes them: ``nworld`` rows are per world, one is
    shared. Declared fields the Model lacks (``site_rgba``) are not captured (`missing` names them:
    the recorder warns, and `Recorder.set_variant` records them). Fields are looked up on the Model
    at every capture, so a field replaced by a batched array (``m.geom_rgba = wp.array(...)``) is
    followed.
    """

    def __init__(self, model: Any, shapes: dict[str, tuple[int, ...]], sel: np.ndarray, nworld: int, device: Any,
                 block_frames: int, ring_buffers: int):
        self.model = model
        self.shapes = {n: s for n, s in shapes.items() if getattr(model, n, None) is not None}
        self.missing = [n for n in shapes if n not in self.shapes]
        self.nworld, self.k = nworld, len(sel)
        self.device = device
        self.rows_captured = 0  # world rows captured so far (each: every captured field of one world)
        self._sel = np.asarray(sel, np.intp)
        self._first = True
        self._numpy = not device.is_cuda and CPU_NUMPY_GATHER
        self._events: list[list] = [[] for _ in range(ring_buffers)]  # NumPy path: (j, positions, values)
        sources = {n: self._source(n) for n in self.shapes}
        if self._numpy:
            return
        cap, cuda = block_frames * self.k, device.is_cuda
        with wp.ScopedDevice(device):
            self._idx = {nworld: wp.array(self._sel.astype(np.int32), dtype=wp.int32)}  # rows by leading dim
            self._pos = wp.zeros(self.k, dtype=wp.int32)
            self._mask = wp.zeros(self.k, dtype=wp.uint8)
            self._no_acc = wp.zeros(self.k, dtype=wp.uint8)
            self._count = [wp.zeros(1, dtype=wp.int32) for _ in range(ring_buffers)]
            self._who = [wp.zeros(cap, dtype=wp.int32) for _ in range(ring_buffers)]
            self._dev = [{n: wp.zeros((cap, a.shape[1]), dtype=a.dtype) for n, a in sources.items()}
                         for _ in range(ring_buffers)]
        host = dict(device="cpu", pinned=True)
        if cuda:
            self._mask_host = [wp.zeros((block_frames, self.k), dtype=wp.uint8, **host) for _ in range(ring_buffers)]
            self._count_host = [wp.zeros(1, dtype=wp.int32, **host) for _ in range(ring_buffers)]
            self._who_host = [wp.zeros(cap, dtype=wp.int32, **host) for _ in range(ring_buffers)]
            self._host = [{n: wp.zeros(a.shape, dtype=a.dtype, **host) for n, a in dev.items()} for dev in self._dev]
            # The rows of a drained slot are complete (its block's event passed): copying them on a
            # stream of their own waits for nothing the simulation queued since.
            self._copy_stream = wp.Stream(device)
            self._zero_count = wp.zeros(1, dtype=wp.int32, device=device)
        else:  # device memory is host memory
            self._count_host, self._who_host, self._host = self._count, self._who, self._dev
        self._mask_set = False
        self._launches: list[tuple[tuple, Any, list]] = [((), None, [])] * ring_buffers

    def _source(self, name: str) -> Any:
        """The field as a (n, count) array of its own dtype; world w uses row w % n."""
        a = getattr(self.model, name)
        count, tail = self.shapes[name][0], self.shapes[name][1:]
        if a.ndim == 1 and a.is_contiguous:
            a = a.reshape((1, a.shape[0]))
        if (a.ndim != 2 or a.shape[0] < 1 or a.shape[1] != count
                or getattr(a.dtype, "_length_", 1) != max(1, int(np.prod(tail)))):
            raise BackendError(f"Model.{name} has shape {a.shape} of {a.dtype.__name__}; a variant field must be "
                               f"(rows, {count}) of {tail or 'scalar'} elements (rows: nworld={self.nworld}, 1, or "
                               f"any n, world w using row w % n), as put_model makes it (batch it with "
                               f"m.{name} = wp.array(values, dtype=...))")
        if a.device != self.device:
            raise BackendError(f"Model.{name} is on {a.device}, the Data on {self.device}; keep them on one device")
        return a

    def _rows_of(self, n: int) -> Any:
        """The device index array of the selected worlds' rows in a field of leading dimension n."""
        if n not in self._idx:
            self._idx[n] = wp.array((self._sel % n).astype(np.int32), dtype=wp.int32, device=self.device)
        return self._idx[n]

    def capture(self, slot: int, j: int, host_reset: np.ndarray, acc: Any) -> None:
        """At frame j of ring slot `slot`: capture the worlds reset since the last frame (`host_reset`
        from NumPy masks, `acc` the device accumulator or None), every world at the first frame."""
        first = self._first  # cleared only once a capture went through: a refused frame is not the first
        if self._numpy:
            mask = np.ones(self.k, bool) if first else host_reset.copy()
            if acc is not None:
                mask |= acc.numpy().astype(bool)  # zero-copy on the "cpu" device
            pos = np.flatnonzero(mask)
            if pos.size:
                values = {}
                for name, shape in self.shapes.items():
                    src = self._source(name)
                    values[name] = src.numpy()[self._sel[pos] % src.shape[0]].reshape(pos.size, *shape)
                self._events[slot].append((j, pos, values))
            self.rows_captured += pos.size
            self._first = False
            return
        mask = np.ones(self.k, np.uint8) if first else host_reset.astype(np.uint8)
        any_host = first or bool(host_reset.any())
        if acc is None and not any_host:
            return
        if any_host or self._mask_set:  # the device mask is left zero between host resets
            if self.device.is_cuda:  # staged in the slot's pinned memory, which outlives the copy
                self._mask_host[slot].numpy()[j] = mask
                wp.copy(self._mask, self._mask_host[slot], src_offset=j * self.k, count=self.k,
                        stream=self.device.stream)
            else:
                self._mask.numpy()[:] = mask
            self._mask_set = any_host
        mark, rows = self._recorded(slot, acc)
        mark.set_param_at_index(5, j)
        mark.launch()
        for cmd in rows:
            cmd.launch()
        self._first = False

    def _recorded(self, slot: int, acc: Any) -> tuple[Any, list]:
        """The slot's launches, recorded once per set of field arrays (replayed: little Python per frame)."""
        key = (acc is None, *((a.ptr, a.shape, a.strides) for a in (getattr(self.model, n) for n in self.shapes)))
        if self._launches[slot][0] == key:
            return self._launches[slot][1:]
        mark = wp.launch(_list_captures, dim=self.k, device=self.device, record_cmd=True,
                         inputs=[self._no_acc if acc is None else acc, self._mask, self._count[slot], self._pos,
                                 self._who[slot], 0, self.k])
        rows = []
        for name in self.shapes:
            src = self._source(name)
            dst = self._dev[slot][name]
            if src.dtype is not dst.dtype:
                raise BackendError(f"Model.{name} changed dtype to {src.dtype.__name__} during the run; keep "
                                   f"{dst.dtype.__name__}")
            rows.append(wp.launch(_capture_rows, dim=self.k, device=self.device, record_cmd=True,
                                  inputs=[src, self._rows_of(src.shape[0]), self._pos, dst]))
        self._launches[slot] = (key, mark, rows)
        return mark, rows

    def seal(self, slot: int, stream: Any) -> None:
        """CUDA: queue the slot's capture count behind its block, on its `stream` (read after its event)."""
        if not self._numpy:
            wp.copy(self._count_host[slot], self._count[slot], stream=stream)

    def collect(self, slot: int) -> list[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
        """The slot's captures, after its block's event: (frame j in block, selection positions, values)."""
        if self._numpy:
            events, self._events[slot] = self._events[slot], []
            return events
        n = int(self._count_host[slot].numpy()[0])
        if not n:
            return []
        self.rows_captured += n
        if self.device.is_cuda:  # only the n captured rows cross
            stream = self._copy_stream
            wp.copy(self._who_host[slot], self._who[slot], count=n, stream=stream)
            for name, dev in self._dev[slot].items():
                wp.copy(self._host[slot][name].flatten(), dev.flatten(), count=n * dev.shape[1], stream=stream)
            wp.copy(self._count[slot], self._zero_count, stream=stream)  # done before any later capture
            wp.synchronize_stream(stream)
        else:
            self._count[slot].zero_()
        who = self._who_host[slot].numpy()[:n]
        order = np.argsort(who, kind="stable")
        who = who[order]
        frames, positions = who // self.k, who % self.k
        values = {name: self._host[slot][name].numpy()[:n][order].reshape(n, *shape)
                  for name, shape in self.shapes.items()}
        events = []
        for j in np.unique(frames).tolist():
            at = frames == j
            events.append((j, positions[at], {name: v[at] for name, v in values.items()}))
        return events
