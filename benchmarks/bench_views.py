"""Replay views benchmark ("Benchmarks" issue): what replay cameras, the scene layout and the HUD cost.

Workload: the mujoco_warp humanoid (nq=28, model cameras "back" and "side", both trackcom),
simulated with mj_step and recorded as float32 qpos at 30 fps (`bench_replay.make_archive`: one
world, a reset every 200 frames; `bench_replay.make_multi_archive`: 16 worlds). Printed as
`name: value` lines, every ratio against a baseline measured in the same run, steady state
(renderers, kernels and derived models built before timing), variants interleaved, best of
`--repeats` (wall time; process CPU time too where noted):

1. cameras, per frame: the model camera "side" vs `Camera.free(lookat=(0, 0, 1), distance=4)`,
   `Camera.track("torso", distance=3)`, `Camera.track("torso", distance=3, smoothing=0.2,
   yaw=True)` and a control view, `track_like_side` (a tracking camera looking the way "side"
   does), same size and quality:
   - `cpu`: `iter_frames` (MuJoCo OpenGL, quality="fast", 300 frames at 240x320); `cpu_render`:
     `render(workers=1, hud=None)` of the same (planning the tracking path and x264 included);
   - `warp`: `iter_frames(backend="warp:<device>")`, 96 frames at 96x128 (Views render through a
     camera added to a derived replay model, posed per batch);
   - controls without mjarchive (what each view's own pixels cost): `content.cpu`, a plain
     mujoco.Renderer posed as each camera is, cameras interleaved frame by frame; `content.warp`,
     a raw mujoco_warp loop with the model camera's pose overwritten by the view's;
     `overhead.<backend>.<camera>` = ratio / control ratio.
   Target: `ratio.<backend>.<camera>_vs_model` <= 1.05 (`target.camera_vs_model`).
2. scene layout: 16 worlds x 60 frames (240x320, CPU, fast): `render(layout="scene",
   cameras=[Camera.auto()])` (one image of 16 robots per frame) vs `render(layout="per-world",
   cameras=["side"])` (16 images per frame), both workers=1, hud=None; images/s of each, scene
   frames/s and `ratio.scene_frame_vs_16_per_world_frames` (time of one scene frame / time of
   the 16 per-world frames of the same instant). The scene model's compile
   (`scene.derived_model(bundle, plan.recipe(), trusted=False)`, in the compile sandbox) is timed
   apart, and so is the first scene render (which compiles it too). Then the same on Warp
   (16 x 24 frames at 96x128; `--no-warp-scene` skips it).
3. HUD: `render(hud=("world", "frame", "time"))` vs `hud=None` per frame, per-world (the 300-frame
   CPU workload, model camera) and in the scene (world IDs become 16 labels over the robots,
   frame and time the corner text).

Defaults take ~5 min on 2 cores; `--quick` (tiny sizes, few frames, one repeat) ~15 s and is what
tests/test_bench_smoke.py runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import mjarchive  # noqa: E402
from bench_replay import make_archive, make_multi_archive  # noqa: E402
from mjarchive import Camera  # noqa: E402

MODEL_CAMERA = "side"
TARGET = 1.05
HUD = ("world", "frame", "time")
#: The humanoid's "side" camera: trackcom, 3 m behind and 1 m above the centre of mass, looking
#: along +y, pitched down by atan(1/2) (xyaxes="1 0 0 0 1 2").
SIDE_DISTANCE, SIDE_ELEVATION = 3.162, -26.565


def cameras() -> dict[str, object]:
    """The compared cameras, by metric name; "model" is the baseline."""
    return {
        "model": MODEL_CAMERA,
        "free": Camera.free(lookat=(0, 0, 1), distance=4),
        "track": Camera.track("torso", distance=3),
        "track_smooth_yaw": Camera.track("torso", distance=3, smoothing=0.2, yaw=True),
        # The control: a tracking view that sees about what "side" sees (same direction, similar
        # distance), so its ratio is the mechanism's cost and the others' add their content's.
        "track_like_side": Camera.track("torso", distance=SIDE_DISTANCE, azimuth=90, elevation=SIDE_ELEVATION),
    }


@dataclasses.dataclass(frozen=True)
class Workload:
    cpu_frames: int = 300
    cpu_size: tuple[int, int] = (240, 320)
    quality: str = "fast"
    warp_frames: int = 96
    warp_size: tuple[int, int] = (96, 128)
    warp_device: str = "cpu"
    scene_worlds: int = 16
    scene_frames: int = 60
    scene_size: tuple[int, int] = (240, 320)
    warp_scene: bool = True
    warp_scene_frames: int = 24
    repeats: int = 3


def interleaved(variants: dict, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Best wall time and best process CPU time of each variant over `repeats` rounds, the variants
    run in turn each round. CPU time (this process's threads: Python, MuJoCo, llvmpipe, Warp's CPU
    kernels; not ffmpeg) is less sensitive than wall time to other jobs taking the cores."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for _ in range(repeats):
        for k, fn in variants.items():
            s, c = time.perf_counter(), time.process_time()
            fn()
            c, s = time.process_time() - c, time.perf_counter() - s
            wall[k], cpu[k] = min(wall.get(k, float("inf")), s), min(cpu.get(k, float("inf")), c)
    return wall, cpu


def drain(it) -> int:
    n = 0
    for _ in it:
        n += 1
    return n


def report_cameras(tag: str, wall: dict[str, float], cpu: dict[str, float] | None, n: int) -> dict[str, float]:
    """Print per-frame times and each camera's ratio to the model camera; returns the ratios."""
    for k in wall:
        extra = "" if cpu is None else f"  (process CPU {1e3 * cpu[k] / n:.3f})"
        print(f"{tag}.{k}_ms_per_frame: {1e3 * wall[k] / n:.3f}{extra}")
    for k in wall:
        if k != "model":
            print(f"ratio.{tag}.{k}_vs_model: {wall[k] / wall['model']:.3f}")
            if cpu is not None:
                print(f"ratio.{tag}.{k}_vs_model_cpu_time: {cpu[k] / cpu['model']:.3f}")
    return {k: wall[k] / wall["model"] for k in wall if k != "model"}


