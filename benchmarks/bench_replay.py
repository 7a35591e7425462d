"""Replay benchmark (issue #5): mjarchive.render / iter_frames against raw loops and a flygym-style baseline.

Workload: the humanoid (nq=28, trackcom camera "back"), one world simulated with mj_step and recorded
as float32 qpos at 30 fps. Printed as `name: value` lines, ratios against baselines measured in the
same run:

1. per-worker throughput: `iter_frames` (replay only) and `render(workers=1)` (replay + mp4 encode)
   vs a raw loop (set qpos, mj_kinematics + mj_comPos + mj_camlight, update_scene, render);
2. `render(workers=2)` vs `render(workers=1)`, quality="fast";
3. vs a flygym-style baseline (one process, every frame kept in RAM, encoded at the end): wall
   time and peak RSS of fresh child processes at two video lengths;
4. Warp backend vs a raw mujoco_warp loop (put_data nworld=B; kinematics, com_pos, camlight,
   refit_bvh, render, read rgb) over the same frames, on Warp's "cpu" device or `--device cuda`;
5. Warp packing (`--only warp_pack`): 16 worlds x 24 frames, (world, frame) states of several worlds
   packed into each launch (`iter_frames`) vs one world per launch (the per-world units rendered one
   by one, each with nworld = its 24 frames, as before packing).

Defaults take ~3-5 min on 2 cores. For the issue's full sizes:
`--rss-frames 1000,10000 --rss-size 480x640` (the baseline then needs ~9 GB of RAM).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

import mjarchive  # noqa: E402

CAMERA = "back"


@dataclasses.dataclass(frozen=True)
class Workload:
    frames: int = 300  # throughput and worker-scaling runs
    size: tuple[int, int] = (240, 320)
    quality: str = "fast"
    rss_frames: tuple[int, int] = (200, 1000)
    rss_size: tuple[int, int] = (240, 320)
    warp_frames: int = 192
    warp_size: tuple[int, int] = (96, 128)
    warp_device: str = "cpu"
    repeats: int = 2
    pack_worlds: int = 16
    pack_frames: int = 24


def humanoid_xml() -> Path:
    return Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))


def make_archive(path: Path, frames: int) -> Path:
    """Simulate one humanoid world (random initial velocity) and record `frames` frames."""
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml()))
    d = mujoco.MjData(model)
    rng = np.random.default_rng(0)
    d.qvel[:] = rng.normal(scale=0.5, size=model.nv)
    steps = max(1, round(1 / 30 / model.opt.timestep))
    with mjarchive.create(path, humanoid_xml(), n_worlds=1, overwrite=True) as w:
        for f in range(frames):
            for _ in range(steps):
                mujoco.mj_step(model, d)
            if f % 200 == 199:  # keep the humanoid in view: a new episode every 200 frames
                mujoco.mj_resetData(model, d)
                d.qvel[:] = rng.normal(scale=0.5, size=model.nv)
            w.append(f / 30, d.qpos[None], reset=np.array([f % 200 == 199]))
    return path


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def raw_cpu_loop(archive: Path, frames: int, size, quality: str, video: Path | None = None):
    """The reference: set up a plain renderer (untimed); returns the loop over the archived qpos to time."""
    with mjarchive.open(archive) as a:
        model = a.model()
    if quality == "fast":
        model.vis.quality.offsamples = 0
    d = mujoco.MjData(model)
    cam = model.camera(CAMERA).id
    r = mujoco.Renderer(model, *size)
    if quality == "fast":
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
            r.scene.flags[flag] = 0

    def loop():
        with mjarchive.open(archive) as a:
            qpos = a.select(frames=slice(0, frames)).qpos[:, 0]
            fps = a.output_fps or 30.0
        writer = None
        if video is not None:  # the same x264 settings as mjarchive's VideoWriter
            import imageio_ffmpeg

            writer = imageio_ffmpeg.write_frames(
                f"file:{video}", (size[1], size[0]), fps=fps, codec="libx264", pix_fmt_in="rgb24",
                pix_fmt_out="yuv420p", quality=None, macro_block_size=1, ffmpeg_log_level="error",
                output_params=["-crf", "23", "-f", "mp4"])
            writer.send(None)
        for q in qpos:
            d.qpos[:] = q
            mujoco.mj_kinematics(model, d)
            mujoco.mj_comPos(model, d)
            mujoco.mj_camlight(model, d)
            r.update_scene(d, camera=cam)
            rgb = r.render()
            if writer is not None:
                writer.send(rgb)
        if writer is not None:
            writer.close()

    return loop


def bench_throughput(w: Workload, archive: Path, tmp: Path) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    n = w.frames
    kw = dict(frames=slice(0, n), size=w.size, quality=w.quality)
    # Steady state everywhere: the raw renderer is built before timing, ours is cached per process
    # after its first run, and a kept pool's workers keep theirs. Variants are interleaved and the
    # best of `repeats` is reported, since other jobs on the machine add noise.
    raw_loop = raw_cpu_loop(archive, n, w.size, w.quality)
    (tmp / "raw").mkdir(exist_ok=True)
    raw_video = raw_cpu_loop(archive, n, w.size, w.quality, video=tmp / "raw" / "raw.mp4")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        variants = {
            "raw": raw_loop,
            "raw_video": raw_video,
            "iter": lambda: sum(1 for _ in mjarchive.iter_frames(archive, camera=CAMERA, **kw)),
            "w1": lambda: mjarchive.render(archive, tmp / "w1", cameras=CAMERA, workers=1, progress=False,
                                           resume=False, **kw),
            "w2_cold": lambda: mjarchive.render(archive, tmp / "w2", cameras=CAMERA, workers=2, progress=False,
                                                resume=False, **kw),
            "w2_pool": lambda: mjarchive.render(archive, tmp / "w2p", cameras=CAMERA, executor=pool, workers=2,
                                                progress=False, resume=False, **kw),
        }
        variants["iter"]()
        variants["w2_pool"]()  # start the pool's workers and build their renderers, untimed
        t: dict[str, float] = {}
        for _ in range(w.repeats):
            for k, v in variants.items():
                t[k] = min(t.get(k, float("inf")), best(v, 1))
    print(f"raw_renderer_loop_fps: {n / t['raw']:.1f}")
    print(f"iter_frames_fps: {n / t['iter']:.1f}")
    print(f"render_workers1_fps: {n / t['w1']:.1f}")
    print(f"render_workers2_fps: {n / t['w2_cold']:.1f}  (its own warm pool, kept from the previous call; "
          "cold starts: bench_render_pool.py)")
    print(f"render_workers2_kept_pool_fps: {n / t['w2_pool']:.1f}")
    print(f"ratio_iter_frames_vs_raw: {t['raw'] / t['iter']:.2f}")
    print(f"raw_renderer_loop_with_video_fps: {n / t['raw_video']:.1f}")
    print(f"ratio_render_workers1_vs_raw: {t['raw'] / t['w1']:.2f}  (includes mp4 encoding; the raw loop does not)")
    print(f"ratio_render_workers1_vs_raw_with_video: {t['raw_video'] / t['w1']:.2f}  (both write the mp4; goal >= 0.95)")
    print(f"ratio_workers2_vs_workers1: {t['w1'] / t['w2_cold']:.2f}")
    print(f"ratio_workers2_kept_pool_vs_workers1: {t['w1'] / t['w2_pool']:.2f}  (os.cpu_count()={os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f})")


# -- peak RSS: every variant runs in a fresh child process ------------------------------------------

def child(kind: str, archive: str, frames: int, size: tuple[int, int], out: str) -> dict:
    t = time.perf_counter()
    if kind in ("ours", "ours_w2"):
        mjarchive.render(archive, out, frames=slice(0, frames), cameras=CAMERA, size=size, quality="fast",
                         workers=1 if kind == "ours" else 2, progress=False, resume=False)
    else:  # flygym style: every frame in a list, then one encode at the end
        import imageio

        kept = [rgb for _, _, rgb in mjarchive.iter_frames(archive, frames=slice(0, frames), camera=CAMERA,
                                                           size=size, quality="fast")]
        with mjarchive.open(archive) as a:
            fps = a.output_fps
        imageio.mimwrite(Path(out) / "baseline.mp4", kept, fps=fps, codec="libx264", macro_block_size=1, quality=None,
                         output_params=["-crf", "23"])  # the same encoder settings as mjarchive's VideoWriter
    wall = time.perf_counter() - t
    return {"wall": wall, "rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """This process's peak RSS. VmHWM, since Linux carries ru_maxrss over from the forking parent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_child(kind: str, archive: Path, frames: int, size, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "--child", kind, "--archive", str(archive), "--child-frames", str(frames),
           "--child-size", f"{size[0]}x{size[1]}", "--child-out", str(out)]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def bench_rss(w: Workload, archive: Path, tmp: Path) -> None:
    short, long = w.rss_frames
    res: dict = {}
    for _ in range(w.repeats):  # interleaved, best wall time and worst peak RSS of the repeats
        for n in (short, long):
            for k in ("ours", "ours_w2", "flygym"):
                r = run_child(k, archive, n, w.rss_size, tmp / f"{k}{n}")
                old = res.setdefault((k, n), r)
                res[k, n] = {"wall": min(old["wall"], r["wall"]), "rss_mib": max(old["rss_mib"], r["rss_mib"])}
    for (k, n), r in res.items():
        print(f"{k}_{n}_frames_wall_s: {r['wall']:.1f}")
        print(f"{k}_{n}_frames_peak_rss_mib: {r['rss_mib']:.0f}")
    print(f"ours_rss_growth_mib ({short}->{long} frames at {w.rss_size[0]}x{w.rss_size[1]}): "
          f"{res['ours', long]['rss_mib'] - res['ours', short]['rss_mib']:.0f}")
    print(f"flygym_rss_growth_mib: {res['flygym', long]['rss_mib'] - res['flygym', short]['rss_mib']:.0f}")
    print(f"ratio_speed_ours_vs_flygym_{long}: {res['flygym', long]['wall'] / res['ours', long]['wall']:.2f}")
    print(f"ratio_speed_ours_workers2_vs_flygym_{long}: "
          f"{res['flygym', long]['wall'] / res['ours_w2', long]['wall']:.2f}  (peak RSS: parent process only)")


