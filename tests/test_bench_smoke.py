"""Smoke test: benchmarks/bench_format.py still runs and prints its metrics (no timing asserted)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_format.py"

EXPECTED = [
    "data.raw_MB",
    "baseline.npz_append_MBps",
    "baseline.blosc_zstd_size_MB",
    "baseline.npz_read_frame_s",
    "baseline.mmap_read_frame_s",
    "layout[cf256_sw256].append_MBps",
    "layout[cf256_sw256].read_world_touched_over_raw",
    "layout[cf256_sw256].read_frame_s",
    "layout[cf256_sw256].read_replay_s",
    "layout[cf256_sw256].size_MB",
    "layout[cf32_sw16].append_MBps",
    "lossy.size_MB",
    "lossy.max_abs_error",
    "ratio.append_vs_npz",
    "ratio.read_world_touched_over_raw",
    "ratio.read_frame_speedup_vs_npz",
    "ratio.read_frame_slowdown_vs_mmap",
    "ratio.size_vs_blosc_zstd",
    "target.append_MBps",
    "frontier[cf32_sw16]",
    "total_s",
]


def test_bench_format_quick_prints_metrics(tmp_path):
    from mjarchive.archive.writer import DEFAULT_CHUNK_FRAMES, DEFAULT_SHARD_WORLDS

    default = f"cf{DEFAULT_CHUNK_FRAMES}_sw{DEFAULT_SHARD_WORLDS}"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--layouts", "32:16", "--tmp", str(tmp_path)],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = {}
    for line in proc.stdout.splitlines():
        name, sep, value = line.partition(": ")
        if sep:
            metrics[name] = value
    for name in EXPECTED:
        name = name.replace("cf256_sw256", default)
        assert name in metrics, f"{name} missing from the benchmark output:\n{proc.stdout[-3000:]}"
    for name in ("data.raw_MB", f"layout[{default}].append_MBps", "ratio.size_vs_blosc_zstd"):
        value = float(metrics[name])
        assert math.isfinite(value) and value > 0, (name, value)
    # The lossy archive must honour its recorded error bound, and every read verified its data.
    assert float(metrics["lossy.max_abs_error"]) <= float(metrics["lossy.recorded_bound"])
    assert metrics["target.lossy_error_within_precision"] == "PASS"
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"
