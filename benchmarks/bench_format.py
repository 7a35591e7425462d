"""Format benchmark: append throughput, read cost and size of mjarchive vs flygym- and mojive-style files.

Workload (issue #3): simulated humanoid qpos (nq=28), 1024 worlds x 4096 frames at 30 fps, float32.
Everything is measured side by side in one run and printed as `name: value` lines, with ratios
against baselines measured in the same run:

- flygym style: one `np.savez_compressed` file per world (qpos (T, nq) and time (T,));
- mojive style: one memory-mapped `.npy` of shape (T, W, nq);
- plain blosc-zstd: numcodecs Blosc(zstd, clevel 3, byte shuffle) over the whole (T, W, nq) array;
- codec only: the archive's own codec chain for qpos (read from its metadata: transpose + blosc) on the
  same qpos cut into its inner chunks, the transpose timed, with numcodecs' `Blosc.encode` on
  os.cpu_count() threads, outputs dropped: what append's compression of qpos alone costs
  (`ratio.append_vs_codec_only`, goal >= 0.70); also with reset's chain (blosc) on the reset markers
  append encodes too (`ratio.append_vs_codec_only_qpos_and_reset`).

Run `python benchmarks/bench_format.py` (default layout, 2-4 min on 2 shared cores), `--quick` for a
tiny run, `--sweep` to also compare chunk layouts and print the frontier (5-10 min). See
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.resources
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import google_crc32c
import mujoco
import numcodecs
import numpy as np
import zarr.storage
from zarr.abc.store import RangeByteRequest, SuffixByteRequest

import mjarchive
from mjarchive.archive.storage.shard_writer import ShardWriter
from mjarchive.archive.writer import DEFAULT_CHUNK_FRAMES, DEFAULT_SHARD_WORLDS

MB = 1e6


@dataclasses.dataclass(frozen=True)
class Workload:
    """Sizes of one run. `sim_*` is what is really simulated; the rest is derived from it."""

    worlds: int = 1024
    frames: int = 4096
    sim_worlds: int = 32
    sim_frames: int = 1024
    fps: float = 30.0
    block: int = 32  # frames per append() call
    replay_worlds: int = 16  # the replay read: a world subset x a frame range
    replay_frames: int = 300
    repeats: int = 3
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Layout:
    """A chunk layout of the (frame, world, nq) arrays: inner chunk (chunk_frames, 1, nq),
    shard (chunk_frames, shard_worlds, nq)."""

    chunk_frames: int
    shard_worlds: int

    @property
    def label(self) -> str:
        return f"cf{self.chunk_frames}_sw{self.shard_worlds}"


QUICK = Workload(worlds=64, frames=192, sim_worlds=4, sim_frames=96, block=16, replay_worlds=4,
                 replay_frames=60, repeats=2)
SWEEP = [Layout(cf, sw) for cf in (256, 512, 1024) for sw in (64, 256, 1024)]
QUICK_SWEEP = [Layout(cf, sw) for cf in (32, 128) for sw in (16, 64)]


def out(name: str, value) -> None:
    if isinstance(value, float):
        value = f"{value:.4g}"
    print(f"{name}: {value}", flush=True)


# -- data ---------------------------------------------------------------------------------------------
def humanoid_xml() -> Path:
    return Path(str(importlib.resources.files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml"))


def simulate(xml: Path, n_worlds: int, n_frames: int, fps: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Humanoid rollouts with smooth random controls, reset when fallen or after 10 s.

    Returns qpos (n_worlds, n_frames, nq) float32 sampled at `fps` and reset markers
    (n_worlds, n_frames) bool.
    """
    model = mujoco.MjModel.from_xml_path(str(xml))
    data = mujoco.MjData(model)
    rng = np.random.default_rng(seed)
    lo, hi = model.actuator_ctrlrange.T
    # Steps between frames alternate (6 or 7 at dt=5 ms) so frame i sits at the first step >= i/fps.
    step_at = np.ceil(np.arange(n_frames + 1) / fps / model.opt.timestep - 1e-9).astype(int)
    qpos = np.empty((n_worlds, n_frames, model.nq), np.float32)
    reset = np.zeros((n_worlds, n_frames), bool)

    def restart() -> None:
        mujoco.mj_resetData(model, data)
        data.qpos[7:] += rng.normal(0, 0.05, model.nq - 7)
        data.qvel[:] = rng.normal(0, 0.1, model.nv)
        data.ctrl[:] = 0

    for w in range(n_worlds):
        restart()
        episode_start = 0
        reset[w, 0] = True
        for i in range(n_frames):
            if i > 0 and (data.qpos[2] < 0.75 or i - episode_start >= 10 * fps):
                restart()
                reset[w, i] = True
                episode_start = i
            qpos[w, i] = data.qpos
            data.ctrl[:] = np.clip(0.8 * data.ctrl + 0.4 * rng.normal(size=model.nu), lo, hi)
            mujoco.mj_step(model, data, nstep=int(step_at[i + 1] - step_at[i]))
    return qpos, reset


