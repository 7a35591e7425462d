"""Compression benchmark: lossless codec pipelines for the per-frame arrays, on policy-like motion.

Workloads (qpos, float32, recorded at 30 fps), simulated once and cached:

- `humanoid_pd`: the mujoco_warp humanoid, PD control (100 Hz) of every actuated joint to smooth
  sinusoid targets (random amplitude, frequency and phase per joint and world); it falls, lies on
  the ground for a second and is reset (also after 10 s);
- `humanoid_fall`: passive falls from a random orientation, reset every 3 s;
- `humanoid_random`: i.i.d. uniform random controls at 100 Hz (the contrast: noisy motion);
- `aloha_pd`: aloha_pot's two arms, position actuators driven to smooth sinusoid targets;
- `aloha_random`: aloha_pot with random set points held for 0.1 s.

Each inner chunk holds one world, so compression never sees across worlds: the distinct simulated
worlds (`--sim-worlds`) are tiled to `--worlds` (1024) for the append measurement.

Per candidate pipeline (inside the sharding codec; `today` is mjarchive 0.1's
bytes + blosc(zstd, 3, bitshuffle); `T_shuffle_z2`, transpose (frames innermost) + bytes +
blosc(zstd, 2, shuffle), is the default now):

- `size_ratio.<workload>.<candidate>`: stored qpos bytes of `today` / the candidate's (higher is better);
- `append_MBps.<candidate>`: raw MB/s appended through `mjarchive.create(...).append` (32-frame blocks,
  including close) for 1024 worlds of `humanoid_pd`; best of `--repeats`, candidates interleaved;
  `append_MB_per_cpu_s`: the same per second of process CPU time (all threads);
- `encode_MBps` / `decode_MBps.<candidate>`: the inner-chunk codec chain alone, on the process's
  cores (what the codecs cost, without the writer or zarr-python's per-chunk overhead); best of
  `--repeats`; `uncompressed` is the writer's ceiling (transpose, no compressor);
- `read_world_ms.<candidate>`: `mjarchive.open(...).qpos[:, w]` of one world (all frames), warm.

Every archive is read back and compared bit for bit with what was appended. Run
`python benchmarks/bench_compression.py` (~5 min on 2 shared cores after the first, cached, simulation),
`--quick` for a small run. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import os
import shutil
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mujoco
import numcodecs
import numpy as np
import zarr
import zarr.codecs

import mjarchive
from mjarchive.archive import format as format_module
from mjarchive.archive import creation as creation_module
from mjarchive.archive.storage import chunk_layout
from mjarchive.archive.storage.shard_writer import PCODEC

MB = 1e6
FPS = 30.0
TEST_DATA = Path(str(importlib.resources.files("mujoco_warp") / "test_data"))
warnings.filterwarnings("ignore", message=".*[Nn]umcodecs.*")


def out(name: str, value) -> None:
    if isinstance(value, float):
        value = f"{value:.4g}"
    print(f"{name}: {value}", flush=True)


# -- workloads --------------------------------------------------------------------------------------
def _humanoid(n_worlds: int, n_frames: int, seed: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    m = mujoco.MjModel.from_xml_path(str(TEST_DATA / "humanoid" / "humanoid.xml"))
    d = mujoco.MjData(m)
    rng = np.random.default_rng(seed)
    lo, hi = m.actuator_ctrlrange.T
    jnt = m.actuator_trnid[:, 0]
    qadr, vadr = m.jnt_qposadr[jnt], m.jnt_dofadr[jnt]
    qlo, qhi = m.jnt_range[jnt].T
    steps = np.diff(np.ceil(np.arange(n_frames + 1) / FPS / m.opt.timestep - 1e-9).astype(int))
    qpos = np.empty((n_frames, n_worlds, m.nq), np.float32)
    reset = np.zeros((n_frames, n_worlds), bool)
    for w in range(n_worlds):
        def restart() -> None:
            mujoco.mj_resetData(m, d)
            d.qpos[7:] += rng.normal(0, 0.05, m.nq - 7)
            d.qvel[:] = rng.normal(0, 0.1, m.nv)
            if mode == "fall":
                q = rng.normal(size=4)
                d.qpos[3:7] = q / np.linalg.norm(q)
                d.qpos[2] = 1.5

        amp = rng.uniform(0.1, 0.5, m.nu) * (qhi - qlo) / 2
        freq, phase = rng.uniform(0.3, 1.5, m.nu), rng.uniform(0, 2 * np.pi, m.nu)
        mid = (qlo + qhi) / 2
        restart()
        start, fallen_at = 0, None
        reset[0, w] = True
        for i in range(n_frames):
            if fallen_at is None and d.qpos[2] < 0.5:
                fallen_at = i
            limit = 3 * FPS if mode == "fall" else 10 * FPS
            if i > 0 and (i - start >= limit or (mode != "fall" and fallen_at is not None and i - fallen_at >= FPS)):
                restart()
                reset[i, w] = True
                start, fallen_at = i, None
            qpos[i, w] = d.qpos
            for _ in range((steps[i] + 1) // 2):  # control at 100 Hz (2 steps of 5 ms)
                if mode == "pd":
                    target = mid + amp * np.sin(2 * np.pi * freq * d.time + phase)
                    d.ctrl[:] = np.clip(2.0 * (target - d.qpos[qadr]) - 0.1 * d.qvel[vadr], lo, hi)
                elif mode == "random":
                    d.ctrl[:] = rng.uniform(lo, hi)
                else:
                    d.ctrl[:] = 0
                mujoco.mj_step(m, d, nstep=2)
    return qpos, reset


def _aloha(n_worlds: int, n_frames: int, seed: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    from mujoco import rollout

    m = mujoco.MjModel.from_xml_path(str(TEST_DATA / "aloha_pot" / "scene.xml"))
    rng = np.random.default_rng(seed)
    lo, hi = m.actuator_ctrlrange.T
    sub = int(round(1 / FPS / m.opt.timestep))
    nstep = n_frames * sub
    t = np.arange(nstep)[:, None] * m.opt.timestep
    ctrl = np.empty((n_worlds, nstep, m.nu))
    for w in range(n_worlds):
        if mode == "pd":
            amp = rng.uniform(0.05, 0.3, m.nu) * (hi - lo) / 2
            freq, phase = rng.uniform(0.2, 1.0, m.nu), rng.uniform(0, 2 * np.pi, m.nu)
            ctrl[w] = np.clip(0.1 * (lo + hi) + amp * np.sin(2 * np.pi * freq * t + phase), lo, hi)
        else:
            held = rng.uniform(lo, hi, (nstep // 50 + 1, m.nu))
            ctrl[w] = np.repeat(held, 50, axis=0)[:nstep]
    d = mujoco.MjData(m)
    kind = mujoco.mjtState.mjSTATE_FULLPHYSICS
    s0 = np.empty((n_worlds, mujoco.mj_stateSize(m, kind)))
    for w in range(n_worlds):
        mujoco.mj_resetData(m, d)
        mujoco.mj_getState(m, d, s0[w], kind)
    state, _ = rollout.rollout(m, [mujoco.MjData(m) for _ in range(os.cpu_count() or 1)], s0, ctrl)
    qpos = np.ascontiguousarray(state[:, sub - 1::sub, 1:1 + m.nq].astype(np.float32).transpose(1, 0, 2))
    reset = np.zeros(qpos.shape[:2], bool)
    reset[0] = True
    return qpos, reset


WORKLOADS = {
    "humanoid_pd": lambda w, f, s: _humanoid(w, f, s, "pd"),
    "humanoid_fall": lambda w, f, s: _humanoid(w, f, s, "fall"),
    "humanoid_random": lambda w, f, s: _humanoid(w, f, s, "random"),
    "aloha_pd": lambda w, f, s: _aloha(w, f, s, "pd"),
    "aloha_random": lambda w, f, s: _aloha(w, f, s, "random"),
}


def workload(name: str, n_worlds: int, n_frames: int, cache: Path, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """qpos (frames, worlds, nq) float32 and reset (frames, worlds), simulated once then read from `cache`."""
    if name.startswith("aloha"):
        n_worlds = max(1, n_worlds // 8)  # 10x slower to simulate; still >= 2 chunks of frames per world
    path = cache / f"{name}_{n_worlds}x{n_frames}_s{seed}.npz"
    if path.exists():
        z = np.load(path)
        return z["qpos"], z["reset"]
    t0 = time.perf_counter()
    qpos, reset = WORKLOADS[name](n_worlds, n_frames, seed)
    print(f"# simulated {name} {n_worlds}x{n_frames} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, qpos=qpos, reset=reset)
    return qpos, reset


# -- candidates -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Candidate:
    """One pipeline of an inner chunk (chunk_frames, 1, *tail) and a chunk_frames."""

    label: str
    transpose: bool  # frames innermost: order (1, 2, ..., 0)
    compressor: str  # "blosc:<cname>:<clevel>:<shuffle>[:<typesize>]" or "pcodec:<level>" or "none"
    chunk_frames: int = 512
    tensorstore: bool = True  # every codec is one tensorstore reads

    def codecs(self, ndim: int, itemsize: int) -> dict:
        """Keyword arguments of zarr's create_array for the (frame, world, ...) array."""
        kw: dict = {}
        if self.transpose:
            kw["filters"] = [zarr.codecs.TransposeCodec(order=(*range(1, ndim), 0))]
        kind, *args = self.compressor.split(":")
        if kind == "blosc":
            cname, clevel, shuffle, *ts = args
            kw["compressors"] = zarr.codecs.BloscCodec(cname=cname, clevel=int(clevel), shuffle=shuffle,
                                                       typesize=int(ts[0]) if ts else itemsize)
        elif kind == "pcodec":
            from zarr.codecs.numcodecs import PCodec
            kw["serializer"] = PCodec(level=int(args[0]))
            kw["compressors"] = None
        else:
            kw["compressors"] = None
        return kw


