"""The documentation: the site builds with warnings as errors, and every code example in README.md
and docs/ runs as written.

A page's examples run in order, in one fresh process in an empty folder, like a reader following
the page: Python blocks share one namespace, and a shell block (every command in it a `mjarchive`
command) runs between them. A hidden setup block, `<!-- setup ... -->` around a Python block,
runs at its place (say, to create the archive a page's examples open) and is not shown. A block
that cannot run here says why in a `<!-- skip: reason -->` line right above it; any other block
must run. A page whose imports are missing here (mjlab, flygym, ...) is skipped with the reason:
CI runs each page where its stack is installed. Archives the examples leave must open and verify.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mjarchive

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
SKIP = re.compile(r"<!-- skip: (\S.*?) -->\n$")
SETUP = re.compile(r"<!-- setup[^\n]*\n$")
SHELL = {"bash", "sh", "console"}
MJARCHIVE_COMMAND = re.compile(r"^(MUJOCO_GL=\w+ )?(mjarchive|python -m mjarchive)( |$)")
ASSIGNMENT = re.compile(r"""^[A-Za-z_]\w*=('[^']*'|"[^"]*"|\S*)$""")  # a shell variable the commands use

# Runs one page's blocks in order: [kind, code, where] with kind "python" or "shell".
RUNNER = textwrap.dedent("""
    import json, subprocess, sys
    namespace = {"__name__": "__main__"}
    for kind, code, where in json.load(sys.stdin):
        if kind == "python":
            exec(compile(code, where, "exec"), namespace)
            continue
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{where}: exit status {done.returncode}\\n{done.stdout[-2000:]}\\n{done.stderr[-3000:]}")
""")


def blocks(page: Path) -> list[tuple[str, str, str, str | None]]:
    """(kind, code, where, skip reason) of each code block of `page`, in order; kind is the fence's
    language, or "setup" for a hidden setup block."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()]
        line = before.count("\n") + 1
        where = f"{page.relative_to(ROOT)}:{line + 1}"
        skip = SKIP.search(before)
        kind = "setup" if SETUP.search(before) else m.group(1)
        out.append((kind, m.group(2), where, skip.group(1) if skip else None))
    return out


def runnable(page: Path) -> list[tuple[str, str, str]]:
    """What `RUNNER` runs for `page`; raises AssertionError for a block that neither runs nor says
    why it is skipped."""
    out = []
    for kind, code, where, skip in blocks(page):
        if skip:
            continue
        if kind in ("python", "setup"):
            out.append(("python", code, where))
        elif kind in SHELL:
            lines = code.replace("\\\n", " ").splitlines()
            commands = [c for c in lines if c.strip() and not c.lstrip().startswith("#")]
            foreign = [c for c in commands if not (MJARCHIVE_COMMAND.match(c.strip()) or ASSIGNMENT.match(c.strip()))]
            assert not foreign, (f"{where}: a shell example runs only mjarchive commands; mark it with "
                                 f"'<!-- skip: reason -->' or change {foreign[0]!r}")
            out.append(("shell", code, where))
        else:
            assert kind in ("", "text", "json", "toml", "yaml"), f"{where}: unknown code block language {kind!r}"
    return out


def _missing_modules(codes: list[str]) -> list[str]:
    names = set()
    for code in codes:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                names.update(a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.partition(".")[0])
    return sorted(m for m in names if importlib.util.find_spec(m) is None)


def test_every_code_block_runs_or_says_why_not():
    skipped = {str(p.relative_to(ROOT)): [b[3] for b in blocks(p) if b[3]] for p in PAGES}
    for page in PAGES:
        runnable(page)  # asserts
    # Skips stay the exception: a page of examples that all skip would test nothing.
    assert sum(map(len, skipped.values())) <= 20, skipped


def test_the_readme_is_one_screen_with_the_quickstart_and_links():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 60
    commands = [code for kind, code, _, _ in blocks(ROOT / "README.md") if kind == "bash"]
    assert any("mjarchive demo" in c for c in commands) and any("pytest" in c for c in commands)
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README.md links to {link}, which does not exist"


@pytest.mark.parametrize("page", [p for p in PAGES if any(b[3] is None and b[0] in ("python", "setup", *SHELL)
                                                        for b in blocks(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(tmp_path, page):
    steps = runnable(page)
    if not steps:
        pytest.skip("no example on this page runs")
    missing = _missing_modules([code for kind, code, _ in steps if kind == "python"])
    if missing:
        pytest.skip(f"{page.relative_to(ROOT)} needs {missing}, not installed here")
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(steps), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    for path in sorted(tmp_path.rglob("*.mjarchive")):
        if (path / "zarr.json").is_file():
            with mjarchive.open(path) as archive:
                assert archive.verify().ok, f"{path.relative_to(tmp_path)} left by the examples does not verify"


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must build the documentation site: pip install -e '.[test]' brings mkdocs")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in mjarchive.__all__:  # the reference documents the whole public surface
        assert re.search(rf'id="mjarchive(\.\w+)*\.{name}"', api), f"the API reference lacks mjarchive.{name}"
    assert (tmp_path / "site" / "format" / "spec" / "index.html").is_file()