def derive(base: np.ndarray, base_reset: np.ndarray, worlds: int, frames: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Tile `sim_worlds` rollouts to (frames, worlds, nq) without repeating any world.

    Each derived world is a sequence of segments; each segment is one simulated world's whole
    rollout, rotated in time by a random shift (rotation point and segment starts are marked as
    resets), and the world gets a random spawn offset of its root x, y in [-2, 2] m, as in
    training with randomized spawn positions.
    """
    rng = np.random.default_rng(seed + 1)
    n_sim, seg, nq = base.shape
    qpos = np.empty((frames, worlds, nq), np.float32)
    reset = np.zeros((frames, worlds), bool)
    for w in range(worlds):
        offset = rng.uniform(-2.0, 2.0, 2).astype(np.float32)
        for start in range(0, frames, seg):
            src, shift = int(rng.integers(n_sim)), int(rng.integers(seg))
            n = min(seg, frames - start)
            piece = np.roll(base[src], -shift, axis=0)[:n]
            qpos[start:start + n, w] = piece
            qpos[start:start + n, w, :2] += offset
            r = np.roll(base_reset[src], -shift)[:n]
            r[0] = True
            reset[start:start + n, w] = r
    return qpos, reset


# -- measuring helpers ----------------------------------------------------------------------------------
class CountingStore(zarr.storage.WrapperStore):
    """Counts the bytes each read returns, split into whole objects, shard indexes (suffix ranges)
    and inner chunks (byte ranges)."""

    def __init__(self, store):
        super().__init__(store)
        self.reset()

    def reset(self) -> None:
        self.bytes = {"object": 0, "index": 0, "chunk": 0}
        self.requests = 0

    def _count(self, byte_range, buf) -> None:
        if buf is None:
            return
        kind = ("index" if isinstance(byte_range, SuffixByteRequest)
                else "chunk" if isinstance(byte_range, RangeByteRequest) else "object")
        self.bytes[kind] += len(buf)
        self.requests += 1

    async def get(self, key, prototype, byte_range=None):
        buf = await self._store.get(key, prototype, byte_range)
        self._count(byte_range, buf)
        return buf

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        bufs = await self._store.get_partial_values(prototype, key_ranges)
        for (_key, byte_range), buf in zip(key_ranges, bufs):
            self._count(byte_range, buf)
        return bufs

    async def get_ranges(self, key, byte_ranges, *, prototype, **kwargs):  # zarr >= 3.4 reads shards so
        byte_ranges = list(byte_ranges)
        async for group in self._store.get_ranges(key, byte_ranges, prototype=prototype, **kwargs):
            for idx, buf in group:
                self._count(byte_ranges[idx], buf)
            yield group


def timed(fn, repeats: int) -> tuple[float, object]:
    """Best wall time over `repeats` calls (warm page cache) and the last result."""
    best, result = math.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def append_archive(path: Path, bundle, qpos, reset, times, layout: Layout, block: int, precision=None) -> float:
    """Seconds to create an archive and append everything in blocks, including close(). A previous
    run's archive at `path` is deleted first, untimed: like the baselines, the append starts empty."""
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    with mjarchive.create(path, bundle, n_worlds=qpos.shape[1], chunk_frames=layout.chunk_frames,
                          shard_worlds=layout.shard_worlds, precision=precision, overwrite=True) as writer:
        for i in range(0, qpos.shape[0], block):
            writer.append(times[i:i + block], qpos[i:i + block], reset=reset[i:i + block])
    return time.perf_counter() - t0


@dataclasses.dataclass(frozen=True)
class CodecChain:
    """One sharded array's inner chunks and codecs, read from the archive's metadata: what append encodes."""

    data: np.ndarray  # the appended array, (frames, worlds, *tail)
    layout: ShardWriter  # its chunk and shard shapes, transpose order and blosc codec, as the writer reads them

    @property
    def chunk_frames(self) -> int:
        return self.layout.chunk_shape[0]

    @functools.cached_property
    def to_chunks(self) -> tuple[int, ...]:
        """Axes taking rows (frames, worlds, 1, *tail) to inner chunks, worlds first, in the transpose codec's order."""
        axes = (1, 0, *range(2, self.data.ndim + 1))
        order = self.layout.order or range(self.data.ndim)
        return (axes[0], *(axes[1 + i] for i in order))


def codec_chains(path: Path, arrays: dict[str, np.ndarray]) -> list[CodecChain]:
    """The codec chain of each of `arrays` (name -> appended data) in the archive at `path`."""
    chains = []
    for name, data in arrays.items():
        layout = ShardWriter.for_array(zarr.open_array(path / name, mode="r").with_config({"write_empty_chunks": True}))
        assert layout is not None and isinstance(layout.compressor, numcodecs.Blosc), f"{name}: not a blosc shard layout"
        shape = layout.chunk_shape
        assert shape[1:] == (1, *data.shape[2:]), f"{name}: inner chunks of one world expected, got {shape}"
        assert layout.shard_shape[0] == shape[0], f"{name}: shards of one chunk of frames expected"
        chains.append(CodecChain(data, layout))
    return chains


def codec_only(chains: list[CodecChain], group: int = 8, digest: bool = False,
               direct: bool = False) -> tuple[float, list[dict]]:
    """Seconds for the codec chains alone to encode every inner chunk of their arrays on os.cpu_count()
    threads (Blosc releases the GIL): each inner chunk is transposed as its codecs say (`group` chunks at a
    time, in cache, as the writer does) and encoded with `Blosc.encode`, as many groups per pool task as
    make the writer's task (2 per thread and shard: 64 chunks of a 256-world shard on 2 cores); outputs
    are measured and dropped, so no time goes to keeping them (keeping 400 MB of outputs cost up to 3x in
    page faults). Returns the seconds and, per chain, each inner chunk's encoded length (with `digest`: its
    crc32c, computed in the timed part too) by (chunk of frames, world). With `direct`, each of these tasks
    is encoded as the writer encodes it where it can: by numcodecs' c-blosc straight through ctypes into
    one buffer, in one call where each chunk is one blosc block (`ShardWriter`'s direct path), instead of
    `Blosc.encode`."""
    workers = os.cpu_count() or 1
    per_task = max(1, round(math.ceil(chains[0].layout.shard_shape[1] / (2 * workers)) / group))  # ShardWriter's tasks
    if direct:  # one task's chunks side by side, copied `group` at a time as the writer does
        group, per_task, step = group * per_task, 1, group
    tasks = [(c, f, w) for c, chain in enumerate(chains) for f in range(0, chain.data.shape[0], chain.chunk_frames)
             for w in range(0, chain.data.shape[1], group)]
    measure = google_crc32c.value if digest else len

    def encode(task) -> list[int]:
        c, f, w = task
        chain = chains[c]
        n = min(group, chain.data.shape[1] - w)

        def chunks_of(lo: int, hi: int) -> np.ndarray:
            """Worlds w+lo..w+hi-1: one inner chunk each, in the transpose codec's order."""
            rows = np.ascontiguousarray(chain.data[f:f + chain.chunk_frames, w + lo:w + hi])[:, :, None]
            return rows.transpose(chain.to_chunks)  # rows: (frames, worlds, 1, *tail)

        # Each chunk's bytes, as zarr-python hands them to blosc: numcodecs < 0.16 takes no typesize and
        # then shuffles with the byte view's item size, 1 (so do zarr and the writer there).
        if direct:
            together = np.empty((n, *chunks_of(0, 0).shape[1:]), chain.data.dtype)
            for lo in range(0, n, step):
                together[lo:lo + step] = chunks_of(lo, min(lo + step, n))
            pieces, lengths = chain.layout._direct.encode_rows(together.reshape(n, -1).view(np.uint8))
            if not digest:
                return lengths
            buffer = np.concatenate(pieces)
            ends = np.cumsum(lengths).tolist()
            return [measure(buffer[end - k:end]) for end, k in zip(ends, lengths)]
        flat = np.ascontiguousarray(chunks_of(0, n)).reshape(n, -1).view(np.uint8)
        return [measure(chain.layout.compressor.encode(chunk)) for chunk in flat]

    batches = [tasks[i:i + per_task] for i in range(0, len(tasks), per_task)]
    with ThreadPoolExecutor(workers) as pool:
        started = threading.Barrier(workers)  # every thread started before the clock, as the writer's are
        list(pool.map(lambda _: started.wait(), range(workers)))
        t0 = time.perf_counter()
        encoded = [got for batch in pool.map(lambda b: [encode(t) for t in b], batches) for got in batch]
        seconds = time.perf_counter() - t0
    measured: list[dict[tuple[int, int], int]] = [{} for _ in chains]
    for (c, f, w), got in zip(tasks, encoded):
        measured[c].update({(f // chains[c].chunk_frames, w + i): n for i, n in enumerate(got)})
    return seconds, measured


def stored_inner_chunks(path: Path, name: str, chain: CodecChain) -> dict[tuple[int, int], int]:
    """Each stored inner chunk's crc32c by (chunk of frames, world), read through the shard indexes of
    array `name` (shards of one chunk of frames, as `codec_chains` checks)."""
    shard_worlds, per_shard = chain.layout.shard_shape[1], chain.layout.chunks_per_shard[1]
    crcs = {}
    for f in (path / name / "c").rglob("*"):
        if f.is_file():
            frame_chunk, shard = (int(k) for k in f.relative_to(path / name / "c").parts[:2])
            data = f.read_bytes()
            index = np.frombuffer(data[-4 - 16 * per_shard:-4], "<u8").reshape(per_shard, 2)
            crcs.update({(frame_chunk, shard * shard_worlds + i): google_crc32c.value(data[int(o):int(o) + int(n)])
                         for i, (o, n) in enumerate(index) if n != 2**64 - 1})
    return crcs


@dataclasses.dataclass(frozen=True)
class Probe:
    """What the reads touch, drawn once so every layout and baseline reads the same data."""

    worlds: tuple[int, ...]  # read one world over all frames, once per world
    frames: tuple[int, ...]  # read one frame of all worlds, once per frame
    replay: tuple[int, int, int, int]  # (first world, n worlds, first frame, n frames)

    @classmethod
    def draw(cls, wl: Workload, rng: np.random.Generator) -> Probe:
        rw, rf = min(wl.replay_worlds, wl.worlds), min(wl.replay_frames, wl.frames)
        return cls(tuple(rng.choice(wl.worlds, wl.repeats, replace=False).tolist()),
                   tuple(rng.integers(wl.frames, size=wl.repeats).tolist()),
                   (int(rng.integers(wl.worlds - rw + 1)), rw, int(rng.integers(wl.frames - rf + 1)), rf))


def measure_layout(prefix: str, path: Path, bundle, qpos, reset, times, layout: Layout, wl: Workload,
                   probe: Probe, codec: bool = False) -> dict[str, float | str]:
    """Append, read one world, read one frame, read a replay window, and size, for one layout. With
    `codec`, also the codec alone on the same bytes (`codec_only`), each the best of `wl.repeats`,
    interleaved with the appends so both see the same machine."""
    T, W, nq = qpos.shape
    raw = qpos.nbytes
    res: dict[str, float | str] = {}
    res["append_s"] = append_archive(path, bundle, qpos, reset, times, layout, wl.block)
    if codec:
        chains = codec_chains(path, {"qpos": qpos, "reset": reset})
        direct = all(c.layout._direct is not None for c in chains)  # the writer's own direct c-blosc calls
        res["append_s"] = res["codec_only_s"] = res["codec_only_all_s"] = math.inf  # the same rounds for each
        res["codec_only_direct_s"] = math.inf if direct else math.nan
        for _ in range(max(wl.repeats, 5)):  # the pair this run is judged by: more rounds against outliers
            res["codec_only_s"] = min(res["codec_only_s"], codec_only(chains[:1])[0])
            res["codec_only_all_s"] = min(res["codec_only_all_s"], codec_only(chains)[0])
            if direct:
                res["codec_only_direct_s"] = min(res["codec_only_direct_s"], codec_only(chains[:1], direct=True)[0])
            res["append_s"] = min(res["append_s"], append_archive(path, bundle, qpos, reset, times, layout, wl.block))
        res["codec_only_MBps"] = raw / MB / res["codec_only_s"]
        res["codec_only_all_MBps"] = raw / MB / res["codec_only_all_s"]
        # The same bytes (checked untimed): every inner chunk the chains encode has the crc32c of the one the
        # archive stores at its place (unless the archive's last chunk is padded to the chunk's frames).
        stored = [stored_inner_chunks(path, n, c) for n, c in zip(("qpos", "reset"), chains)]
        differ = sum(sum(n != want.get(key) for key, n in got.items()) + len(want.keys() - got.keys())
                     for encoded in ([codec_only(chains, digest=True)[1]]
                                     + ([codec_only(chains, digest=True, direct=True)[1]] if direct else []))
                     for got, want in zip(encoded, stored))
        res["codec_only_same_inner_chunks"] = "n/a (partial chunk)" if T % layout.chunk_frames else (
            "yes" if not differ else f"no ({differ} inner chunks differ)")
    res["append_MBps"] = raw / MB / res["append_s"]
    res["size_MB"] = dir_bytes(path / "qpos") / MB
    store = CountingStore(zarr.storage.LocalStore(path, read_only=True))
    archive = mjarchive.open(store)
    times_w, touched = [], []
    for w in probe.worlds:
        store.reset()
        t0 = time.perf_counter()
        got = archive.select(worlds=[int(w)]).qpos
        times_w.append(time.perf_counter() - t0)
        touched.append(dict(store.bytes))
        assert np.array_equal(got[:, 0], qpos[:, w]), "read back differs from what was appended"
    res["read_world_s"] = min(times_w)
    res["read_world_touched_B"] = statistics.mean(sum(b.values()) for b in touched)
    res["read_world_index_B"] = statistics.mean(b["index"] for b in touched)
    res["read_world_chunks_B"] = statistics.mean(b["chunk"] + b["object"] for b in touched)
    res["read_world_touched_over_raw"] = res["read_world_touched_B"] / (T * nq * qpos.itemsize)
    res["read_world_touched_over_compressed"] = res["read_world_touched_B"] / res["read_world_chunks_B"]
    frames = iter(probe.frames)
    res["read_frame_s"], got = timed(lambda: (f := next(frames), archive.select(frames=slice(f, f + 1)).qpos), wl.repeats)
    assert np.array_equal(got[1][0], qpos[got[0]])
    w0, rw, f0, rf = probe.replay
    res["read_replay_s"], got = timed(lambda: archive.select(worlds=slice(w0, w0 + rw), frames=slice(f0, f0 + rf)).qpos,
                                      wl.repeats)
    assert np.array_equal(got, qpos[f0:f0 + rf, w0:w0 + rw])
    store.reset()
    archive.select(worlds=slice(w0, w0 + rw), frames=slice(f0, f0 + rf)).qpos
    res["read_replay_touched_over_raw"] = sum(store.bytes.values()) / got.nbytes
    archive.close()
    for name, value in res.items():
        out(f"{prefix}.{name}", value)
    return res


def compare_zarr_writes(fast_path: Path, path: Path, bundle, qpos, reset, times, layout: Layout, wl: Workload,
                        fast_MBps: float) -> None:
    """The same append with every chunk written by zarr-python (MJARCHIVE_ZARR_WRITES=1, no whole-shard
    encoder), in the same run: its throughput, the speedup of the default path, and whether the two
    wrote byte-identical chunk objects."""
    os.environ["MJARCHIVE_ZARR_WRITES"] = "1"
    try:
        seconds = append_archive(path, bundle, qpos, reset, times, layout, wl.block)
    finally:
        del os.environ["MJARCHIVE_ZARR_WRITES"]
    out("zarr_writes.append_MBps", qpos.nbytes / MB / seconds)
    out("ratio.append_fast_vs_zarr_writes", fast_MBps / (qpos.nbytes / MB / seconds))
    differ = 0
    for name in ("qpos", "reset"):
        files = sorted(p.relative_to(path) for p in (path / name / "c").rglob("*") if p.is_file())
        fast_files = sorted(p.relative_to(fast_path) for p in (fast_path / name / "c").rglob("*") if p.is_file())
        if files != fast_files:
            differ += 1
            continue
        differ += sum((path / f).read_bytes() != (fast_path / f).read_bytes() for f in files)
    out("zarr_writes.chunk_objects_identical", "yes" if differ == 0 else f"no ({differ} differ)")
    shutil.rmtree(path)


# -- main -------------------------------------------------------------------------------------------------
def run(wl: Workload, layouts: list[Layout], workdir: Path, zarr_writes: bool = False) -> None:
    default = Layout(DEFAULT_CHUNK_FRAMES, DEFAULT_SHARD_WORLDS)
    rng = np.random.default_rng(wl.seed)
    t0 = time.perf_counter()
    base, base_reset = simulate(humanoid_xml(), wl.sim_worlds, wl.sim_frames, wl.fps, wl.seed)
    out("data.simulate_s", time.perf_counter() - t0)
    t0 = time.perf_counter()
    qpos, reset = derive(base, base_reset, wl.worlds, wl.frames, wl.seed)
    times = np.arange(wl.frames) / wl.fps
    out("data.derive_s", time.perf_counter() - t0)
    T, W, nq = qpos.shape
    raw = qpos.nbytes
    out("data.shape", (T, W, nq))
    out("data.raw_MB", raw / MB)
    out("data.episodes_per_world", float(reset.sum() / W))
    bundle = mjarchive.ModelBundle.from_file(humanoid_xml())

    # Baselines: flygym-style npz per world, mojive-style mmap .npy, plain blosc-zstd.
    npz_dir = workdir / "npz"
    npz_dir.mkdir()
    t0 = time.perf_counter()
    for w in range(W):
        np.savez_compressed(npz_dir / f"world_{w}.npz", qpos=qpos[:, w], time=times)
    npz_s = time.perf_counter() - t0
    npy = workdir / "qpos.npy"
    t0 = time.perf_counter()
    np.save(npy, qpos)
    npy_s = time.perf_counter() - t0
    blosc = numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.SHUFFLE)
    blosc_MB = len(blosc.encode(qpos)) / MB
    out("baseline.npz_append_MBps", raw / MB / npz_s)
    out("baseline.npy_append_MBps", raw / MB / npy_s)
    out("baseline.npz_size_MB", dir_bytes(npz_dir) / MB)
    out("baseline.npy_size_MB", npy.stat().st_size / MB)
    out("baseline.blosc_zstd_size_MB", blosc_MB)

    probe = Probe.draw(wl, rng)
    w = probe.worlds[0]
    npz_world_s, _ = timed(lambda: np.load(npz_dir / f"world_{w}.npz")["qpos"], wl.repeats)
    mmap_world_s, _ = timed(lambda: np.array(np.load(npy, mmap_mode="r")[:, w]), wl.repeats)
    out("baseline.npz_read_world_s", npz_world_s)
    out("baseline.mmap_read_world_s", mmap_world_s)
    f = probe.frames[0]
    npz_frame_s, got = timed(lambda: np.stack([np.load(npz_dir / f"world_{i}.npz")["qpos"][f] for i in range(W)]), 1)
    assert np.array_equal(got, qpos[f])
    mmap_frame_s, _ = timed(lambda: np.array(np.load(npy, mmap_mode="r")[f]), max(wl.repeats, 20))
    out("baseline.npz_read_frame_s", npz_frame_s)
    out("baseline.mmap_read_frame_s", mmap_frame_s)
    w0, rw, f0, rf = probe.replay
    npz_replay_s, _ = timed(lambda: np.stack([np.load(npz_dir / f"world_{i}.npz")["qpos"][f0:f0 + rf]
                                              for i in range(w0, w0 + rw)], 1), wl.repeats)
    mmap_replay_s, _ = timed(lambda: np.array(np.load(npy, mmap_mode="r")[f0:f0 + rf, w0:w0 + rw]), wl.repeats)
    out("baseline.npz_read_replay_s", npz_replay_s)
    out("baseline.mmap_read_replay_s", mmap_replay_s)
    shutil.rmtree(npz_dir)
    if hasattr(os, "sync"):  # the baselines' ~900 MB of dirty pages would be written back during the appends
        os.sync()

    results: dict[Layout, dict[str, float]] = {}
    for layout in [default] + [lay for lay in layouts if lay != default]:
        path = workdir / f"{layout.label}.mjarchive"
        results[layout] = measure_layout(f"layout[{layout.label}]", path, bundle, qpos, reset, times, layout, wl, probe,
                                         codec=layout == default)
        if zarr_writes and layout == default:
            compare_zarr_writes(path, workdir / "zarr_writes.mjarchive", bundle, qpos, reset, times, layout, wl,
                                results[layout]["append_MBps"])
        shutil.rmtree(path)

    # Lossy: default layout with precision=1e-4.
    path = workdir / "lossy.mjarchive"
    precision = 1e-4
    lossy_s = append_archive(path, bundle, qpos, reset, times, default, wl.block, precision=precision)
    with mjarchive.open(path) as archive:
        err = float(np.abs(archive.select().qpos.astype(np.float64) - qpos).max())
        bound = archive.manifest.abs_error
    out("lossy.precision", precision)
    out("lossy.append_MBps", raw / MB / lossy_s)
    lossy_MB = dir_bytes(path / "qpos") / MB
    out("lossy.size_MB", lossy_MB)
    out("lossy.max_abs_error", err)
    out("lossy.recorded_bound", bound)
    shutil.rmtree(path)

    d = results[default]
    out("codec_only.MBps", d["codec_only_MBps"])
    out("codec_only.same_inner_chunks_as_stored", d["codec_only_same_inner_chunks"])
    out("codec_only.qpos_and_reset_MBps", d["codec_only_all_MBps"])
    out("ratio.append_vs_codec_only_qpos_and_reset", d["codec_only_all_s"] / d["append_s"])
    # The writer calls c-blosc directly (no per-chunk numcodecs wrapper): the codec alone called the same way.
    out("codec_only.direct_MBps", raw / MB / d["codec_only_direct_s"])
    out("ratio.append_vs_codec_only_direct", d["codec_only_direct_s"] / d["append_s"])
    targets = {
        "append_MBps (>= 300)": (d["append_MBps"], d["append_MBps"] >= 300),
        "append_vs_npz (>= 10)": (d["append_MBps"] / (raw / MB / npz_s), d["append_MBps"] / (raw / MB / npz_s) >= 10),
        "append_vs_codec_only (>= 0.70)": (d["codec_only_s"] / d["append_s"], d["codec_only_s"] / d["append_s"] >= 0.70),
        "read_world_touched_over_raw (<= 2)": (d["read_world_touched_over_raw"], d["read_world_touched_over_raw"] <= 2),
        "read_frame_speedup_vs_npz (>= 50)": (npz_frame_s / d["read_frame_s"], npz_frame_s / d["read_frame_s"] >= 50),
        "read_frame_slowdown_vs_mmap (<= 10)": (d["read_frame_s"] / mmap_frame_s, d["read_frame_s"] / mmap_frame_s <= 10),
        "size_vs_blosc_zstd (<= 1)": (d["size_MB"] / blosc_MB, d["size_MB"] / blosc_MB <= 1),
        "lossy_error_within_precision": (err, err <= precision),
    }
    out("default.layout", default.label)
    for name, (value, ok) in targets.items():
        out(f"ratio.{name.split(' ')[0]}", value)
        out(f"target.{name.split(' ')[0]}", "PASS" if ok else "FAIL")
    out("ratio.read_world_slowdown_vs_npz", d["read_world_s"] / npz_world_s)
    out("ratio.read_replay_speedup_vs_npz", npz_replay_s / d["read_replay_s"])
    out("ratio.read_replay_slowdown_vs_mmap", d["read_replay_s"] / mmap_replay_s)
    out("ratio.lossy_size_vs_lossless", lossy_MB / d["size_MB"])
    if len(results) > 1:
        print_frontier(results, npz_s=raw / MB / npz_s, npz_frame_s=npz_frame_s, mmap_frame_s=mmap_frame_s,
                       blosc_MB=blosc_MB)


def print_frontier(results: dict[Layout, dict[str, float]], *, npz_s: float, npz_frame_s: float,
                   mmap_frame_s: float, blosc_MB: float) -> None:
    """A table of all layouts; `*` marks layouts no other layout beats on every metric."""
    keys = [("append_MBps", 1), ("read_world_touched_over_raw", -1), ("read_world_s", -1), ("read_frame_s", -1),
            ("read_replay_s", -1), ("read_replay_touched_over_raw", -1), ("size_MB", -1)]

    def dominated(a, b) -> bool:  # b at least as good everywhere and better somewhere
        ge = all(results[b][k] * s >= results[a][k] * s for k, s in keys)
        return ge and any(results[b][k] * s > results[a][k] * s for k, s in keys)

    print("\nlayout        append MB/s  xnpz  world touched/raw  world ms  frame ms  xnpz  /mmap  replay ms  touched/raw  size MB  /blosc")
    for lay, r in results.items():
        star = "*" if not any(dominated(lay, o) for o in results if o != lay) else " "
        print(f"{star}{lay.label:<13}{r['append_MBps']:>11.0f} {r['append_MBps'] / npz_s:>5.1f}"
              f" {r['read_world_touched_over_raw']:>18.2f} {r['read_world_s'] * 1e3:>9.1f}"
              f" {r['read_frame_s'] * 1e3:>9.1f} {npz_frame_s / r['read_frame_s']:>5.0f} {r['read_frame_s'] / mmap_frame_s:>6.0f}"
              f" {r['read_replay_s'] * 1e3:>10.1f} {r['read_replay_touched_over_raw']:>12.2f} {r['size_MB']:>8.1f} {r['size_MB'] / blosc_MB:>7.3f}")
        out(f"frontier[{lay.label}]", "yes" if star == "*" else "no")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds), for smoke tests")
    parser.add_argument("--sweep", action="store_true", help="also compare chunk layouts and print the frontier")
    parser.add_argument("--worlds", type=int)
    parser.add_argument("--frames", type=int)
    parser.add_argument("--sim-worlds", type=int, help="worlds really simulated (the rest is derived)")
    parser.add_argument("--layouts", help="comma-separated CF:SW pairs for --sweep, e.g. 256:256,1024:64")
    parser.add_argument("--tmp", type=Path, help="scratch directory (default: the system temp dir)")
    parser.add_argument("--zarr-writes", action="store_true",
                        help="also append the default layout with every chunk written by zarr-python "
                             "(MJARCHIVE_ZARR_WRITES=1) and print both throughputs and their ratio")
    args = parser.parse_args(argv)
    wl = QUICK if args.quick else Workload()
    changes = {k: v for k, v in {"worlds": args.worlds, "frames": args.frames, "sim_worlds": args.sim_worlds}.items() if v}
    wl = dataclasses.replace(wl, **changes)
    wl = dataclasses.replace(wl, sim_frames=min(wl.sim_frames, wl.frames))
    layouts: list[Layout] = []
    if args.layouts:
        layouts = [Layout(*map(int, p.split(":"))) for p in args.layouts.split(",")]
    elif args.sweep:
        layouts = QUICK_SWEEP if args.quick else SWEEP
    out("config.workload", wl)
    out("config.machine", f"{os.cpu_count()} cpus, python {sys.version.split()[0]}, zarr {zarr.__version__}, "
                          f"numcodecs {numcodecs.__version__}, mujoco {mujoco.__version__}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_format_", dir=args.tmp) as tmp:
        run(wl, layouts, Path(tmp), zarr_writes=args.zarr_writes)
    out("total_s", time.perf_counter() - t0)


if __name__ == "__main__":
    main()