TODAY = Candidate("today", False, "blosc:zstd:3:bitshuffle")
DEFAULT = Candidate("T_shuffle_z2", True, "blosc:zstd:2:shuffle")  # mjarchive's default (issue 16)
CANDIDATES = [
    TODAY,
    Candidate("shuffle", False, "blosc:zstd:3:shuffle"),
    Candidate("T_bitshuffle", True, "blosc:zstd:3:bitshuffle"),
    Candidate("T_shuffle", True, "blosc:zstd:3:shuffle"),
    DEFAULT,
    Candidate("T_shuffle_z1", True, "blosc:zstd:1:shuffle"),
    Candidate("T_shuffle_z5", True, "blosc:zstd:5:shuffle"),
    Candidate("T_shuffle_lz4", True, "blosc:lz4:5:shuffle"),
    Candidate("T_bitshuffle_lz4", True, "blosc:lz4:5:bitshuffle"),
    Candidate("T_shuffle_z2_ts1", True, "blosc:zstd:2:shuffle:1"),
    Candidate("T_shuffle_z2_cf1024", True, "blosc:zstd:2:shuffle", 1024),
    Candidate("T_shuffle_z2_cf256", True, "blosc:zstd:2:shuffle", 256),
    Candidate("pcodec8", False, "pcodec:8", tensorstore=False),
    Candidate("pcodec4", False, "pcodec:4", tensorstore=False),
    Candidate("uncompressed", True, "none"),  # the writer's ceiling: no compression at all
]


