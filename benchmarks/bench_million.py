"""Issue 28: a 10^6-frame archive costs about what a 10^3-frame one does to open, inspect, slice,
render and view (goal: big / small <= 2 for every operation but verify, which reads everything).

    python benchmarks/bench_million.py                  # 10^6 x 4096 worlds vs 10^3, local disk and moto S3
    python benchmarks/bench_million.py --no-s3 --keep /tmp/million
    python benchmarks/bench_million.py --quick          # 20k frames x 64 worlds vs 1000 (tests/test_bench_smoke.py)

Building: no frame goes through the writer's codec but the first chunk. A 2-hinge chain (nq 2,
float32) archive of `--worlds` worlds is created and ONE chunk of smooth, coarsely rounded qpos is
appended (each world resets once per chunk, at offset (37 w) mod C); then that chunk's stored objects
(every per-frame array's shards) are copied to every other chunk index, `time` is written through
zarr (strictly increasing), every per-frame array is resized, `reset_count` (format 1.3, where the
library creates it) is filled to agree with the copied resets, and the commit record (root attributes
and commit document, from the library's own helpers) says `--frames`. The S3 copy is the same objects
PUT in parallel into the moto server of tests/s3_server.py.

Measured on each archive (big and small, local and S3), interleaved, best of `--repeats`, each on an
archive opened outside the timing (except `open`):
- open: `mjarchive.open(location)`;
- info: `cli.info.archive_info` (everything `mjarchive info` prints);
- select: one world x 1000 frames of qpos (at 3/4 of the archive);
- render: `mjarchive.render` of 100 frames of 2 worlds, 48x64, workers=1, default HUD;
- seek: a viewer PoseWindow of 16 worlds opened, seeked to a far frame, its poses there;
- episodes: what the viewer's page shows of episodes: that window's `episode_count` and
  `episode_starts` of one world and the slider's marks (`episode_marks`: starts of any of its worlds);
- verify: `Archive.verify(progress)` (once: it reads every chunk), stopped after `--verify-budget`
  seconds, its time then extrapolated from the fraction of chunks it read (printed "extrapolated");
- refresh: a reader's `refresh()` after a writer (`mjarchive.open(location, mode="a")`) appended and
  committed one more chunk (each round adds a chunk to the archive).

Prints `<where>.<op>.big_s`, `<where>.<op>.small_s` and `ratio.<where>.<op>` (big / small). An operation
that runs past `--op-timeout` seconds is stopped and printed as `>T`. `--profile` (default on) prints the
cProfile top entries of each local operation whose ratio is above 2, on the big archive.
"""

from __future__ import annotations

import argparse
import cProfile
import concurrent.futures
import dataclasses
import io
import math
import os
import pstats
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402

import mjarchive  # noqa: E402
from mjarchive.archive.creation import write_root  # noqa: E402
from mjarchive.archive.format import COMMIT_KEY  # noqa: E402
from mjarchive.archive.manifest import commit_document, read_commit  # noqa: E402
from mjarchive.archive.storage.locations import open_root  # noqa: E402
from mjarchive.cli.info import archive_info  # noqa: E402
from mjarchive.testing import hinge_chain_xml  # noqa: E402
from mjarchive.viewer.frames import MAX_EPISODE_STARTS, PoseWindow  # noqa: E402
from mjarchive.viewer.playback import MAX_MARKS  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "tests"
FPS = 30.0
NQ = 2
OPS = ("open", "info", "select", "render", "seek", "episodes", "verify", "refresh")
SLOW_S = 30.0  # an operation that took this long once is not repeated (best of 1 says enough)


@dataclasses.dataclass(frozen=True)
class Layout:
    frames: int = 1_000_000
    worlds: int = 4096
    small_frames: int = 1000
    chunk_frames: int = 512
    repeats: int = 3
    s3: bool = True
    op_timeout: float = 600.0
    verify_budget: float = 120.0
    profile: bool = True


def parse() -> tuple[Layout, str | None, str | None]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=Layout.frames)
    p.add_argument("--worlds", type=int, default=Layout.worlds)
    p.add_argument("--small-frames", type=int, default=Layout.small_frames)
    p.add_argument("--repeats", type=int, default=Layout.repeats)
    p.add_argument("--s3", action=argparse.BooleanOptionalAction, default=True, help="also on the moto S3 server")
    p.add_argument("--op-timeout", type=float, default=Layout.op_timeout, help="seconds before an operation is stopped")
    p.add_argument("--verify-budget", type=float, default=Layout.verify_budget,
                   help="seconds after which verify stops; its time is extrapolated from the chunks it read")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                   help="cProfile each local operation whose ratio is above 2")
    p.add_argument("--quick", action="store_true", help="20k frames x 64 worlds vs 1000, one round (a smoke run)")
    p.add_argument("--keep", default=None, help="build the local archives in DIR and keep them")
    p.add_argument("--tmp", default=None, help="scratch folder (default: a new temporary one; removed after)")
    a = p.parse_args()
    layout = Layout(a.frames, a.worlds, a.small_frames, 512, a.repeats, a.s3, a.op_timeout, a.verify_budget,
                    a.profile)
    if a.quick:
        layout = dataclasses.replace(layout, frames=20_000, worlds=64, small_frames=1000, repeats=1, op_timeout=120)
    if min(layout.frames, layout.small_frames) < layout.chunk_frames:
        p.error(f"--frames and --small-frames must be at least one chunk ({layout.chunk_frames})")
    return layout, a.keep, a.tmp


