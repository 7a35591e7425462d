"""Recording from per-world arrays of any library: NumPy, JAX (and MJX ``Data``), torch, CuPy.

`Recorder.record(qpos=..., mocap_pos=..., **tracks)` hands arrays with a leading world dimension
here. The selected worlds are gathered **on the array's own device, with the array's own library**,
into a ring of blocks of ``block_frames`` frames, so only ``frames × selected worlds × row`` values
ever cross to the host:

* NumPy and torch on the CPU gather straight into the host block (``np.take``/``index_select``
  with ``out=``): one copy of the selected rows, nothing else.
* torch on CUDA and CuPy gather into a device block; when it fills, one asynchronous copy per field
  moves it into pinned host memory and an event marks its completion.
* JAX arrays on an accelerator are immutable: one jitted gather per frame returns the selected rows
  of every field, and their device→host copy starts at once (``copy_to_host_async``). JAX arrays in
  host memory (its "cpu" platform) are gathered as NumPy's, from zero-copy views.

A block is handed to the writer (one ``append`` of up to ``block_frames`` frames, whose validation,
casting and finiteness checks run once per block) only when its ring slot is needed again, so the
training thread waits at most once per block, for a copy started ``(ring_buffers - 1) * block_frames``
frames earlier. Each library is imported only when an array of it arrives (its module is already
loaded then). Reset
masks of the arrays' own library are accumulated on their device, so passing a device ``done``
mask every step never synchronizes. On CUDA, torch and CuPy gathers are queued on the library's
current stream, and a block's copy and event follow them on the stream of its last frame (which waits
for an earlier frame's, if that differs): arrays written on another stream (a Warp stack stepping on its
own) must be synchronized with it first, as for any consumer of them.

A sequence of CPU `MjData` (`MjDataGatherer`) takes the same road in host memory: per recorded
frame, one `np.concatenate` per field of views made once (of the fields in the MjData's own buffer;
arena-backed fields are read and size-checked per frame), into a block the writer checks when full.
"""

from __future__ import annotations

import operator
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import AppendError

__all__ = ["ArrayGatherer", "MjDataGatherer", "cuda_capturing", "drain_all", "library_of", "refuse_traced", "to_host",
           "LIBRARIES"]

#: The array libraries `library_of` recognizes, by the top-level module of the array's type.
LIBRARIES = {"numpy": "numpy", "jax": "jax", "jaxlib": "jax", "torch": "torch", "cupy": "cupy", "warp": "warp"}


def library_of(x: Any) -> str | None:
    """'numpy', 'jax', 'torch', 'cupy' or 'warp' for an array of that library, else None."""
    return LIBRARIES.get(type(x).__module__.partition(".")[0])


def to_host(x: Any) -> np.ndarray:
    """An array of any library as a NumPy array (one device→host copy where it lies elsewhere)."""
    library = library_of(x)
    if library == "torch":
        return x.detach().cpu().numpy()
    if library == "cupy":
        return x.get()
    return np.asarray(x)


def refuse_traced(values: dict[str, Any]) -> None:
    """AppendError for JAX values being traced (a call inside `jax.jit`, `vmap`, `lax.scan`, `grad`):
    they hold no frame yet, and the recorder would run once, at tracing, not at each step."""
    jax = sys.modules.get("jax")
    traced = [] if jax is None else [n for n, v in values.items() if isinstance(v, jax.core.Tracer)]
    if traced:
        raise AppendError(f"got traced JAX values for {', '.join(traced)}: the recorder was called inside jax.jit, "
                          "vmap or lax.scan, where it would run once, at tracing. Call it outside, on what the "
                          "jitted function returns (state = step(state); rec.record(state.data), or "
                          "rec.record_rollout(states) after a scan)")


def cuda_capturing(values: Any) -> bool:
    """Whether a CUDA graph capture is under way on the current stream of torch or CuPy, for the
    libraries of the given arrays that are on a GPU (their gathers and copies would only be captured)."""
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    if torch is not None and any(isinstance(v, torch.Tensor) and v.is_cuda for v in values):
        if torch.cuda.is_current_stream_capturing():
            return True
    return cupy is not None and any(isinstance(v, cupy.ndarray) for v in values) and _cupy_capturing(cupy)