def use(candidate: Candidate):
    """Make mjarchive.create write its per-frame arrays with `candidate`'s codecs (benchmark only)."""
    def frame_world_array(W, tail, dims, dtype, chunk_frames, shard_worlds) -> dict:
        tail_chunks = tuple(max(1, t) for t in tail)
        itemsize = np.dtype(dtype).itemsize
        # Only float arrays (qpos here) take the candidate; reset flags keep mjarchive 0.1's codecs.
        kw = (candidate if np.dtype(dtype).kind == "f" else TODAY).codecs(2 + len(tail), itemsize)
        if itemsize == 1:
            kw["compressors"] = zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="noshuffle", typesize=1)
        return dict(shape=(0, W, *tail), chunks=(chunk_frames, 1, *tail_chunks),
                    shards=(chunk_frames, shard_worlds, *tail_chunks), dtype=dtype,
                    dimension_names=("frame", "world", *dims), fill_value=0, **kw)
    creation_module._frame_world_array = frame_world_array
    if not candidate.tensorstore:  # not in the spec: the writer's own store checks refuse it unless told
        allow_pcodec()


def allow_pcodec() -> None:
    """Let the archive's checks pass arrays whose serializer is pcodec (benchmark only): the codec list, and
    pcodec in the place of the 'bytes' codec (an array-to-bytes codec too). The reader's direct decoding
    path stays off for them (it knows only 'bytes'), so zarr decodes them."""
    format_module.ALLOWED_CODECS = format_module.ALLOWED_CODECS | {PCODEC}
    chunk_layout.ALLOWED_CODECS = format_module.ALLOWED_CODECS
    if getattr(chunk_layout._chain, "pcodec", False):
        return
    chain = chunk_layout._chain

    def chain_with_pcodec(codecs: list, decoded: int):
        names = [c if isinstance(c, str) else c.get("name") if isinstance(c, dict) else None for c in codecs]
        return chain(["bytes" if n == PCODEC else c for c, n in zip(codecs, names)], decoded)

    chain_with_pcodec.pcodec = True
    chunk_layout._chain = chain_with_pcodec


