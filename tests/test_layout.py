"""The package's shape: wings by the data's journey, sub-wings whose import directions hold, no
import circles, a light `import mjarchive`, and a reader that never loads the writer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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
                # importlib.import_module(".record.recorder", "mjarchive") in the root's lazy table, or
                # (".cpu", __package__) in the backend registry: a relative module name in a string
                dots = len(node.value) - len(node.value.lstrip("."))
                target = _resolve(name, is_package, dots, node.value[dots:])
                if node.value[dots:] and target in modules:
                    targets = [target]
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
    # importlib.import_module(".cpu", __package__) through the registry's table
    assert {"mjarchive.replay.backends.cpu", "mjarchive.replay.backends.warp"} <= graph[
        "mjarchive.replay.backends.registry"]


def test_no_two_modules_import_each_other():
    assert find_cycle(import_graph()) is None


def test_modules_live_in_their_wings():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    # flygym.py, gymnasium.py, mjlab.py, playground.py: the public faces of their record/ modules.
    assert top == ["__init__.py", "__main__.py", "_errors.py", "_fs.py", "flygym.py", "gymnasium.py", "mjlab.py",
                   "playground.py", "testing.py"]
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text()))
        assert doc, f"{wing}/__init__.py needs a docstring saying what the wing is for"


def test_import_mjarchive_stays_light():
    code = ("import mjarchive, sys; "
            "heavy = [m for m in sys.modules if m.partition('.')[0] in "
            "('warp', 'mujoco_warp', 'imageio', 'dask', 'gymnasium', 'jax', 'torch', 'cupy', 'flygym', "
            "'mujoco_playground')]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- directions ---------------------------------------------------------------------------------------

#: What each room may import of the package besides its own sub-wing (prefixes; a sub-wing's own
#: modules always may import each other). Written in each sub-wing's __init__ docstring too.
ALLOWED = {
    "mjarchive.archive.format": ("mjarchive._errors",),
    "mjarchive.archive.storage": ("mjarchive._errors", "mjarchive._fs", "mjarchive.archive.format"),
    "mjarchive.archive.bundle": ("mjarchive._errors", "mjarchive._fs", "mjarchive.archive.format",
                                 "mjarchive.archive.storage"),
    "mjarchive.archive": ("mjarchive._errors", "mjarchive._fs"),  # the archive wing: nothing of the others
    "mjarchive.replay.views": ("mjarchive._errors", "mjarchive._fs", "mjarchive.archive"),
    "mjarchive.replay.backends": ("mjarchive._errors", "mjarchive.archive", "mjarchive.replay.views",
                                  "mjarchive.replay.worker"),
}
#: Pairs (importer prefix, imported prefix) that must never appear, whatever ALLOWED says.
FORBIDDEN = (
    ("mjarchive.archive.reader", "mjarchive.archive.writer"),
    ("mjarchive.archive.writer", "mjarchive.archive.reader"),
    ("mjarchive.replay.backends", "mjarchive.replay.plan"),
    ("mjarchive.replay.backends", "mjarchive.replay.unit"),
    ("mjarchive.replay.backends", "mjarchive.replay.render"),
    ("mjarchive.replay.backends", "mjarchive.replay.pool"),
)
#: The backend sub-wing's shared rooms; every other module there is a backend, which only the registry
#: imports.
BACKEND_SHARED = ("mjarchive.replay.backends", "mjarchive.replay.backends.base",
                  "mjarchive.replay.backends.registry")


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _room(module: str) -> str | None:
    """The most specific ALLOWED key that holds `module`."""
    keys = [k for k in ALLOWED if _within(module, k)]
    return max(keys, key=len) if keys else None


def direction_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the directions above, as 'a -> b: why' lines."""
    out = []
    for module, targets in sorted(graph.items()):
        room = _room(module)
        for target in sorted(targets):
            if room is not None and not _within(target, room) and not any(
                    _within(target, ok) for ok in ALLOWED[room]):
                out.append(f"{module} -> {target}: {room} may import only {ALLOWED[room]}")
            for importer, imported in FORBIDDEN:
                if _within(module, importer) and _within(target, imported):
                    out.append(f"{module} -> {target}: {importer} never imports {imported}")
            if (_within(module, "mjarchive.replay.backends") and _within(target, "mjarchive.replay.backends")
                    and target not in BACKEND_SHARED and module != "mjarchive.replay.backends.registry"):
                out.append(f"{module} -> {target}: only the registry imports a backend")
    return out