# -- Warp ------------------------------------------------------------------------------------------------

def raw_warp_loop(archive: Path, frames: int, size, device: str, batch: int):
    """Set up a raw mujoco_warp renderer (untimed); returns the loop over the frames to time."""
    import mujoco_warp as mjw
    import warp as wp

    with mjarchive.open(archive) as a:
        model = a.model()
    with wp.ScopedDevice(device):
        m = mjw.put_model(model)
        d = mjw.put_data(model, mujoco.MjData(model), nworld=batch, nconmax=1, njmax=1)
        rc = mjw.create_render_context(model, nworld=batch, cam_res=(size[1], size[0]), render_rgb=True,
                                       render_depth=False, render_seg=False, cam_active=[CAMERA], use_shadows=False)

    def loop():
        with mjarchive.open(archive) as a:  # read the qpos like a replay would
            qpos = a.select(frames=slice(0, frames)).qpos[:, 0].astype(np.float32)
        with wp.ScopedDevice(device):
            for s in range(0, frames, batch):
                q = np.empty((batch, model.nq), np.float32)
                q[:] = qpos[min(s + batch, frames) - 1]
                q[: min(batch, frames - s)] = qpos[s:s + batch]
                d.qpos.assign(q)
                mjw.kinematics(m, d)
                mjw.com_pos(m, d)
                mjw.camlight(m, d)
                mjw.refit_bvh(m, d, rc)
                mjw.render(m, d, rc)
                rc.rgb_data.numpy()

    return loop


