"""Multi-part archives (issue 26), measured in one run: parallel writers, open + select, info on S3.

    python benchmarks/bench_parts.py            # 1024 humanoid worlds x 600 frames, 64 parts (~5 min here)
    python benchmarks/bench_parts.py --quick    # small smoke run (tests/test_bench_smoke.py)

Prints `name: value` lines; every ratio is against a single-part archive of the same worlds measured
in the same run, the variants interleaved, best of N:
- append: aggregate throughput (worlds x frames per second, MB/s of qpos) of 1, 2, 4 and 8 writer
  processes, each creating its own part of one archive (`create(path, model, part=f"rank{r}",
  world_ids=...)`) and appending its worlds' qpos in blocks of `--block` frames, vs ONE process
  writing all worlds to a single-part archive. Wall time from the moment every writer process is
  ready (imported, its data loaded) to the last `close()`; `create` is inside it and reported apart.
  Writer processes are started once, warmed up (one throwaway create) and reused, so process
  start-up and first-call imports are not timed. More writers
  than cores compete for the CPUs: ratios past `machine.cpu_count` writers measure that contention.
- open_select: `mjarchive.open(path).select(worlds=w).qpos` (one world, all frames) of an archive of
  `--parts` parts vs a single-part archive holding the same worlds, local disk: `first` in a fresh
  process each time (imports not timed), `warm` a fresh `open` in one process (goal <= 1.5x).
- s3.info: `mjarchive info s3://...` (the CLI's `main(["info", ...])`, in a fresh process each
  time, imports not timed) of the same two archives on the moto S3 server (tests/s3_server.py),
  with the HTTP requests each run made, counted by the server.
- s3.create: `create()` of an empty 16-world humanoid archive, and of one part of a new multi-part
  archive, on the same server (in this process, closed untimed), and the requests each made.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1] / "tests"
FPS = 30.0


@dataclasses.dataclass(frozen=True)
class Layout:
    tmp: str | None
    worlds: int
    frames: int
    writers: tuple[int, ...]
    parts: int
    block: int
    chunk_frames: int
    repeats: int
    open_repeats: int
    s3: bool


WARM_UP = Layout(None, 1, 1, (1,), 1, 1, 16, 1, 1, False)


def parse() -> Layout:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", type=int, default=1024, help="total worlds (split evenly by writers and parts)")
    p.add_argument("--frames", type=int, default=600)
    p.add_argument("--writers", default="1,2,4,8", help="writer process counts, comma-separated")
    p.add_argument("--parts", type=int, default=64, help="parts of the archive that open/select and info read")
    p.add_argument("--block", type=int, default=16, help="frames per append() call")
    p.add_argument("--chunk-frames", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5, help="append runs per variant (best of)")
    p.add_argument("--open-repeats", type=int, default=7, help="fresh-process open/info runs per archive (best of)")
    p.add_argument("--no-s3", action="store_true", help="skip the S3 info rows")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    p.add_argument("--tmp", default=None, help="scratch folder (default: a new temporary one; removed after)")
    a = p.parse_args()
    if a.quick:
        return Layout(a.tmp, 32, 40, (1, 2), 8, 8, 16, 1, 1, not a.no_s3)
    writers = tuple(int(n) for n in a.writers.split(","))
    for n in (*writers, a.parts):
        if n < 1 or a.worlds % n:
            p.error(f"--worlds {a.worlds} must split evenly into {n} writers/parts")
    return Layout(a.tmp, a.worlds, a.frames, writers, a.parts, a.block, a.chunk_frames, a.repeats,
                  a.open_repeats, not a.no_s3)


def humanoid() -> Path:
    return Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))


def make_qpos(worlds: int, frames: int) -> np.ndarray:
    """(frames, worlds, nq) float32: a small random walk around qpos0 per world (compresses like motion)."""
    import mujoco

    q0 = mujoco.MjModel.from_xml_path(str(humanoid())).qpos0.astype(np.float32)
    rng = np.random.default_rng(0)
    steps = rng.standard_normal((frames, worlds, q0.size), dtype=np.float32) * np.float32(1e-3)
    return q0 + np.cumsum(steps, axis=0)


def write_part(location, qpos: np.ndarray, lo: int, part: str | None, layout: Layout,
               storage_options: dict | None = None) -> float:
    """Create `part` (None: a single-part archive) holding worlds lo.. of `qpos`, append every frame
    in blocks, close. Returns the seconds `create` took."""
    import mjarchive

    kw = {} if part is None else {"part": part}
    t = time.monotonic()
    w = mjarchive.create(location, str(humanoid()), world_ids=range(lo, lo + qpos.shape[1]), output_fps=FPS,
                         chunk_frames=layout.chunk_frames, storage_options=storage_options, **kw)
    created = time.monotonic() - t
    times = np.arange(qpos.shape[0]) / FPS
    for s in range(0, qpos.shape[0], layout.block):
        w.append(times[s:s + layout.block], qpos[s:s + layout.block])
    w.close()
    return created


def writer_process(conn) -> None:
    """A reusable writer: per task, load its worlds, say ready, wait for go, write, report times."""
    with tempfile.TemporaryDirectory() as tmp:  # a first create() pays lazy imports once per process: not timed
        write_part(Path(tmp) / "warm-up", np.zeros((1, 1, 28), np.float32), 0, None, WARM_UP)
    while (task := conn.recv()) is not None:
        location, data, lo, hi, part, layout = task
        qpos = np.ascontiguousarray(np.load(data, mmap_mode="r")[:, lo:hi])
        conn.send("ready")
        conn.recv()
        try:
            created = write_part(location, qpos, lo, part, layout)
        except Exception:  # sent to the parent, which raises it (a dead worker would leave it waiting)
            conn.send(traceback.format_exc())
            continue
        conn.send((created, time.monotonic()))


def run_writers(pool, location: Path, data: Path, layout: Layout, n: int, parted: bool) -> tuple[float, float]:
    """n writers (or the single-part baseline: n=1, parted=False) write one archive. (wall s, max create s)."""
    per = layout.worlds // n
    for r in range(n):
        pool[r].send((location, data, r * per, (r + 1) * per, f"rank{r}" if parted else None, layout))
    for r in range(n):
        assert pool[r].recv() == "ready"
    t0 = time.monotonic()
    for r in range(n):
        pool[r].send("go")
    done = [pool[r].recv() for r in range(n)]
    for answer in done:
        if isinstance(answer, str):
            raise RuntimeError(f"a writer process failed:\n{answer}")
    return max(end for _, end in done) - t0, max(c for c, _ in done)


def rotated(names: list[str], k: int) -> list[str]:
    k %= len(names)
    return names[k:] + names[:k]


def same_as_input(location, qpos: np.ndarray, storage_options: dict | None = None) -> bool:
    import mjarchive

    with mjarchive.open(location, storage_options=storage_options) as a:
        got = a.select(worlds=list(range(qpos.shape[1]))).qpos
    return got.shape == qpos.shape and bool(np.array_equal(got, qpos))


def bench_append(layout: Layout, tmp: Path, data: Path, qpos: np.ndarray) -> None:
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(max(layout.writers))]
    procs = [ctx.Process(target=writer_process, args=(child,), daemon=True) for _, child in pipes]
    for proc in procs:
        proc.start()
    pool = [parent for parent, _ in pipes]
    variants = {"single": (1, False), **{f"writers{n}": (n, True) for n in layout.writers}}
    best: dict[str, tuple[float, float]] = {}
    try:
        for rep in range(layout.repeats):  # interleaved, the order rotated each round
            for name in rotated(list(variants), rep):
                n, parted = variants[name]
                location = tmp / f"append-{name}.mjarchive"
                wall, created = run_writers(pool, location, data, layout, n, parted)
                if rep == 0:
                    print(f"check.append.{name}_equals_input: {same_as_input(location, qpos)}", flush=True)
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, created)
                shutil.rmtree(location)
    finally:
        for parent in pool:
            parent.send(None)
        for proc in procs:
            proc.join(30)
    mb = qpos.nbytes / 1e6
    for name, (wall, created) in best.items():
        print(f"append[{name}].wall_s: {wall:.3f}")
        print(f"append[{name}].worlds_frames_per_s: {layout.worlds * layout.frames / wall:.4g}")
        print(f"append[{name}].qpos_MBps: {mb / wall:.1f}")
        print(f"append[{name}].create_ms: {1e3 * created:.1f}")
    for n in layout.writers:
        print(f"ratio.append.writers{n}_vs_single: {best['single'][0] / best[f'writers{n}'][0]:.2f}x")


FIRST = """
import sys, time
import numpy as np
import mjarchive
t = time.perf_counter()
q = mjarchive.open(sys.argv[1]).select(worlds=int(sys.argv[2])).qpos
dt = time.perf_counter() - t
print(float(np.asarray(q, np.float64).sum()), dt)
"""

INFO = """
import contextlib, io, json, sys, time
import mjarchive.cli.main
out = io.StringIO()
t = time.perf_counter()
with contextlib.redirect_stdout(out):
    rc = mjarchive.cli.main.main(["info", sys.argv[1], "--storage-options", sys.argv[2]])
