"""Recorder overhead on a MuJoCo Warp step loop; ratios measured in one run.

    python benchmarks/bench_recorder.py                      # Warp "cpu" device, nworld=256
    python benchmarks/bench_recorder.py --device cuda --nworld 4096 --steps 2000

Prints `name: value` lines:
- step loop with vs without the recorder (slowdown; goal <= 5%), runs interleaved, medians;
- training-thread time in record() per recorded frame vs a plain device→host copy of the selected
  worlds' bytes (goal <= 2x), and vs the all-worlds readback approach (copy every world, index);
- host bytes copied per frame vs the all-worlds readback.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mujoco
import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
    device: str
    nworld: int
    selected: int
    steps: int
    output_fps: float
    repeats: int
    block_frames: int


def parse() -> Layout:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help='Warp device: "cpu" (default) or "cuda" / "cuda:0"')
    p.add_argument("--nworld", type=int, default=256)
    p.add_argument("--selected", type=int, default=16, help="worlds recorded (spread evenly over the batch)")
    p.add_argument("--steps", type=int, default=150, help="mjw.step calls per timed run")
    p.add_argument("--fps", type=float, default=30.0)
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each variant (median reported)")
    p.add_argument("--block-frames", type=int, default=16)
    a = p.parse_args()
    return Layout(a.device, a.nworld, min(a.selected, a.nworld), a.steps, a.fps, a.repeats, a.block_frames)


def main() -> None:
    lay = parse()
    import warp as wp

    wp.config.quiet = True
    import mujoco_warp as mjw

    import mjarchive

    xml = Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))
    mjm = mujoco.MjModel.from_xml_path(str(xml))
    device = wp.get_device(lay.device)
    sel = np.linspace(0, lay.nworld - 1, lay.selected).round().astype(int)
    sel = np.unique(sel)
    tmp = Path(tempfile.mkdtemp(prefix="bench_recorder_"))
    print(f"workload: humanoid nq={mjm.nq} nworld={lay.nworld} selected={len(sel)} device={device} "
          f"steps={lay.steps} fps={lay.output_fps} timestep={mjm.opt.timestep}")

    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        m.opt.warn_overflow = 0
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=lay.nworld)
        ctrl = wp.array(np.random.default_rng(0).uniform(-0.3, 0.3, (lay.nworld, mjm.nu)).astype(np.float32))
        wp.copy(d.ctrl, ctrl)
        mjw.step(m, d)  # compile / warm up
        wp.synchronize_device(device)

        # Correctness on this device first: the archive must equal hand copies of the selected worlds.
        copies, resets = [], np.zeros(lay.nworld, bool)
        resets[sel[-1]] = True
        with mjarchive.Recorder(tmp / "check", xml, worlds=sel, output_fps=lay.output_fps,
                                block_frames=4, ring_buffers=2) as chk:
            for n in range(60):
                mjw.step(m, d)
                reset = wp.array(resets, dtype=wp.bool) if n == 20 else None
                if chk.record(d, reset=reset):
                    copies.append(d.qpos.numpy()[sel])
        with mjarchive.open(tmp / "check") as archive:
            ok = (archive.world_ids == tuple(sel.tolist()) and archive.n_frames == len(copies)
                  and np.array_equal(archive.select().qpos, np.array(copies))
                  and len(archive.episodes(int(sel[-1]))) == 2
                  and (len(sel) == 1 or len(archive.episodes(int(sel[0]))) == 1))
        print(f"check.archive_equals_device_copies: {ok}")
        print(f"check.bytes_copied_exact: {chk.bytes_copied == len(copies) * len(sel) * mjm.nq * 4}")

        record_times: list[float] = []
        first_call: list[float] = []
        call_times: dict[bool, list[float]] = {True: [], False: []}

        def run(variant: str, i: int) -> tuple[float, int, object]:
            rec = None
            if variant != "plain":
                rec = mjarchive.Recorder(tmp / f"{variant}_{i}", xml, worlds=sel, output_fps=lay.output_fps,
                                         block_frames=lay.block_frames, chunk_frames=64)
            t_sim = float(d.time.numpy()[0])
            if rec is not None:  # first call: creates the archive and device buffers (reported apart)
                f0 = time.perf_counter()
                rec.record(d)
                first_call.append(time.perf_counter() - f0)
            wp.synchronize_device(device)
            t0, c0 = time.perf_counter(), time.process_time()
            in_record = 0.0
            for n in range(lay.steps):
                mjw.step(m, d)
                if rec is not None:
                    r0 = time.perf_counter()
                    if variant == "recorder_host_time":
                        hit = rec.record(d, time=t_sim + (n + 1) * mjm.opt.timestep)
                    else:
                        hit = rec.record(d)
                    dt = time.perf_counter() - r0
                    in_record += dt
                    call_times[hit].append(dt)
            if rec is not None:
                rec.flush()
            wp.synchronize_device(device)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            if rec is not None:
                record_times.append(in_record / max(rec.frames_recorded - 1, 1))
                rec.close()
            return elapsed, cpu, (rec.frames_recorded if rec else 0), rec

        variants = ["plain", "recorder", "recorder_host_time"]
        times: dict[str, list[float]] = {v: [] for v in variants}
        cpu_times: dict[str, list[float]] = {v: [] for v in variants}
        per_frame: dict[str, list[float]] = {v: [] for v in variants[1:]}
        calls: dict[str, dict[bool, list[float]]] = {v: {True: [], False: []} for v in variants[1:]}
        frames, last_rec = 0, None
        for i in range(lay.repeats):
            for v in variants:
                record_times.clear()
                call_times = calls.get(v, {True: [], False: []})
                elapsed, cpu, n_frames, rec = run(v, i)
                times[v].append(elapsed)
                cpu_times[v].append(cpu)
                if rec is not None:
                    per_frame[v].append(record_times[0])
                    frames, last_rec = n_frames, rec

        # Baselines for one frame's copy, same device and buffers sizes.
        row = last_rec.row_bytes // 4
        k = len(sel)
        packed = wp.zeros((k, row), dtype=wp.float32)
        host = wp.zeros((k, row), dtype=wp.float32, device="cpu", pinned=device.is_cuda)
        n_rep = 200

        def bench(fn) -> float:
            fn()
            wp.synchronize_device(device)
            t0 = time.perf_counter()
            for _ in range(n_rep):
                fn()
            wp.synchronize_device(device)
            return (time.perf_counter() - t0) / n_rep

        def memcpy_selected() -> None:  # the bare minimum: one copy of the selected bytes
            wp.copy(host, packed)
            if device.is_cuda:
                wp.synchronize_device(device)

        def readback_all() -> None:  # copy every world to the host, then keep the selected ones
            q = d.qpos.numpy()  # a zero-copy view on the "cpu" device: copy it, as a GPU readback would
            (q if device.is_cuda else q.copy())[sel].copy()

        # record() alone, every call recording (host time): the training thread's cost per frame.
        iso = mjarchive.Recorder(tmp / "isolated", xml, worlds=sel, output_fps=1e6, block_frames=lay.block_frames,
                                 chunk_frames=64)
        iso.record(d, time=0.0)
        iso_calls = []
        for n in range(1, 401):
            r0 = time.perf_counter()
            iso.record(d, time=n * mjm.opt.timestep)
            iso_calls.append(time.perf_counter() - r0)
        skip_calls = []
        for n in range(401, 801):  # output_fps=1e6 records every call; now calls that record nothing
            iso._cadence._next_k = 10**9
            r0 = time.perf_counter()
            iso.record(d, time=n * mjm.opt.timestep)
            skip_calls.append(time.perf_counter() - r0)
        iso.close()
        t_skip = statistics.median(skip_calls)
        t_iso = statistics.median(iso_calls)
        t_iso_mean = statistics.fmean(iso_calls)

        t_memcpy = bench(memcpy_selected)
        t_readall = bench(readback_all)

    plain = statistics.median(times["plain"])
    for v in variants[1:]:
        print(f"{v}.step_loop_s: {statistics.median(times[v]):.4f}")
    print(f"plain.step_loop_s: {plain:.4f}")
    print(f"plain.step_ms: {1e3 * plain / lay.steps:.3f}")
    print(f"frames_per_run: {frames}")
    plain_cpu = statistics.median(cpu_times["plain"])
    print(f"plain.step_loop_cpu_s: {plain_cpu:.4f}")
    for v in variants[1:]:
        print(f"{v}.slowdown_pct: {100 * (statistics.median(times[v]) / plain - 1):.2f}")
        print(f"{v}.cpu_slowdown_pct: {100 * (statistics.median(cpu_times[v]) / plain_cpu - 1):.2f}")
    for v in variants[1:]:
        t = statistics.median(per_frame[v])
        print(f"{v}.record_us_per_frame: {1e6 * t:.1f}")
        print(f"{v}.recording_call_median_us: {1e6 * statistics.median(calls[v][True]):.1f}")
        print(f"{v}.skipping_call_median_us: {1e6 * statistics.median(calls[v][False]):.1f}")
        print(f"{v}.record_vs_memcpy_selected: {t / t_memcpy:.2f}")
        print(f"{v}.record_vs_readback_all: {t / t_readall:.2f}")
    print(f"isolated.record_us_median: {1e6 * t_iso:.1f}")
    print(f"isolated.record_us_mean: {1e6 * t_iso_mean:.1f}")
    print(f"isolated.skipping_call_us_median: {1e6 * t_skip:.1f}")
    print(f"isolated.record_vs_memcpy_selected: {t_iso / t_memcpy:.2f}")
    print(f"isolated.record_vs_readback_all: {t_iso / t_readall:.2f}")
    print(f"first_record_call_ms: {1e3 * statistics.median(first_call):.1f}")
    print(f"memcpy_selected_us: {1e6 * t_memcpy:.1f}")
    print(f"readback_all_us: {1e6 * t_readall:.1f}")
    bytes_frame = last_rec.bytes_copied / max(last_rec.frames_recorded, 1)
    print(f"host_bytes_per_frame: {bytes_frame:.0f}")
    print(f"readback_all_bytes_per_frame: {lay.nworld * mjm.nq * 4}")
    print(f"host_bytes_vs_readback_all: {bytes_frame / (lay.nworld * mjm.nq * 4):.4f}")
    ring = 3 * lay.block_frames * k * row * 4
    print(f"ring_host_bytes: {ring}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("MUJOCO_GL", "egl")
    sys.exit(main())