def _select(d: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in d.items() if k.startswith(prefix)}


# -- 1. cameras ---------------------------------------------------------------------------------------

def bench_cpu_cameras(w: Workload, archive: Path, tmp: Path) -> dict[str, dict[str, float]]:
    n = w.cpu_frames
    kw = dict(frames=slice(0, n), size=w.cpu_size, quality=w.quality)
    variants = {}
    for k, cam in cameras().items():
        variants[f"iter.{k}"] = lambda cam=cam: drain(mjarchive.iter_frames(archive, camera=cam, **kw))
        variants[f"render.{k}"] = lambda cam=cam, k=k: mjarchive.render(
            archive, tmp / f"cam-{k}", cameras=[cam], workers=1, progress=False, resume=False, hud=None, **kw)
    variants["iter.model"]()  # build the (shared, cached) renderer and start the encoder once, untimed
    variants["render.model"]()
    wall, cpu = interleaved(variants, w.repeats)
    print(f"cpu.cameras: {n} frames at {w.cpu_size[0]}x{w.cpu_size[1]} quality={w.quality}; cpu: iter_frames, "
          "cpu_render: render(workers=1, hud=None) incl. planning and x264")
    return {"cpu": report_cameras("cpu", _select(wall, "iter."), _select(cpu, "iter."), n),
            "cpu_render": report_cameras("cpu_render", _select(wall, "render."), _select(cpu, "render."), n)}


