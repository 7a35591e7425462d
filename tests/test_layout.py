"""The package's shape: wings by the data's journey, no import circles, a light `import mjarchive`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import mjarchive

PACKAGE = Path(mjarchive.__file__).resolve().parent
WINGS = ("archive", "record", "replay", "cli")


def _module_name(path: Path) -> str:
    parts = ("mjarchive", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level:
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([target] if target else []))
    return target or ""


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere (module level, in functions, lazily by name)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                # `from . import cpu` names a submodule; `from .reader import open` names the module.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("."):
                # importlib.import_module(".record.recorder", "mjarchive") in the root's lazy table
                if name == "mjarchive" and _resolve(name, True, 1, node.value[1:]) in modules:
                    targets = [_resolve(name, True, 1, node.value[1:])]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_sees_direct_and_chained_circles():
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "mjarchive.replay.render" in graph["mjarchive"]  # the lazy table counts as an import
    assert "mjarchive.replay.worker" in graph["mjarchive.replay.backends.warp"]  # `from . import worker`
    assert "mjarchive.cli.demo" in graph["mjarchive.cli.main"]  # a function-level import


def test_no_two_modules_import_each_other():
    assert find_cycle(import_graph()) is None


def test_modules_live_in_their_wings():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    # gymnasium.py: the public face of record/gymnasium.py (`mjarchive.gymnasium.RecordTrajectory`).
    assert top == ["__init__.py", "__main__.py", "_errors.py", "_fs.py", "gymnasium.py", "testing.py"]
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text()))
        assert doc, f"{wing}/__init__.py needs a docstring saying what the wing is for"


def test_import_mjarchive_stays_light():
    code = ("import mjarchive, sys; "
            "heavy = [m for m in sys.modules if m.partition('.')[0] in "
            "('warp', 'mujoco_warp', 'imageio', 'dask', 'gymnasium', 'jax', 'torch', 'cupy')]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
