"""Open + select benchmark (issue 16): the first and warm `open` + `select` of one world, and the
metadata bytes one commit writes.

Workloads (16 worlds x 600 frames at 30 fps, float32, written by `mjarchive.create` + `append`):
- humanoid (mujoco_warp test_data, nq = 28, a 1.3 KB root document);
- floppy (mujoco_warp test_data/flex, nq = 1153 flex vertices: a big manifest, 60 KB of joints).

Rows, each the best of N, the systems interleaved in one run:
- `first`: in a fresh process, after `import mjarchive` (not timed), `mjarchive.open(path)` then
  `select(worlds=3).qpos`; vs the flygym baseline, `np.load` of an `.npz` holding that world's qpos
  and time, after `import numpy`; and vs the code of the last commit (`git archive HEAD`, the
  pre-issue-16 reader) on the same archive, when git is available;
- `warm`: the same in one process, repeated;
- `commit bytes`: metadata bytes written per live commit (the commit document), vs the root
  document a pre-1.1 writer rewrote at every commit (zarr's indented JSON of the same attributes),
  for a small (humanoid), a big (aloha_pot, 134 meshes) and a flex model (multiflex, 3879 joints).

Run `python benchmarks/bench_open.py` (about 1 min) or `--quick` (fewer repeats).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = Path(str(importlib.resources.files("mujoco_warp") / "test_data"))
MODELS = {"humanoid": TEST_DATA / "humanoid/humanoid.xml", "floppy": TEST_DATA / "flex/floppy.xml",
          "aloha_pot": TEST_DATA / "aloha_pot/scene.xml", "multiflex": TEST_DATA / "flex/multiflex.xml"}
WORLDS, FRAMES, WORLD = 16, 600, 3

FIRST_MJ = """
import sys, time
import mjarchive
t = time.perf_counter()
q = mjarchive.open(sys.argv[1]).select(worlds=%d).qpos
print(time.perf_counter() - t)
""" % WORLD
FIRST_NPZ = """
import sys, time
import numpy as np
t = time.perf_counter()
with np.load(sys.argv[1]) as f:
    q = f["qpos"]
print(time.perf_counter() - t)
"""


def write_archive(path: Path, xml: Path, frames: int = FRAMES, chunk_frames: int = 512) -> None:
    import mujoco

    import mjarchive

    model = mujoco.MjModel.from_xml_path(str(xml))
    rng = np.random.default_rng(0)
    q = np.tile(model.qpos0, (WORLDS, 1)).astype(np.float32)
    with mjarchive.create(path, str(xml), n_worlds=WORLDS, output_fps=30, chunk_frames=chunk_frames) as w:
        for f in range(frames):
            q += rng.normal(0, 1e-3, q.shape).astype(np.float32)
            w.append(f / 30.0, q)


def old_package(tmp: Path) -> Path | None:
    """The last commit's source tree (the reader before this change), or None without git."""
    out = tmp / "head"
    try:
        out.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out / "src"


def first(code: str, target: Path, pythonpath: Path | None = None) -> float:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, env=env,
                         check=True)
    return float(out.stdout.split()[-1])


def best_of(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    n_first, n_warm = (3, 20) if args.quick else (7, 100)

    import mjarchive

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        head = old_package(tmp)
        for name in ("humanoid", "floppy"):
            path, npz = tmp / f"{name}.zarr", tmp / f"{name}.npz"
            write_archive(path, MODELS[name])
            with mjarchive.open(path) as a:
                np.savez(npz, qpos=a.select(worlds=WORLD).qpos[:, 0], time=a.time)
            root_kb = (path / "zarr.json").stat().st_size / 1e3
            print(f"{name}: {WORLDS} worlds x {FRAMES} frames, nq {a.nq}, root document {root_kb:.1f} KB")
            firsts: dict[str, list[float]] = {"mjarchive": [], "np.load": [], "HEAD": []}
            for _ in range(n_first):  # interleaved
                firsts["mjarchive"].append(first(FIRST_MJ, path))
                firsts["np.load"].append(first(FIRST_NPZ, npz))
                if head is not None:
                    firsts["HEAD"].append(first(FIRST_MJ, path, head))
            f_mj, f_np = min(firsts["mjarchive"]), min(firsts["np.load"])
            print(f"{name} first open+select ms: {1e3 * f_mj:.2f}")
            print(f"{name} first np.load ms: {1e3 * f_np:.2f}")
            print(f"{name} first ratio vs np.load: {f_mj / f_np:.2f}x")
            if firsts["HEAD"]:
                f_head = min(firsts["HEAD"])
                print(f"{name} first open+select, HEAD code ms: {1e3 * f_head:.2f}")
                print(f"{name} first speedup vs HEAD: {f_head / f_mj:.1f}x")

            def mj_warm():
                mjarchive.open(path).select(worlds=WORLD).qpos

            def np_warm():
                with np.load(npz) as f:
                    f["qpos"]

            print(f"{name} warm open only ms: {1e3 * best_of(lambda: mjarchive.open(path), n_warm):.3f}")
            warm = {"mjarchive": [], "np.load": []}
            for _ in range(5):
                warm["mjarchive"].append(best_of(mj_warm, n_warm // 5))
                warm["np.load"].append(best_of(np_warm, n_warm // 5))
            w_mj, w_np = min(warm["mjarchive"]), min(warm["np.load"])
            print(f"{name} warm open+select ms: {1e3 * w_mj:.3f}")
            print(f"{name} warm np.load ms: {1e3 * w_np:.3f}")
            print(f"{name} warm ratio vs np.load: {w_mj / w_np:.2f}x")
            if head is not None:
                code = ("import sys, time, mjarchive\n"
                        "def f(): mjarchive.open(sys.argv[1]).select(worlds=%d).qpos\n"
                        "f(); ts = []\n"
                        "for _ in range(%d):\n"
                        "    t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)\n"
                        "print(min(ts))\n") % (WORLD, n_warm)
                w_head = first(code, path, head)
                print(f"{name} warm open+select, HEAD code ms: {1e3 * w_head:.3f}")
                print(f"{name} warm speedup vs HEAD: {w_head / w_mj:.1f}x")

        for name in ("humanoid", "aloha_pot", "multiflex"):
            path = tmp / f"commit-{name}.zarr"
            w = mjarchive.create(path, str(MODELS[name]), n_worlds=WORLDS, chunk_frames=4)
            import mujoco

            nq = mujoco.MjModel.from_xml_path(str(MODELS[name])).nq
            for f in range(5):
                w.append(f / 30.0, np.zeros((WORLDS, nq), np.float32))
            w.flush()
            commit = (path / "_commit" / "zarr.json").stat().st_size
            indented = len(json.dumps(json.loads((path / "zarr.json").read_bytes()), indent=2))
            w.close()
            print(f"{name} commit bytes (commit document): {commit}")
            print(f"{name} commit bytes before 1.1 (indented root document): {indented}")
            print(f"{name} commit bytes ratio: {indented / commit:.0f}x fewer")


if __name__ == "__main__":
    main()
