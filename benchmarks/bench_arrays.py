"""record() from JAX / torch arrays vs a bare device-side gather + host copy of the same rows.

    python benchmarks/bench_arrays.py                        # CPU, nworld=4096, 16 selected
    python benchmarks/bench_arrays.py --device cuda          # torch CUDA tensors, JAX on its GPU
    python benchmarks/bench_arrays.py --quick                # seconds (tests/test_bench_smoke.py)

Workload: the mujoco_warp humanoid (nq=28, nv=27), `--nworld` worlds, `--selected` worlds spread
evenly over the batch, fields `qpos` plus a `qvel` track, float32, `output_fps = 1 / timestep` and
`time=n * timestep`, so every call records. `--frames` recorded frames per timed run; the input
arrays cycle through a few precomputed distinct device arrays (5, coprime with `block_frames`),
so no call sees the previous call's array and producing them is not timed.

What is timed (time.perf_counter() around the one call, accumulated per run, divided by frames):

* `record`: `rec.record(qpos=..., qvel=..., time=...)`. This includes the amortized block hand-off
  to the writer (`ArchiveWriter.append` of a block, done inside `record()` when a ring slot is
  needed again: `frames / block_frames - ring_buffers + 1` blocks per run, e.g. 16 of 19 with 16-frame blocks)
  and the cost of the writer's background compression competing for the cores (`chunk_frames=64`,
  so chunks fill and compress during the run). The first call (creates the archive, compiles the
  gather) is not timed. `flush()` at the end (hands over the last <= `ring_buffers` blocks and
  commits partial chunks through zarr-python: an end-of-run cost, not a per-frame one) is reported
  apart as `flush_ms`; `close()` is not timed.
* `skip`: a record() call that records nothing (time not advanced, so no frame is due).
* baselines, same rows, same arrays: JAX `np.asarray(jnp.take(q, idx, axis=0))` for qpos and
  qvel (`idx` a device int32 array), and the jitted `jax.jit(lambda i, a, b: (a[i], b[i]))` plus
  `np.asarray` of both ("best hand-written"); torch `q.index_select(0, idx).cpu().numpy()` for
  both (`idx` a device long tensor; on CUDA `.cpu()` is a synchronous copy).

Variants run interleaved `--repeats` times; reported: best (min) and median over runs of the
per-frame time (total / frames, so the block hand-offs and any stall are in it), and the median of
single calls (`*_call_us_p50`: the typical call, robust to preemption on a loaded machine). Goal: record() <= 2x the bare gather + copy. Before timing, one run's archive is
read back and compared with the input rows (the benchmark exits 1 if they differ). Prints
`name: value` lines; a library that is not installed (or has no such device) prints its reason
and is skipped (exit 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.resources
import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mujoco
import numpy as np

N_DISTINCT = 5  # distinct input arrays cycled through (coprime with block_frames 16 and 64)


@dataclasses.dataclass(frozen=True)
class Layout:
    device: str
    nworld: int
    selected: int
    frames: int
    repeats: int
    block_frames: int | None
    ring_buffers: int
    chunk_frames: int
    libraries: tuple[str, ...]
    tmp: str | None


def parse(argv: list[str] | None = None) -> Layout:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu (default) or cuda: torch CUDA tensors, JAX arrays on its GPU")
    p.add_argument("--nworld", type=int, default=4096)
    p.add_argument("--selected", type=int, default=16, help="worlds recorded (spread evenly over the batch)")
    p.add_argument("--frames", type=int, default=300, help="recorded frames per timed run")
    p.add_argument("--repeats", type=int, default=7, help="interleaved runs of each variant")
    p.add_argument("--block-frames", type=int, default=None,
                   help="frames per block (default: the Recorder's, 64 in host memory and 16 on a GPU)")
    p.add_argument("--ring-buffers", type=int, default=3)
    p.add_argument("--chunk-frames", type=int, default=64)
    p.add_argument("--libraries", default="jax,torch", help="comma-separated: jax, torch")
    p.add_argument("--quick", action="store_true", help="nworld=64, 64 frames, one repeat (a smoke run)")
    p.add_argument("--tmp", default=None, help="scratch directory (default: the system's temp dir)")
    a = p.parse_args(argv)
    if a.quick:
        a.nworld, a.frames, a.repeats = 64, 64, 1
    libs = tuple(x.strip() for x in a.libraries.split(",") if x.strip())
    unknown = set(libs) - {"jax", "torch"}
    if unknown:
        p.error(f"unknown libraries {sorted(unknown)}")
    return Layout(a.device, a.nworld, min(a.selected, a.nworld), a.frames, a.repeats, a.block_frames,
                  a.ring_buffers, a.chunk_frames, libs, a.tmp)


# -- per-library setup: device arrays, the record() arguments and the baselines ----------------------

class Skip(Exception):
    """The library (or the requested device for it) is not available; the message says why."""


def setup_jax(lay: Layout, host_q: list[np.ndarray], host_v: list[np.ndarray], sel: np.ndarray) -> dict:
    if importlib.util.find_spec("jax") is None:
        raise Skip("jax is not installed")
    import jax
    import jax.numpy as jnp

    try:
        dev = jax.devices("gpu" if lay.device == "cuda" else "cpu")[0]
    except RuntimeError as exc:
        raise Skip(f"jax has no {lay.device} device ({str(exc).splitlines()[0]})") from None
    q = [jax.device_put(a, dev) for a in host_q]
    v = [jax.device_put(a, dev) for a in host_v]
    idx = jax.device_put(np.asarray(sel, np.int32), dev)
    jax.block_until_ready((q, v, idx))

    def take(a, b):
        return np.asarray(jnp.take(a, idx, axis=0)), np.asarray(jnp.take(b, idx, axis=0))

    gather = jax.jit(lambda i, a, b: (a[i], b[i]))

    def jit_take(a, b):
        x, y = gather(idx, a, b)
        return np.asarray(x), np.asarray(y)

    return {"q": q, "v": v, "device": f"{dev} ({dev.device_kind})", "version": f"jax {jax.__version__}",
            "baselines": {"take_asarray": take, "jit_asarray": jit_take},
            "sync": lambda: jax.block_until_ready((q, v))}


def setup_torch(lay: Layout, host_q: list[np.ndarray], host_v: list[np.ndarray], sel: np.ndarray) -> dict:
    if importlib.util.find_spec("torch") is None:
        raise Skip("torch is not installed")
    import torch

    if lay.device == "cuda" and not torch.cuda.is_available():
        raise Skip(f"torch {torch.__version__} has no CUDA device")
    dev = torch.device("cuda" if lay.device == "cuda" else "cpu")
    q = [torch.from_numpy(a).to(dev) for a in host_q]
    v = [torch.from_numpy(a).to(dev) for a in host_v]
    idx = torch.as_tensor(np.asarray(sel, np.int64), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()

    def take(a, b):
        return a.index_select(0, idx).cpu().numpy(), b.index_select(0, idx).cpu().numpy()

    if dev.type == "cuda":
        dev = f"{dev} ({torch.cuda.get_device_name(dev)})"
    return {"q": q, "v": v, "device": str(dev), "version": f"torch {torch.__version__}",
            "baselines": {"index_select_cpu": take}, "sync": sync}


SETUP = {"jax": setup_jax, "torch": setup_torch}
BASELINE_LABEL = {"take_asarray": "baseline take+asarray", "jit_asarray": "jitted gather+asarray",
                  "index_select_cpu": "baseline index_select+cpu"}


# -- timed runs ----------------------------------------------------------------------------------------

def run_record(lay: Layout, lib: dict, xml: Path, sel: np.ndarray, dt: float, path: Path) -> dict:
    """One Recorder, `frames` timed recording calls, then `frames` timed skipped calls, then flush."""
    import mjarchive

    q, v = lib["q"], lib["v"]
    rec = mjarchive.Recorder(path, xml, worlds=sel, output_fps=1.0 / dt, tracks=("qvel",),
                             block_frames=lay.block_frames, ring_buffers=lay.ring_buffers,
                             chunk_frames=lay.chunk_frames)
    t0 = time.perf_counter()
    assert rec.record(qpos=q[0], qvel=v[0], time=0.0)  # creates the archive, compiles the gather
    first = time.perf_counter() - t0
    lib["sync"]()
    gc.collect()
    calls, hits = timed_calls(lay, lib, lambda n, a, b: rec.record(qpos=a, qvel=b, time=n * dt))
    if not all(hits):
        raise AssertionError("record() skipped a frame: the cadence should record every call")
    total = sum(calls)
    perf = time.perf_counter
    t_last = lay.frames * dt
    skip_total = 0.0
    for n in range(lay.frames):
        a, b = q[n % N_DISTINCT], v[n % N_DISTINCT]
        t0 = perf()
        hit = rec.record(qpos=a, qvel=b, time=t_last)
        skip_total += perf() - t0
        if hit:
            raise AssertionError("a call without new time recorded a frame")
    t0 = perf()
    rec.flush()
    flush = perf() - t0
    rec.close()
    return {"per_frame": total / lay.frames, "call_median": statistics.median(calls), "skip": skip_total / lay.frames,
            "first": first, "flush": flush, "bytes_copied": rec.bytes_copied, "frames": rec.frames_recorded,
            "row_bytes": rec.row_bytes}


def run_baseline(lay: Layout, lib: dict, fn) -> tuple[float, float]:
    """(mean, median) seconds per frame of the baseline gather + host copy."""
    q, v = lib["q"], lib["v"]
    fn(q[0], v[0])  # warm up (compiles)
    lib["sync"]()
    gc.collect()
    calls, _ = timed_calls(lay, lib, lambda n, a, b: fn(a, b))
    return sum(calls) / lay.frames, statistics.median(calls)


def timed_calls(lay: Layout, lib: dict, call) -> tuple[list[float], list]:
    """Seconds of each of `lay.frames` calls `call(n, qpos, qvel)` (n from 1), and what each returned."""
    q, v = lib["q"], lib["v"]
    perf = time.perf_counter
    times, results = [], []
    for n in range(1, lay.frames + 1):
        a, b = q[n % N_DISTINCT], v[n % N_DISTINCT]
        t0 = perf()
        results.append(call(n, a, b))
        times.append(perf() - t0)
    return times, results


def check_archive(path: Path, sel: np.ndarray, host_q: list[np.ndarray], host_v: list[np.ndarray], frames: int) -> bool:
    """The archive written by run_record holds exactly the selected rows of the inputs, in order."""
    import mjarchive

    order = [n % N_DISTINCT for n in range(frames + 1)]
    with mjarchive.open(path) as archive:
        s = archive.select()
        return (archive.world_ids == tuple(sel.tolist()) and archive.n_frames == frames + 1
                and np.array_equal(s.qpos, np.stack([host_q[k][sel] for k in order]))
                and np.array_equal(s.qvel, np.stack([host_v[k][sel] for k in order])))


def main(argv: list[str] | None = None) -> int:
    lay = parse(argv)
    import mjarchive  # noqa: F401  (imported before timing)

    xml = Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))
    mjm = mujoco.MjModel.from_xml_path(str(xml))
    dt = float(mjm.opt.timestep)
    sel = np.unique(np.linspace(0, lay.nworld - 1, lay.selected).round().astype(np.int64))
    rng = np.random.default_rng(0)
    host_q = [rng.standard_normal((lay.nworld, mjm.nq)).astype(np.float32) for _ in range(N_DISTINCT)]
    host_v = [rng.standard_normal((lay.nworld, mjm.nv)).astype(np.float32) for _ in range(N_DISTINCT)]
    print(f"workload: humanoid nq={mjm.nq} nv={mjm.nv} nworld={lay.nworld} selected={len(sel)} "
          f"device={lay.device} frames={lay.frames} repeats={lay.repeats} block_frames={lay.block_frames} "
          f"ring_buffers={lay.ring_buffers} chunk_frames={lay.chunk_frames} dtype=float32")
    print(f"versions: python {sys.version.split()[0]}, numpy {np.__version__}, mujoco {mujoco.__version__}")

    libs: dict[str, dict] = {}
    for name in lay.libraries:
        try:
            libs[name] = SETUP[name](lay, host_q, host_v, sel)
        except Skip as exc:
            print(f"{name}.skipped: {exc}")
            continue
        print(f"{name}.version: {libs[name]['version']} on {libs[name]['device']}")
    if not libs:
        print("nothing to measure: every library was skipped")
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="bench_arrays_", dir=lay.tmp))
    ok = True
    try:
        # Correctness first: one (untimed) run per library, its archive read back and compared.
        for name, lib in libs.items():
            run_record(lay, lib, xml, sel, dt, tmp / f"{name}_check")
            good = check_archive(tmp / f"{name}_check", sel, host_q, host_v, lay.frames)
            print(f"check.{name}.archive_equals_input_rows: {good}")
            ok &= good
            shutil.rmtree(tmp / f"{name}_check", ignore_errors=True)
        if not ok:
            print("FAIL: the archive does not hold the input rows; not timing a broken path")
            return 1

        rec_runs: dict[str, list[dict]] = {n: [] for n in libs}
        base_runs: dict[str, dict[str, list[tuple[float, float]]]] = {n: {b: [] for b in lib["baselines"]} for n, lib in libs.items()}
        for i in range(lay.repeats):  # interleaved: every variant of every library once per repeat
            for name, lib in libs.items():
                rec_runs[name].append(run_record(lay, lib, xml, sel, dt, tmp / f"{name}_{i}"))
                shutil.rmtree(tmp / f"{name}_{i}", ignore_errors=True)
                for b, fn in lib["baselines"].items():
                    base_runs[name][b].append(run_baseline(lay, lib, fn))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    us = 1e6
    summary = []
    for name, lib in libs.items():
        runs = rec_runs[name]
        per = [r["per_frame"] for r in runs]
        best, med = min(per), statistics.median(per)
        print(f"{name}.record_us_best: {us * best:.1f}")
        print(f"{name}.record_us_median: {us * med:.1f}")
        call_p50 = statistics.median(r["call_median"] for r in runs)
        print(f"{name}.record_call_us_p50: {us * call_p50:.1f}")
        skip = min(r["skip"] for r in runs)
        print(f"{name}.skip_call_us_best: {us * skip:.1f}")
        print(f"{name}.skip_call_us_median: {us * statistics.median(r['skip'] for r in runs):.1f}")
        print(f"{name}.first_record_call_ms: {1e3 * statistics.median(r['first'] for r in runs):.1f}")
        print(f"{name}.flush_ms: {1e3 * statistics.median(r['flush'] for r in runs):.2f}")
        for b, runs_b in base_runs[name].items():
            times = [t for t, _ in runs_b]
            bb, bm = min(times), statistics.median(times)
            b_p50 = statistics.median(p for _, p in runs_b)
            print(f"{name}.{b}_us_best: {us * bb:.1f}")
            print(f"{name}.{b}_us_median: {us * bm:.1f}")
            print(f"{name}.record_vs_{b}_best: {best / bb:.2f}")
            print(f"{name}.record_vs_{b}_median: {med / bm:.2f}")
            print(f"{name}.{b}_call_us_p50: {us * b_p50:.1f}")
            print(f"{name}.record_vs_{b}_call_p50: {call_p50 / b_p50:.2f}")
            summary.append(f"{name} {lay.device} record per frame: {us * best:.1f} us (best), {BASELINE_LABEL[b]}: "
                           f"{us * bb:.1f} us, ratio {best / bb:.2f} (goal <= 2); medians {us * med:.1f} vs "
                           f"{us * bm:.1f} us, ratio {med / bm:.2f}; per-call p50 {us * call_p50:.1f} vs {us * b_p50:.1f} us, "
                           f"ratio {call_p50 / b_p50:.2f}")
        r = runs[-1]
        per_frame_bytes = r["bytes_copied"] / r["frames"]
        all_bytes = lay.nworld * r["row_bytes"]
        print(f"{name}.bytes_copied_per_frame: {per_frame_bytes:.0f}")
        print(f"{name}.bytes_copied_exact: {r['bytes_copied'] == r['frames'] * len(sel) * r['row_bytes']}")
        summary.append(f"{name} {lay.device} skipped call: {us * skip:.1f} us (best)")
        summary.append(f"{name} {lay.device} bytes copied per frame: {per_frame_bytes:.0f} (selected rows only) vs "
                       f"all worlds: {all_bytes} ({per_frame_bytes / all_bytes:.4f})")
    for line in summary:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
