"""Run a reader against the conformance cases of spec/conformance/ (see spec/README.md, Conformance).

    python spec/conformance/run.py                          # the reference reader (mjarchive)
    python spec/conformance/run.py --reader mymod:read      # any implementation
    python spec/conformance/run.py --cases DIR --only NAME  # other case folders, some cases

Protocol: the reader is a Python callable `read(path: str) -> dict` that opens the archive at
`path` as untrusted input, fully (root attributes, every array's metadata, the committed frames of
every array, the model bundle with its safety checks, and the compiled model's layout), and
returns {"n_frames": int, "world_ids": [int], "status": str, "arrays": {name: array-like}}, where
`arrays` holds the committed frames of `time`, `qpos`, `reset`, `mocap_pos`/`mocap_quat` (when
nmocap > 0) and every track, and (format 1.1) by store key every overlay array's committed frames
and the first `n_events` rows of every variant event array, and (format 1.3) the rows k < n_frames //
chunk_frames of `reset_count`. For a multi-part archive (format 1.2)
it returns {"n_frames": int, "world_ids": [int], "status": str, "parts": {name: dict}}: the
archive's own counts and worlds, and for every joined part, by name, that part read fully as above
(its own n_frames, world_ids, status and arrays). It refuses an invalid archive by raising an
exception. A valid case passes when every expected value (and every expected part's) is returned,
every expected array with the same dtype, shape and bits; an invalid case
passes when the reader raises. With `--error-classes`, the exception's class (or a base class)
must also be named like the case's `error`; with `--messages`, its message must match `match`.
Exit status 0 when every case passes. One line per case: `name: PASS|FAIL detail`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent


def mjarchive_reader(path: str) -> dict[str, Any]:
    """The reference reader: mjarchive opens, verifies, compiles and reads everything."""
    import mjarchive
    from mjarchive import FormatError

    with mjarchive.open(path) as archive:
        archive.bundle.compile()  # the bundle's safety checks, then MuJoCo
        archive.model()  # the layout (and variant shapes) against the compiled model
        report = archive.verify()  # missing chunks, hashes, layout against the compiled model
        if not report.ok:
            raise FormatError(str(report))
        if archive.parts:  # format 1.2, multi-part: every joined part read as an archive of its own
            return {"n_frames": archive.n_frames, "world_ids": list(archive.world_ids), "status": archive.status,
                    "parts": {name: _read_all(archive.part(name)) for name in archive.parts}}
        return _read_all(archive)


def _read_all(archive: Any) -> dict[str, Any]:
    """The committed contents of an open (single or part) archive, by the protocol above."""
    sel = archive.select()
    arrays = {"time": archive.time[:], "qpos": sel.qpos, "reset": sel.reset}
    if archive.nmocap:
        arrays |= {"mocap_pos": sel.mocap_pos, "mocap_quat": sel.mocap_quat}
    arrays |= {name: sel.track(name) for name in archive.tracks}
    for name in archive.overlays:  # format 1.1
        frames = sel.overlay(name)
        arrays |= {f"overlays/{name}/count": frames.count, f"overlays/{name}/data": frames.data}
        if frames.text_bytes is not None:
            arrays[f"overlays/{name}/text"] = frames.text_bytes
    for field in archive.variant_fields:
        arrays |= {f"variants/{field}/{k}": v for k, v in archive.variant_events(field).items()}
    if archive._index_docs is not None:  # format 1.3: the episode index's trusted rows (verify compared them)
        arrays["reset_count"] = archive._index_docs["reset_count"][:archive.n_frames // archive.manifest.chunk_frames]
    return {"n_frames": archive.n_frames, "world_ids": list(archive.world_ids), "status": archive.status,
            "arrays": arrays}


def load_reader(spec: str) -> Callable[[str], dict]:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr or "read")


def load_cases(directory: Path) -> dict[str, dict]:
    return json.loads((directory / "cases.json").read_text())


def check_valid(result: dict, expected: dict) -> str | None:
    """None if `result` equals the expected contents bit for bit, else what differs."""
    for key in ("n_frames", "world_ids", "status"):
        if result.get(key) != expected[key]:
            return f"{key}: got {result.get(key)!r}, expected {expected[key]!r}"
    if "parts" in expected:  # a multi-part archive: each joined part as an archive of its own
        parts = result.get("parts") or {}
        if list(parts) != list(expected["parts"]):
            return f"parts: got {list(parts)}, expected {list(expected['parts'])}"
        for name, want in expected["parts"].items():
            problem = check_valid(parts[name], want)
            if problem:
                return f"part {name}: {problem}"
        return None
    arrays = result.get("arrays", {})
    if set(arrays) != set(expected["arrays"]):
        return f"arrays: got {sorted(arrays)}, expected {sorted(expected['arrays'])}"
    for name, want in expected["arrays"].items():
        got = np.asarray(arrays[name])
        ref = np.array(want["data"], dtype=want["dtype"]).reshape(want["shape"])
        if got.dtype != ref.dtype or got.shape != ref.shape or got.tobytes() != ref.tobytes():
            return f"{name}: got {got.dtype}{got.shape}, expected {ref.dtype}{ref.shape} (or the values differ)"
    return None


def run_case(read: Callable[[str], dict], path: Path, entry: dict, *, error_classes: bool = False,
             messages: bool = False) -> tuple[bool, str]:
    """(passed, detail) for one case."""
    try:
        result = read(str(path))
    except Exception as exc:  # noqa: BLE001 - any refusal counts; its class is checked below
        if entry["expect"] == "valid":
            return False, f"refused a valid archive: {type(exc).__name__}: {exc}"
        names = {cls.__name__ for cls in type(exc).__mro__}
        if error_classes and entry["error"] not in names:
            return False, f"raised {type(exc).__name__}, expected {entry['error']}: {exc}"
        if messages and entry.get("match") and not re.search(entry["match"], str(exc)):
            return False, f"message does not match {entry['match']!r}: {exc}"
        return True, f"{type(exc).__name__}"
    if entry["expect"] == "invalid":
        return False, f"accepted an archive that breaks {entry['rule']}"
    problem = check_valid(result, entry["expected"])
    return problem is None, problem or "read back exactly"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", default=None, help="module:function (default: the mjarchive reader)")
    parser.add_argument("--cases", type=Path, default=HERE, help="folder holding cases.json and cases/")
    parser.add_argument("--only", action="append", help="run only these cases (repeatable)")
    parser.add_argument("--error-classes", action="store_true", help="also compare exception class names")
    parser.add_argument("--messages", action="store_true", help="also match messages against `match`")
    args = parser.parse_args(argv)
    reference = args.reader is None
    read = mjarchive_reader if reference else load_reader(args.reader)
    index = load_cases(args.cases)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        runtime = {n for n, e in index.items() if e.get("runtime")}
        if runtime and (not args.only or runtime & set(args.only)):
            sys.path.insert(0, str(HERE))
            import make_cases

            make_cases.write_cases(Path(tmp), runtime=True)
        for name, entry in index.items():
            if args.only and name not in args.only:
                continue
            path = Path(tmp) / name if entry.get("runtime") else args.cases / "cases" / name
            ok, detail = run_case(read, path, entry, error_classes=args.error_classes or reference,
                                  messages=args.messages or reference)
            failures += not ok
            print(f"{name}: {'PASS' if ok else 'FAIL'} {detail}")
    print(f"{len(index) - failures if not args.only else '-'} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
