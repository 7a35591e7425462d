"""Smoke test: benchmarks/bench_format.py still runs and prints its metrics (no timing asserted)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

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
        # 512 frames: the default layout's first chunk fills, so the shard writer and the codec-only
        # baseline (which must encode exactly the bytes the archive stores) both run.
        [sys.executable, str(BENCH), "--quick", "--frames", "512", "--layouts", "32:16", "--tmp", str(tmp_path)],
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
    assert metrics["codec_only.same_inner_chunks_as_stored"] == "yes"
    assert float(metrics["ratio.append_vs_codec_only"]) > 0
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


ARRAYS_BENCH = BENCH.parent / "bench_arrays.py"

ARRAYS_EXPECTED = {
    "jax": ["record_us_best", "record_us_median", "record_call_us_p50", "skip_call_us_best", "flush_ms",
            "take_asarray_us_best", "jit_asarray_us_best", "record_vs_take_asarray_best",
            "record_vs_jit_asarray_best", "bytes_copied_per_frame"],
    "torch": ["record_us_best", "record_us_median", "record_call_us_p50", "skip_call_us_best", "flush_ms",
              "index_select_cpu_us_best", "record_vs_index_select_cpu_best", "bytes_copied_per_frame"],
}


def _run_quick(script: Path, tmp_path: Path, *, timeout: int) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Run `script --quick --tmp tmp_path`; its `name: value` lines as a dict."""
    proc = subprocess.run([sys.executable, str(script), "--quick", "--tmp", str(tmp_path)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    metrics = {}
    for line in proc.stdout.splitlines():
        name, sep, value = line.partition(": ")
        if sep:
            metrics[name] = value
    return proc, metrics


def test_bench_arrays_quick_prints_metrics(tmp_path):
    """benchmarks/bench_arrays.py --quick runs for each installed library (and prints why it skips
    the others), its archive holds the input rows, and only the selected rows are copied."""
    import importlib.util

    import pytest

    proc, metrics = _run_quick(ARRAYS_BENCH, tmp_path, timeout=180)
    measured = []
    for lib, names in ARRAYS_EXPECTED.items():
        if importlib.util.find_spec(lib) is None:
            assert f"{lib}.skipped" in metrics, f"no skip reason for {lib}:\n{proc.stdout[-3000:]}"
            continue
        measured.append(lib)
        assert metrics[f"check.{lib}.archive_equals_input_rows"] == "True"
        assert metrics[f"{lib}.bytes_copied_exact"] == "True"
        for name in names:
            assert f"{lib}.{name}" in metrics, f"{lib}.{name} missing from the output:\n{proc.stdout[-3000:]}"
            value = float(metrics[f"{lib}.{name}"])
            assert math.isfinite(value) and value > 0, (lib, name, value)
        # 16 selected worlds x (nq=28 + nv=27) float32 values per frame, nothing else.
        assert float(metrics[f"{lib}.bytes_copied_per_frame"]) == 16 * (28 + 27) * 4
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"
    if not measured:
        pytest.skip("neither jax nor torch is installed; the benchmark printed both skip reasons")


VIEWS_BENCH = BENCH.parent / "bench_views.py"

VIEWS_CAMERAS = ("free", "track", "track_smooth_yaw", "track_like_side")


def test_bench_views_quick_prints_metrics(tmp_path):
    """benchmarks/bench_views.py --quick runs every section (cameras on both backends with their
    plain-renderer controls, scene layout on CPU and Warp, HUD) and prints parseable numbers."""
    proc, metrics = _run_quick(VIEWS_BENCH, tmp_path, timeout=300)
    metrics = {name: value.split()[0] if value.split() else value for name, value in metrics.items()}
    expected = ["target.camera_vs_model", "ratio.worst_camera_vs_model", "target.camera_vs_model_met",
                "scene.compile_s", "scene.first_render_s", "scene.images_per_s", "per_world.images_per_s",
                "ratio.scene_frame_vs_16_per_world_frames", "warp_scene.images_per_s",
                "warp_per_world.images_per_s", "ratio.warp_scene_frame_vs_16_per_world_frames",
                "hud.per_world_ms_per_frame", "ratio.hud_vs_none.per_world", "hud.scene_ms_per_frame",
                "ratio.hud_vs_none.scene", "total_s"]
    for tag in ("cpu", "cpu_render", "warp", "content.cpu", "content.warp"):
        expected.append(f"{tag}.model_ms_per_frame")
        for cam in VIEWS_CAMERAS:
            expected += [f"{tag}.{cam}_ms_per_frame", f"ratio.{tag}.{cam}_vs_model"]
    for tag in ("cpu", "warp"):
        expected += [f"overhead.{tag}.{cam}" for cam in VIEWS_CAMERAS]
    if "warp.skipped" in metrics:  # backend 'warp' cannot render here (it says why): the CPU rows remain
        expected = [name for name in expected if "warp" not in name]
    for name in expected:
        assert name in metrics, f"{name} missing from the benchmark output:\n{proc.stdout[-3000:]}"
        if name != "target.camera_vs_model_met":
            value = float(metrics[name])
            assert math.isfinite(value) and value > 0, (name, value)
    assert float(metrics["target.camera_vs_model"]) == 1.05
    assert metrics["target.camera_vs_model_met"] in ("PASS", "FAIL")
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


def test_bench_view_quick_prints_metrics(tmp_path):
    """benchmarks/bench_view.py --quick: seek latency and playback through the real viewer."""
    _, metrics = _run_quick(BENCH.parent / "bench_view.py", tmp_path, timeout=180)
    for name in ("local.seek_p50_ms", "local.seek_p95_ms", "local.window_held_MB", "playback.frames_per_s",
                 "ratio.playback_vs_output_fps"):
        value = float(metrics[name])
        assert math.isfinite(value) and value > 0, (name, value)
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


VARIANTS_BENCH = BENCH.parent / "bench_variants.py"


def test_bench_variants_quick_prints_metrics(tmp_path):
    """benchmarks/bench_variants.py --quick: the recorded variants replay as the device held them,
    one event per resetting world and frame is stored, and both sections print their ratios."""
    proc, metrics = _run_quick(VARIANTS_BENCH, tmp_path, timeout=300)
    assert metrics["check.values_in_force_equal_device_values"] == "True", proc.stdout[-3000:]
    assert metrics["check.events_one_per_resetting_world"] == "True", proc.stdout[-3000:]
    for name in ("record.variant_cost_per_frame.reset_1%",):
        assert name in metrics, f"{name} missing:\n{proc.stdout[-3000:]}"
    assert any(name.startswith("overlays.ratio.") and math.isfinite(float(v.split()[0])) for name, v in metrics.items())
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


def test_bench_peer_flygym_quick_prints_metrics(tmp_path):
    """benchmarks/bench_peer_flygym.py --quick: every row prints (render may say why it skipped), the
    archive holds what the flygym-style recorder kept, and the ratios parse."""
    proc, metrics = _run_quick(BENCH.parent / "bench_peer_flygym.py", tmp_path, timeout=240)
    assert metrics["check.archive_equals_peer_trajectory"] == "True", proc.stdout[-3000:]
    names = ["record.ours_us", "record.flygym_us", "record.bare_copy_us", "ratio.record_vs_bare_copy",
             "ratio.record_vs_flygym", "skip.ours_us", "skip.flygym_us", "construct.ours_ms",
             "construct.one_compile_ms", "ratio.construct_vs_compile", "open_select_first.ours_ms",
             "open_select_first.npz_ms", "open_select_warm.ours_ms", "ratio.open_select_warm_vs_npz"]
    if "render.skipped" not in metrics:
        names += ["render.ours_workers1_s", "render.flygym_s", "ratio.render_vs_flygym"]
    if "warp.skipped" not in metrics:
        assert metrics["check.warp_archive_equals_peer"] == "True", proc.stdout[-3000:]
        names += ["warp.record_us", "warp.skip_us", "warp.flygym_us", "ratio.warp_record_vs_bare_gather_copy"]
    for name in names:
        assert name in metrics, f"{name} missing from the output:\n{proc.stdout[-3000:]}"
        value = float(metrics[name])
        assert math.isfinite(value) and value > 0, (name, value)
    assert metrics["target.record_vs_bare_copy_le_1.5"] in ("PASS", "FAIL")
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


def test_bench_mjlab_quick_prints_metrics(tmp_path):
    """benchmarks/bench_mjlab.py --quick: the wrapper's per-step cost next to the env's own, where
    mjlab is installed (it says why it skips elsewhere)."""
    proc, metrics = _run_quick(BENCH.parent / "bench_mjlab.py", tmp_path, timeout=600)
    if "mjlab.skipped" in metrics:
        pytest.skip(metrics["mjlab.skipped"])
    for name in ("plain.step_ms", "wrapped.step_ms", "ratio.wrapped_vs_plain"):
        value = float(metrics[name])
        assert math.isfinite(value) and value > 0, (name, value, proc.stdout[-2000:])
    assert int(metrics["wrapped.frames"]) > 10  # every step of every timed run was recorded
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


def test_bench_parts_quick_prints_metrics(tmp_path):
    """benchmarks/bench_parts.py --quick: parallel writers of one multi-part archive, open + select
    and S3 info, each next to its single-part baseline; every archive read back equals its input."""
    proc, metrics = _run_quick(BENCH.parent / "bench_parts.py", tmp_path, timeout=300)
    checks = [name for name in metrics if name.startswith("check.")]
    assert len(checks) >= 4, proc.stdout[-3000:]
    assert all(metrics[name] == "True" for name in checks), proc.stdout[-3000:]
    names = ["append[single].worlds_frames_per_s", "append[single].qpos_MBps", "ratio.append.writers1_vs_single",
             "ratio.append.writers2_vs_single", "open_select_first[parts8].ms",
             "ratio.open_select_first.parts8_vs_single", "ratio.open_select_warm.parts8_vs_single"]
    if "s3.skipped" not in metrics:
        names += ["s3.info[single].ms", "s3.info[parts8].ms", "s3.info[parts8].requests",
                  "ratio.s3.info.parts8_vs_single"]
    for name in names:
        assert name in metrics, f"{name} missing from the output:\n{proc.stdout[-3000:]}"
        value = float(metrics[name].rstrip("x"))
        assert math.isfinite(value) and value > 0, (name, value)
    assert metrics["target.open_select_parts8_le_1.5x_single"] in ("PASS", "FAIL")
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


def test_bench_rollout_quick_prints_metrics(tmp_path):
    """benchmarks/bench_rollout.py --quick: record_rollout of scanned JAX arrays next to a bare gather +
    host copy of the same rows; the archive holds the input rows at the cadence's steps, and only the
    selected rows were copied (it says why it skips without JAX)."""
    proc, metrics = _run_quick(BENCH.parent / "bench_rollout.py", tmp_path, timeout=180)
    if "jax.skipped" in metrics:
        pytest.skip(metrics["jax.skipped"])
    assert metrics["check.archive_equals_input_rows"] == "True", proc.stdout[-3000:]
    assert metrics["check.bytes_copied_exact"] == "True", proc.stdout[-3000:]
    names = ["record_rollout.us_per_frame_best", "record_rollout_reset.us_per_frame_best",
             "jit_gather.us_per_frame_best", "ratio.record_rollout_vs_jit_gather_best",
             "ratio.record_rollout_reset_vs_jit_gather_best"]
    for name in names:
        value = float(metrics[name])
        assert math.isfinite(value) and value > 0, (name, value, proc.stdout[-2000:])
    assert float(metrics["bytes_copied_per_frame"]) == 16 * (28 + 27) * 4  # selected rows only
    assert metrics["target.record_rollout_vs_jit_gather_le_1.5"] in ("PASS", "FAIL")
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


def test_bench_million_quick_prints_metrics(tmp_path):
    """benchmarks/bench_million.py --quick: the archive built from one written chunk is valid (verify,
    info's episode count, a selection and episode starts equal the replicated pattern), and every
    operation prints its big and small times and their ratio, locally and (where moto is) on S3."""
    proc, metrics = _run_quick(BENCH.parent / "bench_million.py", tmp_path, timeout=300)
    wheres = ["local"] + ([] if "s3.skipped" in metrics else ["s3"])
    for where in wheres:
        checks = [name for name in metrics if name.startswith(f"check.{where}.")]
        assert len(checks) == 8, proc.stdout[-3000:]
        assert all(metrics[name].startswith("True") for name in checks), proc.stdout[-3000:]
        for op in ("open", "info", "select", "render", "seek", "episodes", "verify", "refresh"):
            for name in (f"{where}.{op}.big_s", f"{where}.{op}.small_s", f"ratio.{where}.{op}"):
                assert name in metrics, f"{name} missing from the output:\n{proc.stdout[-3000:]}"
                value = float(metrics[name].split()[0])
                assert math.isfinite(value) and value > 0, (name, value)
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"
