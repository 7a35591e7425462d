"""Scanned rollouts: many steps of many worlds handed over at once, as ``(T, W, ...)`` arrays.

A rollout run by ``jax.lax.scan`` inside ``jit`` (MuJoCo Playground, MJX, Brax) has no Python call
per step to record from; it returns the stacked states. `Recorder.record_rollout` takes them and
keeps what a per-step `record()` would have kept, with a few whole-array operations instead:

* The step times (one value per step: world 0's, the batch clock) are the only values read before
  the gather; the recorder's `Cadence` picks the steps that are frames from them on the host.
* Every field is gathered for those steps × the selected worlds in one indexing operation of the
  arrays' own library, on their own device (`gather_rows`); only those rows are copied to the host.
* Resets: the selected worlds' ``(T, k)`` mask is copied (a byte per step and world) and each frame
  gets the OR of the steps since the previous frame (`frame_resets`); resets after the last frame
  carry over to the next call.

The rows reach the writer as one block (in parts of at most `MAX_BLOCK_BYTES`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import AppendError
from .arrays import CAPTURE_REFUSED, cuda_capturing, is_mjx_data, library_of, to_host

__all__ = ["MAX_BLOCK_BYTES", "check_rollout", "frame_resets", "gather_rows", "refuse_capture", "rollout_arrays",
           "row_itemsize", "selected_resets", "step_times"]

#: Host bytes gathered per part of a rollout's block: bounds the memory a long rollout takes.
MAX_BLOCK_BYTES = 64 << 20

_LIBRARIES = ("numpy", "jax", "torch", "cupy")


def rollout_arrays(rollout: Any, arrays: dict[str, Any], time: Any, reset: Any,
                   shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, Any], Any, Any, str | None]:
    """(fields, time, reset, backend) from `record_rollout`'s arguments: a stacked MJX Data, an object
    with ``.data`` (a Playground State) or ``.pipeline_state`` (a Brax State; either's ``.done`` is the
    reset mask), or named arrays; arrays named with a rollout are tracks it does not hold
    (``reward=states.reward``) or stand in for its fields."""
    backend = None
    if rollout is not None:
        data = rollout if is_mjx_data(rollout) else getattr(rollout, "data", None)
        if data is None:  # a Brax State: its MJX pipeline's state is an MJX Data
            data = getattr(rollout, "pipeline_state", None)
        if data is None or not hasattr(data, "qpos"):
            raise AppendError(f"record_rollout() takes a stacked MJX Data, a State with .data (Playground) or "
                              f".pipeline_state (Brax's MJX backend) or named arrays, got {type(rollout).__name__}")
        arrays = {**{name: getattr(data, name) for name in shapes if name not in arrays and hasattr(data, name)},
                  **arrays}
        if time is None:
            time = getattr(data, "time", None)
        if reset is None and data is not rollout:
            reset = getattr(rollout, "done", None)
        backend = "mjx" if any(c.__module__.startswith("mujoco.mjx") for c in type(data).__mro__) else None
    if time is None:
        raise AppendError("pass time=... (T,) or (T, nworld): the simulation time of each step in seconds; "
                          "arrays carry no clock")
    return arrays, time, reset, backend


def check_rollout(arrays: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> tuple[str, int, int]:
    """(library, steps, worlds) of the fields, each of shape (T, W, *per-world shape), one library."""
    library = library_of(arrays["qpos"])
    if library not in _LIBRARIES:
        kind = f"{type(arrays['qpos']).__module__}.{type(arrays['qpos']).__name__}"
        raise AppendError(f"qpos is a {kind}; record_rollout() takes NumPy, JAX, torch or CuPy arrays "
                          "(record Warp data step by step with record())")
    q = tuple(arrays["qpos"].shape)
    if len(q) != 3:
        raise AppendError(f"qpos has shape {q}; a rollout's qpos is (steps, nworld, nq)")
    steps, nworld = q[0], q[1]
    if nworld < 1:
        raise AppendError(f"qpos has shape {q}: no worlds; a rollout's qpos is (steps, nworld, nq)")
    device = _device_of(library, arrays["qpos"])
    for name, shape in shapes.items():
        a = arrays[name]
        if library_of(a) != library:
            raise AppendError(f"{name} is a {type(a).__module__}.{type(a).__name__}, qpos a {library} array: "
                              "pass every field in one library")
        if _device_of(library, a) != device:
            raise AppendError(f"{name} is on {_device_of(library, a)}, qpos on {device}: pass every field on one "
                              "device")
        if tuple(a.shape) != (steps, nworld, *shape):
            raise AppendError(f"{name} has shape {tuple(a.shape)}; expected (steps, nworld, "
                              f"{', '.join(map(str, shape))}) = {(steps, nworld, *shape)}")
        row_itemsize(name, a)
    return library, steps, nworld


def refuse_capture(values: dict[str, Any]) -> None:
    """AppendError for GPU arrays inside a CUDA graph capture: the rollout's copies to the host (and
    those of blocks of earlier `record()` calls) cannot run there."""
    if cuda_capturing(values.values()):
        raise AppendError(CAPTURE_REFUSED)


def _device_of(library: str, a: Any) -> Any:
    """Where a field lies: torch's and CuPy's device, JAX's set of devices (None for NumPy)."""
    if library == "jax":
        return a.devices()
    return getattr(a, "device", None) if library in ("torch", "cupy") else None