def camera_poses(archive: Path, n: int, size: tuple[int, int]):
    """(model, qpos (n, nq), views, poses) for the plain-renderer controls: each camera resolved as
    mjarchive resolves it (a model camera id or a `camera.View`) and, for a tracking view, its
    per-frame (lookat x, y, z, azimuth) from `camera.track_path`, as `render` plans it."""
    import mujoco

    from mjarchive.replay.views.camera import View, track_path
    from mjarchive.replay.plan import resolve_cameras

    with mjarchive.open(archive) as a:
        model = a.model()
        wid = a.world_ids[0]
        sel = a.select(worlds=[wid], frames=slice(0, n))
        qpos, times = sel.qpos[:, 0], sel.time
        starts = np.asarray([ep.start for ep in a.episodes(wid)])
        views = {k: resolve_cameras(a, model, [c], world_ids=[wid], frame_idx=np.arange(n), size=size)[0][0]
                 for k, c in cameras().items()}
    data = mujoco.MjData(model)
    xpos, xmat = np.empty((n, model.nbody, 3)), np.empty((n, model.nbody, 9))
    for i, q in enumerate(qpos):
        data.qpos[:] = q
        mujoco.mj_kinematics(model, data)
        xpos[i], xmat[i] = data.xpos, data.xmat
    episode = np.searchsorted(starts, np.arange(n), side="right") - 1
    poses = {}
    for k, v in views.items():
        if isinstance(v, View):
            poses[k] = (track_path(v, xpos[:, v.body], xmat[:, v.body], times, episode) if v.tracking else
                        np.tile([*v.lookat, v.azimuth], (n, 1)))
    return model, qpos, views, poses


def bench_cpu_content(w: Workload, archive: Path) -> dict[str, float]:
    """The control without mjarchive: a plain mujoco.Renderer at the same states, size and quality,
    posed as each camera is, the cameras taken in turn at every frame (rotating which goes first),
    so other jobs' noise falls on all of them alike: what each view's pixels cost the rasterizer."""
    import mujoco

    n = w.cpu_frames
    model, qpos, views, poses = camera_poses(archive, n, w.cpu_size)
    model.vis.quality.offsamples = 0  # quality="fast", as mjarchive sets it
    data = mujoco.MjData(model)
    r = mujoco.Renderer(model, *w.cpu_size)
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        r.scene.flags[flag] = 0
    targets = {}
    for k, v in views.items():
        if k in poses:
            c = targets[k] = mujoco.MjvCamera()
            c.type = mujoco.mjtCamera.mjCAMERA_FREE
            c.distance, c.elevation = v.distance, v.elevation
        else:
            targets[k] = v
    keys = list(targets)
    t = dict.fromkeys(keys, 0.0)
    for i, q in enumerate(qpos):
        data.qpos[:] = q
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        mujoco.mj_camlight(model, data)
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            if k in poses:
                targets[k].lookat[:], targets[k].azimuth = poses[k][i, :3], poses[k][i, 3]
            s = time.perf_counter()
            r.update_scene(data, camera=targets[k])
            r.render()
            t[k] += time.perf_counter() - s
    r.close()
    print(f"content.cpu: plain mujoco.Renderer, {n} frames at {w.cpu_size[0]}x{w.cpu_size[1]}, cameras interleaved "
          "frame by frame")
    return report_cameras("content.cpu", t, None, n)


def bench_warp_content(w: Workload, archive: Path) -> dict[str, float]:
    """The Warp control without mjarchive: a raw mujoco_warp loop (put_data nworld=B; kinematics,
    com_pos, camlight, refit_bvh, render of the model camera "side", read the packed pixels) in
    which a View's poses overwrite that camera's cam_xpos/cam_xmat after camlight, for every state
    of the batch: the same rays as mjarchive's added replay camera, without mjarchive."""
    import mujoco
    import mujoco_warp as mjw
    import warp as wp

    from mjarchive.replay.views.camera import view_pose

    n = w.warp_frames
    model, qpos, views, poses = camera_poses(archive, n, w.warp_size)
    cid = views["model"]
    batch = min(n, 256)
    h, wd = w.warp_size
    with wp.ScopedDevice(w.warp_device):
        m = mjw.put_model(model)
        d = mjw.put_data(model, mujoco.MjData(model), nworld=batch, nconmax=1, njmax=1)
        rc = mjw.create_render_context(model, nworld=batch, cam_res=(wd, h), render_rgb=True, render_depth=False,
                                       render_seg=False, cam_active=[cid], use_shadows=False, render_skybox=False)
    q32 = qpos.astype(np.float32)
    pose_of = {k: view_pose(p[:, :3], views[k].distance, p[:, 3], views[k].elevation) for k, p in poses.items()}

    def loop(k):
        with wp.ScopedDevice(w.warp_device):
            for s in range(0, n, batch):
                e = min(n, s + batch)
                q = np.empty((batch, model.nq), np.float32)
                q[:] = q32[e - 1]
                q[:e - s] = q32[s:e]
                d.qpos.assign(q)
                mjw.kinematics(m, d)
                mjw.com_pos(m, d)
                mjw.camlight(m, d)
                if k in pose_of:
                    pos, xmat = pose_of[k]
                    cam_xpos, cam_xmat = d.cam_xpos.numpy(), d.cam_xmat.numpy()
                    cam_xpos[:, cid], cam_xmat[:, cid] = pos[e - 1], xmat[e - 1]
                    cam_xpos[:e - s, cid], cam_xmat[:e - s, cid] = pos[s:e], xmat[s:e]
                    d.cam_xpos.assign(cam_xpos)
                    d.cam_xmat.assign(cam_xmat)
                mjw.refit_bvh(m, d, rc)
                mjw.render(m, d, rc)
                rc.rgb_data.numpy()

    variants = {k: (lambda k=k: loop(k)) for k in views}
    for fn in variants.values():
        fn()
    wall, cpu = interleaved(variants, max(w.repeats, 3))
    print(f"content.warp: raw mujoco_warp loop, {n} frames at {h}x{wd}, batch {batch}, device {w.warp_device}")
    return report_cameras("content.warp", wall, cpu, n)