def test_direction_rules_catch_what_they_forbid():
    bad = [
        ("mjarchive.archive.storage.checked", "mjarchive.archive.manifest"),
        ("mjarchive.archive.bundle.sandbox", "mjarchive.archive.reader"),
        ("mjarchive.archive.reader", "mjarchive.archive.writer"),
        ("mjarchive.archive.writer", "mjarchive.archive.reader"),
        ("mjarchive.archive.verify", "mjarchive.replay.render"),
        ("mjarchive.replay.views.camera", "mjarchive.replay.worker"),
        ("mjarchive.replay.backends.warp", "mjarchive.replay.backends.cpu"),
        ("mjarchive.replay.backends.base", "mjarchive.replay.backends.warp"),
        ("mjarchive.replay.backends.cpu", "mjarchive.replay.unit"),
        ("mjarchive.replay.backends.cpu", "mjarchive.replay.video"),
        ("mjarchive.replay.backends.cpu", "mjarchive.record.recorder"),
    ]
    for module, target in bad:
        assert direction_violations({module: {target}}), (module, target)
    fine = {
        "mjarchive.archive.storage.checked": {"mjarchive.archive.format", "mjarchive.archive.storage.chunk_layout"},
        "mjarchive.archive.bundle.model_bundle": {"mjarchive.archive.storage.local", "mjarchive._fs"},
        "mjarchive.replay.backends.warp": {"mjarchive.replay.backends.base", "mjarchive.replay.views.scene"},
        "mjarchive.replay.backends.registry": {"mjarchive.replay.backends.cpu"},
    }
    assert direction_violations(fine) == []


def test_sub_wings_keep_their_import_directions():
    assert direction_violations(import_graph()) == []


def test_each_sub_wing_says_what_it_guards():
    for wing in ("archive/storage", "archive/bundle", "replay/backends", "replay/views"):
        tree = ast.parse((PACKAGE / wing / "__init__.py").read_text())
        doc = ast.get_docstring(tree)
        assert doc and "import" in doc, f"{wing}/__init__.py: one docstring saying what it guards and may import"
        assert len(tree.body) == 1, f"{wing}/__init__.py holds its docstring only"


def test_replay_never_branches_on_a_backend_name():
    """Outside replay/backends/, code asks a backend (`backends.base.Backend`) instead of comparing
    its name: a new backend is one module plus one registry line."""
    found = []
    for path in (PACKAGE / "replay").rglob("*.py"):
        if "backends" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                values = [c for c in (node.left, *node.comparators)]
                values += [e for c in values if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts]
                if any(isinstance(c, ast.Constant) and c.value in ("cpu", "warp") for c in values):
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, found


def test_every_registered_backend_keeps_the_contract():
    from mjarchive.replay.backends import registry
    from mjarchive.replay.backends.base import Backend

    for name in registry.BACKENDS:
        backend = registry.backend_for(name)
        assert isinstance(backend, Backend) and backend.name == name
        assert type(backend).renderer_for is not Backend.renderer_for
        assert type(backend).render_states is not Backend.render_states
    for bad in ("gpu", "cpu:0", "warp:", "", None, 3):
        with pytest.raises(mjarchive.MjArchiveError, match="unknown backend .*choose 'cpu'"):
            registry.backend_for(bad)
    assert registry.backend_for("warp:cuda:0").name == "warp"


def test_reading_never_loads_the_writer(tmp_path, humanoid_xml):
    path = tmp_path / "r.mjarchive"
    with mjarchive.create(path, humanoid_xml, world_ids=[3, 7]) as w:
        w.append(np.arange(2) * 0.1, np.zeros((2, 2, 28)))
    code = ("import sys, mjarchive\n"
            f"a = mjarchive.open({str(path)!r})\n"
            "assert a.select(worlds=[7], frames=slice(0, 2)).qpos.shape == (2, 1, 28)\n"
            "a.model(); a.verify(); a.close()\n"
            "assert 'mjarchive.archive.writer' not in sys.modules, 'reading loaded the writer'\n"
            "mjarchive.open, mjarchive.create\n"
            "assert 'mjarchive.archive.writer' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