def row_itemsize(name: str, a: Any) -> int:
    """Bytes per value of a field (any library), refused unless it is a real float or integer dtype."""
    try:
        dtype = np.dtype(str(a.dtype).removeprefix("torch."))
    except TypeError:  # e.g. torch.bfloat16
        dtype = np.dtype(object)
    if dtype.kind not in "fiu":
        raise AppendError(f"{name} has dtype {a.dtype}; record float32 or float64 arrays")
    return dtype.itemsize


def step_times(time: Any, steps: int) -> np.ndarray:
    """The batch clock of each step: `time` (T,) or world 0's column of (T, W), as float64 on the host."""
    if library_of(time) in (None, "numpy"):  # a list, say
        try:
            time = np.asarray(time, np.float64)
        except (TypeError, ValueError):
            raise AppendError(f"time must be numbers of seconds, (steps,) or (steps, nworld); got "
                              f"{time!r:.60}") from None
    shape = tuple(getattr(time, "shape", np.shape(time)))
    if shape[:1] != (steps,) or len(shape) > 2:
        raise AppendError(f"time has shape {shape}; pass (steps,) or (steps, nworld) = ({steps},) or ({steps}, W)")
    column = time[:, 0] if len(shape) == 2 else time
    t = to_host(column).astype(np.float64, copy=False)
    if not np.isfinite(t).all():
        raise AppendError(f"time holds a non-finite value at step {int(np.flatnonzero(~np.isfinite(t))[0])}")
    return t


def selected_resets(reset: Any, steps: int, nworld: int, sel: np.ndarray) -> np.ndarray | None:
    """The selected worlds' reset mask (steps, k) on the host, or None without one."""
    if reset is None:
        return None
    shape = tuple(reset.shape) if hasattr(reset, "shape") else np.shape(reset)
    if shape != (steps, nworld):
        raise AppendError(f"reset has shape {shape}; a rollout's reset mask is (steps, nworld) = {(steps, nworld)}")
    library = library_of(reset)
    if library == "jax" and all(d.platform == "cpu" for d in reset.devices()):
        reset, library = np.asarray(reset), "numpy"  # a zero-copy view: NumPy takes the columns
    if library in ("jax", "torch", "cupy"):
        kind = str(reset.dtype).removeprefix("torch.")
        if kind != "bool" and not kind.startswith(("int", "uint", "float")):
            raise AppendError(f"reset must be a boolean (or number) mask, got dtype {reset.dtype}")
        return to_host(_take2(library, reset, None, sel)) != 0
    mask = np.asarray(reset)
    if mask.dtype.kind not in "biuf":
        raise AppendError(f"reset must be a boolean (or number) mask, got dtype {mask.dtype}")
    return mask[:, sel] != 0