def bench_warp_cameras(w: Workload, archive: Path) -> dict[str, float]:
    backend = f"warp:{w.warp_device}"
    n = w.warp_frames
    kw = dict(frames=slice(0, n), size=w.warp_size, quality=w.quality, backend=backend)
    variants = {k: (lambda cam=cam: drain(mjarchive.iter_frames(archive, camera=cam, **kw)))
                for k, cam in cameras().items()}
    t0 = time.perf_counter()
    for fn in variants.values():  # kernels, the derived model with its replay camera, render contexts
        fn()
    print(f"warp.cameras: {n} frames at {w.warp_size[0]}x{w.warp_size[1]} backend={backend} "
          f"quality={w.quality}, iter_frames (warm-up {time.perf_counter() - t0:.1f} s)")
    wall, cpu = interleaved(variants, w.repeats)
    return report_cameras("warp", wall, cpu, n)


# -- 2. scene layout ----------------------------------------------------------------------------------

def bench_scene(w: Workload, archive: Path, tmp: Path) -> None:
    from mjarchive.replay.views.scene import ScenePlan, derived_model

    nw, n = w.scene_worlds, w.scene_frames
    kw = dict(frames=slice(0, n), size=w.scene_size, quality=w.quality, workers=1, progress=False, resume=False)

    def scene(hud=None, out="scene"):
        return mjarchive.render(archive, tmp / out, layout="scene", cameras=[Camera.auto()], hud=hud, **kw)

    def per_world():
        return mjarchive.render(archive, tmp / "per-world", layout="per-world", cameras=[MODEL_CAMERA], hud=None, **kw)

    with mjarchive.open(archive) as a:
        plan = ScenePlan.grid(list(a.world_ids), 2.0)
        s = time.perf_counter()
        derived_model(a.bundle, plan.recipe(), trusted=False)
        compile_s = time.perf_counter() - s
    s = time.perf_counter()
    scene()  # compiles the scene model again (cached per thread from then on) and builds its renderer
    first_s = time.perf_counter() - s
    per_world()
    scene(HUD, "scene-hud")
    t, _ = interleaved({"scene": scene, "per_world": per_world,
                        "scene_hud": lambda: scene(HUD, "scene-hud")}, w.repeats)
    print(f"scene: {nw} worlds x {n} frames at {w.scene_size[0]}x{w.scene_size[1]} cpu quality={w.quality}")
    print(f"scene.compile_s: {compile_s:.3f}")
    print(f"scene.first_render_s: {first_s:.3f}  (includes compiling the scene model; steady state: "
          f"{t['scene']:.3f})")
    print(f"scene.images_per_s: {n / t['scene']:.2f}")
    print(f"scene.robots_per_s: {n * nw / t['scene']:.1f}")
    print(f"per_world.images_per_s: {n * nw / t['per_world']:.1f}")
    print(f"ratio.scene_frame_vs_16_per_world_frames: {t['scene'] / t['per_world']:.3f}")
    print(f"ratio.scene_image_vs_per_world_image: {(t['scene'] / n) / (t['per_world'] / (n * nw)):.2f}")
    print(f"hud.scene_ms_per_frame: {1e3 * t['scene_hud'] / n:.3f}  (vs {1e3 * t['scene'] / n:.3f} without)")
    print(f"hud.scene_extra_ms_per_frame: {1e3 * (t['scene_hud'] - t['scene']) / n:.3f}")
    print(f"ratio.hud_vs_none.scene: {t['scene_hud'] / t['scene']:.3f}")


