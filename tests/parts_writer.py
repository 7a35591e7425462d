"""The child-process side of tests/archive/test_parts_concurrency.py: a writer of one part, a reader
that checks every committed frame it sees, a holder and a racer for the refusal tests, and a
torch.distributed rank. Each runs in a process of multiprocessing's spawn context, so every argument
is picklable and every value is recomputed here from indices alone.

A writer notes its progress in a log file, one line per event, before the event for "appending N"
(at most N frames handed to the writer) and after it for "flushed N" (N frames committed), so the
parent knows bounds on what a SIGKILL may have left committed.
"""

from __future__ import annotations

import time
import traceback

import numpy as np

import mjarchive
from mjarchive import SelectionError
from mjarchive.testing import hinge_chain_xml

NQ = 3
XML = hinge_chain_xml(NQ)
CHUNK = 4


def expected(world_ids, start: int, stop: int, generation: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(time, qpos) of frames [start, stop) of these global worlds: exact in float32, nonzero, and
    different for every (frame, world, coordinate) and for a resumed writer (`generation` 1)."""
    f = np.arange(start, stop, dtype=np.float64)[:, None, None]
    w = np.asarray(world_ids, dtype=np.float64)[None, :, None]
    q = np.arange(NQ, dtype=np.float64)[None, None, :]
    qpos = (1.0 + f + 1024.0 * generation + w / 64.0 + q / 4096.0).astype(np.float32)
    return (np.arange(start, stop) + 1) / 64.0, qpos


def _note(log: str, line: str) -> None:
    with open(log, "a") as f:
        f.write(line + "\n")


def write_part(location: str, part: str, world_ids: list[int], log: str, *, total: int | None = None,
               extra: int = 0, resume: bool = False, kill_at: int | None = None, seed: int = 0, go=None,
               storage_options: dict | None = None, open_options: dict | None = None) -> None:
    """Create (or resume, as generation 1) one part and append frames in blocks of 1-3 with random
    flushes until `total` frames, or `extra` frames past what a resume found committed; a created part
    waits for the event `go` before its first frame. With `kill_at`, it never finishes: once a flush
    has committed `kill_at` frames it goes on slowly, waiting for its SIGKILL."""
    rng = np.random.default_rng(seed)
    if resume:
        w = mjarchive.open(location, mode="a", part=part, storage_options=storage_options, **(open_options or {}))
        _note(log, f"resumed {w.n_committed}")
        total = w.n_committed + extra
    else:
        w = mjarchive.create(location, mjarchive.ModelBundle.from_xml(XML), part=part, world_ids=world_ids,
                             chunk_frames=CHUNK, storage_options=storage_options)
        _note(log, "created 0")
        if go is not None:
            go.wait(60)
    n, pause = w.n_committed, 0.002
    while kill_at is not None or n < total:
        if kill_at is not None and n >= 400:  # a run-away bound: the parent kills it long before
            time.sleep(60)
            continue
        k = int(rng.integers(1, 4)) if kill_at is not None else min(int(rng.integers(1, 4)), total - n)
        _note(log, f"appending {n + k}")
        w.append(*expected(world_ids, n, n + k, int(resume)))
        n += k
        if rng.random() < 0.3:
            w.flush()
            _note(log, f"flushed {n}")
            if kill_at is not None and n >= kill_at:
                pause = 0.02
        time.sleep(pause)
    w.close()
    _note(log, f"closed {n}")


def log_events(log: str) -> dict[str, list[int]]:
    """{"created": [0], "appending": [...], "flushed": [...], ...} from a writer's log (as far as it is
    written: a line still being written is left for the next look)."""
    events: dict[str, list[int]] = {}
    with open(log) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            name, value = line.split()
            events.setdefault(name, []).append(int(value))
    return events


# -- the reader --------------------------------------------------------------------------------------------------
def check_view(archive, parts: dict[str, list[int]], resumed: set[str], seen: dict[int, int]) -> None:
    """Every frame this Archive shows is one a writer committed, with its exact values; the view is
    consistent (worlds in part-name order, frames_of per part) and no world's count went backwards."""
    joined = archive.parts
    assert set(joined) <= set(parts) and list(joined) == sorted(joined), joined
    assert archive.world_ids == tuple(w for p in joined for w in parts[p]), (joined, archive.world_ids)
    assert set(seen) <= set(archive.world_ids), f"worlds {sorted(set(seen) - set(archive.world_ids))} disappeared"
    read = {}
    for p in joined:
        ids = parts[p]
        n = archive.frames_of(ids[0])
        assert n >= 1 and all(archive.frames_of(w) == n for w in ids), (p, [archive.frames_of(w) for w in ids])
        assert all(archive.part_of(w) == p for w in ids)
        assert n >= max(seen.get(w, 0) for w in ids), f"part {p}: {n} frames after {seen[ids[0]]}"
        sel = archive.select(worlds=ids, frames=slice(0, n))
        t, q0 = expected(ids, 0, n)
        np.testing.assert_array_equal(sel.time, t)
        got = read[p] = sel.qpos
        first = (got == q0).all(axis=(1, 2))
        if p in resumed:  # frames of the killed writer, then of the resumed one
            second = (got == expected(ids, 0, n, 1)[1]).all(axis=(1, 2))
            k = int(np.argmax(second)) if second.any() else n
            assert first[:k].all() and second[k:].all(), (p, n, got)
        else:
            assert first.all(), (p, n, got)
        try:
            archive.select(worlds=ids[:1], frames=[n])
        except SelectionError:
            pass
        else:
            raise AssertionError(f"part {p}: frame {n}, past its {n} committed frames, was readable")
        seen.update({w: n for w in ids})
    if joined:  # all worlds at once: the frames every part has committed, the same values
        assert archive.n_frames == min(archive.frames_of(parts[p][0]) for p in joined)
        np.testing.assert_array_equal(archive.select().qpos,
                                      np.concatenate([read[p][:archive.n_frames] for p in joined], axis=1))
        longest = max(joined, key=lambda p: len(read[p]))
        if len(read[longest]) > archive.n_frames:  # a frame one part has committed and another has not
            try:
                archive.select(worlds=[w for p in joined for w in parts[p][:1]], frames=[archive.n_frames])
            except SelectionError:
                pass
            else:
                raise AssertionError(f"frame {archive.n_frames} of all parts was readable, past the shortest part")


