"""README.md's examples that follow a `<!-- readme-test -->` line run as written, each in a fresh
process and an empty folder, and leave a readable archive there."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mjarchive

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- readme-test -->\n```python\n(.*?)```", re.S)


def _blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def _top_level_imports(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names


def test_readme_has_tested_examples():
    assert len(_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_example_runs(tmp_path, index):
    code = _blocks()[index]
    missing = sorted(m for m in _top_level_imports(code) if importlib.util.find_spec(m) is None)
    if missing:
        pytest.skip(f"README example {index} needs {missing}, not installed here")
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    archives = sorted(tmp_path.glob("*.mjarchive"))
    assert archives, "the example wrote no archive"
    for path in archives:
        with mjarchive.open(path) as archive:
            assert archive.status == "finalized" and archive.n_frames > 0
            assert archive.verify().ok