def _cupy_capturing(cupy: Any) -> bool:
    is_capturing = getattr(cupy.cuda.get_current_stream(), "is_capturing", None)  # CuPy 10 on
    return bool(is_capturing is not None and is_capturing())


def on_host(library: str, arrays: dict[str, Any]) -> bool:
    """Whether the arrays are in host memory (NumPy, JAX's "cpu" platform, torch CPU tensors)."""
    if library == "numpy":
        return True
    a = next(iter(arrays.values()))
    if library == "torch":
        return a.device.type == "cpu"
    if library == "jax":
        return all(d.platform == "cpu" for d in a.devices())
    return False


Sink = Callable[[np.ndarray, dict[str, np.ndarray], np.ndarray], None]

CAPTURE_REFUSED = ("recording cannot run inside a CUDA graph capture (torch.cuda.graph, a CuPy stream capture): its "
                   "gathers and copies would run at the graph's replays, not at the call; call it between replays, "
                   "outside the capture")


class ArrayGatherer:
    """The ring of blocks (see the module docstring); `lib` does the per-library gather and copy."""

    def __init__(self, library: str, arrays: dict[str, Any], sel: np.ndarray, *, block_frames: int,
                 ring_buffers: int, sink: Sink):
        self.library = library
        self.k = len(sel)
        self.block = block_frames
        self._ring = ring_buffers
        self._sink = sink
        self.names = tuple(arrays)
        self.nworld = int(arrays[self.names[0]].shape[0])
        self._expected = [(n, type(a), tuple(a.shape), a.dtype) for n, a in arrays.items()]
        for name, a in arrays.items():
            if library != "torch" and np.dtype(a.dtype).kind not in "fiu":
                raise AppendError(f"{name} has dtype {a.dtype}; record float32 or float64 arrays")
        adapter = _ADAPTERS[library]
        if library == "jax" and all(d.platform == "cpu" for a in arrays.values() for d in a.devices()):
            adapter = _JaxHost  # host memory already: gather from zero-copy NumPy views
        self._lib = adapter(arrays, sel, block_frames, ring_buffers)
        self.row_bytes = sum(self._lib.itemsize[n] * int(np.prod(shape[1:], dtype=np.int64))
                             for n, _kind, shape, _dtype in self._expected)
        self._slot = 0
        self._fill = 0
        self._times = np.zeros(block_frames, np.float64)
        self._host_reset_rows = np.zeros((block_frames, self.k), bool)
        self._device_reset = [False] * ring_buffers
        self._pending: deque = deque()  # (slot, copy handle, times, host resets, n)
        self.bytes_copied = 0

    def check(self, arrays: dict[str, Any]) -> None:
        """Every call: same fields, array types, shapes and dtypes as the first (a few comparisons)."""
        if len(arrays) == len(self._expected):
            for name, kind, shape, dtype in self._expected:
                a = arrays.get(name)
                if type(a) is not kind or a.shape != shape or a.dtype != dtype:
                    break
            else:
                return
        self._explain_mismatch(arrays)

    def _explain_mismatch(self, arrays: dict[str, Any]) -> None:
        refuse_traced(arrays)
        if arrays.keys() != set(self.names):
            raise AppendError(f"record() got fields {sorted(arrays)}, but earlier calls had {sorted(self.names)}")
        for name, _kind, shape, dtype in self._expected:
            a = arrays[name]
            if library_of(a) != self.library:
                raise AppendError(f"{name} is a {type(a).__module__}.{type(a).__name__}; this Recorder records "
                                  f"{self.library} arrays (use one library for every field and call)")
            if tuple(a.shape) != shape or a.dtype != dtype:
                raise AppendError(f"{name} has shape {tuple(a.shape)} and dtype {a.dtype}; earlier calls had "
                                  f"{shape} and {dtype}")
        raise AppendError("record() got arrays of other types than its first call: "
                          f"{ {n: type(a).__name__ for n, a in arrays.items()} }")

    def accumulate_reset(self, mask: Any) -> None:
        """OR a (nworld,) bool/int mask of this library into the device-side accumulator."""
        nworld = self.nworld
        if tuple(mask.shape) != (nworld,):
            raise AppendError(f"reset must be a mask over all {nworld} worlds, shape ({nworld},); got {tuple(mask.shape)}")
        if not _is_bool_or_int(mask.dtype):
            raise AppendError(f"reset must be a boolean (or integer) mask, got dtype {mask.dtype}")
        if self.library == "jax":
            refuse_traced({"reset": mask})
        self._lib.accumulate_reset(mask)

    def take_device_resets(self, into: np.ndarray) -> None:
        """OR the resets accumulated on the device since the last gathered frame into `into`, a host
        mask over all worlds (a rollout recorded after `record()` calls carries them on)."""
        host = self._lib.take_reset_host()
        if host is not None:
            into |= host

    def gather(self, arrays: dict[str, Any], time: float, host_reset: np.ndarray) -> None:
        """Gather one frame of the selected worlds into the ring (`seal_if_full` then moves a full block on)."""
        slot, j = self._slot, self._fill
        try:
            self._device_reset[slot] |= self._lib.take(slot, j, [arrays[n] for n in self.names])
        except AppendError:
            raise
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:  # e.g. a tensor moved to another device
            raise AppendError(f"gathering the selected worlds failed: {exc}") from exc
        self.bytes_copied += self.k * self.row_bytes
        self._times[j] = time
        self._host_reset_rows[j] = host_reset
        self._fill += 1

    def seal_if_full(self) -> None:
        """After a gather: a full block starts its copy; may hand the oldest block to the sink."""
        if self._fill == self.block:
            self._seal()

    def _seal(self) -> None:
        if not self._fill:
            return
        handle = self._lib.seal(self._slot, self._fill)
        self._pending.append((self._slot, handle, self._times[: self._fill].copy(),
                              self._host_reset_rows[: self._fill].copy(), self._fill))
        self._slot = (self._slot + 1) % self._ring
        self._fill = 0
        if len(self._pending) >= self._ring:
            self._drain_one()

    def _drain_one(self) -> None:
        slot, handle, times, reset, n = self._pending.popleft()
        host, device_reset = self._lib.wait(slot, handle, n)
        fields = dict(zip(self.names, host))
        if self._device_reset[slot]:
            reset = reset | device_reset
            self._device_reset[slot] = False
        self._sink(times, fields, reset)  # the writer copies before returning, so the slot is free

    def drain_all(self) -> None:
        """Seal the partial block and hand every pending block to the sink, oldest first."""
        drain_all(self)


