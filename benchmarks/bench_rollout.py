"""record_rollout() of scanned (steps, worlds, ...) JAX arrays vs a bare gather + host copy of the same rows.

    python benchmarks/bench_rollout.py                       # JAX's default device, nworld=1024, 16 selected
    python benchmarks/bench_rollout.py --quick               # seconds (tests/test_bench_smoke.py)

Workload: the mujoco_warp humanoid (nq=28, nv=27; timestep 0.005 s), a rollout chunk of `--steps`
steps × `--nworld` worlds as JAX arrays `qpos` (T, W, 28) and a `qvel` track (T, W, 27), float32,
as `jax.lax.scan` returns them (Playground, MJX); `--selected` worlds spread evenly over the batch,
recorded at `--fps` (30: a frame every 6.67 steps, 30 of 200 steps). Each timed run hands over
`--chunks` chunks, cycling through a few precomputed distinct device arrays, so producing them is
not timed; the time array is a host (T,) array from a step counter (what `PlaygroundRecorder`
passes).

What is timed (time.perf_counter() around each call, summed per run, divided by the frames):

* `record_rollout`: `rec.record_rollout(qpos=..., qvel=..., time=...)`: the cadence over the
  chunk's steps, the gather of the due steps × selected worlds, the host copy and the hand-off of
  the block to the writer (validation, cast, finiteness check; compression and I/O run on the
  writer's thread, competing for the cores: `chunk_frames=64`, so chunks fill during the run).
  The first call (creates the archive) is not timed; `close()` is not timed.
* `record_rollout_reset`: the same plus a (T, W) boolean JAX reset mask (`done`), of which the
  selected worlds' columns are copied.
* baselines, the same rows of the same arrays, due steps known in advance (`jit_gather`): a jitted
  `(a[d[:, None], s], b[d[:, None], s])` on the arrays' device, then `np.asarray` of both (the
  brief's bare gather + host copy); `numpy_take`: on JAX's CPU, NumPy advanced indexing of
  zero-copy views `np.asarray(a)[d[:, None], s]` (the cheapest host gather there is).

Variants run interleaved `--repeats` times; reported: best and median over runs of the time per
recorded frame. Goal: record_rollout <= 1.5x jit_gather (best of runs). Before timing, one run's
archive is read back and compared with the input rows (exit 1 if they differ). Prints `name: value`
lines; without JAX it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.resources
import importlib.util
import math
import shutil
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import mujoco
import numpy as np

N_DISTINCT = 3  # distinct rollout chunks cycled through


@dataclasses.dataclass(frozen=True)
class Layout:
    nworld: int
    selected: int
    steps: int
    chunks: int
    fps: float
    repeats: int
    chunk_frames: int
    tmp: str | None


def parse(argv: list[str] | None = None) -> Layout:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nworld", type=int, default=1024)
    p.add_argument("--selected", type=int, default=16, help="worlds recorded (spread evenly over the batch)")
    p.add_argument("--steps", type=int, default=200, help="steps per rollout chunk (the scan length)")
    p.add_argument("--chunks", type=int, default=20, help="chunks handed over per timed run")
    p.add_argument("--fps", type=float, default=30.0, help="output_fps (frames per second of simulated time)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved runs of each variant")
    p.add_argument("--chunk-frames", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="nworld=64, 50 steps, 4 chunks, 2 repeats (a smoke run)")
    p.add_argument("--tmp", default=None, help="scratch directory (default: the system's temp dir)")
    a = p.parse_args(argv)
    if a.quick:
        a.nworld, a.steps, a.chunks, a.repeats = 64, 50, 4, 2
    return Layout(a.nworld, min(a.selected, a.nworld), a.steps, a.chunks, a.fps, a.repeats, a.chunk_frames, a.tmp)


def due_steps(lay: Layout, dt: float) -> list[np.ndarray]:
    """Per chunk, the rows (0-based in the chunk) that are frames. The untimed first call records
    step 0 (frame 0); chunk c's rows are steps c·T + 1 ... (c + 1)·T; frame k shows the first step
    at or after its render time k / fps: step ceil(k / (fps · dt))."""
    per_frame = Fraction(1) / (Fraction(lay.fps) * Fraction(dt).limit_denominator(10**6))
    total, due, k = lay.steps * lay.chunks, set(), 1
    while (n := math.ceil(k * per_frame)) <= total:
        due.add(n)
        k += 1
    return [np.asarray(sorted(n - 1 - c * lay.steps for n in due if c * lay.steps < n <= (c + 1) * lay.steps),
                       np.int64) for c in range(lay.chunks)]


def main(argv: list[str] | None = None) -> int:
    lay = parse(argv)
    if importlib.util.find_spec("jax") is None:
        print("jax.skipped: jax is not installed")
        return 0
    import jax
    import jax.numpy as jnp

    import mjarchive

    xml = Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))
    mjm = mujoco.MjModel.from_xml_path(str(xml))
    dt = float(mjm.opt.timestep)
    sel = np.unique(np.linspace(0, lay.nworld - 1, lay.selected).round().astype(np.int64))
    dev = jax.devices()[0]
    rng = np.random.default_rng(0)
    host_q = [rng.standard_normal((lay.steps, lay.nworld, mjm.nq)).astype(np.float32) for _ in range(N_DISTINCT)]
    host_v = [rng.standard_normal((lay.steps, lay.nworld, mjm.nv)).astype(np.float32) for _ in range(N_DISTINCT)]
    host_r = [rng.random((lay.steps, lay.nworld)) < 0.01 for _ in range(N_DISTINCT)]
    q = [jax.device_put(a, dev) for a in host_q]
    v = [jax.device_put(a, dev) for a in host_v]
    r = [jax.device_put(a, dev) for a in host_r]
    jax.block_until_ready((q, v, r))
    due = due_steps(lay, dt)
    frames = sum(len(d) for d in due)
    print(f"workload: humanoid nq={mjm.nq} nv={mjm.nv} nworld={lay.nworld} selected={len(sel)} steps={lay.steps} "
          f"chunks={lay.chunks} fps={lay.fps} frames_per_run={frames} repeats={lay.repeats} dtype=float32")
    print(f"versions: python {sys.version.split()[0]}, numpy {np.__version__}, mujoco {mujoco.__version__}, "
          f"jax {jax.__version__} on {dev}")

    def run_record(path: Path, with_reset: bool) -> tuple[float, int, int, int]:
        rec = mjarchive.Recorder(path, xml, worlds=sel, output_fps=lay.fps, tracks=("qvel",),
                                 chunk_frames=lay.chunk_frames)
        rec.record_rollout(qpos=q[0][:1], qvel=v[0][:1], time=np.zeros(1))  # creates the archive: untimed
        gc.collect()
        total, n = 0.0, 0
        for c in range(lay.chunks):
            times = (c * lay.steps + np.arange(1, lay.steps + 1)) * dt
            a, b, m = q[c % N_DISTINCT], v[c % N_DISTINCT], r[c % N_DISTINCT] if with_reset else None
            t0 = time.perf_counter()
            n += rec.record_rollout(qpos=a, qvel=b, time=times, reset=m)
            total += time.perf_counter() - t0
        rec.close()
        return total, n, rec.bytes_copied, rec.row_bytes

    gather = jax.jit(lambda a, b, d, s: (a[d[:, None], s[None, :]], b[d[:, None], s[None, :]]))
    sel32 = jnp.asarray(sel.astype(np.int32))
    due32 = [jnp.asarray(d.astype(np.int32)) for d in due]

    def run_jit_gather() -> float:
        total = 0.0
        for c in range(lay.chunks):
            a, b, d = q[c % N_DISTINCT], v[c % N_DISTINCT], due32[c]
            t0 = time.perf_counter()
            x, y = gather(a, b, d, sel32)
            np.asarray(x), np.asarray(y)
            total += time.perf_counter() - t0
        return total

    def run_numpy_take() -> float:
        total = 0.0
        for c in range(lay.chunks):
            a, b, d = q[c % N_DISTINCT], v[c % N_DISTINCT], due[c]
            t0 = time.perf_counter()
            np.asarray(a)[d[:, None], sel[None, :]], np.asarray(b)[d[:, None], sel[None, :]]
            total += time.perf_counter() - t0
        return total

    for c in range(lay.chunks):  # compile the gather for each chunk's number of due steps
        jax.block_until_ready(gather(q[c % N_DISTINCT], v[c % N_DISTINCT], due32[c], sel32))
    baselines = {"jit_gather": run_jit_gather}
    if dev.platform == "cpu":
        baselines["numpy_take"] = run_numpy_take

    tmp = Path(tempfile.mkdtemp(prefix="bench_rollout_", dir=lay.tmp))
    try:
        # Correctness first: one untimed run, read back and compared with the input rows (with a reset
        # mask, so JAX has compiled its gather of the mask's columns before the timed runs).
        _, n, copied, row_bytes = run_record(tmp / "check", with_reset=True)
        with mjarchive.open(tmp / "check") as archive:
            s = archive.select(frames=slice(1, None))
            want_q = np.concatenate([host_q[c % N_DISTINCT][d][:, sel] for c, d in enumerate(due)])
            want_v = np.concatenate([host_v[c % N_DISTINCT][d][:, sel] for c, d in enumerate(due)])
            good = (n == frames and archive.n_frames == frames + 1 and np.array_equal(s.qpos, want_q)
                    and np.array_equal(s.qvel, want_v))
        print(f"check.archive_equals_input_rows: {good}")
        print(f"check.bytes_copied_exact: {copied == (frames + 1) * len(sel) * row_bytes}")
        if not good:
            print("FAIL: the archive does not hold the input rows at the cadence's steps; not timing a broken path")
            return 1
        shutil.rmtree(tmp / "check", ignore_errors=True)

        runs: dict[str, list[float]] = {"record_rollout": [], "record_rollout_reset": [], **{b: [] for b in baselines}}
        for i in range(lay.repeats):  # interleaved: every variant once per repeat
            for variant in ("record_rollout", "record_rollout_reset"):
                total, n, _, _ = run_record(tmp / f"{variant}_{i}", with_reset=variant.endswith("reset"))
                assert n == frames, (variant, n, frames)
                runs[variant].append(total)
                shutil.rmtree(tmp / f"{variant}_{i}", ignore_errors=True)
            for name, fn in baselines.items():
                runs[name].append(fn())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    us = 1e6 / frames
    best = {name: min(t) for name, t in runs.items()}
    med = {name: statistics.median(t) for name, t in runs.items()}
    for name in runs:
        print(f"{name}.us_per_frame_best: {us * best[name]:.2f}")
        print(f"{name}.us_per_frame_median: {us * med[name]:.2f}")
    for variant in ("record_rollout", "record_rollout_reset"):
        for b in baselines:
            print(f"ratio.{variant}_vs_{b}_best: {best[variant] / best[b]:.2f}")
            print(f"ratio.{variant}_vs_{b}_median: {med[variant] / med[b]:.2f}")
    ratio = best["record_rollout"] / best["jit_gather"]
    print(f"target.record_rollout_vs_jit_gather_le_1.5: {'PASS' if ratio <= 1.5 else 'FAIL'}")
    print(f"bytes_copied_per_frame: {len(sel) * row_bytes}")
    print(f"record_rollout per frame: {us * best['record_rollout']:.1f} us (best), bare jitted gather + copy: "
          f"{us * best['jit_gather']:.1f} us, ratio {ratio:.2f} (goal <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
