"""Crash-safety trials: a child appends to an archive and is killed with SIGKILL at a random moment.

After each kill the archive must open, pass verify(), hold no more frames than were appended and
at least those a completed flush() covered, hold every committed frame bit-identical to what was
appended, and accept appends again (open mode="a", append, close, verify).

Usage: python benchmarks/crash_trials.py [N=100] [--seed S] [--max-delay SECONDS]
Prints `name: value` lines; exits non-zero if any trial failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from mjarchive.testing import run_crash_trial


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=100, help="number of trials (default 100)")
    parser.add_argument("--seed", type=int, default=1000, help="first trial seed")
    parser.add_argument("--max-delay", type=float, default=0.4, help="kill within this many seconds of start")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    trials = []
    with tempfile.TemporaryDirectory(prefix="mjarchive-crash-") as directory:
        for i in range(args.n):
            seed = args.seed + i
            trial = run_crash_trial(directory, seed, chunk_frames=4 + seed % 5, max_delay_s=args.max_delay)
            trials.append(trial)
            if not trial.ok:
                print(f"FAILED seed {seed}: {trial.problems}", file=sys.stderr)
    elapsed = time.perf_counter() - start

    def count(pred) -> int:
        return sum(1 for t in trials if pred(t))

    print(f"trials: {len(trials)}")
    print(f"opened: {count(lambda t: t.opened)}")
    print(f"verify_ok: {count(lambda t: t.verify_ok)}")
    print(f"committed_le_appended: {count(lambda t: t.committed <= t.intent)}")
    print(f"flushed_frames_survived: {count(lambda t: t.committed >= t.flushed)}")
    print(f"bit_identical: {count(lambda t: t.bit_identical)}")
    print(f"resumed_ok: {count(lambda t: t.resumed_ok)}")
    print(f"all_ok: {count(lambda t: t.ok)}")
    print(f"killed_with_uncommitted_frames: {count(lambda t: t.committed < t.intent)}")
    print(f"mean_committed_frames: {sum(t.committed for t in trials) / max(1, len(trials)):.1f}")
    print(f"mean_lost_uncommitted_frames: {sum(t.intent - t.committed for t in trials) / max(1, len(trials)):.1f}")
    print(f"seconds: {elapsed:.1f}")
    return 0 if all(t.ok for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
