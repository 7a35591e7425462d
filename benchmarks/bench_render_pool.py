"""Short and long renders (issue #16): time to the first frame and total time of `render` with the
default worker count vs `workers=1` vs `workers=2`, and `workers=1` vs a raw `mujoco.Renderer` loop
that writes the same videos.

Workload: the mujoco_warp humanoid, 2 worlds simulated with `mj_step` (different initial
velocities) and recorded at 30 fps; both worlds rendered from camera `back` at 120×160,
quality="fast", one mp4 per world, for each of `--frames` (frames per world).

Every measurement runs in a fresh child process (imports untimed) that calls `render` twice: the
first call is "cold" (model compile, GL context, and for a pool its workers' start-up), the
second "warm" (what a notebook or a training loop that renders repeatedly sees: cached renderer,
kept pool). The first frame's time is when `on_frame` first sees a frame (the first frame handed
to the encoder). `raw`: the archive's qpos read once, then per world set qpos, `mj_kinematics` +
`mj_comPos` + `mj_camlight`, `update_scene`, `render`, each frame sent to the same x264 writer
(cold: the model compiled and the renderer made inside the timing; warm: kept). Systems
interleaved, best of `--repeats`; the 2-core machine is shared, so expect ±20% between runs.

    python benchmarks/bench_render_pool.py                      # 48, 480 frames per world
    python benchmarks/bench_render_pool.py --frames 4800 --repeats 1 --cold-only   # ~8 min
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

SIZE = (120, 160)
CAMERA = "back"
CONFIGS = ("raw", "w1", "default", "w2")


def _raw_setup(archive: str, n: int):
    import mujoco

    import mjarchive

    with mjarchive.open(archive) as a:
        model = a.model()
        qpos = a.select(frames=slice(0, n)).qpos
        fps = a.output_fps or 30.0
    model.vis.quality.offsamples = 0
    data = mujoco.MjData(model)
    r = mujoco.Renderer(model, *SIZE)
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        r.scene.flags[flag] = 0
    return model, data, r, qpos, fps, model.camera(CAMERA).id


def _raw_loop(setup, out: Path, marks: list) -> None:
    import imageio_ffmpeg
    import mujoco

    model, d, r, qpos, fps, cam = setup
    for w in range(qpos.shape[1]):
        gen = imageio_ffmpeg.write_frames(  # the settings of mjarchive's VideoWriter
            f"file:{out / f'raw-{w}.mp4'}", (SIZE[1], SIZE[0]), fps=fps, codec="libx264", pix_fmt_in="rgb24",
            pix_fmt_out="yuv420p", quality=None, macro_block_size=1, ffmpeg_log_level="error",
            output_params=["-crf", "23", "-f", "mp4"])
        gen.send(None)
        for q in qpos[:, w]:
            d.qpos[:] = q
            mujoco.mj_kinematics(model, d)
            mujoco.mj_comPos(model, d)
            mujoco.mj_camlight(model, d)
            r.update_scene(d, camera=cam)
            gen.send(r.render())
            if not marks:
                marks.append(time.perf_counter())
        gen.close()


def child(kind: str, archive: str, n: int, out: str, calls: tuple[str, ...]) -> dict:
    import mjarchive

    res = {}
    setup = None
    for call in calls:
        marks: list[float] = []
        t = time.perf_counter()
        if kind == "raw":
            if setup is None:
                setup = _raw_setup(archive, n)
            _raw_loop(setup, Path(out), marks)
        else:
            workers = {"w1": 1, "w2": 2, "default": None}[kind]
            mjarchive.render(archive, out, frames=slice(0, n), cameras=CAMERA, size=SIZE, quality="fast",
                             workers=workers, progress=False, resume=False,
                             on_frame=lambda w, f, rgb: marks.append(time.perf_counter()) if not marks else None)
        res[call] = {"first": marks[0] - t, "total": time.perf_counter() - t}
    return res


def make_archive(path: Path, frames: int) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_replay import make_multi_archive

    return make_multi_archive(path, 2, frames)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", default="48,480", help="frames per world, comma-separated (e.g. 48,480,4800)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--cold-only", action="store_true", help="one call per child (long videos)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--archive", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    calls = ("cold",) if args.cold_only else ("cold", "warm")
    if args.child:
        print(json.dumps(child(args.child, args.archive, args.n, args.out, calls)))
        return
    lengths = [int(x) for x in args.frames.split(",")]
    configs = args.configs.split(",")
    print(f"workload: humanoid, 2 worlds, {SIZE[0]}x{SIZE[1]} quality=fast, frames per world {lengths}, "
          f"best of {args.repeats}, os.cpu_count()={os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        archive = make_archive(tmp / "h2.mjarchive", max(lengths))
        best: dict = {}
        for _ in range(args.repeats):
            for n in lengths:
                for kind in configs:  # interleaved
                    out = tmp / f"{kind}{n}"
                    out.mkdir(exist_ok=True)
                    cmd = [sys.executable, __file__, "--child", kind, "--archive", str(archive), "--n", str(n),
                           "--out", str(out)] + (["--cold-only"] if args.cold_only else [])
                    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
                    for call, v in r.items():
                        for metric, x in v.items():
                            key = (n, kind, call, metric)
                            best[key] = min(best.get(key, float("inf")), x)
    for n in lengths:
        for call in calls:
            for kind in configs:
                print(f"{n}_frames_{call}_{kind}: first {best[n, kind, call, 'first']:.2f} s  "
                      f"total {best[n, kind, call, 'total']:.2f} s")
            if "w1" not in configs:
                continue
            w1 = best[n, "w1", call, "total"]
            for kind in configs:
                if kind == "raw":  # goal: >= 0.95
                    print(f"ratio_{n}_{call}_w1_vs_raw: {best[n, 'raw', call, 'total'] / w1:.2f}")
                elif kind != "w1":  # goal for default: >= 1.0 (never slower than one worker)
                    print(f"ratio_{n}_{call}_{kind}_vs_w1: {w1 / best[n, kind, call, 'total']:.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