#: MjData fields MuJoCo allocates in its fixed buffer in every supported version (mjDATA_POINTERS,
#: sized by the model); everything else (the arena's efc_*, contacts, islands, which older versions
#: also carve out of the buffer's span) is read and checked at each frame.
_BUFFER_FIELDS = frozenset({
    "qpos", "qvel", "act", "qacc_warmstart", "plugin_state", "ctrl", "qfrc_applied", "xfrc_applied",
    "mocap_pos", "mocap_quat", "qacc", "act_dot", "userdata", "sensordata", "xpos", "xquat", "xmat",
    "xipos", "ximat", "xanchor", "xaxis", "geom_xpos", "geom_xmat", "site_xpos", "site_xmat", "cam_xpos",
    "cam_xmat", "light_xpos", "light_xdir", "subtree_com", "cdof", "cinert", "ten_length",
    "actuator_length", "actuator_velocity", "actuator_force", "qfrc_bias", "qfrc_passive",
    "qfrc_actuator", "qfrc_smooth", "qacc_smooth", "qfrc_constraint", "qfrc_inverse", "cvel", "cacc",
    "cfrc_int", "cfrc_ext", "subtree_linvel", "subtree_angmom", "actuator_moment",
})


class MjDataGatherer:
    """A sequence of MuJoCo `MjData` (one per world): the selected worlds' fields are copied into one
    host block of ``block_frames`` frames, handed to the sink (the writer's `append`, which validates,
    casts and checks it once per block) when it fills.

    Per recorded frame the caller's thread does one `np.concatenate` per field, of flat views of the
    selected worlds' arrays made once, into the block's row, in the field's own dtype; nothing else.
    Only fields in the `MjData`'s own buffer are bound so: that buffer is allocated once, sized by
    the model, and kept for the `MjData`'s lifetime (the views are made again when the sequence
    holds other objects). Fields outside it (arena-backed ones such as ``efc_*`` and the island
    arrays, whose size or address can change at every step, and the few fixed arrays inside the
    struct itself) are read with ``getattr`` and their size checked at every recorded frame.
    """

    library = "mujoco"
    bytes_copied = 0  # host memory already: nothing crosses a device boundary

    def __init__(self, batch: Any, sel: np.ndarray, fields: dict[str, tuple[int, ...]], *, block_frames: int,
                 sink: Sink):
        self.k = len(sel)
        self.block = block_frames
        self._sink = sink
        self._shapes = fields
        picks = [int(i) for i in sel]
        self._pick = (lambda b: (b[picks[0]],)) if len(picks) == 1 else operator.itemgetter(*picks)
        self._objs: tuple | None = None
        self._views: list[list[np.ndarray]] = []  # the bound fields' views, per field
        self._checked: list[tuple[str, int, tuple[int, ...]]] = []  # (name, size, shape): read per frame
        dtypes = self._bind(self._pick(batch))
        self._blocks = {name: np.empty((block_frames, self.k, *shape), dtypes[name])
                        for name, shape in fields.items()}
        self._make_rows()
        self._times = np.zeros(block_frames, np.float64)
        self._reset = np.zeros((block_frames, self.k), bool)
        self._fill = 0
        self._pending: deque = deque()  # always empty: a block goes to the sink when it fills (drain_all protocol)

    def _bind(self, objs: tuple) -> dict[str, np.dtype]:
        """Flat views of each selected MjData's buffer-resident fields, checked once per set of objects;
        the other fields are left to the per-frame checked read. Returns each field's dtype."""
        spans = [_buffer_span(d) for d in objs]
        views, bound, checked, dtypes = [], [], [], {}
        for name, shape in self._shapes.items():
            size = int(np.prod(shape, dtype=np.int64))
            per_field = []
            fixed = True
            for d, span in zip(objs, spans):
                a = getattr(d, name, None)
                if not isinstance(a, np.ndarray):
                    raise AppendError(f"track {name!r} is not an MjData field; record it with the arrays: "
                                      f"record(qpos=..., {name}=..., time=...)")
                if a.size != size:
                    raise AppendError(f"MjData.{name} has shape {a.shape}; this archive stores {shape} per world")
                dtypes[name] = a.dtype
                addr = a.__array_interface__["data"][0]
                fixed = fixed and name in _BUFFER_FIELDS and a.flags.c_contiguous and span is not None and \
                    span[0] <= addr and addr + a.nbytes <= span[1]
                per_field.append(a.reshape(-1))
            if fixed:  # in the buffer: the same memory for the MjData's lifetime
                views.append(per_field)
                bound.append(name)
            else:  # arena-backed (or otherwise not the buffer's): its memory may move or resize per step
                checked.append((name, size, shape))
        again = self._objs is not None and (bound != self._bound_names or checked != self._checked)
        self._views, self._bound_names, self._checked, self._objs = views, bound, checked, objs
        if again:  # other objects whose fields are split otherwise: rows into the same blocks
            self._make_rows()
        return dtypes

    def _make_rows(self) -> None:
        """Each frame's flat rows of the block, bound fields and checked ones, made once."""
        self._rows = [[self._blocks[name][j].reshape(-1) for name in self._bound_names]
                      for j in range(self.block)]
        self._checked_rows = [[self._blocks[name][j].reshape(-1) for name, _size, _shape in self._checked]
                              for j in range(self.block)]

    def gather(self, batch: Any, time: float, host_reset: np.ndarray) -> None:
        """Copy one frame of the selected worlds into the block."""
        objs = self._pick(batch)
        if objs != self._objs:  # identity comparisons: other MjData objects than last time
            self._bind(objs)
        j = self._fill
        for views, out in zip(self._views, self._rows[j]):
            np.concatenate(views, out=out)
        if self._checked:
            self._gather_checked(objs, self._checked_rows[j])
        self._times[j] = time
        self._reset[j] = host_reset
        self._fill = j + 1

    def _gather_checked(self, objs: tuple, rows: list[np.ndarray]) -> None:
        """Fields outside the MjData buffer: read now, their size checked (refused at this call)."""
        for (name, size, shape), out in zip(self._checked, rows):
            arrays = [getattr(d, name) for d in objs]
            for a in arrays:
                if a.size != size:
                    raise AppendError(f"MjData.{name} has shape {a.shape} at this call; this archive stores "
                                      f"{shape} per world (its size is not fixed by the model: record it with "
                                      f"the arrays, padded, or leave it out)")
            np.concatenate([a.reshape(-1) for a in arrays], out=out)

    def seal_if_full(self) -> None:
        if self._fill == self.block:
            self._seal()

    def _seal(self) -> None:
        n, self._fill = self._fill, 0
        if n:  # the writer copies the block before returning: it is free again at once
            self._sink(self._times[:n].copy(), {name: b[:n] for name, b in self._blocks.items()},
                       self._reset[:n].copy())

    def drain_all(self) -> None:
        """Hand the partial block to the sink."""
        drain_all(self)