def bench_warp(w: Workload, archive: Path) -> None:
    from mjarchive.replay.backends.warp import batch_size

    backend = f"warp:{w.warp_device}"
    n = w.warp_frames
    with mjarchive.open(archive) as a:
        batch = min(batch_size(a.model(), w.warp_size, w.warp_device), 256, n)

    def ours():
        for _ in mjarchive.iter_frames(archive, frames=slice(0, n), camera=CAMERA, size=w.warp_size,
                                       backend=backend, quality="fast", warp_batch=batch):  # the raw loop's
            pass

    loop = raw_warp_loop(archive, n, w.warp_size, w.warp_device, batch)
    loop()  # compile kernels once, untimed
    ours()  # and build our cached renderer, untimed: both are measured in steady state
    raw = best(loop, w.repeats)
    mine = best(ours, w.repeats)
    print(f"warp_device: {w.warp_device}  batch: {batch}  size: {w.warp_size[0]}x{w.warp_size[1]}")
    print(f"warp_raw_loop_fps: {n / raw:.1f}")
    print(f"warp_iter_frames_fps: {n / mine:.1f}")
    print(f"ratio_warp_ours_vs_raw: {raw / mine:.2f}  (steady state: contexts built before timing)")


def make_multi_archive(path: Path, worlds: int, frames: int) -> Path:
    """Simulate `worlds` humanoids (different random initial velocities), record `frames` frames."""
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml()))
    rng = np.random.default_rng(1)
    datas = [mujoco.MjData(model) for _ in range(worlds)]
    for d in datas:
        d.qvel[:] = rng.normal(scale=0.5, size=model.nv)
    steps = max(1, round(1 / 30 / model.opt.timestep))
    with mjarchive.create(path, humanoid_xml(), n_worlds=worlds, overwrite=True) as w:
        for f in range(frames):
            for d in datas:
                for _ in range(steps):
                    mujoco.mj_step(model, d)
            w.append(f / 30, np.stack([d.qpos for d in datas]))
    return path


