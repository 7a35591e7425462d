"""Bundling and archive construction vs one compile of the model.

For each model, interleaved and best of N (process CPU time; wall time too):
- baseline `compile`: `MjModel.from_xml_path(path)` (for an MjSpec, `spec.compile()`);
- `bundle`: `ModelBundle.from_file(path)` (for an MjSpec, `ModelBundle.from_spec(spec)`);
- `create`: `mjarchive.create(tmp, path, n_worlds=16)` (the archive writer, closed untimed);
- `recorder`: `Recorder(tmp, path, n_worlds=16)` (creates the archive at construction);
- `recorder_lazy`: `Recorder(tmp, path)` (bundles only: the archive is created by the first
  `record()`, when the number of worlds is known).
MuJoCo keeps processed meshes in an asset cache across compiles in a process (aloha_pot: 0.3 s
cold, 0.05 s warm). By default it is cleared before every timed call, as for the first compile
of a model in a process; `--warm-cache` keeps it.
Prints `model.what_s: seconds` and `model.what_vs_compile: ratio` lines (goal: create and
recorder <= 1.2x). The `spec` rows bundle the model as an MjSpec edited in Python (one body added),
which MuJoCo writes as MJCF with exact numbers.

    python benchmarks/bench_bundle.py                # humanoid, aloha_pot, humanoid_CMU if found
    python benchmarks/bench_bundle.py --repeats 3 --models humanoid
    # the same against another checkout's code, loaded side by side as `mjarchive_base`:
    git archive HEAD src | tar -x -C /tmp/base && python benchmarks/bench_bundle.py --base /tmp/base/src
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import shutil
import tempfile
import time
from pathlib import Path

import mujoco

import mjarchive
from mjarchive import ModelBundle, Recorder

_TEST_DATA = Path(mujoco.__file__).parent.parent / "mujoco_warp" / "test_data"


def _models() -> dict[str, Path]:
    found = {"humanoid": _TEST_DATA / "humanoid" / "humanoid.xml", "aloha_pot": _TEST_DATA / "aloha_pot" / "scene.xml"}
    spec = importlib.util.find_spec("dm_control")
    for root in ([Path(p) for p in spec.submodule_search_locations] if spec else []) + [Path("/tmp/dmc/dm_control")]:
        if (root / "suite" / "humanoid_CMU.xml").is_file():
            found["humanoid_CMU"] = root / "suite" / "humanoid_CMU.xml"
            break
    else:
        print("# humanoid_CMU: dm_control not installed (pip install --no-deps --target /tmp/dmc dm-control)")
    return {k: v for k, v in found.items() if v.is_file()}


def _load_base(src: str):
    """Another version of mjarchive (its `src` folder), imported as the package `mjarchive_base`."""
    init = Path(src) / "mjarchive" / "__init__.py"
    spec = importlib.util.spec_from_file_location("mjarchive_base", init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["mjarchive_base"] = module
    spec.loader.exec_module(module)
    return module


def _edited_spec(path: Path) -> mujoco.MjSpec:
    spec = mujoco.MjSpec.from_file(str(path))
    body = spec.worldbody.add_body(name="bench_extra", pos=[0.1234567891234, 1 / 3, 1 / 7])
    body.add_geom(size=[0.0123456789, 0, 0], rgba=[0.1, 0.2, 0.3, 1])
    return spec


def _timed(fn, cold: bool) -> tuple[float, float]:
    if cold:
        mujoco.mj_clearCache(mujoco.mj_getCache())
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    cpu, wall = time.process_time() - c, time.perf_counter() - w
    close = getattr(out, "close", None)
    if close is not None:  # outside the timing: the writer's thread, pending metadata
        close()
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--warm-cache", action="store_true", help="keep MuJoCo's asset cache between calls")
    parser.add_argument("--base", default=None, help="src folder of a baseline version: rows base_*")
    args = parser.parse_args()
    base = _load_base(args.base) if args.base else None
    models = _models()
    if args.models:
        models = {k: v for k, v in models.items() if k in args.models}
    tmp = Path(tempfile.mkdtemp(prefix="bench-bundle-"))
    counter = iter(range(10**9))

    def location() -> str:
        return str(tmp / f"a{next(counter)}.zarr")

    try:
        for name, path in models.items():
            spec = _edited_spec(path)
            p = str(path)
            systems = {
                "compile": lambda: mujoco.MjModel.from_xml_path(p),
                "bundle": lambda: ModelBundle.from_file(p),
                "create": lambda: mjarchive.create(location(), p, n_worlds=16),
                "recorder": lambda: Recorder(location(), p, n_worlds=16),
                "recorder_lazy": lambda: Recorder(location(), p),
                "spec_compile": lambda: spec.compile(),
                "spec_bundle": lambda: ModelBundle.from_spec(spec),
                "spec_create": lambda: mjarchive.create(location(), spec, n_worlds=16),
            }
            if base is not None:
                systems.update({
                    "base_bundle": lambda: base.ModelBundle.from_file(p),
                    "base_create": lambda: base.create(location(), p, n_worlds=16),
                    "base_recorder": lambda: base.Recorder(location(), p, n_worlds=16),
                    "base_recorder_lazy": lambda: base.Recorder(location(), p),
                    "base_spec_bundle": lambda: base.ModelBundle.from_spec(spec),
                    "base_spec_create": lambda: base.create(location(), spec, n_worlds=16),
                })
            best = {k: (float("inf"), float("inf")) for k in systems}
            for k, fn in systems.items():  # warm-up: imports, file cache
                fn_out = fn()
                getattr(fn_out, "close", lambda: None)()
            for _ in range(args.repeats):
                for k, fn in systems.items():  # interleaved
                    cpu, wall = _timed(fn, not args.warm_cache)
                    best[k] = (min(best[k][0], cpu), min(best[k][1], wall))
                for child in tmp.iterdir():
                    shutil.rmtree(child, ignore_errors=True)
            for k, (cpu, wall) in best.items():
                print(f"{name}.{k}_cpu_s: {cpu:.4f}")
                print(f"{name}.{k}_wall_s: {wall:.4f}")
            for k in best:
                if k.endswith("compile"):
                    continue
                ref = "spec_compile" if "spec_" in k else "compile"
                print(f"{name}.{k}_vs_compile_cpu: {best[k][0] / best[ref][0]:.2f}")
                print(f"{name}.{k}_vs_compile_wall: {best[k][1] / best[ref][1]:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