def _buffer_span(d: Any) -> tuple[int, int] | None:
    """The address range of an MjData's buffer: the fields whose size the model fixes, allocated
    once with the MjData (``qpos`` is its first field); None when the bindings do not tell."""
    nbuffer = getattr(d, "nbuffer", None)
    qpos = getattr(d, "qpos", None)
    if not isinstance(nbuffer, int) or not isinstance(qpos, np.ndarray):
        return None
    start = qpos.__array_interface__["data"][0]
    return start, start + nbuffer


def drain_all(gatherer: Any) -> None:
    """Seal a gatherer's partial block, then hand every pending block to its sink, oldest first
    (this one and the Warp gatherer share the ring protocol: `_seal`, `_drain_one`, `_pending`).
    A refused frame does not stop the blocks after it; the first refusal is raised at the end."""
    first: AppendError | None = None
    try:
        gatherer._seal()  # may drain the oldest block itself
    except AppendError as exc:
        first = exc
    while gatherer._pending:
        try:
            gatherer._drain_one()
        except AppendError as exc:
            first = first or exc
    if first is not None:
        raise first


# -- per-library gathers --------------------------------------------------------------------------
# Each adapter: take(slot, j, arrays) gathers frame j of ring slot `slot` and returns whether device
# resets were taken with it; seal(slot, n) starts the block's copy to the host; wait(slot, handle, n)
# returns ([host array (n, k, ...) per field], device reset rows (n, k) bool); take_reset_host() hands
# the resets accumulated since the last frame to a rollout.

