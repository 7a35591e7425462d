"""Format 1.1 costs, measured in one run: model variants while recording, overlays while replaying.

    python benchmarks/bench_variants.py                         # Warp "cpu" device, 4096 worlds
    python benchmarks/bench_variants.py --device cuda --nworld 4096
    python benchmarks/bench_variants.py --quick                 # small smoke run (CI)

Prints `name: value` lines:
- record: caller-thread time of `Recorder.record()` per recorded frame on a MuJoCo Warp Data whose
  Model carries a batched `geom_rgba` (one row per world), with `variant_fields=("geom_rgba",)`
  vs without, at reset fractions 0, 1 % and 2 % per frame, and over a short and a twice as long
  run: the variant cost follows resetting worlds × field size and not frames (events stored are
  reported too). Runs interleaved, best of N.
- overlays: CPU replay frames/s of the same archive drawn with 64 overlay primitives per frame
  (32 points and 32 arrows) vs without overlays (goal >= 0.8x), at a small size with
  quality="fast" and at twice that size with quality="full" (render's default quality).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import shutil
import sys
import tempfile
import time
from pathlib import Path

import mujoco
import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
    tmp: str | None
    device: str
    nworld: int
    frames: int
    repeats: int
    render_frames: int
    size: tuple[int, int]


def parse() -> Layout:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help='Warp device: "cpu" (default) or "cuda"')
    p.add_argument("--nworld", type=int, default=4096)
    p.add_argument("--frames", type=int, default=64, help="recorded frames of the short run (the long run: 2x)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--render-frames", type=int, default=60)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    p.add_argument("--tmp", default=None, help="scratch folder (default: a new temporary one; removed after)")
    a = p.parse_args()
    if a.quick:
        return Layout(a.tmp, a.device, 256, 16, 1, 6, (48, 64))
    return Layout(a.tmp, a.device, a.nworld, a.frames, a.repeats, a.render_frames, (240, 320))


def humanoid() -> Path:
    return Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))


def bench_record(lay: Layout, tmp: Path) -> None:
    import warp as wp

    wp.config.quiet = True
    import mujoco_warp as mjw

    import mjarchive

    xml = humanoid()
    mjm = mujoco.MjModel.from_xml_path(str(xml))
    device = wp.get_device(lay.device)
    rng = np.random.default_rng(0)
    print(f"workload.record: humanoid ngeom={mjm.ngeom} nworld={lay.nworld} (all recorded) device={device} "
          f"frames={lay.frames} and {2 * lay.frames}")
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=lay.nworld)
        colours = rng.uniform(0, 1, (lay.nworld, mjm.ngeom, 4)).astype(np.float32)
        colours[..., 3] = 1
        m.geom_rgba = wp.array(colours, dtype=wp.vec4)
        masks = {}
        for fraction in (0.0, 0.01, 0.02):
            k = int(round(fraction * lay.nworld))
            host = [np.isin(np.arange(lay.nworld), rng.choice(lay.nworld, k, replace=False)) for _ in range(8)]
            masks[fraction] = [(h, wp.array(h, dtype=wp.bool)) for h in host]

        frame_dt = 7 * mjm.opt.timestep  # > 1/30 s: every call records a frame
        # Correctness first: every recorded (world, frame) replays with the colours the device held.
        truth, path = [], tmp / "check"
        with mjarchive.Recorder(path, xml, output_fps=30.0, sim_model=m, variant_fields=("geom_rgba",),
                                block_frames=4) as chk:
            for n in range(24):
                host, reset = masks[0.02][n % 8]
                colours[host, :, :3] = rng.uniform(0, 1, (int(host.sum()), mjm.ngeom, 3))
                m.geom_rgba.assign(colours)
                chk.record(d, reset=reset if n else None, time=n * frame_dt)
                truth.append(colours.copy())
        with mjarchive.open(path) as a:
            ok = a.n_frames == len(truth) and all(np.array_equal(a.variant(w, f)["geom_rgba"], truth[f][w])
                                                   for f in range(0, len(truth), 5) for w in range(lay.nworld))
        print(f"check.values_in_force_equal_device_values: {ok}")

        def run(variants: bool, fraction: float, frames: int, i: int) -> tuple[float, int]:
            kwargs = dict(sim_model=m, variant_fields=("geom_rgba",)) if variants else {}
            path = tmp / f"rec_{variants}_{fraction}_{frames}_{i}"
            rec = mjarchive.Recorder(path, xml, output_fps=30.0, chunk_frames=64, **kwargs)
            rec.record(d, time=0.0)  # creates the archive and device buffers: not timed
            wp.synchronize_device(device)
            spent = 0.0
            for n in range(1, frames + 1):
                host, reset = masks[fraction][n % 8]
                if host.any():  # the training loop re-randomizes the resetting worlds (not timed)
                    colours[host, :, :3] = rng.uniform(0, 1, (int(host.sum()), mjm.ngeom, 3))
                    m.geom_rgba.assign(colours)
                    wp.synchronize_device(device)
                t0 = time.perf_counter()
                rec.record(d, reset=reset, time=n * frame_dt)
                spent += time.perf_counter() - t0
            t0 = time.perf_counter()  # the last blocks' hand-over (their captured rows' copy), not the commit
            rec._gatherer.drain_all()
            spent += time.perf_counter() - t0
            rec.close()
            events = 0
            if variants:
                with mjarchive.open(path) as a:
                    events = a.variant_event_counts["geom_rgba"]
            shutil.rmtree(path, ignore_errors=True)
            return spent / frames, events

        cases = [(v, f, n) for f in (0.0, 0.01, 0.02) for n in (lay.frames, 2 * lay.frames) for v in (False, True)]
        best: dict[tuple, float] = {}
        events: dict[tuple, int] = {}
        run(True, 0.01, 4, -1)  # warm up kernels and caches
        for i in range(lay.repeats):  # interleaved: every case once per round
            for case in cases:
                t, e = run(*case, i)
                best[case] = min(best.get(case, np.inf), t)
                events[case] = e
                v, f, n = case  # as it goes: a time limit keeps what ran
                print(f"progress.round_{i}.reset_{f:.0%}.frames_{n}.{'variants' if v else 'plain'}: "
                      f"{t * 1e6:.0f} us/frame, events {e}", flush=True)
    row = mjm.ngeom * 16
    exact = all(events[(True, f, n)] == lay.nworld + int(round(f * lay.nworld)) * n
                for f in (0.0, 0.01, 0.02) for n in (lay.frames, 2 * lay.frames))
    print(f"check.events_one_per_resetting_world: {exact}")
    for f in (0.0, 0.01, 0.02):
        for n in (lay.frames, 2 * lay.frames):
            plain, var = best[(False, f, n)], best[(True, f, n)]
            resetting = int(round(f * lay.nworld))
            print(f"record.reset_{f:.0%}.frames_{n}: {var * 1e6:.0f} us/frame with variants vs {plain * 1e6:.0f} "
                  f"without ({var / plain:.2f}x); events {events[(True, f, n)]} "
                  f"(expected {lay.nworld} + {resetting}/frame × {n}), {resetting * row} B of values/frame")
    for f in (0.01, 0.02):
        short = best[(True, f, lay.frames)] - best[(False, f, lay.frames)]
        long = best[(True, f, 2 * lay.frames)] - best[(False, f, 2 * lay.frames)]
        print(f"record.variant_cost_per_frame.reset_{f:.0%}: {short * 1e6:.1f} us ({lay.frames} frames) vs "
              f"{long * 1e6:.1f} us ({2 * lay.frames} frames): ratio {long / short if short > 0 else float('nan'):.2f} "
              "(1: independent of the frame count)")


def bench_overlays(lay: Layout, tmp: Path) -> None:
    import mjarchive

    xml = humanoid()
    mjm = mujoco.MjModel.from_xml_path(str(xml))
    data = mujoco.MjData(mjm)
    n = lay.render_frames
    qpos = np.tile(mjm.qpos0, (n, 2, 1))
    qpos[:, :, 2] += 0.05 * np.sin(np.arange(n) / 5)[:, None]
    paths = {}
    for kind in ("plain", "overlays"):
        path = tmp / f"replay_{kind}"
        overlays = {"points": mjarchive.Overlay.points(radius=0.03, max_count=32),
                    "arrows": mjarchive.Overlay.arrows(width=0.01, max_count=32)} if kind == "overlays" else None
        with mjarchive.create(path, xml, n_worlds=2, overlays=overlays) as w:
            for f in range(n):
                value = None
                if overlays:
                    data.qpos[:] = qpos[f, 0]
                    mujoco.mj_kinematics(mjm, data)
                    centres = np.resize(data.xpos[1:], (32, 3)) + [0, 0, 0.3]
                    value = {"points": np.stack([centres, centres]),
                             "arrows": np.stack([np.hstack([centres, centres + [0.2, 0, 0]])] * 2)}
                w.append((f + 1) / 30, qpos[f], overlays=value)
        paths[kind] = path
    for size, quality in ((lay.size, "fast"), ((2 * lay.size[0], 2 * lay.size[1]), "full")):
        print(f"workload.overlays: humanoid, 2 worlds x {n} frames, {size[0]}x{size[1]} quality={quality}, CPU, "
              "1 worker, 64 primitives per frame and world")
        best = {}
        for i in range(-1, lay.repeats):  # round -1 warms up (compiles, GL context): not counted
            for kind, path in paths.items():
                out = tmp / f"out_{kind}_{i}"
                t0 = time.perf_counter()
                mjarchive.render(path, out, size=size, workers=1, quality=quality, progress=False, resume=False,
                                 cameras=["auto"])
                if i >= 0:
                    best[kind] = min(best.get(kind, np.inf), time.perf_counter() - t0)
                shutil.rmtree(out, ignore_errors=True)
        fps = {k: 2 * n / t for k, t in best.items()}
        tag = f"{size[0]}x{size[1]}_{quality}"
        print(f"overlays.replay_fps.{tag}: {fps['overlays']:.1f} with 64 primitives vs {fps['plain']:.1f} without")
        print(f"overlays.ratio.{tag}: {fps['overlays'] / fps['plain']:.2f} (goal >= 0.8)")


def main() -> None:
    lay = parse()
    tmp = Path(tempfile.mkdtemp(prefix="bench_variants_", dir=lay.tmp))
    try:
        bench_record(lay, tmp)
        bench_overlays(lay, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