def bench_warp_scene(w: Workload, archive: Path, tmp: Path) -> None:
    backend = f"warp:{w.warp_device}"
    nw, n = w.scene_worlds, w.warp_scene_frames
    kw = dict(frames=slice(0, n), size=w.warp_size, quality=w.quality, backend=backend, hud=None, workers=1,
              progress=False, resume=False)

    def scene():
        return mjarchive.render(archive, tmp / "warp-scene", layout="scene", cameras=[Camera.auto()], **kw)

    def per_world():
        return mjarchive.render(archive, tmp / "warp-per-world", layout="per-world", cameras=[MODEL_CAMERA], **kw)

    s = time.perf_counter()
    scene()  # the scene model (sandboxed compile), put_model, kernels, render context
    first_s = time.perf_counter() - s
    per_world()
    t, _ = interleaved({"scene": scene, "per_world": per_world}, w.repeats)
    print(f"warp_scene: {nw} worlds x {n} frames at {w.warp_size[0]}x{w.warp_size[1]} backend={backend}, "
          "render(workers=1, hud=None)")
    print(f"warp_scene.first_render_s: {first_s:.2f}  (steady state: {t['scene']:.2f})")
    print(f"warp_scene.images_per_s: {n / t['scene']:.2f}")
    print(f"warp_per_world.images_per_s: {n * nw / t['per_world']:.1f}")
    print(f"ratio.warp_scene_frame_vs_16_per_world_frames: {t['scene'] / t['per_world']:.3f}")


# -- 3. HUD -------------------------------------------------------------------------------------------

def bench_hud(w: Workload, archive: Path, tmp: Path) -> None:
    n = w.cpu_frames
    kw = dict(frames=slice(0, n), size=w.cpu_size, quality=w.quality, cameras=[MODEL_CAMERA], workers=1,
              progress=False, resume=False)
    variants = {"none": lambda: mjarchive.render(archive, tmp / "hud-none", hud=None, **kw),
                "hud": lambda: mjarchive.render(archive, tmp / "hud", hud=HUD, **kw)}
    for fn in variants.values():
        fn()
    t, _ = interleaved(variants, w.repeats)
    print(f"hud: render(hud={HUD}) vs hud=None, {n} frames at {w.cpu_size[0]}x{w.cpu_size[1]}, per-world, "
          f"camera {MODEL_CAMERA!r}")
    print(f"hud.per_world_ms_per_frame: {1e3 * t['hud'] / n:.3f}  (vs {1e3 * t['none'] / n:.3f} without)")
    print(f"hud.per_world_extra_ms_per_frame: {1e3 * (t['hud'] - t['none']) / n:.3f}")
    print(f"ratio.hud_vs_none.per_world: {t['hud'] / t['none']:.3f}")


def summarize(ratios: dict[str, dict[str, float]]) -> None:
    """The worst camera ratio of mjarchive's paths, and what mjarchive adds to each view's own cost:
    its ratio divided by the same view's ratio in the plain-renderer control of that backend."""
    for tag, control in (("cpu", "content.cpu"), ("warp", "content.warp")):
        if tag in ratios and control in ratios:
            for k, r in ratios[tag].items():
                print(f"overhead.{tag}.{k}: {r / ratios[control][k]:.3f}")
    paths = [(r, f"{tag}.{k}") for tag in ("cpu", "cpu_render", "warp") for k, r in ratios.get(tag, {}).items()]
    asked = [x for x in paths if not x[1].endswith("track_like_side")]
    if asked:
        r, name = max(asked)
        print(f"ratio.worst_camera_vs_model: {r:.3f}  ({name})")
        print(f"target.camera_vs_model_met: {'PASS' if r <= TARGET else 'FAIL'}")