class _NumpyLike:
    """NumPy: gather into host blocks. CuPy reuses it with device blocks and a copy at seal."""

    xp: Any = np

    def __init__(self, arrays: dict, sel: np.ndarray, block_frames: int, ring_buffers: int):
        self.itemsize = {n: a.dtype.itemsize for n, a in arrays.items()}
        arrays = list(arrays.values())
        self.idx = self.xp.asarray(np.asarray(sel, np.intp))
        shape = lambda a: (block_frames, len(sel), *a.shape[1:])  # noqa: E731
        self.dev = [[self.xp.empty(shape(a), a.dtype) for a in arrays] for _ in range(ring_buffers)]
        self.dev_reset = [self.xp.zeros((block_frames, len(sel)), bool) for _ in range(ring_buffers)]
        self.host, self.host_reset = self.dev, self.dev_reset
        self._acc = None

    def take(self, slot: int, j: int, arrays: list) -> bool:
        take, idx = self.xp.take, self.idx
        for src, block in zip(arrays, self.dev[slot]):
            take(src, idx, axis=0, out=block[j])
        if self._acc is None:
            return False
        take(self._acc, idx, out=self.dev_reset[slot][j])
        self._acc = None
        return True

    def accumulate_reset(self, mask: Any) -> None:
        mask = mask != 0
        self._acc = mask if self._acc is None else self._acc | mask

    def take_reset_host(self) -> np.ndarray | None:
        """The resets accumulated since the last gathered frame as a host mask over all worlds (or
        None), let go of: a rollout recorded next carries them on."""
        acc, self._acc = self._acc, None
        return None if acc is None else to_host(acc) != 0

    def seal(self, slot: int, n: int) -> Any:
        return None

    def wait(self, slot: int, handle: Any, n: int) -> tuple[list, np.ndarray]:
        reset = self.host_reset[slot][:n].copy()
        self.host_reset[slot][:n] = False
        return [h[:n] for h in self.host[slot]], reset


