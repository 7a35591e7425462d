"""Mutation fuzzing of archives: damage one file of a real archive at random, run the public entry
points on it in a limited child (tests/hostile.py), and report every outcome that is not a clean
success or a clean MjArchiveError (a crash, a timeout, or anything touched outside).

    python tests/fuzz_hostile.py --cases 300 --seed 0      # prints failures, exits 1 if any

`tests/archive/test_fuzz.py` runs a fixed-seed sample in CI. A mutation is plain data (file,
kind, parameters), so a failure prints what reproduces it.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile  # noqa: E402

import mjarchive  # noqa: E402
from mjarchive.testing import hinge_chain_xml  # noqa: E402

ENTRIES = ("open", "select", "verify", "append", "cli_info", "model")
_HOSTILE_VALUES = [None, True, -1, 0, 2**31, 2**63, 2**70, -2**63, 1e308, -0.0, 0.5, "", "x" * 300, "NaN",
                   "../../x", "\n", [], [[[[[]]]]], {}, {"a": {"b": {}}}, [0] * 5, ["qpos"], 1.5, "1.0\n"]


def make_base(path: Path) -> Path:
    """A small real archive: 3 worlds, 9 frames (a partial last chunk), mocap, a track, resets."""
    bundle = mjarchive.ModelBundle.from_xml(hinge_chain_xml(2, n_mocap=1))
    with mjarchive.create(path, bundle, world_ids=[5, 1, 9], chunk_frames=4, shard_worlds=2,
                          tracks={"reward": ()}) as w:
        n = 9
        reset = np.zeros((n, 3), bool)
        reset[4, 1] = True
        w.append(np.arange(1, n + 1) / 10, np.linspace(0, 1, n * 6).reshape(n, 3, 2),
                 mocap_pos=np.zeros((n, 3, 1, 3)), mocap_quat=np.tile([1.0, 0, 0, 0], (n, 3, 1, 1)),
                 reset=reset, reward=np.ones((n, 3)))
    return path


def _json_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _json_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:8]):
            out += _json_paths(v, prefix + (i,))
    return out


def mutate(archive: Path, rng: random.Random) -> dict:
    """Damage one file of `archive` in place; returns a description that reproduces it."""
    files = sorted(p for p in archive.rglob("*") if p.is_file())
    target = rng.choice(files)
    rel = str(target.relative_to(archive))
    data = target.read_bytes()
    if target.name == "zarr.json" and rng.random() < 0.7:
        doc = json.loads(data)
        path = rng.choice(_json_paths(doc)[1:] or [()])
        value = rng.choice(_HOSTILE_VALUES)
        node = doc
        for k in path[:-1]:
            node = node[k]
        if path:
            if rng.random() < 0.15 and isinstance(node, dict):
                del node[path[-1]]
                value = "<deleted>"
            else:
                node[path[-1]] = value
        target.write_text(json.dumps(doc))
        return {"file": rel, "kind": "json", "path": list(path), "value": value}
    kind = rng.choice(["flip", "truncate", "append", "empty", "delete", "zeros"])
    if kind == "flip" and data:
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(b))
    elif kind == "truncate":
        target.write_bytes(data[: rng.randrange(len(data) + 1)])
    elif kind == "append":
        target.write_bytes(data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))
    elif kind == "empty":
        target.write_bytes(b"")
    elif kind == "zeros":
        target.write_bytes(bytes(len(data)))
    else:
        target.unlink()
    return {"file": rel, "kind": kind}


def run_case(base: Path, work: Path, seed: int, outside: Path, entries=ENTRIES) -> list[str]:
    """Mutate a copy of `base` with `seed`, run `entries` on copies of it; returns failures."""
    rng = random.Random(seed)
    damaged = work / f"case-{seed}"
    shutil.copytree(base, damaged)
    what = mutate(damaged, rng)
    failures = []
    for entry in entries:
        copy = work / f"case-{seed}-{entry}"
        shutil.copytree(damaged, copy)
        o = hostile.run(entry, copy, work / f"out-{seed}-{entry}", watch=[outside], timeout=30)
        if o.status not in ("ok", "error") or o.touched_outside:
            failures.append(f"seed {seed} {what} {entry}: {o.status} {o.error_class} "
                            f"{o.message.strip().splitlines()[-1][:300] if o.message.strip() else ''}"
                            f"{' touched ' + str(o.touched_outside) if o.touched_outside else ''}")
        shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(damaged, ignore_errors=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        outside = work / "outside"
        outside.mkdir()
        (outside / "secret").write_text("secret")
        base = make_base(work / "base.mjarchive")
        failures = []
        for seed in range(args.seed, args.seed + args.cases):
            found = run_case(base, work, seed, outside)
            for f in found:
                print(f, flush=True)
            failures += found
        print(f"fuzz: {args.cases} cases, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
