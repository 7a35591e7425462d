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
synchronizes once per ``block_frames * (ring_buffers - 1)`` frames rather than per frame.
"""

from __future__ import annotations

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
                 block_frames: int, ring_buffers: int,
                 sink: Callable[[np.ndarray, dict[str, np.ndarray], np.ndarray], None]):
        self.device = data.qpos.device
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
        self._stream = wp.get_stream(self.device) if cuda else None
        self._sel_np = np.asarray(sel, dtype=np.intp)
        self._numpy_views: list[np.ndarray] | None = None
        self._launch_key: tuple | None = None
        self._launches: list[list[Any]] = []
        self._host_np = [h.numpy() for h in self._host]
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

    # -- per call --------------------------------------------------------------------------------
    def read_time(self, data: Any) -> float:
        """World 0's time: one scalar device→host copy (a synchronization point on CUDA)."""
        if self._time_host is None:
            self._time_host = wp.zeros(1, dtype=data.time.dtype, **self._host_kwargs)
        wp.copy(self._time_host, data.time, count=1, stream=self._stream)
        if self._stream is not None:
            wp.synchronize_stream(self._stream)
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
        wp.launch(kernel, dim=self.k, inputs=[mask, self._idx, self._acc], device=self.device)
        self._device_reset_used = True

    def gather(self, data: Any, time: float, host_reset: np.ndarray) -> None:
        """Gather one frame of the selected worlds into the ring; may hand a finished block to the sink."""
        slot, j = self._slot, self._fill
        key = tuple(getattr(data, attr).ptr for _n, attr, _s, _c, _w in self.fields)
        if key != self._launch_key:
            self._record_launches(data, key)
        if self._numpy_views is not None:
            out = self._host_np[slot][j]
            for src, (_n, _a, _s, col, width) in zip(self._numpy_views, self.fields):
                np.take(src, self._sel_np, axis=0, out=out[:, col:col + width], mode="clip")
        else:
            for cmd in self._launches[slot]:
                cmd.set_param_at_index(3, j)
                cmd.launch()
        # On CUDA the rows stay in the device block; _seal() copies the whole block to the host at once.
        self.bytes_copied += self.k * self.row * 4
        if self._device_reset_used:
            wp.launch(_take_reset, dim=self.k, inputs=[self._acc, self._dev_reset[slot], j], device=self.device)
        self._times[j] = time
        self._host_reset_rows[j] = host_reset
        self._fill += 1
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
        if self._dev is not self._host:  # one asynchronous device→pinned-host copy per block
            slot = self._slot
            wp.copy(self._host[slot], self._dev[slot], count=self._fill * self.k * self.row, stream=self._stream)
            if self._device_reset_used:
                wp.copy(self._host_reset[slot], self._dev_reset[slot], count=self._fill * self.k, stream=self._stream)
        event = wp.get_stream(self.device).record_event() if self.device.is_cuda else None
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
        self._sink(times, fields, reset)  # the writer copies before returning, so the slot is free

    def drain_all(self) -> None:
        """Seal the partial block and hand every pending block to the sink, oldest first."""
        drain_all(self)