class _Cupy(_NumpyLike):
    """CuPy (always a GPU): device blocks, pinned host blocks, one async copy per field at seal."""

    def __init__(self, arrays: dict, sel: np.ndarray, block_frames: int, ring_buffers: int):
        import cupy
        import cupyx

        self.xp = cupy
        self._refuse_capture()  # before anything is allocated
        super().__init__(arrays, sel, block_frames, ring_buffers)
        self.host = [[cupyx.empty_pinned(b.shape, b.dtype) for b in blocks] for blocks in self.dev]
        self.host_reset = [cupyx.empty_pinned(r.shape, bool) for r in self.dev_reset]
        for r in self.host_reset:
            r[:] = False
        self._block_stream = None
        # Accumulators a slot's frames read, kept until its event: CuPy's memory pool hands freed memory
        # out again on the stream that allocated it, which need not wait for the one that reads it.
        self._held: list[list] = [[] for _ in range(ring_buffers)]

    def _refuse_capture(self) -> None:
        """As _Torch._refuse_capture, for a CuPy stream capture (`stream.begin_capture()`)."""
        if _cupy_capturing(self.xp):
            raise AppendError(CAPTURE_REFUSED)

    def _follow_stream(self) -> None:
        """As _Torch._follow_stream; first refuses a graph capture."""
        self._refuse_capture()
        current = self.xp.cuda.get_current_stream()
        if self._block_stream is not None and current != self._block_stream:
            current.wait_event(self._block_stream.record())
        self._block_stream = current

    def take(self, slot: int, j: int, arrays: list) -> bool:
        self._follow_stream()
        acc = self._acc
        taken = super().take(slot, j, arrays)
        if taken:
            self._held[slot].append(acc)
        return taken

    def accumulate_reset(self, mask: Any) -> None:
        self._follow_stream()
        if self._acc is None:
            self._acc = mask != 0
        else:  # in place: the accumulator is allocated once per frame, whichever streams use it
            self.xp.logical_or(self._acc, mask != 0, out=self._acc)

    def take_reset_host(self) -> np.ndarray | None:
        if self._acc is not None:
            self._follow_stream()  # the copy (on the current stream) after the accumulator's last update
        return super().take_reset_host()

    def seal(self, slot: int, n: int) -> Any:
        stream = self._block_stream or self.xp.cuda.get_current_stream()
        with stream:
            for dev, host in zip([*self.dev[slot], self.dev_reset[slot]], [*self.host[slot], self.host_reset[slot]]):
                self.xp.asnumpy(dev[:n], stream=stream, out=host[:n], blocking=False)
            self.dev_reset[slot][:n] = False
        return stream.record()

    def wait(self, slot: int, handle: Any, n: int) -> tuple[list, np.ndarray]:
        handle.synchronize()
        self._held[slot].clear()
        return super().wait(slot, handle, n)


class _JaxHost(_NumpyLike):
    """JAX arrays in host memory (the "cpu" platform): `np.asarray` of one is a zero-copy view, so
    the gather is NumPy's, straight into the host block, with nothing left to copy at the end."""

    def take(self, slot: int, j: int, arrays: list) -> bool:
        return super().take(slot, j, [np.asarray(a) for a in arrays])

    def accumulate_reset(self, mask: Any) -> None:
        super().accumulate_reset(np.asarray(mask))