# -- building ----------------------------------------------------------------------------------------------
def one_chunk(worlds: int, cf: int) -> tuple[np.ndarray, np.ndarray]:
    """(qpos (cf, W, NQ) float32, reset (cf, W) bool) of the chunk every chunk copies: smooth, rounded
    to 1/256 (low entropy), world w resetting at offset (37 w) mod cf."""
    f = np.arange(cf)[:, None, None]
    w = np.arange(worlds)[None, :, None]
    qpos = np.round(0.5 * np.sin(2 * np.pi * f / cf + 0.37 * w + np.arange(NQ)) * 256) / 256
    reset = np.arange(cf)[:, None] == (37 * np.arange(worlds)[None, :]) % cf
    return qpos.astype(np.float32), reset


def build(path: Path, frames: int, worlds: int, cf: int) -> None:
    """A local archive of `frames` frames x `worlds` worlds from one written chunk (module docstring)."""
    qpos, reset = one_chunk(worlds, cf)
    bundle = mjarchive.ModelBundle.from_xml(hinge_chain_xml(NQ))
    with mjarchive.create(path, bundle, n_worlds=worlds, chunk_frames=cf) as writer:
        writer.append((np.arange(cf) + 1) / FPS, qpos, reset=reset)
    root = open_root(path, mode="a")
    manifest = read_commit(root)[0]
    n_chunks = -(-frames // cf)
    for name in manifest.per_frame_arrays():
        arr = root[name]
        arr.resize((frames, *arr.shape[1:]))
        first = path / name / "c" / "0"
        shards = [(p.relative_to(first), p.read_bytes()) for p in first.rglob("*") if p.is_file()]
        for k in range(1, n_chunks):
            for rel, data in shards:
                target = path / name / "c" / str(k) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
    times = root["time"]
    times.resize((frames,))
    times[:] = (np.arange(frames) + 1) / FPS
    if "reset_count" in root:  # format 1.3's episode index: cumulative resets after frame 0, per chunk
        per_chunk = reset.sum(axis=0).astype(np.int64)
        first_chunk = reset[1:].sum(axis=0).astype(np.int64)
        counts = first_chunk[None, :] + np.arange(n_chunks, dtype=np.int64)[:, None] * per_chunk[None, :]
        index = root["reset_count"]
        index.resize((n_chunks, worlds))
        index[:] = counts
    root.store_path.store.write_now(COMMIT_KEY, commit_document(frames, {}))
    write_root(root.store_path.store, root.metadata.to_dict(), manifest.to_dict(frames, "finalized", {}))


def upload(path: Path, bucket: str, prefix: str, options: dict) -> int:
    """PUT every object of a local archive (its writer lease excepted) under s3://bucket/prefix; returns
    how many."""
    import boto3

    client = boto3.client("s3", endpoint_url=options["endpoint_url"], aws_access_key_id=options["key"],
                          aws_secret_access_key=options["secret"], **options["client_kwargs"])
    keys = [p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()]
    keys = [k for k in keys if not k.startswith("_writer/")]

    def put(key: str) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=(path / key).read_bytes())

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        for _ in pool.map(put, keys):
            pass
    return len(keys)


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- operations --------------------------------------------------------------------------------------------
class OpTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise OpTimeout()


