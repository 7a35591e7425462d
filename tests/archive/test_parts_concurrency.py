"""Multi-part archives under real concurrency (issue 26): writer processes append to their own parts
of one archive at the same time, on a local disk and on the moto S3 server; one is SIGKILLed and
resumed; reader processes check every frame they see throughout; the final archive holds exactly
what each writer committed. Also through torch.distributed (gloo), and the refusals between
processes: a part claimed twice, overlapping world IDs, a different model or timestep.

The processes are spawned (never forked from the test process); their code is tests/parts_writer.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import queue
import re
import shutil
import signal
import time

import numpy as np
import pytest

import mjarchive
import parts_writer
from mjarchive import FormatError, MjArchiveError, WriterLockedError
from parts_writer import CHUNK, XML, expected, log_events
from s3_server import s3_server, s3_url  # noqa: F401  (pytest fixtures)

CTX = multiprocessing.get_context("spawn")
# Global world IDs of each part: interleaved, not sorted within a part, different counts.
PARTS = {"rank0": [0, 4, 8], "rank1": [9, 1], "rank2": [2, 6], "rank3": [3, 7, 11, 15]}
KILLED = "rank2"
LATE = "rank3"  # starts appending only once the readers have the archive open
RESUME_EXTRA = 10  # frames the resumed writer appends past what it finds committed (as generation 1)
DEADLINE_S = 60


def spawn(target, **kwargs):
    process = CTX.Process(target=target, kwargs=kwargs, daemon=True)
    process.start()
    return process


def wait_for(condition, what: str, processes=()) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        dead = [p for p in processes if p.exitcode not in (None, 0, -signal.SIGKILL)]
        assert not dead, f"a process failed (exit codes {[p.exitcode for p in dead]}) while waiting until {what}"
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def events(log) -> dict[str, list[int]]:
    return log_events(log) if os.path.exists(log) else {}


def in_flight(log: dict[str, list[int]], kill_at: int) -> bool:
    """The writer has flushed `kill_at` frames, and appended frames it has not flushed since."""
    flushed = max(log.get("flushed", [0]))
    return flushed >= kill_at and max(log["appending"]) > flushed


def stop_all(processes) -> None:
    for p in processes:
        if p.is_alive():
            p.kill()
        p.join()


def record_with_a_crash(location: str, tmp_path, totals: dict[str, int], *, kill_at: int, extra: int,
                        storage_options: dict | None = None, resume_options: dict | None = None) -> dict[str, int]:
    """Four writers and two readers at once; KILLED is SIGKILLed once it has flushed `kill_at` frames and
    handed over more, then resumed for `extra` frames past what it finds committed. Returns each part's
    final frame count."""
    logs = {p: str(tmp_path / f"{p}.log") for p in PARTS}
    go, go_late, stop, results = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Queue()
    writers = {p: spawn(parts_writer.write_part, location=location, part=p, world_ids=ids, log=logs[p],
                        total=totals.get(p), kill_at=kill_at if p == KILLED else None, seed=i,
                        go=go_late if p == LATE else go, storage_options=storage_options)
               for i, (p, ids) in enumerate(PARTS.items())}
    processes = list(writers.values())
    try:
        # Readers start once the archive's root exists and see parts being built, pending and joining;
        # LATE appends only once every reader holds an open Archive, which must see it join on refresh().
        wait_for(lambda: any("created" in events(log) for log in logs.values()), "a writer created", processes)
        started = [CTX.Event() for _ in range(2)]
        readers = [spawn(parts_writer.read_until, location=location, parts=PARTS, resumed=[KILLED], started=s,
                         stop=stop, results=results, storage_options=storage_options) for s in started]
        processes += readers
        go.set()
        wait_for(lambda: all(s.is_set() for s in started), "the readers opened the archive", processes)
        go_late.set()
        wait_for(lambda: in_flight(events(logs[KILLED]), kill_at), f"{KILLED} has frames in flight", processes)
        os.kill(writers[KILLED].pid, signal.SIGKILL)
        writers[KILLED].join()
        assert writers[KILLED].exitcode == -signal.SIGKILL
        before = events(logs[KILLED])
        resumed_log = str(tmp_path / "resumed.log")
        resumed = spawn(parts_writer.write_part, location=location, part=KILLED, world_ids=PARTS[KILLED],
                        log=resumed_log, extra=extra, resume=True, seed=9, storage_options=storage_options,
                        open_options=resume_options)
        processes.append(resumed)
        for p in [*(w for name, w in writers.items() if name != KILLED), resumed]:
            p.join(DEADLINE_S)
            assert p.exitcode == 0, f"a writer exited with {p.exitcode}"
        stop.set()
        seen = []
        for _ in readers:
            try:
                seen.append(results.get(timeout=DEADLINE_S))
            except queue.Empty:
                pytest.fail("a reader never reported")
        for r in readers:
            r.join(DEADLINE_S)
    finally:
        stop_all(processes)
    # What the kill left committed lies between the last completed flush and the frames handed over.
    committed = events(resumed_log)["resumed"][0]
    assert max(before["flushed"]) <= committed <= max(before["appending"]), (before, committed)
    final = {**totals, KILLED: committed + extra}
    for r in seen:
        assert r["ok"], r["error"]
        # The kept-open Archive read the archive while it grew, and its refreshes saw LATE join and
        # every part's last frames.
        totals_seen = [sum(view.values()) for view in r["views"]]
        assert LATE not in r["views"][0] and any(0 < t < sum(final.values()) for t in totals_seen), r["views"]
        assert r["views"][-1] == final, (r["views"], final)
    return final


def written_qpos(part: str, n: int) -> np.ndarray:
    """What a part's writers appended for its first n frames: the killed part's last RESUME_EXTRA frames
    come from its resumed writer (generation 1), the ones before from the writer that was killed."""
    ids, qpos = PARTS[part], expected(PARTS[part], 0, n)[1]
    if part == KILLED:
        qpos[n - RESUME_EXTRA:] = expected(ids, n - RESUME_EXTRA, n, 1)[1]
    return qpos


def check_final(location: str, final: dict[str, int], storage_options: dict | None = None) -> None:
    """The archive is the union of the parts, each world holding exactly what its writer committed."""
    with mjarchive.open(location, storage_options=storage_options) as archive:
        assert archive.parts == tuple(PARTS)
        assert archive.world_ids == tuple(w for ids in PARTS.values() for w in ids)
        for p, ids in PARTS.items():
            n = final[p]
            assert all(archive.frames_of(w) == n and archive.part_of(w) == p for w in ids)
            sel = archive.select(worlds=ids)  # default frames: all of this part's committed frames
            np.testing.assert_array_equal(sel.time, expected(ids, 0, n)[0])
            np.testing.assert_array_equal(sel.qpos, written_qpos(p, n))
            part = archive.part(p)
            assert part.world_ids == tuple(ids) and part.n_frames == n and part.status == "finalized"
        # All worlds together: the frames every part committed.
        first = min(final.values())
        assert archive.n_frames == first
        np.testing.assert_array_equal(archive.select().qpos,
                                      np.concatenate([written_qpos(p, final[p])[:first] for p in PARTS], axis=1))
        report = archive.verify()
        assert report.ok, str(report)


def test_four_writers_on_disk_one_killed_and_resumed_while_readers_read(tmp_path):
    path = str(tmp_path / "run.mjarchive")
    final = record_with_a_crash(path, tmp_path, {"rank0": 40, "rank1": 23, "rank3": 31}, kill_at=12,
                                extra=RESUME_EXTRA)
    check_final(path, final)


def test_four_writers_on_s3_one_killed_and_resumed_while_readers_read(tmp_path, s3_server, s3_url):
    so = s3_server.storage_options()
    # A SIGKILLed writer never releases its S3 lease: the resume takes over the lease of a writer known gone.
    final = record_with_a_crash(s3_url, tmp_path, {"rank0": 17, "rank1": 9, "rank3": 13}, kill_at=6,
                                extra=RESUME_EXTRA, storage_options=so, resume_options={"take_over": True})
    check_final(s3_url, final, storage_options=so)


def test_torch_distributed_gloo_ranks_record_one_archive(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    path, world_size, results = str(tmp_path / "run.mjarchive"), 4, CTX.Queue()
    # Only the ranks import torch: the test process must not load its threads (see conftest's RUN_LAST).
    ranks = [spawn(parts_writer.torch_rank, rank=r, location=path, rendezvous=str(tmp_path / "rendezvous"),
                   world_size=world_size, results=results) for r in range(world_size)]
    try:
        said = []
        for _ in ranks:
            said.append(results.get(timeout=2 * DEADLINE_S))
            assert said[-1][0] != "error", said[-1][1]
        for r in ranks:
            r.join(DEADLINE_S)
    finally:
        stop_all(ranks)
    if {kind for kind, _ in said} == {"skip"}:
        pytest.skip(said[0][1])
    assert said == [("done", "")] * world_size and [r.exitcode for r in ranks] == [0] * world_size
    with mjarchive.open(path) as archive:
        assert archive.parts == tuple(f"rank{r}" for r in range(world_size))
        ids = [parts_writer.torch_worlds(r, world_size) for r in range(world_size)]
        assert archive.world_ids == tuple(w for rank_ids in ids for w in rank_ids)
        assert sorted(archive.world_ids) == list(range(2 * world_size))
        for r, rank_ids in enumerate(ids):
            n = parts_writer.torch_frames(r)
            assert archive.frames_of(rank_ids[0]) == n
            sel = archive.select(worlds=rank_ids)
            np.testing.assert_array_equal(sel.qpos, expected(rank_ids, 0, n)[1])
            np.testing.assert_array_equal(sel.time, expected(rank_ids, 0, n)[0])
        assert archive.n_frames == parts_writer.torch_frames(0)
        assert archive.verify().ok


# -- refusals between processes ------------------------------------------------------------------------------------
def bundle(xml: str = XML):
    return mjarchive.ModelBundle.from_xml(xml)


def names(message, location: str, *words: str) -> bool:
    """The message names each of these (whole words, outside the archive's location)."""
    text = str(message).replace(location, "")
    return all(re.search(rf"\b{re.escape(w)}\b", text) for w in words)


def create(path, part: str, world_ids, **kwargs):
    return mjarchive.create(path, kwargs.pop("model", bundle()), part=part, world_ids=world_ids,
                            chunk_frames=kwargs.pop("chunk_frames", CHUNK), **kwargs)


@contextlib.contextmanager
def rank0_held(path: str):
    """Another process holding part rank0 (worlds 0, 1; 5 frames committed) until the block ends."""
    ready, release = CTX.Event(), CTX.Event()
    holder = spawn(parts_writer.hold_part, location=path, part="rank0", world_ids=[0, 1], frames=5, ready=ready,
                   release=release)
    try:
        wait_for(ready.is_set, "the holder committed", [holder])
        yield holder
    finally:
        release.set()
        holder.join(DEADLINE_S)
        stop_all([holder])
    assert holder.exitcode == 0


def test_a_part_held_by_another_process_is_refused(tmp_path):
    path = str(tmp_path / "run.mjarchive")
    with rank0_held(path) as holder:
        with pytest.raises(WriterLockedError) as refused:
            mjarchive.open(path, mode="a", part="rank0")
        assert f"pid {holder.pid}" in str(refused.value)
        with pytest.raises(WriterLockedError):
            create(path, "rank0", [0, 1], overwrite=True)
        with pytest.raises(WriterLockedError):
            create(path, "rank0", [0, 1])
        with mjarchive.open(path) as archive:  # readers are not blocked, and nothing was touched
            assert archive.parts == ("rank0",) and archive.frames_of(0) == 5
        with create(path, "rank1", [2]) as other:  # another part of the same archive is free to write
            other.append(*expected([2], 0, 3))
    with mjarchive.open(path, mode="a", part="rank0") as w:  # free once its holder closed
        assert w.n_committed == 5
        w.append(*expected([0, 1], 5, 6))
    with mjarchive.open(path) as archive:
        assert archive.parts == ("rank0", "rank1") and archive.frames_of(0) == 6 and archive.frames_of(2) == 3
        np.testing.assert_array_equal(archive.select(worlds=[0, 1]).qpos, expected([0, 1], 0, 6)[1])


@pytest.mark.parametrize("where", ["disk", "s3"])
def test_parts_created_at_the_same_moment_on_a_fresh_location_all_join(tmp_path, request, where):
    """Ranks started together (torchrun) all find no archive yet and race to create its root: each one
    either creates it or joins the one that won (spec: create-if-absent, the loser reads it)."""
    rounds, parts = (8, ("rank0", "rank1", "rank2", "rank3")) if where == "disk" else (2, ("rank0", "rank1", "rank2"))
    so = None
    if where == "disk":
        locations = [str(tmp_path / f"run{i}.mjarchive") for i in range(rounds)]
    else:
        so = request.getfixturevalue("s3_server").storage_options()
        url = request.getfixturevalue("s3_url")
        locations = [url.replace("run.mjarchive", f"run{i}.mjarchive") for i in range(rounds)]
    barrier, results = CTX.Barrier(len(parts)), CTX.Queue()
    racers = [spawn(parts_writer.race_joins, locations=locations, part=p, world_ids=[i], barrier=barrier,
                    results=results, storage_options=so) for i, p in enumerate(parts)]
    try:
        outcomes = [results.get(timeout=DEADLINE_S) for _ in range(rounds * len(parts))]
    finally:
        stop_all(racers)
    failed = [o for o in outcomes if o[2] != "won"]
    assert not failed, "\n".join(f"{loc.rsplit('/', 1)[1]} {part}: {what}" for loc, part, what in failed)
    for location in locations:
        with mjarchive.open(location, storage_options=so) as archive:
            assert archive.parts == parts and archive.world_ids == tuple(range(len(parts))) and archive.n_frames == 1
            assert archive.verify().ok


def test_racing_claims_of_one_part_have_one_winner(tmp_path):
    path = str(tmp_path / "run.mjarchive")
    n = 3
    barrier, results, release = CTX.Barrier(n), CTX.Queue(), CTX.Event()
    racers = [spawn(parts_writer.race_create, location=path, part="rank0", world_ids=[5, 6], barrier=barrier,
                    results=results, release=release) for _ in range(n)]
    try:
        outcomes = [results.get(timeout=DEADLINE_S) for _ in range(n)]
        release.set()
        for r in racers:
            r.join(DEADLINE_S)
    finally:
        release.set()
        stop_all(racers)
    assert [o[1] for o in outcomes].count("won") == 1, outcomes
    losers = [o for o in outcomes if o[1] != "won"]
    assert all(o[1] == "WriterLockedError" for o in losers), losers  # the winner holds the part's lease
    with mjarchive.open(path) as archive:
        assert archive.parts == ("rank0",) and archive.frames_of(5) == 1
        np.testing.assert_array_equal(archive.select().qpos, expected([5, 6], 0, 1)[1])
        assert archive.verify().ok


def test_parts_that_differ_from_the_root_or_each_other_are_refused(tmp_path):
    path = str(tmp_path / "run.mjarchive")
    with rank0_held(path):
        refusals = {
            "a world of rank0": dict(world_ids=[7, 1]),
            "another model": dict(model=bundle(parts_writer.hinge_chain_xml(parts_writer.NQ + 1))),
            "another timestep": dict(timestep=0.004),
            "another output_fps": dict(output_fps=25.0),
            "another chunk_frames": dict(chunk_frames=2 * CHUNK),
            "another dtype": dict(dtype="float64"),
        }
        for case, kwargs in refusals.items():
            with pytest.raises(MjArchiveError) as refused:
                create(path, "rank1", kwargs.pop("world_ids", [7]), **kwargs).close()
            assert not isinstance(refused.value, WriterLockedError), case
            # Named: the refused part, and the root's creator or the part it differs from.
            assert names(refused.value, path, "rank1", "rank0"), (case, str(refused.value))
            if case == "a world of rank0":
                assert names(refused.value, path, "1"), str(refused.value)
        with mjarchive.open(path) as archive:  # the refused parts never joined
            assert archive.parts == ("rank0",) and archive.world_ids == (0, 1) and archive.frames_of(0) == 5
        with create(path, "rank1", [7]) as w:  # the name is still free for a part that fits
            w.append(*expected([7], 0, 2))
    with mjarchive.open(path) as archive:
        assert archive.parts == ("rank0", "rank1") and archive.world_ids == (0, 1, 7)
        assert archive.verify().ok


def test_parts_claiming_the_same_world_are_refused_at_open(tmp_path):
    """A part copied in from another archive of the same model (the early check at create bypassed)."""
    path, other = tmp_path / "run.mjarchive", tmp_path / "other.mjarchive"
    with create(str(path), "rank0", [0, 1]) as w:
        w.append(*expected([0, 1], 0, 3))
    with create(str(other), "rank9", [4, 1]) as w:
        w.append(*expected([4, 1], 0, 3))
    shutil.copytree(other / "parts" / "rank9", path / "parts" / "rank9")
    with pytest.raises(FormatError) as refused:
        mjarchive.open(str(path))
    assert names(refused.value, str(path), "rank0", "rank9", "1"), str(refused.value)
    shutil.rmtree(path / "parts" / "rank9")
    with mjarchive.open(str(path)) as archive:
        assert archive.parts == ("rank0",)


def test_racing_parts_with_overlapping_worlds_never_open_as_one(tmp_path):
    """Two parts created at the same moment that share world 31: the best-effort check at create may
    miss the other (neither has committed yet); then the archive is refused at open, naming both."""
    path = str(tmp_path / "run.mjarchive")
    barrier, results = CTX.Barrier(2), CTX.Queue()
    racers = [spawn(parts_writer.race_create, location=path, part=p, world_ids=ids, barrier=barrier, results=results)
              for p, ids in (("rank6", [30, 31]), ("rank7", [31, 32]))]
    try:
        outcomes = {o[0]: o for o in (results.get(timeout=DEADLINE_S) for _ in racers)}
        for r in racers:
            r.join(DEADLINE_S)
    finally:
        stop_all(racers)
    won = [p for p, o in outcomes.items() if o[1] == "won"]
    assert won, outcomes
    if len(won) == 2:
        with pytest.raises(FormatError) as refused:
            mjarchive.open(path)
        assert names(refused.value, path, "rank6", "rank7", "31"), str(refused.value)
    else:
        loser = outcomes[({"rank6", "rank7"} - set(won)).pop()]
        assert names(loser[2], path, won[0], "31"), outcomes
        with mjarchive.open(path) as archive:
            assert archive.parts == tuple(won)