def read_until(location: str, parts: dict[str, list[int]], resumed: list[str], started, stop, results, *,
               storage_options: dict | None = None) -> None:
    """Check the archive over and over, through one Archive kept open and refreshed (`started` is set
    once it is open) and through fresh opens, until `stop` is set; then refresh once more and put what
    the kept one saw at each poll on `results`."""
    try:
        live = open_when_joined(location, storage_options)
        started.set()
        seen_live: dict[int, int] = {}
        seen_fresh: dict[int, int] = {}
        views = [{p: live.frames_of(parts[p][0]) for p in live.parts}]  # what the kept one saw: at open, each poll
        while not stop.is_set():
            live.refresh()
            check_view(live, parts, set(resumed), seen_live)
            views.append({p: live.frames_of(parts[p][0]) for p in live.parts})
            with mjarchive.open(location, storage_options=storage_options) as fresh:
                check_view(fresh, parts, set(resumed), seen_fresh)
        live.refresh()
        check_view(live, parts, set(resumed), seen_live)
        views.append({p: live.frames_of(parts[p][0]) for p in live.parts})
        results.put({"ok": True, "views": views})
        live.close()
    except BaseException:
        results.put({"ok": False, "error": traceback.format_exc()})
        raise


def open_when_joined(location: str, storage_options: dict | None, timeout: float = 60):
    """`mjarchive.open(location)`, retried while no part has committed a frame (it refuses then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return mjarchive.open(location, storage_options=storage_options)
        except mjarchive.MjArchiveError as exc:
            if "no part with committed frames" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


# -- refusals ----------------------------------------------------------------------------------------------------
def hold_part(location: str, part: str, world_ids: list[int], frames: int, ready, release,
              storage_options: dict | None = None) -> None:
    """Create a part, commit `frames` frames, set `ready`, keep the writer open until `release`."""
    with mjarchive.create(location, mjarchive.ModelBundle.from_xml(XML), part=part, world_ids=world_ids,
                          chunk_frames=CHUNK, storage_options=storage_options) as w:
        w.append(*expected(world_ids, 0, frames))
        w.flush()
        ready.set()
        release.wait(120)


def race_create(location: str, part: str, world_ids: list[int], barrier, results, release=None) -> None:
    """Create a part at the same moment as the other racers; put "won" or the error's class and message
    on `results`; a winner commits one frame and, with `release`, holds the part until it is set."""
    try:
        barrier.wait(60)
        w = mjarchive.create(location, mjarchive.ModelBundle.from_xml(XML), part=part, world_ids=world_ids,
                             chunk_frames=CHUNK)
    except mjarchive.MjArchiveError as exc:
        results.put((part, type(exc).__name__, str(exc)))
        return
    w.append(*expected(world_ids, 0, 1))
    w.flush()
    results.put((part, "won", ""))
    if release is not None:
        release.wait(120)
    w.close()


def race_joins(locations: list[str], part: str, world_ids: list[int], barrier, results,
               storage_options: dict | None = None) -> None:
    """For each location in turn, create this part at the same moment as the other racers (their own
    parts) and commit one frame; put (location, part, "won" or the error) on `results`."""
    for location in locations:
        barrier.wait(60)
        try:
            with mjarchive.create(location, mjarchive.ModelBundle.from_xml(XML), part=part, world_ids=world_ids,
                                  chunk_frames=CHUNK, storage_options=storage_options) as w:
                w.append(*expected(world_ids, 0, 1))
        except mjarchive.MjArchiveError as exc:
            results.put((location, part, f"{type(exc).__name__}: {exc}"))
        else:
            results.put((location, part, "won"))


# -- torch.distributed -------------------------------------------------------------------------------------------
def torch_rank(rank: int, location: str, rendezvous: str, world_size: int, results) -> None:
    """One rank of a gloo process group, joined through a rendezvous file, recording its part; puts
    ("done", "") on `results`, or ("skip", why) or ("error", traceback)."""
    try:
        import datetime

        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            results.put(("skip", "this torch has no gloo backend"))
            return
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        _record_rank(dist, location)
    except BaseException:
        results.put(("error", traceback.format_exc()))
        raise
    results.put(("done", ""))


def _record_rank(dist, location: str) -> None:
    """Part f"rank{rank}": the worlds rank, rank + world_size, ... of 2 * world_size, with 10 + 3 * rank
    frames; all ranks create before any appends, and close together."""
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        ids = torch_worlds(rank, world_size)
        w = mjarchive.create(location, mjarchive.ModelBundle.from_xml(XML), part=f"rank{rank}", world_ids=ids,
                             chunk_frames=CHUNK)
        dist.barrier()
        n = torch_frames(rank)
        for start in range(0, n, 2):
            w.append(*expected(ids, start, min(start + 2, n)))
            if start % 4 == 0:
                w.flush()
        dist.barrier()
        w.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def torch_worlds(rank: int, world_size: int) -> list[int]:
    return list(range(rank, 2 * world_size, world_size))


def torch_frames(rank: int) -> int:
    return 10 + 3 * rank