class _Torch:
    """torch: index_select into a block; on CUDA a device block, pinned host block and an event."""

    def __init__(self, arrays: dict, sel: np.ndarray, block_frames: int, ring_buffers: int):
        import torch

        self.torch = torch
        first = next(iter(arrays.values()))
        self.device = first.device
        self.cuda = self.device.type == "cuda"
        for name, a in arrays.items():
            if a.device != self.device:
                raise AppendError(f"{name} is on {a.device}, qpos on {self.device}: pass every field on one device")
            if a.dtype in (torch.bfloat16, torch.float16) or a.is_complex():
                raise AppendError(f"{name} has dtype {a.dtype}; record float32 or float64 tensors")
        self.itemsize = {n: a.element_size() for n, a in arrays.items()}
        if self.cuda:
            self._refuse_capture()  # before anything is allocated (in the graph's private pool otherwise)
        with torch.inference_mode(False):  # a first call under inference_mode must not make them inference tensors
            self._allocate(arrays, sel, block_frames, ring_buffers)
        self._acc = None
        self._block_stream = None  # CUDA: the stream of the latest gather or accumulated reset
        self._acc_stream = None  # CUDA: the stream the reset accumulator was made on

    def _allocate(self, arrays: dict, sel: np.ndarray, block_frames: int, ring_buffers: int) -> None:
        torch = self.torch
        self.idx = torch.as_tensor(np.asarray(sel, np.int64), device=self.device)
        k = len(sel)
        shape = lambda a: (block_frames, k, *a.shape[1:])  # noqa: E731
        self.host = [[torch.empty(shape(a), dtype=a.dtype, pin_memory=self.cuda) for a in arrays.values()]
                     for _ in range(ring_buffers)]
        self.host_reset = [torch.zeros((block_frames, k), dtype=torch.bool, pin_memory=self.cuda)
                           for _ in range(ring_buffers)]
        if self.cuda:
            self.dev = [[torch.empty_like(h, device=self.device) for h in hs] for hs in self.host]
            self.dev_reset = [torch.zeros_like(r, device=self.device) for r in self.host_reset]
        else:
            self.dev, self.dev_reset = self.host, self.host_reset
        self.host_np = [[h.numpy() for h in hs] for hs in self.host]
        self.host_reset_np = [r.numpy() for r in self.host_reset]
        # Views of each frame row, made once: indexing a tensor costs about 1 µs per call.
        self._rows = [[[block[j] for block in blocks] for j in range(block_frames)] for blocks in self.dev]

    def _refuse_capture(self) -> None:
        """CUDA: AppendError inside a graph capture (`torch.cuda.graph`), whose gathers and copies would
        only run at the graph's replays, long after this frame's bookkeeping (~1 µs: recorded frames and
        resets only)."""
        if self.torch.cuda.is_current_stream_capturing():
            raise AppendError(CAPTURE_REFUSED)

    def _follow_stream(self) -> None:
        """CUDA: the recorder's work goes on the stream current at this call, which first waits for the
        one its previous work ran on if that differs. A block's gathers, copy and event then follow each
        other (a block filled inside `torch.cuda.stream(s)` and sealed outside it by close() is copied
        once its gathers ran), and so do the uses of the reset accumulator. First refuses a graph capture."""
        self._refuse_capture()
        current = self.torch.cuda.current_stream(self.device)
        if self._block_stream is not None and current != self._block_stream:
            current.wait_stream(self._block_stream)
        self._block_stream = current

    def _release_acc(self) -> None:
        """Let go of the accumulator; made on another CUDA stream than its last use, it is kept from
        reuse until that use ran (torch's caching allocator otherwise hands it out on its own stream)."""
        if self._acc_stream != self._block_stream:
            self._acc.record_stream(self._block_stream)
        self._acc = None

    def take(self, slot: int, j: int, arrays: list) -> bool:
        if self.cuda:
            self._follow_stream()
        index_select, idx = self.torch.index_select, self.idx
        for src, out in zip(arrays, self._rows[slot][j]):
            index_select(src.detach() if src.requires_grad else src, 0, idx, out=out)
        if self._acc is None:
            return False
        index_select(self._acc, 0, self.idx, out=self.dev_reset[slot][j])
        self._release_acc()
        return True

    def accumulate_reset(self, mask: Any) -> None:
        if mask.device != self.device:
            raise AppendError(f"the reset mask is on {mask.device}, the arrays on {self.device}")
        if self.cuda:
            self._follow_stream()
        mask = mask.detach() != 0
        acc = mask if self._acc is None else self._acc | mask
        if self._acc is not None:
            self._release_acc()
        self._acc, self._acc_stream = acc, self._block_stream

    def take_reset_host(self) -> np.ndarray | None:
        """As _NumpyLike.take_reset_host; on CUDA the copy follows the accumulator's stream."""
        if self._acc is None:
            return None
        if self.cuda:
            self._follow_stream()
        host = self._acc.cpu().numpy()  # synchronous, on the current stream
        self._release_acc()
        return host

    def seal(self, slot: int, n: int) -> Any:
        if not self.cuda:
            return None
        torch = self.torch
        stream = self._block_stream or torch.cuda.current_stream(self.device)
        with torch.cuda.stream(stream):
            for dev, host in zip([*self.dev[slot], self.dev_reset[slot]], [*self.host[slot], self.host_reset[slot]]):
                host[:n].copy_(dev[:n], non_blocking=True)
            self.dev_reset[slot][:n] = False
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def wait(self, slot: int, handle: Any, n: int) -> tuple[list, np.ndarray]:
        if handle is not None:
            handle.synchronize()
        reset = self.host_reset_np[slot][:n].copy()
        self.host_reset_np[slot][:n] = False
        return [h[:n] for h in self.host_np[slot]], reset