def _size(s: str) -> tuple[int, int]:
    h, w = s.lower().split("x")
    return int(h), int(w)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Workload()
    p.add_argument("--cpu-frames", type=int, default=d.cpu_frames)
    p.add_argument("--cpu-size", type=_size, default=d.cpu_size, help="HxW")
    p.add_argument("--warp-frames", type=int, default=d.warp_frames)
    p.add_argument("--warp-size", type=_size, default=d.warp_size, help="HxW")
    p.add_argument("--device", default=d.warp_device, help="Warp device: cpu or cuda")
    p.add_argument("--scene-worlds", type=int, default=d.scene_worlds)
    p.add_argument("--scene-frames", type=int, default=d.scene_frames)
    p.add_argument("--scene-size", type=_size, default=d.scene_size, help="HxW")
    p.add_argument("--no-warp-scene", dest="warp_scene", action="store_false", help="skip the Warp scene run")
    p.add_argument("--warp-scene-frames", type=int, default=d.warp_scene_frames)
    p.add_argument("--repeats", type=int, default=d.repeats)
    p.add_argument("--only", choices=["cameras", "warp", "scene", "hud"], action="append")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few frames, one repeat (the smoke test)")
    p.add_argument("--lp-threads", type=int, default=1,
                   help="Mesa llvmpipe raster threads (0: Mesa's default, one per core)")
    p.add_argument("--tmp", help="scratch directory (default: a fresh temporary one)")
    args = p.parse_args()
    if args.lp_threads:  # before any GL context
        os.environ["LP_NUM_THREADS"] = str(args.lp_threads)
    if args.quick:
        w = Workload(cpu_frames=24, cpu_size=(48, 64), warp_frames=16, warp_size=(24, 32), scene_worlds=4,
                     scene_frames=8, scene_size=(48, 64), warp_scene=args.warp_scene, warp_scene_frames=4, repeats=1)
    else:
        w = Workload(args.cpu_frames, args.cpu_size, "fast", args.warp_frames, args.warp_size, args.device,
                     args.scene_worlds, args.scene_frames, args.scene_size, args.warp_scene, args.warp_scene_frames,
                     args.repeats)
    only = set(args.only or ["cameras", "warp", "scene", "hud"])
    from mjarchive.replay.backends.warp import unavailable

    if unavailable():  # e.g. mujoco-warp older than replay needs: the CPU sections still run
        print(f"warp.skipped: {unavailable()}")
        only.discard("warp")
        w = dataclasses.replace(w, warp_scene=False)
    print(f"workload: {w}  LP_NUM_THREADS={os.environ.get('LP_NUM_THREADS', 'default')}  "
          f"cpus={os.cpu_count()}  load={os.getloadavg()[0]:.1f}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        tmp = Path(d)
        if only & {"cameras", "warp", "hud"}:
            archive = make_archive(tmp / "one.mjarchive", max(w.cpu_frames, w.warp_frames))
            ratios: dict[str, dict[str, float]] = {}
            if "cameras" in only:
                ratios.update(bench_cpu_cameras(w, archive, tmp))
                ratios["content.cpu"] = bench_cpu_content(w, archive)
            if "warp" in only:
                ratios["warp"] = bench_warp_cameras(w, archive)
                ratios["content.warp"] = bench_warp_content(w, archive)
            summarize(ratios)
            if "hud" in only:
                bench_hud(w, archive, tmp)
        if "scene" in only:
            multi = make_multi_archive(tmp / "multi.mjarchive", w.scene_worlds,
                                       max(w.scene_frames, w.warp_scene_frames))
            if w.warp_scene:  # first: on a GPU machine whose OpenGL fails, the CPU scene would stop the script
                bench_warp_scene(w, multi, tmp)
            bench_scene(w, multi, tmp)
    print(f"target.camera_vs_model: {TARGET}")
    print(f"total_s: {time.perf_counter() - start:.1f}")


if __name__ == "__main__":
    main()