def pcodec_missing() -> str | None:
    """Why the pcodec candidates cannot run here, or None."""
    try:
        import pcodec  # noqa: F401
    except ImportError as exc:
        return f"{exc} (pip install pcodec)"
    return None


# -- measurements -----------------------------------------------------------------------------------
def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def append(path: Path, bundle, qpos: np.ndarray, reset: np.ndarray, cand: Candidate, block: int = 32
           ) -> tuple[float, float]:
    """(wall, process CPU) seconds to create an archive with `cand` and append `qpos` in blocks,
    including close()."""
    use(cand)
    times = np.arange(len(qpos)) / FPS
    t0, c0 = time.perf_counter(), time.process_time()
    with mjarchive.create(path, bundle, n_worlds=qpos.shape[1], chunk_frames=cand.chunk_frames,
                          overwrite=True) as w:
        for i in range(0, len(qpos), block):
            w.append(times[i:i + block], qpos[i:i + block], reset=reset[i:i + block])
    return time.perf_counter() - t0, time.process_time() - c0


def check_exact(path: Path, qpos: np.ndarray) -> None:
    got = zarr.open_array(path / "qpos", mode="r")[...]
    if not np.array_equal(got.view(np.uint32), qpos.view(np.uint32)):
        raise SystemExit(f"{path}: read back differs from what was appended")