class _Jax:
    """JAX on an accelerator: one jitted gather per frame (all fields and the reset accumulator), async host copies."""

    def __init__(self, arrays: dict, sel: np.ndarray, block_frames: int, ring_buffers: int):
        import jax

        self.jax = jax
        first = next(iter(arrays.values()))
        devices = first.devices()
        self.itemsize = {n: a.dtype.itemsize for n, a in arrays.items()}
        idx = np.asarray(sel, np.int32)
        self.idx = jax.device_put(idx, next(iter(devices))) if len(devices) == 1 else jax.numpy.asarray(idx)
        self._take = jax.jit(lambda i, xs: [x[i] for x in xs])
        self._or = jax.jit(lambda acc, m: acc | (m != 0))
        self._frames: list[list[Any]] = [[None] * block_frames for _ in range(ring_buffers)]
        self._acc = None
        k = len(sel)
        self.host = [[np.empty((block_frames, k, *a.shape[1:]), a.dtype) for a in arrays.values()]
                     for _ in range(ring_buffers)]

    def take(self, slot: int, j: int, arrays: list) -> bool:
        with_reset = self._acc is not None
        out = self._take(self.idx, arrays + [self._acc] if with_reset else arrays)
        for y in out:
            y.copy_to_host_async()
        self._frames[slot][j] = out
        self._acc = None
        return with_reset

    def accumulate_reset(self, mask: Any) -> None:
        self._acc = (mask != 0) if self._acc is None else self._or(self._acc, mask)

    def take_reset_host(self) -> np.ndarray | None:
        acc, self._acc = self._acc, None
        return None if acc is None else np.asarray(acc)

    def seal(self, slot: int, n: int) -> Any:
        return None

    def wait(self, slot: int, handle: Any, n: int) -> tuple[list, np.ndarray]:
        host = self.host[slot]
        reset = np.zeros((n, host[0].shape[1]), bool)
        for j, out in enumerate(self._frames[slot][:n]):
            for h, y in zip(host, out):
                h[j] = np.asarray(y)
            if len(out) > len(host):
                reset[j] = np.asarray(out[-1])
        self._frames[slot][:n] = [None] * n
        return [h[:n] for h in host], reset


def _is_bool_or_int(dtype: Any) -> bool:
    name = str(dtype).removeprefix("torch.")
    return name == "bool" or name.startswith(("int", "uint"))


_ADAPTERS: dict[str, type] = {"numpy": _NumpyLike, "torch": _Torch, "jax": _Jax, "cupy": _Cupy}


def is_mjx_data(data: Any) -> bool:
    """A MuJoCo MJX ``Data`` (batched with ``jax.vmap``: every field has a leading world axis)."""
    return type(data).__module__.startswith("mujoco.mjx") and "mujoco.mjx" in sys.modules
