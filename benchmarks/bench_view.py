"""Viewer benchmark (issue #15): seek latency and sustainable playback of `mjarchive view`.

Workloads (printed as `name: value` lines, measured in one run):

1. seek latency: a 1024-world humanoid archive (scripted motion, float32, resets every 200
   frames), 16 worlds shown; 100 random seeks through `Viewer.seek(frame)` (what releasing the
   slider does: read the chunk if it is not held, kinematics of 16 worlds, every batched mesh
   posed and flushed to the websocket), p50 and p95, with the memory the pose window holds and
   the server's RSS; on local disk and on a moto S3 server (the same archive copied there).
2. playback: 16 worlds, the frames in order (what play does: the chunk ahead is prefetched),
   frames per second sustained against the archive's output_fps (the target).

`--quick` (tiny archive, few seeks) is what tests/test_bench_smoke.py runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

import mjarchive  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Workload:
    worlds: int = 1024
    frames: int = 1024
    chunk_frames: int = 128
    shown: int = 16
    seeks: int = 100
    playback_frames: int = 300
    s3: bool = True


def humanoid_xml() -> Path:
    return Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))


def make_archive(path: Path | str, w: Workload, storage_options: dict | None = None) -> Path | str:
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml()))
    rng = np.random.default_rng(0)
    phase = rng.uniform(0, 2 * np.pi, (w.worlds, model.nq))
    with mjarchive.create(path, humanoid_xml(), n_worlds=w.worlds, chunk_frames=w.chunk_frames, overwrite=True,
                          storage_options=storage_options) as a:
        for start in range(0, w.frames, w.chunk_frames):
            n = min(w.chunk_frames, w.frames - start)
            t = (start + np.arange(n)) / 30
            qpos = np.broadcast_to(model.qpos0, (n, w.worlds, model.nq)).copy()
            qpos[..., 7:] += 0.4 * np.sin(t[:, None, None] * 3 + phase[None, :, 7:])
            qpos[..., 0] += 0.3 * t[:, None]
            qpos[..., 2] = 1.3
            reset = ((start + np.arange(n)) % 200 == 0)[:, None] & np.ones(w.worlds, bool)
            a.append(t, qpos.astype(np.float32), reset=reset)
    return path


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seek_latency(location: str, w: Workload, tag: str, storage_options: dict | None = None) -> None:
    rng = np.random.default_rng(1)
    with mjarchive.open(location, storage_options=storage_options) as archive:
        with mjarchive.view(archive, worlds=list(range(w.shown)), port=0, block=False) as viewer:
            frames = rng.integers(0, archive.n_frames, w.seeks)
            times = []
            held = 0
            for f in frames:
                t0 = time.perf_counter()
                viewer.seek(int(f))
                times.append(time.perf_counter() - t0)
                held = max(held, viewer._window.memory_bytes)
            ms = np.asarray(times) * 1e3
            print(f"{tag}.seek_p50_ms: {np.percentile(ms, 50):.2f}")
            print(f"{tag}.seek_p95_ms: {np.percentile(ms, 95):.2f}")
            print(f"{tag}.seek_max_ms: {ms.max():.2f}")
            print(f"{tag}.window_held_MB: {held / 2**20:.2f}")
            print(f"{tag}.server_maxrss_MB: {rss_mb():.0f}")


def playback(location: str, w: Workload) -> None:
    with mjarchive.open(location) as archive:
        fps = float(archive.output_fps or 30.0)
        with mjarchive.view(archive, worlds=list(range(w.shown)), port=0, block=False) as viewer:
            n = min(w.playback_frames, archive.n_frames)
            viewer.seek(0)
            t0 = time.perf_counter()
            for f in range(1, n):
                viewer.seek(f)
            rate = (n - 1) / (time.perf_counter() - t0)
    print(f"playback.frames_per_s: {rate:.1f}")
    print(f"playback.target_fps: {fps:.1f}")
    print(f"ratio.playback_vs_output_fps: {rate / fps:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="64 worlds, 256 frames, 20 seeks, no S3 (a smoke run)")
    p.add_argument("--no-s3", action="store_true", help="skip the moto S3 part")
    p.add_argument("--tmp", default=None, help="scratch directory (default: a fresh temporary one)")
    a = p.parse_args()
    w = Workload()
    if a.quick:
        w = dataclasses.replace(w, worlds=64, frames=256, chunk_frames=64, seeks=20, playback_frames=60, s3=False)
    if a.no_s3:
        w = dataclasses.replace(w, s3=False)
    print(f"workload: {w}")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        path = make_archive(Path(tmp) / "view.mjarchive", w)
        seek_latency(str(path), w, "local")
        playback(str(path), w)
        if w.s3:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from s3_server import S3Server  # the test suite's moto server (a child process)

            server = S3Server(Path(tmp) / "s3.log").start()
            try:
                server.create_bucket("bench")
                options = server.storage_options()
                url = make_archive("s3://bench/view.mjarchive", w, options)
                seek_latency(url, w, "s3", options)
            finally:
                server.stop()
    print(f"total_s: {time.perf_counter() - t_start:.1f}")


if __name__ == "__main__":
    main()
