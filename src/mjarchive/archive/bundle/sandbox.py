"""Compiling a model bundle read from an archive: in a child process, under time and memory limits.

A few hundred bytes of MJCF can ask MuJoCo for enormous work or memory (`<replicate>`, huge
builtin or PNG textures, visual quality settings, composites), and MuJoCo's parser and compiler
run in C where a bomb would take the whole process down. So an untrusted bundle is first checked
statically (`xml_checks.check_bundle_xml`), then parsed, checked again as an MjSpec, sized for
replay (its arena: `compile_child.size_for_replay`, whatever `<size>` declares), compiled and posed
once in a fresh interpreter that imports only MuJoCo (`compile_child.py`), limited in address space
and CPU time; the parent loads the returned MJB.
Results are cached per process by the bundle's content hash (computed from the bytes, never taken
from the archive) and the replay recipe, so each (bundle, recipe) is compiled once per process. A
recipe (`compile_child.apply_recipe`: scene copies, replay cameras) is applied in the child too.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import mujoco

from ..._errors import BundleError
from .xml_checks import check_bundle_xml

__all__ = ["compile_untrusted", "COMPILE_TIMEOUT_S", "COMPILE_MEMORY_BYTES"]

#: Wall-clock limit for compiling one bundle (real robot models compile in a few seconds).
COMPILE_TIMEOUT_S = float(os.environ.get("MJARCHIVE_COMPILE_TIMEOUT_S", 60))
#: Address-space limit of the compiling process (an interpreter with MuJoCo needs ~200 MiB).
COMPILE_MEMORY_BYTES = int(os.environ.get("MJARCHIVE_COMPILE_MEMORY_BYTES", 3 * 2**30))
_CHILD = str(Path(__file__).with_name("compile_child.py"))
# Runs compile_child.py as the script it is, with the import path the parent passes first on sys.path.
_BOOTSTRAP = ("import json, runpy, sys; sys.path[:0] = json.loads(sys.argv[1]); sys.argv = sys.argv[2:]; "
              "runpy.run_path(sys.argv[0], run_name='__main__')")
_CACHE_BYTES = 256 * 2**20

_cache: collections.OrderedDict[str, bytes] = collections.OrderedDict()
_lock = threading.Lock()


def compile_untrusted(bundle: Any, recipe: dict | None = None) -> mujoco.MjModel:
    """An MjModel compiled from an untrusted ModelBundle in a limited child process; with `recipe`
    (plain JSON data, checked in the child), the replay model `compile_child.apply_recipe` derives."""
    key = bundle.sha256  # a content hash of the bundle's own bytes
    if recipe is not None:
        try:
            recipe_json = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise BundleError(f"the replay recipe is not plain JSON data: {exc}") from None
        key += "\0" + recipe_json
    with _lock:
        mjb = _cache.get(key)
        if mjb is not None:
            _cache.move_to_end(key)
    if mjb is None:
        check_bundle_xml(bundle.xml, bundle.assets)
        mjb = _compile_in_child(bundle, recipe)
        with _lock:
            _cache[key] = mjb
            while sum(len(v) for v in _cache.values()) > _CACHE_BYTES and len(_cache) > 1:
                _cache.popitem(last=False)
    try:
        return mujoco.MjModel.from_binary_path("model.mjb", {"model.mjb": mjb})
    except Exception as exc:
        raise BundleError(f"the compiled bundle could not be loaded: {exc}") from None


def _compile_in_child(bundle: Any, recipe: dict | None = None) -> bytes:
    xml = bundle.xml.encode()
    names = list(bundle.assets)
    fields: dict[str, Any] = {"xml": len(xml), "assets": [[n, len(bundle.assets[n])] for n in names]}
    if recipe is not None:
        fields["recipe"] = recipe
    header = json.dumps(fields).encode()
    payload = b"".join([header, b"\n", xml, *(bundle.assets[n] for n in names)])
    cpu = max(1, int(COMPILE_TIMEOUT_S) + 1)
    # -I: isolated mode, so neither the working directory nor PYTHON* variables shape the child; it
    # finds MuJoCo and NumPy where this process did (`_import_path`).
    cmd = [sys.executable, "-I", "-c", _BOOTSTRAP, json.dumps(_import_path()), _CHILD, str(COMPILE_MEMORY_BYTES),
           str(cpu)]
    try:
        proc = subprocess.run(cmd, input=payload, capture_output=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BundleError(
            f"compiling the archive's model took longer than {COMPILE_TIMEOUT_S:g} s and was stopped; the bundle "
            "may be hostile (set MJARCHIVE_COMPILE_TIMEOUT_S to allow more for a model you trust)"
        ) from None
    except OSError as exc:
        raise BundleError(f"cannot start a process to compile the archive's model: {exc}") from None
    if proc.returncode == 0:
        return proc.stdout
    reason = _child_error(proc.stderr)
    if proc.returncode == 1 and not reason:  # it failed before reading the bundle (compile_child.main returns 2, 3)
        last = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise BundleError(
            f"cannot start MuJoCo in a process of its own to compile the archive's model: {last[0][:300]} "
            f"(the interpreter {sys.executable} -I, with this process's import path)"
        )
    if proc.returncode < 0:
        reason = f"MuJoCo died with signal {-proc.returncode} ({reason or 'likely out of memory or CPU time'})"
    raise BundleError(
        f"the archive's model cannot be compiled safely: {reason or f'exit code {proc.returncode}'} "
        f"(limits: {COMPILE_TIMEOUT_S:g} s, {COMPILE_MEMORY_BYTES // 2**20} MiB; the bundle may be hostile)"
    )


def _import_path() -> list[str]:
    """This process's import path without the working directory (relative entries, and the folder
    itself): an isolated interpreter ignores PYTHONPATH, where a `pip install --target`, a cluster's
    module system or a zipped application may have put MuJoCo."""
    cwd = os.path.realpath(os.getcwd())
    return [p for p in sys.path if isinstance(p, str) and os.path.isabs(p) and os.path.realpath(p) != cwd]


def _child_error(stderr: bytes) -> str:
    for line in reversed(stderr.decode(errors="replace").strip().splitlines()[-20:]):
        try:
            return str(json.loads(line)["error"])
        except (ValueError, KeyError, TypeError):
            continue
    return ""