def chunk_codec(cand: Candidate, shape: tuple[int, ...]):
    """(encode, decode) of one inner chunk's ndarray, the chain zarr applies inside the shard."""
    order = (*range(1, len(shape)), 0) if cand.transpose else tuple(range(len(shape)))
    kind, *args = cand.compressor.split(":")
    if kind == "blosc":
        cname, clevel, shuffle, *ts = args
        blosc = numcodecs.Blosc(cname=cname, clevel=int(clevel), typesize=int(ts[0]) if ts else 4,
                                shuffle={"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[shuffle])
        enc = lambda a: blosc.encode(np.ascontiguousarray(a.transpose(order)))  # noqa: E731
        dec = lambda b: np.frombuffer(blosc.decode(b), np.float32)  # noqa: E731
    else:
        from numcodecs.pcodec import PCodec
        pc = PCodec(level=int(args[0]))
        enc = lambda a: pc.encode(np.ascontiguousarray(a.transpose(order)))  # noqa: E731
        dec = lambda b: pc.decode(b)  # noqa: E731
    return enc, dec


def codec_MBps(cand: Candidate, qpos: np.ndarray, repeats: int) -> tuple[float, float]:
    """(encode, decode) MB/s of the inner-chunk chain alone, on all cores, best of `repeats`."""
    cf = cand.chunk_frames
    chunks = [qpos[f:f + cf, w:w + 1] for w in range(qpos.shape[1]) for f in range(0, len(qpos) - cf + 1, cf)]
    enc, dec = chunk_codec(cand, chunks[0].shape)
    n = os.cpu_count() or 1
    best_enc = best_dec = float("inf")
    with ThreadPoolExecutor(n) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            blobs = [b for part in pool.map(lambda p: [enc(c) for c in p], [chunks[i::n] for i in range(n)])
                     for b in part]
            best_enc = min(best_enc, time.perf_counter() - t0)
            t0 = time.perf_counter()
            list(pool.map(lambda p: [dec(b) for b in p], [blobs[i::n] for i in range(n)]))
            best_dec = min(best_dec, time.perf_counter() - t0)
    raw = sum(c.nbytes for c in chunks) / MB
    return raw / best_enc, raw / best_dec


def read_world_ms(path: Path, w: int, expect: np.ndarray, repeats: int) -> float:
    best = float("inf")
    with mjarchive.open(path) as a:
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            got = np.asarray(a.select(worlds=[w]).qpos)
            best = min(best, time.perf_counter() - t0)
    if not np.array_equal(got.reshape(expect.shape).view(np.uint32), expect.view(np.uint32)):
        raise SystemExit(f"{path}: world {w} read back differs")
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny run: few worlds and frames, few candidates")
    ap.add_argument("--sim-worlds", type=int, default=64)
    ap.add_argument("--frames", type=int, default=1024)
    ap.add_argument("--worlds", type=int, default=1024, help="worlds of the append measurement (tiled)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated candidate labels (today is always run)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "mjarchive_bench_compression")
    args = ap.parse_args()
    cands = CANDIDATES
    if args.quick:
        args.sim_worlds, args.frames, args.worlds, args.repeats = 8, 256, 64, 1
        cands = [TODAY, dataclasses.replace(DEFAULT, chunk_frames=128),
                 Candidate("pcodec8", False, "pcodec:8", 128, tensorstore=False)]
        cands[0] = dataclasses.replace(TODAY, chunk_frames=128)
    if args.only:
        keep = set(args.only.split(","))
        cands = [c for c in cands if c.label == "today" or c.label in keep]
    missing = pcodec_missing()
    if missing:
        for c in cands:
            if c.compressor.startswith("pcodec"):
                out(f"skipped.{c.label}", missing)
        cands = [c for c in cands if not c.compressor.startswith("pcodec")]
    names = list(WORKLOADS)
    data = {n: workload(n, args.sim_worlds, args.frames, args.cache) for n in names}
    bundle = mjarchive.ModelBundle.from_file(TEST_DATA / "humanoid" / "humanoid.xml")
    bundles = {"humanoid": bundle, "aloha": mjarchive.ModelBundle.from_file(TEST_DATA / "aloha_pot" / "scene.xml")}
    tmp = Path(tempfile.mkdtemp(prefix="bench_compression_"))
    try:
        out("workload.frames", args.frames)
        out("workload.sim_worlds", args.sim_worlds)
        out("workload.append_worlds", args.worlds)
        sizes: dict[tuple[str, str], int] = {}
        for n in names:
            qpos, reset = data[n]
            out(f"raw_MB.{n}", qpos.nbytes / MB)
            for c in cands:
                path = tmp / f"{n}_{c.label}"
                append(path, bundles[n.split("_")[0]], qpos, reset, c)
                check_exact(path, qpos)
                sizes[n, c.label] = dir_bytes(path / "qpos")
                shutil.rmtree(path)
            for c in cands:
                out(f"size_ratio.{n}.{c.label}", sizes[n, "today"] / sizes[n, c.label])
            out(f"raw_over_today.{n}", qpos.nbytes / sizes[n, "today"])
        policy = [n for n in names if "random" not in n]
        for c in cands:
            ratios = [sizes[n, "today"] / sizes[n, c.label] for n in policy]
            out(f"size_ratio.policy_geomean.{c.label}", float(np.exp(np.mean(np.log(ratios)))))

        qpos, reset = data["humanoid_pd"]
        reps = -(-args.worlds // qpos.shape[1])
        big_q = np.ascontiguousarray(np.tile(qpos, (1, reps, 1))[:, :args.worlds])
        big_r = np.ascontiguousarray(np.tile(reset, (1, reps))[:, :args.worlds])
        best = {c.label: float("inf") for c in cands}
        best_cpu = dict(best)
        for _ in range(args.repeats):  # interleaved
            for c in cands:
                wall, cpu = append(tmp / f"big_{c.label}", bundle, big_q, big_r, c)
                best[c.label], best_cpu[c.label] = min(best[c.label], wall), min(best_cpu[c.label], cpu)
        for c in cands:
            out(f"append_MBps.{c.label}", big_q.nbytes / MB / best[c.label])
        for c in cands:  # less sensitive to other processes than wall time; 2 cores can at most double it
            out(f"append_MB_per_cpu_s.{c.label}", big_q.nbytes / MB / best_cpu[c.label])
        for c in cands:
            out(f"ratio.append_vs_today.{c.label}", best["today"] / best[c.label])
        for c in cands:
            path = tmp / f"big_{c.label}"
            check_exact(path, big_q)
            if c.compressor != "none":
                enc, dec = codec_MBps(c, qpos, args.repeats)
                out(f"encode_MBps.{c.label}", enc)
                out(f"decode_MBps.{c.label}", dec)
            if c.tensorstore:  # mjarchive's reader refuses pcodec (not in the spec)
                out(f"read_world_ms.{c.label}", read_world_ms(path, 3, big_q[:, 3], args.repeats))
            out(f"tensorstore_reads.{c.label}", "yes" if c.tensorstore else "no")
            shutil.rmtree(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
