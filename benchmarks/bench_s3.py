"""Reads from an S3 archive: HTTP requests and bytes per selection, counted by the server.

Starts moto's S3 server on 127.0.0.1 (tests/s3_server.py), writes one archive of smooth synthetic
qpos, then reads typical replay selections and prints `name: value` lines from the server's own
request log. Loopback latency says little about a real bucket, so the numbers that matter are
requests and bytes; wall times are printed for completeness.

    python benchmarks/bench_s3.py [--worlds 64] [--frames 1024] [--chunk-frames 256]
"""

from __future__ import annotations

import argparse
import importlib.resources
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from s3_server import S3Server  # noqa: E402

import mjarchive  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--frames", type=int, default=1024)
    parser.add_argument("--chunk-frames", type=int, default=256)
    args = parser.parse_args()
    W, T = args.worlds, args.frames
    xml = Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))
    with tempfile.TemporaryDirectory() as tmp:
        server = S3Server(Path(tmp) / "requests.jsonl").start()
        try:
            server.create_bucket("bench")
            so = server.storage_options()
            url = "s3://bench/run.mjarchive"
            f = np.arange(T)[:, None, None]
            qpos = np.sin(0.01 * f + 0.37 * np.arange(W)[None, :, None] + 0.1 * np.arange(28)).astype(np.float32)
            mark = server.mark()
            t0 = time.perf_counter()
            with mjarchive.create(url, xml, n_worlds=W, chunk_frames=args.chunk_frames, storage_options=so) as w:
                w.append(0.01 * np.arange(1, T + 1), qpos)
            write_s = time.perf_counter() - t0
            puts = [r for r in server.requests(mark) if r["method"] == "PUT"]
            print(f"layout: worlds={W} frames={T} nq=28 float32 chunk_frames={args.chunk_frames}")
            print(f"write_seconds: {write_s:.2f}")
            print(f"write_put_requests: {len(puts)}")
            raw_one_world = T * 28 * 4

            def measure(name, read, needed):
                mark = server.mark()
                t = time.perf_counter()
                with mjarchive.open(url, storage_options=so) as archive:
                    read(archive)
                dt = time.perf_counter() - t
                log = server.requests(mark)
                meta = [r for r in log if r["path"].endswith("zarr.json")]
                data = [r for r in log if not r["path"].endswith("zarr.json")]
                nbytes = sum(r["length"] or 0 for r in data)
                print(f"{name}_seconds: {dt:.3f}")
                print(f"{name}_metadata_gets: {len(meta)}")
                print(f"{name}_data_gets: {len(data)} ({sum(r['range'] is not None for r in data)} byte-range)")
                print(f"{name}_data_bytes: {nbytes}")
                print(f"{name}_bytes_over_raw_needed: {nbytes / needed:.2f}")

            measure("open_only", lambda a: None, 1)
            measure("one_world_all_frames", lambda a: a.select(worlds=[W // 2]).qpos, raw_one_world)
            measure("one_frame_all_worlds", lambda a: a.select(frames=[T // 2]).qpos, W * 28 * 4)
            measure("all", lambda a: a.select().qpos, W * raw_one_world)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