def bench_warp_pack(w: Workload, tmp: Path) -> None:
    """The same per-world units, rendered packed (`_unit_results`: several worlds per launch,
    nworld = the default batch) and one unit per launch (`render_unit`, nworld = frames per unit)."""
    from mjarchive.replay.backends.warp import BACKEND as WARP
    from mjarchive.replay.render import RenderUnit, _unit_results, render_unit

    archive = make_multi_archive(tmp / "multi.mjarchive", w.pack_worlds, w.pack_frames)
    backend = f"warp:{w.warp_device}"
    n = w.pack_worlds * w.pack_frames
    with mjarchive.open(archive) as a:
        model = a.model()
        world_ids = list(a.world_ids)
    cam = model.camera(CAMERA).id
    # the batch render() plans for this selection:
    batch = WARP.states_per_launch(backend, model, w.warp_size, requested=None, copies=1, n_states=n,
                                   budget=WARP.unit_bytes)

    def units(warp_batch: int) -> list:
        return [RenderUnit(str(archive), None, wid, cam, tuple(range(w.pack_frames)), w.warp_size, "fast", backend,
                           warp_batch=warp_batch) for wid in world_ids]

    def packed():
        for _ in _unit_results(units(batch), None, 1):
            pass

    def one_world():  # one world per launch: what planning did before packing (nworld = frames per unit)
        for u in units(w.pack_frames):
            render_unit(u)

    packed()  # build both cached renderers (and compile kernels) untimed
    one_world()
    t_one, t_packed = [], []
    for _ in range(w.repeats):  # interleaved
        t_one.append(best(one_world, 1))
        t_packed.append(best(packed, 1))
    print(f"warp_pack: {w.pack_worlds} worlds x {w.pack_frames} frames  size: {w.warp_size[0]}x{w.warp_size[1]}  "
          f"device: {w.warp_device}  packed batch: {batch}")
    print(f"warp_one_world_batches_fps: {n / min(t_one):.1f}")
    print(f"warp_packed_fps: {n / min(t_packed):.1f}")
    print(f"ratio_warp_packed_vs_one_world: {min(t_one) / min(t_packed):.2f}")


def _size(s: str) -> tuple[int, int]:
    h, w = s.lower().split("x")
    return int(h), int(w)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=Workload.frames)
    p.add_argument("--size", type=_size, default=Workload.size, help="HxW, e.g. 480x640")
    p.add_argument("--rss-frames", default="200,1000", help="two video lengths, e.g. 1000,10000")
    p.add_argument("--rss-size", type=_size, default=Workload.rss_size)
    p.add_argument("--warp-frames", type=int, default=Workload.warp_frames)
    p.add_argument("--warp-size", type=_size, default=Workload.warp_size)
    p.add_argument("--device", default="cpu", help="Warp device: cpu or cuda")
    p.add_argument("--repeats", type=int, default=Workload.repeats)
    p.add_argument("--lp-threads", type=int, default=1,
                   help="Mesa llvmpipe raster threads per process (0: Mesa's default, one per core); 1 makes "
                        "`workers` the only parallelism, as on a GPU driver")
    p.add_argument("--pack-worlds", type=int, default=Workload.pack_worlds)
    p.add_argument("--pack-frames", type=int, default=Workload.pack_frames)
    p.add_argument("--only", choices=["throughput", "rss", "warp", "warp_pack"], action="append")
    p.add_argument("--child", choices=["ours", "ours_w2", "flygym"], help=argparse.SUPPRESS)
    p.add_argument("--archive", help=argparse.SUPPRESS)
    p.add_argument("--child-frames", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-size", type=_size, help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.lp_threads:  # before any GL context: software GL threads per process (workers inherit it)
        os.environ["LP_NUM_THREADS"] = str(args.lp_threads)
    if args.child:
        print(json.dumps(child(args.child, args.archive, args.child_frames, args.child_size, args.child_out)))
        return
    rss_frames = tuple(int(x) for x in args.rss_frames.split(","))
    w = Workload(args.frames, args.size, "fast", rss_frames, args.rss_size, args.warp_frames, args.warp_size,
                 args.device, args.repeats, args.pack_worlds, args.pack_frames)
    only = set(args.only or ["throughput", "rss", "warp", "warp_pack"])
    print(f"workload: {w}  LP_NUM_THREADS={os.environ.get('LP_NUM_THREADS', 'default')}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if only == {"warp_pack"}:
            bench_warp_pack(w, tmp)
            return
        archive = make_archive(tmp / "humanoid.mjarchive", max(w.frames, max(w.rss_frames), w.warp_frames))
        if "throughput" in only:
            bench_throughput(w, archive, tmp)
        if "rss" in only:
            bench_rss(w, archive, tmp)
        if "warp" in only:
            bench_warp(w, archive)
        if "warp_pack" in only:
            bench_warp_pack(w, tmp)


if __name__ == "__main__":
    main()
