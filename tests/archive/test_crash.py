"""Crash safety and live reading, with real child processes.

A child appends frames derived from their index (so the parent can recompute them), with small
chunks and random flushes, logging before each append how many frames it has handed to the
writer. It is killed with SIGKILL at a random moment. benchmarks/crash_trials.py runs 100 trials.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import mjarchive
from mjarchive import SelectionError
from mjarchive.testing import CrashChild, check_archive_frames, run_crash_trial

N_TRIALS = 20


def test_sigkill_at_random_moments(tmp_path):
    trials = [run_crash_trial(tmp_path, seed, chunk_frames=4 + seed % 5) for seed in range(N_TRIALS)]
    failed = [t for t in trials if not t.ok]
    assert not failed, "\n".join(f"seed {t.seed}: {t}" for t in failed)
    # The kills really landed mid-stream: some appended frames were never committed, and some
    # trials had completed flushes before the kill (whose frames therefore had to survive).
    assert any(t.committed < t.intent for t in trials)
    assert any(t.flushed > 0 for t in trials)
    assert sum(t.committed for t in trials) > 0


def test_live_reader_never_sees_uncommitted_frames(tmp_path):
    path, progress = str(tmp_path / "live.zarr"), str(tmp_path / "live.log")
    total = 300
    child = CrashChild([path, progress, 7, 4, total, 0.01])
    try:
        deadline = time.monotonic() + 60
        # The child logs "created" once mjarchive.create() has returned.
        while not (os.path.exists(progress) and b"created" in open(progress, "rb").read()):
            assert child.is_alive() and time.monotonic() < deadline, "the writer process did not start"
            time.sleep(0.005)
        archive = mjarchive.open(path)
        seen, polls, growths, statuses = 0, 0, 0, set()
        rng = np.random.default_rng(0)
        while True:
            alive = child.is_alive()
            n = archive.refresh()
            polls += 1
            statuses.add(archive.status)
            assert n >= seen, "the committed frame count went backwards"
            problems = check_archive_frames(archive, seen, n)
            if n:  # re-read a random earlier window too: committed frames never change
                a = int(rng.integers(0, n))
                problems += check_archive_frames(archive, a, min(n, a + 9))
            assert not problems, problems
            with pytest.raises(SelectionError):  # frames past the commit are not readable
                archive.select(frames=[n])
            growths += n > seen
            seen = n
            if not alive:
                break
            time.sleep(0.003)
        archive.refresh()
        assert archive.n_frames == total and archive.status == "finalized"
        assert not check_archive_frames(archive, 0, total)
        assert archive.verify().ok
        archive.close()
    finally:
        child.kill()  # only if an assertion above ended the test early
        child.join()
    assert child.exitcode == 0
    assert "live" in statuses and growths >= 3, (polls, growths)  # it really read a live archive
