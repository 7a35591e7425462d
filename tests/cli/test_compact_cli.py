"""`mjarchive compact` end to end, as a subprocess on real archives (see tests/cli/test_cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import mjarchive
from mjarchive.cli.main import main


def run_cli(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    return subprocess.run([sys.executable, "-m", "mjarchive", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _seed(path, xml, seed: int, n_frames: int):
    rng = np.random.default_rng(seed)
    with mjarchive.create(path, xml, n_worlds=2, chunk_frames=4, tracks={"reward": ()}) as w:
        for f in range(n_frames):
            w.append(0.1 * (f + 1), rng.normal(size=(2, 28)), reset=rng.random(2) < 0.2, reward=rng.normal(size=2))
    return path


def test_compact_seeds(tmp_path, humanoid_xml):
    a = _seed(tmp_path / "seed0.mjarchive", humanoid_xml, 0, 10)
    b = _seed(tmp_path / "seed1.mjarchive", humanoid_xml, 1, 9)
    out = tmp_path / "seeds.mjarchive"

    proc = run_cli("compact", a, b, out, "--renumber")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "mjarchive compact: error:" in proc.stderr
    assert "seed0.mjarchive: 10" in proc.stderr and "seed1.mjarchive: 9" in proc.stderr
    assert "--frames :9" in proc.stderr and not out.exists()

    proc = run_cli("compact", a, b, out, "--frames", ":9")
    assert proc.returncode == 1 and "world ID 0 is in both" in proc.stderr and "--renumber" in proc.stderr

    proc = run_cli("compact", a, b, out, "--frames", ":9", "--renumber")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{src} world {old} -> {new}"
                                        for new, (src, old) in enumerate([(a, 0), (a, 1), (b, 0), (b, 1)])]
    assert "mjarchive compact" in proc.stderr  # the progress bar
    assert proc.stderr.rstrip().endswith(f"wrote {out}: 4 worlds, 9 frames (verified)")
    with mjarchive.open(out) as merged, mjarchive.open(a) as sa, mjarchive.open(b) as sb:
        assert merged.world_ids == (0, 1, 2, 3) and merged.n_frames == 9 and merged.verify().ok
        np.testing.assert_array_equal(merged.select(worlds=[2, 3]).qpos, sb.select().qpos)
        np.testing.assert_array_equal(merged.select(worlds=[0, 1]).track("reward"),
                                      sa.select(frames=slice(0, 9)).track("reward"))

    proc = run_cli("compact", a, b, out, "--frames", ":9", "--renumber", "--no-progress")
    assert proc.returncode == 1 and "exists" in proc.stderr
    proc = run_cli("compact", a, b, out, "--frames", ":9", "--renumber", "--no-progress", "--overwrite")
    assert proc.returncode == 0 and "mjarchive compact:" not in proc.stderr.split("wrote")[0]


@pytest.mark.parametrize("args, message", [
    (["only-one.mjarchive"], "the following arguments are required: DEST"),
    (["a", "b", "--frames", "::2"], "consecutive frames"),
    (["a", "b", "--frames", "5"], "consecutive frames"),
])
def test_compact_usage_errors(args, message, capsys):
    try:
        code = main(["compact", *args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code in (1, 2)
    assert message in capsys.readouterr().err


def test_compact_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compact", "--help"])
    assert exit_info.value.code == 0
    assert "mjarchive compact seed0.mjarchive" in capsys.readouterr().out.split("example:")[1]