def frame_resets(mask: np.ndarray | None, due: np.ndarray, pending: np.ndarray, k: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(per-frame reset rows (F, k), resets after the last frame (k,)): frame j gets the OR of the
    steps after frame j-1 up to its own (the first frame also `pending`, carried from earlier calls)."""
    rows = np.zeros((len(due), k), bool)
    if mask is None:
        if len(due):
            rows[0] = pending
            return rows, np.zeros(k, bool)
        return rows, pending.copy()
    if len(due):
        # Frame j's steps are [due[j-1] + 1, due[j]]: never empty, as frames are increasing steps.
        starts = np.concatenate(([0], due[:-1] + 1))
        rows = np.logical_or.reduceat(mask[: due[-1] + 1], starts, axis=0)
        rows[0] |= pending
        tail = mask[due[-1] + 1:].any(axis=0)
    else:
        tail = pending | mask.any(axis=0)
    return rows, tail


def gather_rows(library: str, arrays: dict[str, Any], due: np.ndarray, sel: np.ndarray) -> dict[str, np.ndarray]:
    """Each field's rows at steps `due` × worlds `sel`, gathered by the arrays' library on their device
    in one operation, as host arrays (F, k, ...)."""
    if library == "jax":
        return _gather_jax(arrays, due, sel)
    return {name: to_host(_take2(library, a, due, sel)) for name, a in arrays.items()}


def _take2(library: str, a: Any, steps: np.ndarray | None, sel: np.ndarray) -> Any:
    """a[steps][:, sel] (steps None: all) in one advanced-indexing gather of the array's library."""
    if library == "numpy":
        if steps is None:
            return a[:, sel]
        if a.flags.c_contiguous:  # one take of flat rows: no broadcast index arrays to walk
            rows = (steps[:, None] * a.shape[1] + sel[None, :]).ravel()
            flat = a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])
            return np.take(flat, rows, axis=0).reshape(len(steps), len(sel), *a.shape[2:])
        return a[steps[:, None], sel[None, :]]
    if library == "torch":
        import torch

        a = a.detach()
        s = torch.as_tensor(sel, device=a.device)
        if steps is None:
            return a[:, s]
        return a[torch.as_tensor(steps, device=a.device)[:, None], s[None, :]]
    if library == "cupy":
        import cupy

        with a.device:  # the index arrays and the gather on the array's own GPU, not the current one
            s = cupy.asarray(sel)
            return a[:, s] if steps is None else a[cupy.asarray(steps)[:, None], s[None, :]]
    import jax.numpy as jnp  # jax

    s = jnp.asarray(sel.astype(np.int32))
    return a[:, s] if steps is None else a[jnp.asarray(steps.astype(np.int32))[:, None], s[None, :]]


_jax_gather = None


def _gather_jax(arrays: dict[str, Any], due: np.ndarray, sel: np.ndarray) -> dict[str, np.ndarray]:
    """JAX: in host memory (its "cpu" platform) NumPy gathers from zero-copy views; on an accelerator
    one jitted gather of every field runs on the device and only its result is copied."""
    first = next(iter(arrays.values()))
    if all(d.platform == "cpu" for d in first.devices()):
        return {name: _take2("numpy", np.asarray(a), due, sel) for name, a in arrays.items()}
    global _jax_gather
    if _jax_gather is None:
        import jax

        _jax_gather = jax.jit(lambda xs, d, s: [x[d[:, None], s[None, :]] for x in xs])
    out = _jax_gather(list(arrays.values()), due.astype(np.int32), sel.astype(np.int32))
    for y in out:
        y.copy_to_host_async()
    return {name: np.asarray(y) for name, y in zip(arrays, out)}