dt = time.perf_counter() - t
assert rc == 0 and "worlds" in out.getvalue(), (rc, out.getvalue())
print(dt)
"""


def child(code: str, *args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    return out.stdout.split()


def build(location, qpos: np.ndarray, layout: Layout, n_parts: int, storage_options: dict | None = None) -> None:
    """The single-part archive (n_parts == 0) or an n_parts archive of the same worlds, written in this process."""
    if n_parts == 0:
        write_part(location, qpos, 0, None, layout, storage_options)
        return
    per = layout.worlds // n_parts
    for r in range(n_parts):
        write_part(location, np.ascontiguousarray(qpos[:, r * per:(r + 1) * per]), r * per, f"rank{r}", layout,
                   storage_options)


def bench_open(layout: Layout, tmp: Path, qpos: np.ndarray) -> None:
    import mjarchive

    paths = {"single": tmp / "single.mjarchive", f"parts{layout.parts}": tmp / "parted.mjarchive"}
    t = time.monotonic()
    build(paths["single"], qpos, layout, 0)
    build(paths[f"parts{layout.parts}"], qpos, layout, layout.parts)
    print(f"open_select.build_s: {time.monotonic() - t:.1f}")
    world = layout.worlds // 2 + 3  # a part in the middle
    expected = float(np.asarray(qpos[:, world], np.float64).sum())
    with mjarchive.open(paths[f"parts{layout.parts}"]) as a:
        ok = a.select(worlds=world).qpos.shape == (layout.frames, 1, qpos.shape[2]) and len(a.parts) == layout.parts
    first: dict[str, list[float]] = {name: [] for name in paths}
    for rep in range(layout.open_repeats):  # interleaved, a fresh process each
        for name in rotated(list(paths), rep):
            path = paths[name]
            total, dt = child(FIRST, str(path), str(world))
            ok &= float(total) == expected
            first[name].append(float(dt))
    print(f"check.open_select.world_equals_input: {ok}")

    def warm(path: Path, select: bool) -> float:
        t = time.perf_counter()
        a = mjarchive.open(path)
        if select:
            a.select(worlds=world).qpos
        a.close()
        return time.perf_counter() - t

    rows = {"first": {n: min(v) for n, v in first.items()}}
    for row, select in (("warm", True), ("warm_open_only", False)):
        times: dict[str, list[float]] = {name: [] for name in paths}
        for rep in range(5 * layout.open_repeats):
            for name in rotated(list(paths), rep):
                times[name].append(warm(paths[name], select))
        rows[row] = {n: min(v) for n, v in times.items()}
    parted = f"parts{layout.parts}"
    for row, best in rows.items():
        for name, s in best.items():
            print(f"open_select_{row}[{name}].ms: {1e3 * s:.2f}")
        print(f"ratio.open_select_{row}.{parted}_vs_single: {best[parted] / best['single']:.2f}x")
    met = all(best[parted] <= 1.5 * best["single"] for row, best in rows.items() if row != "warm_open_only")
    print(f"target.open_select_{parted}_le_1.5x_single: {'PASS' if met else 'FAIL'}")


def bench_s3_info(layout: Layout, tmp: Path, qpos: np.ndarray) -> None:
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as exc:
        print(f"s3.skipped: {exc} (pip install moto[server] s3fs)")
        return
    sys.path.insert(0, str(TESTS))
    from s3_server import S3Server

    server = S3Server(tmp / "requests.jsonl").start()
    try:
        server.create_bucket("bench")
        so = server.storage_options()
        parted = f"parts{layout.parts}"
        urls = {"single": "s3://bench/single.mjarchive", parted: "s3://bench/parted.mjarchive"}
        for name, n_parts in (("single", 0), (parted, layout.parts)):
            mark, t = server.mark(), time.monotonic()
            build(urls[name], qpos, layout, n_parts, so)
            print(f"s3.build[{name}].s: {time.monotonic() - t:.1f}")
            print(f"s3.build[{name}].requests: {len(server.requests(mark))}")
        print(f"check.s3.{parted}_equals_input: {same_as_input(urls[parted], qpos, so)}")
        times: dict[str, list[float]] = {name: [] for name in urls}
        requests: dict[str, int] = {}
        for rep in range(layout.open_repeats):  # interleaved, a fresh process each
            for name in rotated(list(urls), rep):
                mark = server.mark()
                (dt,) = child(INFO, urls[name], json.dumps(so))
                times[name].append(float(dt))
                requests[name] = len(server.requests(mark))
        for name in urls:
            print(f"s3.info[{name}].ms: {1e3 * min(times[name]):.1f}")
            print(f"s3.info[{name}].requests: {requests[name]}")
        print(f"ratio.s3.info.{parted}_vs_single: {min(times[parted]) / min(times['single']):.2f}x")
        print(f"ratio.s3.info_requests.{parted}_vs_single: {requests[parted] / requests['single']:.1f}x")
        bench_s3_create(layout, server, so)
    finally:
        server.stop()


def bench_s3_create(layout: Layout, server, so: dict) -> None:
    """`create()` of an empty archive (closed untimed) and of one part of a new multi-part archive, on
    the S3 server from this process (imports and the first create not timed), interleaved, best of
    N, with the HTTP requests the create made."""
    import mjarchive

    bundle = mjarchive.ModelBundle.from_file(humanoid())
    kinds = {"single": {}, "part": {"part": "rank0"}}
    mjarchive.create("s3://bench/create_warm_up.mjarchive", bundle, n_worlds=16, storage_options=so).close()
    times: dict[str, list[float]] = {name: [] for name in kinds}
    requests: dict[str, int] = {}
    for rep in range(max(3, layout.open_repeats)):
        for name in rotated(list(kinds), rep):
            mark, t = server.mark(), time.perf_counter()
            writer = mjarchive.create(f"s3://bench/create_{name}_{rep}.mjarchive", bundle, n_worlds=16,
                                      storage_options=so, **kinds[name])
            times[name].append(time.perf_counter() - t)
            requests[name] = len(server.requests(mark))
            writer.close()
    for name in kinds:
        print(f"s3.create[{name}].ms: {1e3 * min(times[name]):.1f}")
        print(f"s3.create[{name}].requests: {requests[name]}")


def main() -> None:
    layout = parse()
    print(f"machine.cpu_count: {os.cpu_count()}")
    print(f"layout: worlds={layout.worlds} frames={layout.frames} nq=28 float32 block={layout.block} "
          f"chunk_frames={layout.chunk_frames} writers={','.join(map(str, layout.writers))} parts={layout.parts}")
    t = time.monotonic()
    with tempfile.TemporaryDirectory(dir=layout.tmp) as tmp:
        tmp = Path(tmp)
        qpos = make_qpos(layout.worlds, layout.frames)
        np.save(tmp / "qpos.npy", qpos)
        print(f"data.qpos_MB: {qpos.nbytes / 1e6:.1f}", flush=True)
        bench_append(layout, tmp, tmp / "qpos.npy", qpos)
        bench_open(layout, tmp, qpos)
        if layout.s3:
            bench_s3_info(layout, tmp, qpos)
    print(f"total_s: {time.monotonic() - t:.1f}")


if __name__ == "__main__":
    main()