@dataclasses.dataclass
class Target:
    """One archive to measure: where it is, its size, and what its operations check."""

    tag: str  # "big" or "small"
    location: str
    frames: int  # as built (refresh appends a chunk each round)
    worlds: int
    options: dict | None = None
    scratch: Path | None = None
    appended: int = 0  # chunks appended by refresh so far

    def far(self, length: int) -> int:
        """A frame range of `length` starting about 3/4 into the archive."""
        return max(0, min(self.frames - length, 3 * self.frames // 4))

    def open(self):
        return mjarchive.open(self.location, storage_options=self.options)


def shown_worlds(worlds: int, n: int = 16) -> list[int]:
    return sorted({int(w) for w in np.linspace(0, worlds - 1, min(n, worlds))})


class _Stop(Exception):
    pass


@dataclasses.dataclass
class Partial:
    """A verify stopped after its time budget: the fraction of its chunks it had read (the time is
    extrapolated from it)."""

    fraction: float
    ok: bool = True


def verify_within(archive, budget: float):
    """`archive.verify(progress)`, stopped once `budget` seconds have passed (a Partial then)."""
    t0, seen = time.perf_counter(), [0.0]

    def progress(done: int, total: int) -> None:
        seen[0] = done / total
        if time.perf_counter() - t0 > budget and done < total:
            raise _Stop()

    try:
        return archive.verify(progress)
    except _Stop:
        return Partial(seen[0])


def prepare(op: str, t: Target, cf: int, budget: float = math.inf):
    """(the timed call, what to do after it): the archive is opened (and the window made) outside the timing."""
    if op == "open":
        return lambda: t.open().close(), None
    archive = t.open()
    if op == "info":
        return lambda: archive_info(archive), archive.close
    if op == "select":
        lo, w = t.far(1000), t.worlds // 2
        return lambda: archive.select(worlds=[w], frames=slice(lo, lo + min(1000, t.frames))).qpos, archive.close
    if op == "render":
        lo = t.far(100)
        out = Path(tempfile.mkdtemp(dir=t.scratch))

        def render():
            mjarchive.render(archive, out, worlds=[1, t.worlds - 2], frames=slice(lo, lo + 100), size=(48, 64),
                             workers=1, progress=False, resume=False)

        return render, lambda: (archive.close(), shutil.rmtree(out))
    if op in ("seek", "episodes"):
        model = archive.model()
        worlds = shown_worlds(t.worlds)
        geoms = list(range(model.ngeom))
        if op == "seek":
            frame = t.far(1) + 123

            def seek():
                with PoseWindow(archive, model, worlds, geoms) as window:
                    window.set_playhead(frame)
                    return window.poses(frame)

            return seek, archive.close
        window = PoseWindow(archive, model, worlds, geoms, prefetch=False)
        w = worlds[len(worlds) // 2]
        return (lambda: (window.episode_count(w), window.episode_starts(w), window.episode_marks(MAX_MARKS)),
                lambda: (window.close(), archive.close()))
    if op == "verify":
        return lambda: verify_within(archive, budget), archive.close
    if op == "refresh":
        writer = mjarchive.open(t.location, mode="a", storage_options=t.options)
        start = t.frames + t.appended * cf
        rows = (start + np.arange(cf)) % cf  # the frames continue the pattern every check expects
        qpos, reset = one_chunk(t.worlds, cf)
        writer.append((start + np.arange(cf) + 1) / FPS, qpos[rows], reset=reset[rows])
        writer.flush()
        t.appended += 1
        return archive.refresh, lambda: (writer.close(), archive.close())
    raise ValueError(op)


def timed(op: str, t: Target, cf: int, timeout: float, budget: float) -> tuple[float, object]:
    """Seconds one run of `op` took (math.inf if stopped at `timeout`; a verify stopped at `budget`
    extrapolated to all its chunks), and what it returned."""
    call, after = prepare(op, t, cf, budget)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    result = None
    try:
        t0 = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - t0
        if isinstance(result, Partial):
            print(f"# {t.location}: verify stopped after {seconds:.0f} s at {100 * result.fraction:.1f}% "
                  "of its chunks; its time is extrapolated")
            seconds /= max(result.fraction, 1e-9)
    except OpTimeout:
        seconds = math.inf
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if after is not None:
            after()
    return seconds, result


def check(where: str, op: str, t: Target, result, cf: int) -> None:
    """What the operations return must match the built archive (printed as `check.*`)."""
    if result is None:
        return
    name = f"check.{where}.{op}.{t.tag}"
    if op == "select":
        lo, w = t.far(1000), t.worlds // 2
        qpos, _ = one_chunk(t.worlds, cf)
        expected = qpos[(lo + np.arange(min(1000, t.frames))) % cf, w]
        print(f"{name}: {bool(np.array_equal(result[:, 0], expected))}")
    elif op == "info":
        offsets = (37 * np.arange(t.worlds)) % cf
        n = t.frames + t.appended * cf
        resets = sum(len(range(o if o else cf, n, cf)) for o in offsets)
        print(f"{name}: {result['n_frames'] == n and result['n_episodes'] == t.worlds + resets}")
    elif op == "verify":
        print(f"{name}: {result.ok}" + (" (partial)" if isinstance(result, Partial) else ""))
        if not result.ok:
            print(f"# verify problems: {result.problems[:5]}")
    elif op == "episodes":
        w = shown_worlds(t.worlds)[len(shown_worlds(t.worlds)) // 2]
        offset = (37 * w) % cf
        n = t.frames + t.appended * cf
        starts = [0, *range(offset if offset else cf, n, cf)]
        marks = sorted({f for x in shown_worlds(t.worlds) for f in range((37 * x) % cf or cf, n, cf)})
        print(f"{name}: {result[0] == len(starts) and result[1] == starts[:MAX_EPISODE_STARTS]}"
              f" and {result[2] == (marks if len(marks) <= MAX_MARKS else None)}")


def measure(where: str, targets: list[Target], lay: Layout) -> dict[str, dict[str, float]]:
    """Best seconds per op and size, the sizes interleaved (the order alternating each round)."""
    best = {op: {t.tag: math.inf for t in targets} for op in OPS}
    partial: set[tuple[str, str]] = set()
    for r in range(lay.repeats):
        for op in OPS:
            for t in targets[::1 if r % 2 == 0 else -1]:
                if r and (op == "verify" or best[op][t.tag] > SLOW_S):
                    continue
                seconds, result = timed(op, t, lay.chunk_frames, lay.op_timeout, lay.verify_budget)
                if r == 0:
                    check(where, op, t, result, lay.chunk_frames)
                if isinstance(result, Partial):
                    partial.add((op, t.tag))
                best[op][t.tag] = min(best[op][t.tag], seconds)
    for op in OPS:
        big, small = best[op]["big"], best[op]["small"]
        for tag, seconds in (("big", big), ("small", small)):
            note = " (extrapolated)" if (op, tag) in partial else ""
            print(f"{where}.{op}.{tag}_s: {_s(seconds, lay.op_timeout)}{note}")
        ratio = big / small
        print(f"ratio.{where}.{op}: {'>' + format(lay.op_timeout / small, '.1f') if math.isinf(big) else format(ratio, '.2f')}")
    return best


def _s(seconds: float, timeout: float) -> str:
    return f">{timeout:.0f} (stopped)" if math.isinf(seconds) else f"{seconds:.4f}"


def profile(op: str, t: Target, lay: Layout, top: int = 18) -> None:
    """cProfile of one run of `op` on `t` (stopped at the timeout: what it did until then)."""
    call, after = prepare(op, t, lay.chunk_frames, min(lay.verify_budget, 60.0))
    prof = cProfile.Profile()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, min(lay.op_timeout, 120.0))
    try:
        prof.enable()
        call()
    except OpTimeout:
        pass
    finally:
        prof.disable()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if after is not None:
            after()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    print(f"# profile of {op} on the big local archive (cumulative):")
    for line in out.getvalue().splitlines():
        if line.strip() and not line.lstrip().startswith(("Ordered by", "List reduced")):
            print(f"#   {line.rstrip()}")


def main() -> None:
    lay, keep, tmp = parse()
    print(f"layout: {lay}")
    t_start = time.perf_counter()
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=tmp))
    base = Path(keep) if keep else scratch
    try:
        targets = []
        for tag, frames in (("big", lay.frames), ("small", lay.small_frames)):
            path = base / f"{tag}.mjarchive"
            shutil.rmtree(path, ignore_errors=True)
            t0 = time.perf_counter()
            build(path, frames, lay.worlds, lay.chunk_frames)
            print(f"build.local.{tag}_s: {time.perf_counter() - t0:.1f}")
            print(f"build.local.{tag}_GB: {disk_bytes(path) / 1e9:.3f}")
            targets.append(Target(tag, str(path), frames, lay.worlds, scratch=scratch))
        best = measure("local", targets, lay)
        if lay.profile:
            for op in OPS:
                if best[op]["big"] > 2 * best[op]["small"]:
                    profile(op, targets[0], lay)
        if lay.s3:
            measure_s3(targets, lay, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"total_s: {time.perf_counter() - t_start:.1f}")


def measure_s3(local: list[Target], lay: Layout, scratch: Path) -> None:
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as exc:
        print(f"s3.skipped: {exc}")
        return
    sys.path.insert(0, str(TESTS))
    from s3_server import S3Server  # the test suite's moto server (a child process)

    server = S3Server(scratch / "s3.log").start()
    try:
        server.create_bucket("bench")
        options = server.storage_options()
        targets = []
        for t in local:
            t0 = time.perf_counter()
            n = upload(Path(t.location), "bench", f"{t.tag}.mjarchive", options)
            print(f"build.s3.{t.tag}_s: {time.perf_counter() - t0:.1f}")
            print(f"build.s3.{t.tag}_objects: {n}")
            # (the local archive grew by refresh's chunks: the copy has those frames too)
            targets.append(Target(t.tag, f"s3://bench/{t.tag}.mjarchive", t.frames + t.appended * lay.chunk_frames,
                                  t.worlds, options=options, scratch=scratch))
        measure("s3", targets, lay)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
