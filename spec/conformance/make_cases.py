"""Generate spec/conformance/: small valid and invalid archives and their expected outcomes.

    python spec/conformance/make_cases.py              # rewrite spec/conformance/cases/ and cases.json
    python spec/conformance/make_cases.py OUT          # write the committed cases into OUT instead
    python spec/conformance/make_cases.py --runtime OUT  # write only the runtime cases into OUT

Each case is a function registered with `@case(...)` that writes one archive into a directory.
Valid cases are written by the reference writer from exact dyadic data (the expected values are
that data, recorded in cases.json); invalid cases copy a valid base archive and break one rule the
way a hostile or buggy writer would, keeping everything else consistent (hashes recomputed), so
that only the rule under test can refuse it.

*Runtime* cases (`runtime=True`) are not committed: they are too large, or cannot be committed
safely (symbolic links, FIFOs). Runners create them in a temporary folder with `--runtime`.

To add a case: write a function below, decorate it, run this script, commit the result. The
`rule` is the anchor of the spec section (spec/README.md) that the case breaks; `match` is a
regular expression the reference implementation's message matches (optional for others).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
CASES_DIR = HERE / "cases"
INDEX = HERE / "cases.json"

#: Informational root attributes are pinned so that regenerating gives identical documents.
PINNED = {"created": "2026-01-01T00:00:00+00:00",
          "producer": {"name": "mjarchive", "version": "conformance", "backend": "unknown"},
          "mujoco_version": "4.0.0"}

HINGE = """<mujoco model="hinge"><option timestep="0.0078125"/><worldbody>
  <body name="arm"><joint name="hinge" axis="0 0 1"/><geom size="0.1"/></body>
</worldbody></mujoco>"""
CAMERA = """<mujoco model="camera"><worldbody>
  <camera name="front" pos="0 -1 0" xyaxes="1 0 0 0 0 1"/>
  <body name="arm"><joint name="hinge" axis="0 0 1"/><geom size="0.1"/></body>
</worldbody></mujoco>"""
MOCAP_ONLY = """<mujoco model="mocap_only"><worldbody>
  <camera name="cam" pos="0 -1 0" xyaxes="1 0 0 0 0 1"/>
  <body name="target" mocap="true"><geom size="0.05" contype="0" conaffinity="0"/></body>
</worldbody></mujoco>"""
UNNAMED = """<mujoco model="unnamed"><worldbody>
  <camera pos="0 -1 0" xyaxes="1 0 0 0 0 1"/><camera name="named" pos="0 -2 0" xyaxes="1 0 0 0 0 1"/>
  <body><joint type="slide" axis="1 0 0"/><geom size="0.1"/></body>
  <body mocap="true"><geom size="0.05" contype="0" conaffinity="0"/></body>
</worldbody></mujoco>"""
UNICODE = """<mujoco model="unicode"><worldbody>
  <camera name="caméra" pos="0 -1 0" xyaxes="1 0 0 0 0 1"/>
  <body name="bras"><joint name="épaule" axis="0 0 1"/><geom size="0.1"/></body>
</worldbody></mujoco>"""

CASES: dict[str, dict[str, Any]] = {}
_WRITERS: dict[str, Callable[[Path], dict | None]] = {}


def case(name: str, *, expect: str = "invalid", error: str = "FormatError", rule: str = "root-attributes",
         match: str | None = None, schema: str | None = None, runtime: bool = False,
         note: str | None = None) -> Callable:
    """Register a case. `schema`: the verdict of the JSON Schemas alone ("valid" when only the rules
    beyond the schema catch it); defaults to `expect` for root-attribute cases."""
    def register(fn: Callable[[Path], dict | None]) -> Callable:
        entry: dict[str, Any] = {"expect": expect}
        if expect == "invalid":
            entry |= {"error": error, "rule": rule}
            if match:
                entry["match"] = match
        if schema:
            entry["schema"] = schema
        if runtime:
            entry["runtime"] = True
        if note:
            entry["note"] = note
        CASES[name] = entry
        _WRITERS[name] = fn
        return fn
    return register


# -- helpers ------------------------------------------------------------------------------------------
def _data(n_frames: int, n_worlds: int, tail: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Exact dyadic values (multiples of 1/64 below 4), deterministic."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-256, 256, size=(n_frames, n_worlds, *tail)) / 64.0).astype(dtype)


def _write(out: Path, xml: str, world_ids: list[int], n_frames: int, *, close: bool = True,
           tracks: dict | None = None, part: str | None = None, seed: int = 0, first_frame: int = 0,
           **kwargs: Any) -> dict:
    """Write an archive (with `part`: that part of a multi-part archive, joining it) with the
    reference writer; returns the expected contents (of the part). `seed` varies the values and
    `first_frame` shifts the times, so that parts differ."""
    import mjarchive

    bundle = mjarchive.ModelBundle.from_xml(xml)
    model = bundle.compile()
    W, dtype = len(world_ids), kwargs.get("dtype", "float32")
    arrays: dict[str, np.ndarray] = {
        "time": (np.arange(n_frames, dtype=np.float64) + 1 + first_frame) / 32.0,
        "qpos": _data(n_frames, W, (model.nq,), dtype, 1 + seed),
        "reset": np.zeros((n_frames, W), bool),
    }
    if n_frames:
        arrays["reset"][0] = True
        arrays["reset"][n_frames // 2, 0] = True
    if model.nmocap:
        arrays["mocap_pos"] = _data(n_frames, W, (model.nmocap, 3), dtype, 2 + seed)
        arrays["mocap_quat"] = _data(n_frames, W, (model.nmocap, 4), dtype, 3 + seed)
    for i, (name, (shape, tdtype)) in enumerate((tracks or {}).items()):
        if tdtype == "bool":
            arrays[name] = (np.arange(n_frames * W * int(np.prod(shape))) % 3 == 0).reshape(n_frames, W, *shape)
        elif tdtype.startswith(("int", "uint")):  # the extremes of the type, then small values
            info, n = np.iinfo(tdtype), n_frames * W * int(np.prod(shape))
            values = [int(info.min), int(info.max)] + [i - 3 if info.min else i for i in range(max(0, n - 2))]
            arrays[name] = np.array(values[:n], dtype=tdtype).reshape(n_frames, W, *shape)
        else:
            arrays[name] = _data(n_frames, W, shape, tdtype, 10 + i + seed)
    if part is not None:
        kwargs["part"] = part
    writer = mjarchive.create(out, bundle, world_ids=world_ids, output_fps=32.0, tracks=tracks, **kwargs)
    for f in range(n_frames):
        extra = {k: v[f] for k, v in arrays.items() if k not in ("time", "qpos")}
        writer.append(arrays["time"][f], arrays["qpos"][f], **extra)
    if close:
        writer.close()
    else:
        writer.flush()  # the writer stays open, as if it crashed: status "live"
    _patch(out, lambda a: a.update(PINNED))
    if part is not None:
        _patch(out, lambda a: a.update(PINNED), node=f"parts/{part}")
    return {"n_frames": n_frames, "world_ids": list(world_ids), "status": "finalized" if close else "live",
            "arrays": arrays}


def _root_doc(out: Path, node: str = "") -> dict:
    return json.loads((out / node / "zarr.json").read_text())


def _patch(out: Path, change: Callable[[dict], Any], *, allow_nan: bool = False, node: str = "") -> None:
    """Apply `change` to the root attribute `mjarchive` in place (the writer's own formatting); with
    `node`, to the attribute of that node (a part's document, `parts/<name>`)."""
    doc = _root_doc(out, node)
    change(doc["attributes"]["mjarchive"])
    (out / node / "zarr.json").write_text(json.dumps(doc, indent=2, allow_nan=allow_nan))


def _set(**changes: Any) -> Callable[[dict], None]:
    def change(attrs: dict) -> None:
        for dotted, value in changes.items():
            *parents, key = dotted.split("__")
            node = attrs
            for p in parents:
                node = node[p]
            node[key] = value
    return change


_BASES: dict[str, Path] = {}


def _base(kind: str, scratch: Path) -> Path:
    """A valid archive to break; written once per run."""
    if kind not in _BASES:
        out = scratch / f"base-{kind}"
        if kind == "hinge":
            _write(out, HINGE, [0, 1], 3, chunk_frames=2, tracks={"reward": ((), "float32")})
        elif kind == "camera":
            _write(out, CAMERA, [0, 1], 3, chunk_frames=2)
        elif kind == "mocap":
            _write(out, MOCAP_ONLY, [0, 1], 3, chunk_frames=2)
        elif kind == "variants":
            _write_variants(out)
        elif kind == "overlays":
            _write_overlays(out)
        elif kind == "parts":
            _parted(out, PARTS_BASE)
        _BASES[kind] = out
    return _BASES[kind]


def _broken(out: Path, kind: str = "hinge", *, allow_nan: bool = False, **changes: Any) -> None:
    shutil.copytree(_base(kind, out.parent / ".scratch"), out)
    _patch(out, _set(**changes), allow_nan=allow_nan)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _forge_bundle(out: Path, xml: str, assets: dict[str, bytes] | None = None, *, names: dict[str, str] | None = None) -> None:
    """Replace the bundle of `out` the way an attacker would: every hash recomputed and consistent
    (member hashes, bundle hash, root `model.sha256`), so that only the safety rules refuse it."""
    import zarr
    import zarr.codecs

    assets = dict(sorted((assets or {}).items()))
    root = zarr.open_group(out, mode="r+")
    del root["model"]
    group = root.create_group("model")
    entries = []
    blobs = [("xml", xml.encode())] + [(f"asset_{i:05d}", d) for i, d in enumerate(assets.values())]
    for key, data in blobs:
        arr = group.create_array(key, shape=(len(data),), chunks=(max(1, len(data)),), dtype="uint8",
                                 compressors=zarr.codecs.ZstdCodec(level=3), fill_value=0)
        if data:
            arr[:] = np.frombuffer(data, np.uint8)
    for (key, data), name in zip(blobs[1:], assets):
        entries.append({"name": (names or {}).get(name, name), "key": key, "size": len(data), "sha256": _sha(data)})
    h = hashlib.sha256(b"mjarchive-bundle-v1\0")
    h.update(_sha(blobs[0][1]).encode() + b"\0")
    for entry, (_key, data) in sorted(zip(entries, blobs[1:]), key=lambda e: e[0]["name"].encode()):
        h.update(entry["name"].encode() + b"\0" + _sha(data).encode() + b"\0")
    group.attrs.put({"mjarchive_bundle": {"sha256": h.hexdigest(),
                                          "xml": {"size": len(blobs[0][1]), "sha256": _sha(blobs[0][1])},
                                          "assets": entries}})
    _patch(out, _set(model__sha256=h.hexdigest()))


# -- valid cases ----------------------------------------------------------------------------------------
@case("valid-minimal", expect="valid")
def _(out):
    return _write(out, HINGE, [0], 3)


@case("valid-mocap-only-nq0", expect="valid", note="nq = 0: qpos has shape (F, W, 0) and chunk extent 1 there")
def _(out):
    return _write(out, MOCAP_ONLY, [4, 2], 3, chunk_frames=2)


@case("valid-live-zero-frames", expect="valid")
def _(out):
    return _write(out, HINGE, [0, 1], 0, close=False)


@case("valid-live-uncommitted-tail", expect="valid",
      note="arrays hold 3 frames and are longer still, but n_frames = 2: readers return 2 frames")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, close=False, chunk_frames=2)
    _commit_doc(out, 2)
    expected["n_frames"] = 2
    expected["arrays"] = {k: v[:2] for k, v in expected["arrays"].items()}
    return expected


# -- the commit document (1.1) ---------------------------------------------------------------------
def _commit_doc(out: Path, n_frames: Any = None, n_events: Any = None, *, record: Any = None,
                raw: bytes | None = None) -> None:
    """Write `_commit/zarr.json`: the given bytes, or a group document holding `record` (default:
    these counts, the writer's compact formatting)."""
    if raw is None:
        if record is None:
            record = {"n_frames": n_frames, "n_events": n_events or {}}
        doc = {"zarr_format": 3, "node_type": "group", "attributes": {"mjarchive_commit": record}}
        raw = json.dumps(doc, separators=(",", ":")).encode()
    (out / "_commit").mkdir(exist_ok=True)
    (out / "_commit" / "zarr.json").write_bytes(raw)


def _live(out: Path, kind: str = "hinge", **root: Any) -> None:
    """A copy of a finalized base archive made live again (as a resuming writer does), root changed,
    without the commit document finalizing kept."""
    shutil.copytree(_base(kind, out.parent / ".scratch"), out)
    shutil.rmtree(out / "_commit", ignore_errors=True)
    _patch(out, _set(status="live", **root))


@case("valid-live-commit-document", expect="valid",
      note="a live 1.1 archive: the root says n_frames = 0 (as written at creation), the commit document 3")
def _(out):
    return _write(out, HINGE, [0, 1], 3, close=False, chunk_frames=2)


@case("valid-live-root-commit-without-document", expect="valid", rule="commit-protocol",
      note="a live 1.1 archive without a commit document: the root's counts are the commit record")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    shutil.rmtree(out / "_commit")  # finalizing kept the last live commit's document
    _patch(out, _set(status="live"))
    return {**expected, "status": "live"}


def _lease_doc(out: Path, raw: bytes) -> None:
    (out / "_writer").mkdir(exist_ok=True)
    (out / "_writer" / "zarr.json").write_bytes(raw)


@case("valid-writer-lease", expect="valid", rule="writer-lease",
      note="a 1.2 archive while its writer holds the lease (object storage: an expiry time): readers ignore it")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, close=False, chunk_frames=2)
    _lease_doc(out, json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"mjarchive_writer": {
        "host": "node7", "pid": 4242, "started": "2026-01-01T00:00:00+00:00", "token": "0123456789abcdef" * 2,
        "expires": 1767225660.5}}}, separators=(",", ":")).encode())
    return expected


@case("valid-writer-lease-garbage", expect="valid", rule="writer-lease",
      note="a lease document that is not JSON (not UTF-8, unbalanced): readers never read it, so it does not matter")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    _lease_doc(out, b"\xff\xfe{{{{[[[[ not a lease " + b"[" * 64)
    return expected


@case("valid-finalized-stale-commit-document", expect="valid", rule="commit-protocol",
      note="a finalized root is the commit record: a commit document left by a crash during finalization "
           "(here a hostile one: a negative count, an unknown field) is ignored, never read")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    _commit_doc(out, -7, {"geom_rgba": 1})
    return expected


@case("valid-1.0-commit-document-ignored", expect="valid", rule="commit-protocol",
      note="a live 1.0 archive commits in its root attributes: a commit document in it is ignored")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    _patch(out, _set(status="live", format_version="1.0"))
    _commit_doc(out, 1000)
    return {**expected, "status": "live"}


@case("commit-document-duplicate-key", rule="security-requirements-for-readers", match="appears twice",
      note="n_frames twice in one object: JSON parsers disagree which one counts")
def _(out):
    _live(out)
    _commit_doc(out, raw=b'{"zarr_format":3,"node_type":"group","attributes":{"mjarchive_commit":'
                         b'{"n_frames":3,"n_frames":1,"n_events":{}}}}')


@case("commit-document-is-a-directory", rule="commit-protocol", match="directory", runtime=True,
      note="a folder where the commit document belongs: damage, not an absent document (made at test time)")
def _(out):
    _live(out)
    (out / "_commit" / "zarr.json").mkdir(parents=True)
    (out / "_commit" / "zarr.json" / "zarr.json").write_text("{}")


@case("root-document-utf16", rule="security-requirements-for-readers", match="UTF-8",
      note="the root document re-encoded as UTF-16: Python's json guesses the encoding, other readers refuse")
def _(out):
    _broken(out)
    (out / "zarr.json").write_bytes((out / "zarr.json").read_text().encode("utf-16"))


@case("transpose-order-booleans", rule="codecs", match="transpose order",
      note="order [true, 2, false]: zarr reads booleans as 1 and 0; the spec's orders are integers")
def _(out):
    _broken(out)
    _edit_doc(out / "qpos" / "zarr.json", lambda d: d["codecs"][0]["configuration"]["codecs"][0]["configuration"]
              .__setitem__("order", [True, 2, False]))


@case("bytes-big-endian", rule="codecs", match="endian",
      note="qpos declared big-endian: the spec's arrays are little-endian")
def _(out):
    _broken(out)
    _edit_doc(out / "qpos" / "zarr.json", lambda d: d["codecs"][0]["configuration"]["codecs"][1]
              .__setitem__("configuration", {"endian": "big"}))


@case("commit-document-beyond-arrays", rule="commit-protocol", match="n_frames=1000 exceeds")
def _(out):
    _live(out)
    _commit_doc(out, 1000)


@case("commit-document-below-root", rule="commit-document", match="root's n_frames",
      note="counts only grow: a commit document below the root's counts is corrupt")
def _(out):
    _live(out)
    _commit_doc(out, 2)



@case("valid-tracks-every-dtype-float64", expect="valid")
def _(out):
    tracks = {"t_float32": ((), "float32"), "t_float64": ((2,), "float64"), "t_int8": ((3,), "int8"),
              "t_int16": ((2, 2), "int16"), "t_int32": ((), "int32"), "t_int64": ((1, 1, 1, 2), "int64"),
              "t_uint8": ((4,), "uint8"), "t_bool": ((2,), "bool")}
    return _write(out, HINGE, [5, 9], 3, dtype="float64", chunk_frames=2, tracks=tracks)


@case("valid-precision-quantize", expect="valid", note="abs_error = 2**-7; the data lie on the grid of step 2**-6")
def _(out):
    return _write(out, HINGE, [0, 1], 3, precision=2.0**-7)


@case("valid-unnamed-joint-mocap-camera", expect="valid")
def _(out):
    return _write(out, UNNAMED, [0], 2)


@case("valid-unicode-names", expect="valid")
def _(out):
    return _write(out, UNICODE, [0], 2)


@case("valid-world-ids-int64-max", expect="valid")
def _(out):
    return _write(out, HINGE, [0, 2**63 - 1], 2, shard_worlds=1)


def _rewrite_qpos(out: Path, values: np.ndarray, *, transpose: bool) -> None:
    """Store `qpos` again with the 1.0 writers' chain (bytes + blosc zstd 3 bitshuffle) or 1.1's."""
    import zarr
    import zarr.codecs

    meta = json.loads((out / "qpos" / "zarr.json").read_text())
    shards = meta["chunk_grid"]["configuration"]["chunk_shape"]
    inner = meta["codecs"][0]["configuration"]["chunk_shape"]
    blosc = zarr.codecs.BloscCodec(cname="zstd", clevel=3 if not transpose else 2, typesize=values.dtype.itemsize,
                                   shuffle="shuffle" if transpose else "bitshuffle")
    filters = [zarr.codecs.TransposeCodec(order=(1, 2, 0))] if transpose else []
    shutil.rmtree(out / "qpos")
    zarr.open_group(out, mode="r+").create_array(
        "qpos", shape=values.shape, chunks=tuple(inner), shards=tuple(shards), dtype=values.dtype,
        filters=filters, compressors=blosc, fill_value=0.0, dimension_names=meta["dimension_names"])[...] = values


@case("valid-1.0-codec-chain", expect="valid", rule="codecs",
      note="a 1.1 archive whose qpos uses the 1.0 writers' chain (no transpose, bitshuffle): codecs come from "
           "each array's metadata, never from format_version")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    _rewrite_qpos(out, expected["arrays"]["qpos"], transpose=False)
    return expected


@case("transpose-order-not-a-permutation", rule="codecs", match="transpose order",
      note="transpose order [0, 0, 1] names axis 0 twice (qpos chunks removed: refused from its metadata alone)")
def _(out):
    _broken(out)
    shutil.rmtree(out / "qpos" / "c")  # undecodable either way; their bytes differ between numcodecs versions
    _edit_doc(out / "qpos" / "zarr.json", lambda d: d["codecs"][0]["configuration"]["codecs"][0]["configuration"]
              .__setitem__("order", [0, 0, 1]))


@case("valid-newer-minor-version", expect="valid", rule="versioning-and-stability-policy",
      note="format 1.9 with unknown top-level keys, producer keys and arrays: readers ignore them")
def _(out):
    import zarr

    expected = _write(out, HINGE, [0], 2)
    _patch(out, _set(format_version="1.9", future_key={"a": [1, 2]},
                     producer={**PINNED["producer"], "host": "example"}))
    zarr.open_group(out, mode="r+").create_array("future_array", shape=(2,), dtype="float32", fill_value=0.0)
    return expected


# -- invalid root attributes ----------------------------------------------------------------------------
for _name, _changes, _match, _schema in [
    ("format-misspelled", {"format": "mjarchiv"}, "not an mjarchive archive", None),
    ("version-trailing-newline", {"format_version": "1.0\n"}, "format_version", None),
    ("version-unicode-digits", {"format_version": "\u0661.\u0660"}, "format_version", None),
    ("version-five-digits", {"format_version": "1.00000"}, "format_version", None),
    ("version-leading-zero-major", {"format_version": "01.1"}, "format_version", None),
    ("version-leading-zero-minor", {"format_version": "1.00"}, "format_version", None),
    ("version-number", {"format_version": 1.0}, "format_version", None),
    ("world-ids-duplicate", {"world_ids": [0, 0]}, "duplicates", None),
    ("world-ids-negative", {"world_ids": [-1, 1]}, "world_ids", None),
    ("world-ids-beyond-int64", {"world_ids": [0, 2**63]}, "world_ids", None),
    ("world-ids-float", {"world_ids": [0, 1.0]}, "world_ids", "valid"),
    ("world-ids-empty", {"world_ids": []}, "world_ids", None),
    ("n-frames-float", {"n_frames": 3.0}, "n_frames", "valid"),
    ("n-frames-2-pow-50", {"n_frames": 2**50}, "n_frames", None),
    ("n-frames-bool", {"n_frames": True}, "n_frames", None),
    ("n-frames-string", {"n_frames": "3"}, "n_frames", None),
    ("n-frames-negative", {"n_frames": -1}, "n_frames", None),
    ("abs-error-not-power-of-two", {"storage__precision": {"mode": "quantize", "abs_error": 0.001}}, "abs_error", None),
    ("abs-error-bool", {"storage__precision": {"mode": "quantize", "abs_error": True}}, "abs_error", None),
    ("abs-error-tiny-power", {"storage__precision": {"mode": "quantize", "abs_error": 2.0**-70}}, "abs_error", None),
    ("precision-mode-unknown", {"storage__precision": {"mode": "round", "abs_error": 0.5}}, "mode", None),
    ("track-named-qpos", {"tracks": {"qpos": {"shape": [1], "dtype": "float32"}}}, "track name", None),
    ("track-name-trailing-newline", {"tracks": {"reward\n": {"shape": [], "dtype": "float32"}}}, "track name", None),
    ("track-name-uppercase", {"tracks": {"Reward": {"shape": [], "dtype": "float32"}}}, "track name", None),
    ("track-dtype-complex", {"tracks": {"reward": {"shape": [], "dtype": "complex64"}}}, "dtype", None),
    ("track-shape-zero", {"tracks": {"reward": {"shape": [0], "dtype": "float32"}}}, "shape", None),
    ("track-shape-too-many-elements", {"tracks": {"reward": {"shape": [256, 257], "dtype": "float32"}}}, "elements", "valid"),
    ("track-shape-float", {"tracks": {"reward": {"shape": [1.0], "dtype": "float32"}}}, "shape", "valid"),
    ("status-garbage", {"status": "done"}, "status", None),
    ("chunk-worlds-2", {"storage__chunk_worlds": 2}, "chunk_worlds", None),
    ("chunk-worlds-float", {"storage__chunk_worlds": 1.0}, "chunk_worlds", "valid"),
    ("chunk-frames-float", {"storage__chunk_frames": 2.0}, "chunk_frames", "valid"),
    ("chunk-frames-bool", {"storage__chunk_frames": True}, "chunk_frames", None),
    ("chunk-frames-zero", {"storage__chunk_frames": 0}, "chunk_frames", None),
    ("chunk-frames-too-large", {"storage__chunk_frames": 2**17}, "chunk_frames", None),
    ("shard-worlds-beyond-world-count", {"storage__shard_worlds": 3}, "shard_worlds", "valid"),
    ("storage-dtype-float16", {"storage__dtype": "float16"}, "dtype", None),
    ("storage-unknown-key", {"storage__compression": "zstd"}, "unknown key", None),
    ("output-fps-huge", {"output_fps": 1e300}, "output_fps", None),
    ("output-fps-nan-string", {"output_fps": "NaN"}, "output_fps", None),
    ("timestep-infinity-string", {"timestep": "Infinity"}, "timestep", None),
    ("timestep-zero", {"timestep": 0}, "timestep", None),
    ("timestep-denormal", {"timestep": 5e-324}, "timestep", None),
    ("playback-speed-negative", {"playback_speed": -1.0}, "playback_speed", None),
    ("playback-speed-bool", {"playback_speed": True}, "playback_speed", None),
    ("sha256-uppercase", {"model__sha256": "A" * 64}, "sha256", None),
    ("sha256-trailing-newline", {"model__sha256": "a" * 64 + "\n"}, "sha256", None),
    ("layout-unknown-key", {"model__layout__ntendon": 0}, "unknown key", None),
    ("layout-qpos-address-gap", {"model__layout__joints": [["hinge", "hinge", 1]], "model__layout__nq": 2}, "qpos address", "valid"),
    ("layout-nq-disagrees-with-joints", {"model__layout__nq": 2}, "nq", "valid"),
    ("layout-mocap-count", {"model__layout__nmocap": 1}, "mocap_bodies", "valid"),
    ("joint-name-nul", {"model__layout__joints": [["hin\u0000ge", "hinge", 0]]}, "joints", None),
    ("joint-type-unknown", {"model__layout__joints": [["hinge", "spherical", 0]]}, "joint type", None),
    ("joint-name-too-long", {"model__layout__joints": [["j" * 1025, "hinge", 0]]}, "joints", None),
    ("created-too-long", {"created": "2" * 65}, "created", None),
    ("created-carriage-return", {"created": "2026-01-01\r"}, "created", None),
    ("producer-name-newline", {"producer": {"name": "mjarchive\n", "version": "1", "backend": "x"}}, "producer", None),
    ("producer-bidi-override", {"producer": {"name": "mj\u202earchive", "version": "1", "backend": "x"}}, "producer", None),
    ("mujoco-version-object", {"mujoco_version": {"major": 4}}, "mujoco_version", None),
]:
    def _writer(out, changes=_changes):
        _broken(out, **changes)
    case(_name, match=_match, schema=_schema,
         rule="rules-beyond-the-schema" if _schema == "valid" else "root-attributes")(_writer)


@case("version-newer-major", error="FormatVersionError", rule="versioning-and-stability-policy", match="newer")
def _(out):
    _broken(out, format_version="2.0", storage={"a 2.0 layout": True})


@case("version-older-major", error="FormatVersionError", rule="versioning-and-stability-policy", match="predates")
def _(out):
    _broken(out, format_version="0.9")


@case("missing-status", match="status")
def _(out):
    _broken(out)
    _patch(out, lambda a: a.pop("status"))


@case("output-fps-nan-literal", match="output_fps", schema="valid", rule="conventions",
      note="NaN is not JSON, but Python's json module (and so zarr-python) parses it; NaN passes minimum/maximum")
def _(out):
    _broken(out, allow_nan=True, output_fps=float("nan"))


@case("timestep-infinity-literal", match="timestep", schema="invalid", rule="conventions",
      note="Infinity is not JSON, but Python's json module parses it")
def _(out):
    _broken(out, allow_nan=True, timestep=float("inf"))


@case("cameras-mismatch", match="cameras", schema="valid", rule="rules-beyond-the-schema")
def _(out):
    _broken(out, "camera", cameras=[])


@case("cameras-reordered", match="cameras", schema="valid", rule="rules-beyond-the-schema")
def _(out):
    _broken(out, "camera", cameras=["front", "front2"], model__layout__cameras=["front2", "front"])


@case("camera-name-trailing-newline", match="cameras")
def _(out):
    _broken(out, "camera", cameras=["front\n"], model__layout__cameras=["front\n"])


@case("camera-names-duplicate", match="repeats a name", schema="valid", rule="rules-beyond-the-schema")
def _(out):
    _broken(out, "camera", cameras=["front", "front"], model__layout__cameras=["front", "front"])


@case("mocap-body-name-lone-surrogate", match="mocap_bodies", schema="valid", rule="rules-beyond-the-schema",
      note="a lone surrogate is not a Unicode scalar value; the schema cannot portably say so")
def _(out):
    _broken(out, "mocap", model__layout__mocap_bodies=["\ud800"])


@case("tracks-too-many", match="tracks", runtime=True, note="257 tracks: 28 kB of JSON, made at test time")
def _(out):
    _broken(out, tracks={f"t{i}": {"shape": [], "dtype": "float32"} for i in range(257)})


@case("world-ids-too-many", match="world_ids", runtime=True, note="2**20 + 1 world IDs: 8 MB, made at test time")
def _(out):
    _broken(out, world_ids=list(range(2**20 + 1)))


# -- invalid metadata placement (item 9 of the security requirements) ------------------------------------
def _edit_doc(path: Path, change: Callable[[dict], Any]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


@case("consolidated-metadata-in-bundle", rule="security-requirements-for-readers", match="consolidated",
      note="the bundle group serves its members' metadata from a copy, so their own documents are never read")
def _(out):
    _broken(out)
    xml_doc = json.loads((out / "model" / "xml" / "zarr.json").read_text())
    _edit_doc(out / "model" / "zarr.json", lambda d: d.__setitem__(
        "consolidated_metadata", {"kind": "inline", "must_understand": False, "metadata": {"xml": xml_doc}}))


@case("chunk-key-encoding-v2", rule="security-requirements-for-readers", match="chunk_key_encoding",
      note="chunks stored under v2 keys (time/0): objects that are no default-encoded chunk of a checked array")
def _(out):
    _broken(out)
    _edit_doc(out / "time" / "zarr.json", lambda d: d.__setitem__(
        "chunk_key_encoding", {"name": "v2", "configuration": {"separator": "."}}))
    for chunk in sorted((out / "time" / "c").iterdir()):
        chunk.rename(out / "time" / chunk.name)
    (out / "time" / "c").rmdir()


@case("valid-consolidated-metadata-null", expect="valid", rule="layout",
      note='"consolidated_metadata": null (what zarr-python 3.0 writes for every group) means absent')
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    for group in ("zarr.json", "model/zarr.json", "_commit/zarr.json"):
        _edit_doc(out / group, lambda d: d.__setitem__("consolidated_metadata", None))
    return expected


@case("consolidated-metadata-empty-in-root", rule="security-requirements-for-readers", match="consolidated",
      note="consolidated metadata listing no node is refused too: only null means absent")
def _(out):
    _broken(out)
    _edit_doc(out / "zarr.json", lambda d: d.__setitem__(
        "consolidated_metadata", {"kind": "inline", "must_understand": False, "metadata": {}}))


#: What a reader that read it would refuse: a blosc header claiming 2**31 decoded bytes, truncated.
_NOT_A_CHUNK = bytes([2, 1, 0x91, 4]) + (2**31).to_bytes(4, "little") + b"garbage, not a chunk\n"


@case("valid-chunks-outside-shape", expect="valid", rule="security-requirements-for-readers",
      note="objects at chunk keys outside the arrays' shapes (as a writer that shrank an array in its metadata "
           "only, or crashed while trimming, leaves them) hold garbage: readers never read them")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2, tracks={"reward": ((), "float32")})
    for key in ("time/c/2", "time/c/9", "qpos/c/2/0/0", "qpos/c/0/1/0", "reset/c/7/0", "reward/c/2/0",
                "world_id/c/1", "model/xml/c/1"):
        (out / key).parent.mkdir(parents=True, exist_ok=True)
        (out / key).write_bytes(_NOT_A_CHUNK)
    return expected


@case("valid-writer-temporaries-and-other-keys", expect="valid", rule="security-requirements-for-readers",
      note="a writer's temporary files (<key>.<32 hex>.partial, here hostile), a node at another key whose "
           "group document a reader would refuse, and a stray file: readers never list the store nor read them")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    tmp = ".0123456789abcdef0123456789abcdef.partial"
    hostile_root = _root_doc(out)
    hostile_root["attributes"]["mjarchive"].update(status="live", n_frames=1000, format_version="9.0")
    (out / f"zarr.json{tmp}").write_text(json.dumps(hostile_root))
    (out / f"_commit/zarr.json{tmp}").write_text('{"zarr_format":3,"node_type":"group","attributes":'
                                                 '{"mjarchive_commit":{"n_frames":1000,"n_events":{}}}}')
    (out / f"qpos/c/0/0/0{tmp}").write_bytes(_NOT_A_CHUNK)
    (out / "cache").mkdir()
    (out / "cache" / "zarr.json").write_text(json.dumps(
        {"zarr_format": 3, "node_type": "group", "attributes": {},
         "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}}}))
    (out / "cache" / "frames.bin").write_bytes(_NOT_A_CHUNK)
    (out / "notes.txt").write_text("a file no one wrote through zarr\n")
    return expected


@case("valid-finalized-without-commit-document", expect="valid", rule="commit-protocol",
      note="a finalized 1.1 archive without _commit/ (e.g. copied by a tool that left it out): the root is the record")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    shutil.rmtree(out / "_commit")
    return expected


def _zstd_frame_without_content_size(raw: bytes) -> bytes:
    """`raw` as a valid zstd frame whose header does not declare its content size (one raw block)."""
    header = (0xFD2FB528).to_bytes(4, "little") + bytes([0x00, 0x00])  # no content size; 1 KiB window
    return header + ((len(raw) << 3) | 1).to_bytes(3, "little") + raw  # the last block, stored raw


@case("zstd-frame-without-content-size", rule="security-considerations", match="declares no decoded bytes",
      note="time's first chunk as a valid zstd frame that does not declare its content size: numcodecs would "
           "decompress such frames without bound, so readers refuse them before decompressing")
def _(out):
    _broken(out)
    chunk = out / "time" / "c" / "0"
    chunk.write_bytes(_zstd_frame_without_content_size(np.array([1 / 32, 2 / 32], "<f8").tobytes()))


@case("zstd-chunk-second-frame", rule="security-considerations", match="a chunk is one frame",
      note="time's first chunk as its valid zstd frame followed by a second frame that declares no size, of RLE "
           "blocks (4 bytes each inflating to 128 KiB): decoders such as numcodecs' decompress it after the first, "
           "without bound, so readers refuse any byte after the first frame")
def _(out):
    header = (0xFD2FB528).to_bytes(4, "little") + bytes([0x00, (17 - 10) << 3])  # no content size; 128 KiB window
    runs = b"".join((((128 << 10) << 3 | 1 << 1 | (i == 15)).to_bytes(3, "little") + b"\x00") for i in range(16))
    _time_frame_then(out, header + runs)


@case("zstd-chunk-trailing-skippable-frame", rule="security-considerations", match="a chunk is one frame",
      note="time's first chunk as its valid zstd frame followed by an empty skippable frame: a decode bounded to "
           "the chunk's size passes it (it writes nothing), so readers find the first frame's end from its blocks")
def _(out):
    _time_frame_then(out, (0x184D2A50).to_bytes(4, "little") + bytes(4))


def _time_frame_then(out: Path, after: bytes) -> None:
    """The broken archive with time's first chunk as its own zstd frame followed by `after`."""
    import numcodecs
    _broken(out)
    first = numcodecs.Zstd(level=3).encode(np.array([1 / 32, 2 / 32], "<f8").tobytes())
    (out / "time" / "c" / "0").write_bytes(first + after)


def _rewrite_blosc(out: Path, key: str, values: np.ndarray, cname: str) -> None:
    """Store array `key` again with blosc `cname` (same shapes, transpose and shuffle as before)."""
    import zarr
    import zarr.codecs

    meta = json.loads((out / key / "zarr.json").read_text())
    inner_conf = meta["codecs"][0]["configuration"]
    blosc = next(c for c in inner_conf["codecs"] if c["name"] == "blosc")["configuration"]
    filters = [zarr.codecs.TransposeCodec(order=tuple(c["configuration"]["order"]))
               for c in inner_conf["codecs"] if c["name"] == "transpose"]
    shutil.rmtree(out / key)
    zarr.open_group(out, mode="r+").create_array(
        key, shape=values.shape, chunks=tuple(inner_conf["chunk_shape"]),
        shards=tuple(meta["chunk_grid"]["configuration"]["chunk_shape"]), dtype=values.dtype, filters=filters,
        compressors=zarr.codecs.BloscCodec(cname=cname, clevel=5, typesize=blosc["typesize"], shuffle=blosc["shuffle"]),
        fill_value=0, dimension_names=meta["dimension_names"], config={"write_empty_chunks": True})[...] = values


@case("valid-blosc-cnames", expect="valid", rule="codecs",
      note="qpos, reset and a track compressed by blosc with lz4, blosclz and zlib: every listed cname is read")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2, tracks={"reward": ((2, 8), "float32")})
    for key, cname in (("qpos", "lz4"), ("reset", "blosclz"), ("reward", "zlib")):
        _rewrite_blosc(out, key, expected["arrays"][key], cname)
    return expected


@case("blosc-cname-snappy", rule="codecs", match="cname",
      note="zarr-python accepts the cname snappy, which numcodecs cannot decode; the spec does not list it "
           "(the chunks themselves are zstd: refused from the metadata alone)")
def _(out):
    _broken(out)
    _edit_doc(out / "qpos" / "zarr.json", lambda d: d["codecs"][0]["configuration"]["codecs"][-1]["configuration"]
              .__setitem__("cname", "snappy"))


@case("blosc-chunk-compressor-snappy", rule="codecs", match="compressor code",
      note="a blosc chunk stored uncompressed whose header names snappy (code 2): c-blosc would copy it out, "
           "but the header names a compressor the spec does not allow")
def _(out):
    _broken(out)
    chunk = out / "qpos" / "c" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())  # a shard: its first inner chunk starts at offset 0
    data[2] = (data[2] & 0x1F) | (2 << 5)
    chunk.write_bytes(bytes(data))


# -- invalid bundles (hashes consistent; only the safety rules refuse them) ------------------------------
_ENTITY = '<!DOCTYPE mujoco [<!ENTITY name "arm">]>\n' + HINGE.replace('name="arm"', 'name="&name;"')


@case("bundle-xml-doctype-entity", error="UnsafeBundleError", rule="security-considerations", match="DOCTYPE|entit",
      note="internal entities expand differently in MuJoCo's parser and in a checker's; refuse DOCTYPE")
def _(out):
    _broken(out)
    _forge_bundle(out, _ENTITY)


@case("bundle-xml-processing-instruction", error="UnsafeBundleError", rule="security-considerations",
      match="processing instruction")
def _(out):
    _broken(out)
    _forge_bundle(out, '<?xml-stylesheet href="http://example.invalid/x.xsl"?>\n' + HINGE)


@case("bundle-xml-control-character", error="UnsafeBundleError", rule="security-considerations",
      match="control character", note="U+000C (form feed) in a comment: XML 1.0 forbids it, parsers differ")
def _(out):
    _broken(out)
    _forge_bundle(out, HINGE.replace("<worldbody>", "<!-- page\x0cbreak --><worldbody>"))


@case("bundle-xml-character-reference", error="UnsafeBundleError", rule="security-considerations",
      match="character reference", note="&#97; spells 'a': character references could spell refused characters")
def _(out):
    _broken(out)
    _forge_bundle(out, HINGE.replace('name="arm"', 'name="&#97;rm"'))


@case("valid-bundle-xml-tab-crlf-c1", expect="valid", rule="security-considerations",
      note="TAB, CR LF line ends and a C1 control (U+0085) in a comment: XML 1.0 allows them, and so do readers")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    _forge_bundle(out, HINGE.replace("\n", "\r\n").replace("<worldbody>", "<!--\ttab, NEL \x85 --><worldbody>"))
    return expected


@case("bundle-asset-name-trailing-newline", error="UnsafeBundleError", rule="asset-names", match="asset name")
def _(out):
    _broken(out)
    _forge_bundle(out, HINGE, {"tet.obj\n": b"v 0 0 0\nv 1 0 0\nv 0 1 0\nv 0 0 1\nf 1 2 3\nf 1 2 4\nf 1 3 4\nf 2 3 4\n"})


@case("bundle-submodel-references-outside", error="UnsafeBundleError", rule="security-considerations",
      match="outside\\.stl|not a bundle member|sub\\.xml",
      note="<model file=...> makes MuJoCo parse a member as XML: its file references must be checked too")
def _(out):
    _broken(out)
    sub = ('<mujoco model="sub"><asset><mesh name="m" file="/nonexistent/outside.stl"/></asset><worldbody>'
           '<body name="b"><geom type="mesh" mesh="m"/></body></worldbody></mujoco>')
    xml = HINGE.replace("<worldbody>", '<asset><model name="sub" file="sub.xml"/></asset><worldbody>')
    xml = xml.replace('<geom size="0.1"/>', '<geom size="0.1"/><attach model="sub" body="b" prefix="s_"/>')
    _forge_bundle(out, xml, {"sub.xml": sub.encode()})


# -- format 1.1: variants and overlays -------------------------------------------------------------------
VARIANTS = """<mujoco model="variants"><option timestep="0.0078125"/><worldbody>
  <body name="arm"><joint name="hinge" axis="0 0 1"/><geom name="ball" size="0.1"/>
  <geom name="box" type="box" size="0.1 0.1 0.1" pos="0.25 0 0"/></body>
</worldbody></mujoco>"""


def _write_variants(out: Path, world_ids: tuple[int, int] = (4, 9), part: str | None = None) -> dict:
    """2 worlds × 5 frames: geom_rgba set for both at frame 0, world 1 changes at frame 3 (its
    reset); geom_size of world 0 at frame 2. Exact dyadic values. With `part`, that part of a
    multi-part archive."""
    import mjarchive

    w0, w1 = world_ids
    writer = mjarchive.create(out, mjarchive.ModelBundle.from_xml(VARIANTS), world_ids=list(world_ids),
                              output_fps=32.0, chunk_frames=2, variant_fields=("geom_rgba", "geom_size"),
                              **({"part": part} if part else {}))
    rgba = np.array([[[1, 0, 0, 1], [0, 0.5, 0, 1]], [[0, 0, 1, 1], [0.25, 0.25, 0.25, 1]],
                     [[0.75, 0.125, 0, 1], [0, 0, 0, 0.5]]], np.float32)
    size = np.array([[0.0625, 0, 0], [0.125, 0.0625, 0.03125]])
    events = {"geom_rgba": ([0, 0, 3], [0, 1, 1], rgba), "geom_size": ([2], [0], size[None])}
    qpos = _data(5, 2, (1,), "float32", 1)
    reset = np.zeros((5, 2), bool)
    reset[0] = reset[3, 1] = True
    writer.set_variant([w0, w1], frame=0, geom_rgba=rgba[:2])
    writer.set_variant(w0, frame=2, geom_size=size)
    writer.set_variant(w1, frame=3, geom_rgba=rgba[2])
    for f in range(5):
        writer.append((f + 1) / 32.0, qpos[f], reset=reset[f])
    writer.close()
    _patch(out, lambda a: a.update(PINNED))
    if part:
        _patch(out, lambda a: a.update(PINNED), node=f"parts/{part}")
    arrays = {"time": (np.arange(5) + 1) / 32.0, "qpos": qpos, "reset": reset}
    for field, (frames, worlds, values) in events.items():
        arrays |= {f"variants/{field}/frame": np.array(frames, np.int64),
                   f"variants/{field}/world": np.array(worlds, np.int32),
                   f"variants/{field}/value": values.astype("float32" if field == "geom_rgba" else "float64")}
    return {"n_frames": 5, "world_ids": list(world_ids), "status": "finalized", "arrays": arrays}


def _write_overlays(out: Path) -> dict:
    """2 worlds × 3 frames of points (variable counts), arrows and labels (anchored and not)."""
    import mjarchive

    Overlay = mjarchive.Overlay
    writer = mjarchive.create(out, mjarchive.ModelBundle.from_xml(HINGE), world_ids=[0, 1], output_fps=32.0,
                              chunk_frames=2, overlays={"target": Overlay.points(radius=0.03125, max_count=2),
                                                        "command": Overlay.arrows(width=0.015625, max_count=1),
                                                        "label": Overlay.text(max_count=2, max_chars=8)})
    qpos = _data(3, 2, (1,), "float32", 1)
    reset = np.zeros((3, 2), bool)
    reset[0] = True
    points = _data(3, 2, (2, 3), "float32", 5)
    counts = np.array([[2, 0], [1, 2], [0, 0]], np.int32)
    arrows = _data(3, 2, (1, 6), "float32", 6)
    labels = [[["é"], [((0.5, 0.25, 1.0), "x=1")]], [[], ["a", "b"]], [["frame 2"], []]]
    for f in range(3):
        writer.append((f + 1) / 32.0, qpos[f], reset=reset[f], overlays={
            "target": [points[f, w, :counts[f, w]] for w in range(2)], "command": arrows[f], "label": labels[f]})
    writer.close()
    _patch(out, lambda a: a.update(PINNED))
    data = np.zeros((3, 2, 2, 3), np.float32)
    for f in range(3):
        for w in range(2):
            data[f, w, :counts[f, w]] = points[f, w, :counts[f, w]]
    text = np.zeros((3, 2, 2, 8), np.uint8)
    anchors = np.zeros((3, 2, 2, 3), np.float32)
    for f in range(3):
        for w in range(2):
            for i, label in enumerate(labels[f][w]):
                pos, label = (None, label) if isinstance(label, str) else label
                raw = label.encode()
                text[f, w, i, :len(raw)] = np.frombuffer(raw, np.uint8)
                anchors[f, w, i] = np.nan if pos is None else pos
    label_counts = np.array([[len(x) for x in row] for row in labels], np.int32)
    arrays = {"time": (np.arange(3) + 1) / 32.0, "qpos": qpos, "reset": reset,
              "overlays/target/count": counts, "overlays/target/data": data,
              "overlays/command/count": np.ones((3, 2), np.int32), "overlays/command/data": arrows,
              "overlays/label/count": label_counts, "overlays/label/data": anchors, "overlays/label/text": text}
    return {"n_frames": 3, "world_ids": [0, 1], "status": "finalized", "arrays": arrays}


@case("valid-variants", expect="valid", note="format 1.1: geom_rgba and geom_size events; world 9 changes at frame 3")
def _(out):
    return _write_variants(out)


@case("valid-overlays", expect="valid",
      note="format 1.1: points with variable counts, arrows, labels; NaN anchors mean the world's first body")
def _(out):
    return _write_overlays(out)


@case("valid-1.0-track-named-like-a-feature", expect="valid", rule="rules-beyond-the-schema",
      note="a 1.0 archive may have a track named 'variants': the name is reserved only where the feature is used")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2, tracks={"xvariants": ((), "float32")})
    (out / "xvariants").rename(out / "variants")
    _patch(out, lambda a: a.update(tracks={"variants": a["tracks"]["xvariants"]}))
    expected["arrays"]["variants"] = expected["arrays"].pop("xvariants")
    return expected


def _copy_of(out: Path, kind: str, change: Callable[[dict], Any] | None = None) -> None:
    """A copy of the valid 1.1 base archive `kind` ("variants" or "overlays"), root attributes changed."""
    shutil.copytree(_base(kind, out.parent / ".scratch"), out)
    if change is not None:
        _patch(out, change)


def _set_item(out: Path, key: str, index: Any, value: Any) -> None:
    import zarr

    zarr.open_group(out, mode="r+")[key][index] = value


@case("required-feature-unknown", error="FormatVersionError", rule="required-features", match="teleport",
      schema="valid", note="an archive that needs a feature this reader lacks is refused, not read without it")
def _(out):
    _copy_of(out, "variants", lambda a: a["required_features"].append("teleport"))


@case("required-feature-unknown-newer-minor", error="FormatVersionError", rule="required-features", match="upgrade",
      schema="valid", note="format 1.9 is readable, but not when it requires a feature this reader lacks")
def _(out):
    _broken(out, format_version="1.9", required_features=["holograms"])


@case("required-features-missing", rule="rules-beyond-the-schema", match="required_features", schema="valid",
      note="variants present, but not declared as required: a 1.0 reader would render the worlds wrongly")
def _(out):
    _copy_of(out, "variants", lambda a: a.pop("required_features"))


@case("required-features-in-format-1.0", rule="rules-beyond-the-schema", match="1\\.1", schema="valid")
def _(out):
    _copy_of(out, "variants", lambda a: a.update(format_version="1.0"))


@case("variant-field-not-allowed", rule="root-attributes", match="allowed",
      note="body_mass changes no pixel; only the allowed fields may vary")
def _(out):
    _copy_of(out, "variants", lambda a: a["variants"].update(body_mass=a["variants"].pop("geom_size")))


@case("variant-shape-differs-from-model", error="LayoutMismatchError", rule="events", match="geom_size",
      schema="valid", note="3 geoms declared, the model has 2")
def _(out):
    import zarr

    _copy_of(out, "variants", lambda a: a["variants"]["geom_size"].update(shape=[3, 3]))
    root = zarr.open_group(out, mode="r+")
    rows = root["variants/geom_size/value"][:]
    del root["variants/geom_size/value"]
    import zarr.codecs

    arr = root.create_array("variants/geom_size/value", shape=(1, 3, 3), chunks=(4096, 3, 3), dtype="float64",
                            dimension_names=("event", "geom_size_0", "geom_size_1"), fill_value=0,
                            compressors=zarr.codecs.ZstdCodec(level=3))
    arr[0, :2] = rows[0]


@case("variant-n-events-beyond-array", rule="commit", match="events", schema="valid")
def _(out):
    _copy_of(out, "variants", lambda a: a["variants"]["geom_rgba"].update(n_events=4))


@case("variant-event-frames-decreasing", rule="events", match="nondecreasing", schema="valid")
def _(out):
    _copy_of(out, "variants")
    _set_item(out, "variants/geom_rgba/frame", 1, 4)


@case("variant-event-frame-uncommitted", rule="events", match="committed", schema="valid")
def _(out):
    _copy_of(out, "variants")
    _set_item(out, "variants/geom_rgba/frame", 2, 5)


@case("variant-event-world-out-of-range", rule="events", match="world", schema="valid")
def _(out):
    _copy_of(out, "variants")
    _set_item(out, "variants/geom_rgba/world", 2, 2)


@case("variant-event-frames-wrap-around", rule="events", match="nondecreasing", schema="valid",
      note="frames 0, 2**63 - 1, -2**63, -1, 2: each difference is >= 0 once int64 subtraction wraps around "
           "(np.diff), yet -2**63 and 2**63 - 1 are no committed frames; compare neighbours, never subtract")
def _(out):
    _copy_of(out, "variants", lambda a: a["variants"]["geom_rgba"].update(n_events=5))
    import zarr

    root = zarr.open_group(out, mode="r+")
    for key, rows in (("frame", [0, 2**63 - 1, -2**63, -1, 2]), ("world", [0, 1, 0, 1, 1])):
        root[f"variants/geom_rgba/{key}"].resize((5,))
        root[f"variants/geom_rgba/{key}"][:] = np.array(rows)
    root["variants/geom_rgba/value"].resize((5, 2, 4))
    root["variants/geom_rgba/value"][:] = np.full((5, 2, 4), 0.5, np.float32)


@case("valid-variants-uncommitted-event-rows", expect="valid",
      note="event arrays 65 chunks longer than n_events, as a writer leaves them that stored one commit's many "
           "events and stopped before the commit: rows past n_events are no damage")
def _(out):
    expected = _write_variants(out)
    for field in ("geom_rgba", "geom_size"):
        for column in ("frame", "world", "value"):
            _edit_doc(out / "variants" / field / column / "zarr.json",
                      lambda d: d.update(shape=[d["shape"][0] + 4096 * 65, *d["shape"][1:]]))
    return expected


@case("variants-null", rule="root-attributes", match="variants",
      note="`variants` is an object when present; null is not 'absent'")
def _(out):
    _copy_of(out, "variants", lambda a: a.update(variants=None, required_features=[]))


@case("variant-value-colour-out-of-range", rule="allowed-fields", match="\\[0, 1\\]", schema="valid")
def _(out):
    _copy_of(out, "variants")
    _set_item(out, "variants/geom_rgba/value", 1, np.full((2, 4), 2.0, np.float32))


@case("variant-value-not-finite", rule="allowed-fields", match="finite", schema="valid")
def _(out):
    _copy_of(out, "variants")
    _set_item(out, "variants/geom_size/value", 0, np.full((2, 3), np.nan))


@case("overlay-count-above-max", rule="overlays", match="count", schema="valid")
def _(out):
    _copy_of(out, "overlays")
    _set_item(out, "overlays/target/count", (1, 0), 3)


@case("overlay-coordinate-not-finite", rule="overlays", match="finite", schema="valid")
def _(out):
    _copy_of(out, "overlays")
    _set_item(out, "overlays/command/data", (0, 1, 0, 2), np.inf)


@case("overlay-label-not-utf8", rule="overlays", match="UTF-8", schema="valid")
def _(out):
    _copy_of(out, "overlays")
    _set_item(out, "overlays/label/text", (2, 0, 0, slice(0, 2)), np.array([0xC3, 0x28], np.uint8))


@case("overlay-label-control-character", rule="overlays", match="control", schema="valid",
      note="an escape sequence in a label would reach terminals and logs")
def _(out):
    _copy_of(out, "overlays")
    _set_item(out, "overlays/label/text", (1, 1, 0, 1), 0x1B)


@case("overlay-text-too-large", rule="rules-beyond-the-schema", match="max_bytes", schema="valid",
      note="max_count × max_bytes = 4096 × 1024: each in range, the product above 65536 per frame and world")
def _(out):
    _copy_of(out, "overlays", lambda a: a["overlays"]["label"].update(max_count=4096, max_bytes=1024))


@case("overlay-kind-unknown", rule="root-attributes", match="kind")
def _(out):
    _copy_of(out, "overlays", lambda a: a["overlays"]["target"].update(kind="mesh"))


@case("overlay-name-is-a-path", rule="root-attributes", match="name")
def _(out):
    _copy_of(out, "overlays", lambda a: a["overlays"].update({"../target": a["overlays"].pop("target")}))


@case("overlay-kind-not-a-string", rule="root-attributes", match="kind",
      note="a JSON array as kind: a reader that looks it up in a table of kinds must not fail on an unhashable key")
def _(out):
    _copy_of(out, "overlays", lambda a: a["overlays"]["target"].update(kind=["points"]))


for _name, _record in {
    "commit-document-count-not-integer": {"n_frames": 3.0, "n_events": {}},
    "commit-document-count-is-bool": {"n_frames": True, "n_events": {}},
    "commit-document-count-is-string": {"n_frames": "3", "n_events": {}},
    "commit-document-unknown-key": {"n_frames": 3, "n_events": {}, "n_overlays": 1},
    "commit-document-missing-events": {"n_frames": 3},
    "commit-document-events-unknown-field": {"n_frames": 3, "n_events": {"geom_rgba": 0}},
    "commit-document-not-an-object": [3, {}],
}.items():
    case(_name, rule="commit-document", match="commit document")(
        lambda out, record=_record: (_live(out), _commit_doc(out, record=record)))


@case("commit-document-events-below-root", rule="commit-document", match="root's n_events")
def _(out):
    _live(out, "variants")
    _commit_doc(out, 5, {"geom_rgba": 2, "geom_size": 1})


@case("commit-document-events-field-missing", rule="commit-document", match="variant fields")
def _(out):
    _live(out, "variants")
    _commit_doc(out, 5, {"geom_rgba": 3})


@case("commit-document-events-beyond-arrays", rule="commit-document", match="geom_size",
      note="event counts are checked against the event arrays like the root's")
def _(out):
    _live(out, "variants")
    _commit_doc(out, 5, {"geom_rgba": 3, "geom_size": 9})


@case("commit-document-huge", rule="commit-document", match="65536", runtime=True,
      note="64 KiB at most, refused before it is parsed (here padded with an ignored attribute)")
def _(out):
    _live(out)
    doc = {"zarr_format": 3, "node_type": "group",
           "attributes": {"mjarchive_commit": {"n_frames": 3, "n_events": {}}, "pad": "x" * 70000}}
    _commit_doc(out, raw=json.dumps(doc).encode())


@case("commit-document-not-json", rule="commit-document", match="commit document|JSON", runtime=True,
      note="runtime: the committed-cases check parses every committed zarr.json")
def _(out):
    _live(out)
    _commit_doc(out, raw=b'{"zarr_format":3,"node_type":"group","attributes":{"mjarchive_commit":{"n_frames":3,')


@case("commit-document-not-a-group", rule="commit-document", match="group document")
def _(out):
    _live(out)
    _commit_doc(out, raw=json.dumps({"zarr_format": 3, "node_type": "array",
                                     "attributes": {"mjarchive_commit": {"n_frames": 3, "n_events": {}}}}).encode())


# -- format 1.2: multi-part archives ----------------------------------------------------------------------
def _parted(out: Path, parts: dict[str, dict]) -> dict:
    """A multi-part archive written by one reference writer per part, joining in the order given
    (each joins the same location, as concurrent writers do); returns the expected contents: the
    archive's counts and worlds, and every joined part's own contents, by name."""
    expected = {}
    for i, (name, spec) in enumerate(parts.items()):
        spec = dict(spec)
        expected[name] = _write(out, spec.pop("xml", HINGE), spec.pop("world_ids"), spec.pop("n_frames"), part=name,
                                seed=100 * i, **spec)
    joined = {name: expected[name] for name in sorted(expected) if expected[name]["n_frames"] > 0}
    return {"n_frames": min((e["n_frames"] for e in joined.values()), default=0),
            "world_ids": [w for e in joined.values() for w in e["world_ids"]],
            "status": "finalized" if all(e["status"] == "finalized" for e in joined.values()) else "live",
            "parts": joined}


#: The base of the invalid multi-part cases: two finalized parts of the hinge model.
PARTS_BASE = {"a": {"world_ids": [0, 1], "n_frames": 3, "chunk_frames": 2},
              "b": {"world_ids": [2], "n_frames": 2, "chunk_frames": 2}}


def _assembled(out: Path, parts: dict[str, dict]) -> None:
    """A multi-part archive whose parts were each written alone (into a location of their own) and
    then put side by side: what writers that skipped the join checks, or a person copying folders,
    make. The root (and bundle) is the first part's."""
    scratch = out.parent / ".scratch" / f"assembled-{out.name}"
    for name, spec in parts.items():
        spec = dict(spec)
        _write(scratch / name, spec.pop("xml", HINGE), spec.pop("world_ids"), spec.pop("n_frames"), part=name, **spec)
        if not out.exists():
            shutil.copytree(scratch / name, out, ignore=shutil.ignore_patterns("_writer"))
        else:
            shutil.copytree(scratch / name / "parts" / name, out / "parts" / name,
                            ignore=shutil.ignore_patterns("_writer"))


def _parts_copy(out: Path) -> None:
    shutil.copytree(_base("parts", out.parent / ".scratch"), out)


def _rename_part(out: Path, old: str, new: str) -> None:
    (out / "parts" / old).rename(out / "parts" / new)


@case("valid-parts-two", expect="valid", rule="parts",
      note="part b (world 7, joined first, live: its writer stays open) has 3 frames at other times than part a "
           "(worlds 0 and 1, finalized, 5 frames): the archive has n_frames 3, worlds [0, 1, 7] in part-name order")
def _(out):
    return _parted(out, {"b": {"world_ids": [7], "n_frames": 3, "close": False, "chunk_frames": 2, "first_frame": 4,
                               "tracks": {"reward": ((), "float32")}},
                         "a": {"world_ids": [0, 1], "n_frames": 5, "chunk_frames": 2,
                               "tracks": {"reward": ((), "float32")}}})


@case("valid-parts-variants", expect="valid", rule="parts",
      note="two parts with the same variant fields; each part's events give world positions within the part")
def _(out):
    parts = {"b": _write_variants(out, (5, 10), part="b"), "a": _write_variants(out, (4, 9), part="a")}
    return {"n_frames": 5, "world_ids": [4, 9, 5, 10], "status": "finalized", "parts": dict(sorted(parts.items()))}


@case("parts-variant-declarations-disagree", rule="parts", match="parts 'a' and 'b'.*variant",
      note="part a declares variant fields, part b none; each part alone is valid")
def _(out):
    _assembled(out, {"b": {**PARTS_BASE["b"], "xml": VARIANTS}})
    scratch = out.parent / ".scratch" / f"assembled-{out.name}-a"
    _write_variants(scratch, (0, 1), part="a")
    shutil.copytree(scratch / "parts" / "a", out / "parts" / "a", ignore=shutil.ignore_patterns("_writer"))


@case("valid-parts-one", expect="valid", rule="parts", note="a multi-part archive with a single part")
def _(out):
    return _parted(out, {"rank0": {"world_ids": [3], "n_frames": 2}})


@case("valid-parts-pending", expect="valid", rule="parts",
      note="part b has a document with n_frames 0 (its writer has not committed), part c only a writer's temporary "
           "file, part d a group document without attributes (its writer is creating it): all three are pending "
           "and not in the archive. A writer's temporary object directly in parts/ is ignored")
def _(out):
    expected = _parted(out, {"a": {"world_ids": [0], "n_frames": 2}, "b": {"world_ids": [1], "n_frames": 0,
                                                                            "close": False}})
    (out / "parts" / "c").mkdir()
    (out / "parts" / "c" / f"zarr.json.{'0' * 32}.partial").write_bytes(b'{"zarr_format":3,')
    (out / "parts" / "d").mkdir()
    (out / "parts" / "d" / "zarr.json").write_bytes(b'{"zarr_format":3,"node_type":"group","attributes":{}}')
    (out / "parts" / f"zarr.json.{'1' * 32}.partial").write_bytes(b"\xff not a document")
    expected["status"] = "live"  # a pending part's writer will still append
    return expected


@case("valid-parts-plain-objects-ignored", expect="valid", rule="listing-parts",
      note="plain files directly in parts/ (a note, a file manager's .DS_Store, a file named like a part) are "
           "ignored: only child folders are parts")
def _(out):
    expected = _parted(out, {"a": {"world_ids": [0], "n_frames": 2}})
    (out / "parts" / "NOTES.txt").write_bytes(b"plain objects in parts/ are never read\n")
    (out / "parts" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (out / "parts" / "e").write_bytes(b"not a folder")
    return expected


@case("parts-pending-document-invalid", rule="parts", match="world_ids",
      note="part c has committed nothing, but its document holds mjarchive attributes without world_ids: "
           "a document that is there must be valid, pending or not")
def _(out):
    _parts_copy(out)
    shutil.copytree(out / "parts" / "b", out / "parts" / "c")
    _patch(out, lambda a: (a.pop("world_ids"), a.update(n_frames=0, status="live")), node="parts/c")
    shutil.rmtree(out / "parts" / "c" / "_commit", ignore_errors=True)


@case("valid-single-archive-with-parts-folder", expect="valid", rule="parts",
      note="a single archive (no \"parts\" feature) is never listed: a parts/ folder in it is one of the other keys")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2)
    (out / "parts" / "Not A Part!").mkdir(parents=True)
    (out / "parts" / "Not A Part!" / "zarr.json").write_bytes(b"garbage")
    return expected


@case("parts-name-uppercase", rule="parts", match="Rank1.*part name",
      note="part names are lowercase: Rank1 and rank1 would be one folder on a case-insensitive file system")
def _(out):
    _parts_copy(out)
    _rename_part(out, "b", "Rank1")


@case("parts-name-dot", rule="parts", match=r"b\.old.*part name",
      note="a copy someone kept next to the part: not a part name")
def _(out):
    _parts_copy(out)
    _rename_part(out, "b", "b.old")


@case("parts-name-leading-hyphen", rule="parts", match="'-b'.*part name",
      note="a name starting with '-' reads as an option")
def _(out):
    _parts_copy(out)
    _rename_part(out, "b", "-b")


@case("parts-name-too-long", rule="parts", match="b{65}.*part name", note="65 characters; part names have at most 64")
def _(out):
    _parts_copy(out)
    _rename_part(out, "b", "b" * 65)


@case("parts-name-dots", rule="parts", match=r"'\.\.\.'.*part name", runtime=True,
      note="'...' is a valid folder name on POSIX file systems (not on Windows): runtime")
def _(out):
    _parts_copy(out)
    _rename_part(out, "b", "...")


@case("parts-name-fullwidth-digit", rule="parts", match="rank.*part name", runtime=True,
      note="'rank\\uff11' becomes 'rank1' under Unicode normalization (NFKC): runtime, a non-ASCII file name")
def _(out):
    _parts_copy(out)
    _rename_part(out, "a", "rank1")
    _rename_part(out, "b", "rank\uff11")


@case("parts-name-trailing-newline", rule="parts", match=r"b\\n.*part name", runtime=True,
      note="a name that matches the pattern but for a final line feed: runtime, a control character in a file name")
def _(out):
    _parts_copy(out)
    _rename_part(out, "b", "b\n")


@case("parts-symbolic-link", rule="parts", match="parts/b .*link", runtime=True,
      note="parts/b is a symbolic link to a part folder elsewhere: refused, never followed")
def _(out):
    _parts_copy(out)
    (out / "parts" / "b").rename(out.parent / f"{out.name}-elsewhere")
    (out / "parts" / "b").symlink_to(out.parent / f"{out.name}-elsewhere", target_is_directory=True)


@case("parts-fifo", rule="parts", match="parts/c .*FIFO", runtime=True,
      note="a FIFO named like a part in parts/: opening it would block")
def _(out):
    import os

    _parts_copy(out)
    os.mkfifo(out / "parts" / "c")


@case("parts-too-many", rule="parts", match="more than 4096 parts", runtime=True,
      note="4097 part folders (empty: the listing alone refuses them, before any part's document is read)")
def _(out):
    _parts_copy(out)
    for i in range(4097 - 2):
        (out / "parts" / f"p{i:04d}").mkdir()


@case("parts-world-id-in-two-parts", rule="parts", match="world 1 .*part 'a'.*part 'b'",
      note="world 1 is claimed by parts a and b: refused at open, both parts named")
def _(out):
    _assembled(out, {"a": {"world_ids": [0, 1], "n_frames": 3, "chunk_frames": 2},
                     "b": {"world_ids": [1], "n_frames": 2, "chunk_frames": 2}})


@case("parts-model-differs-from-root", rule="parts", match="part 'b'.*created by part 'a'.*model",
      note="part b names another bundle than the root's (hash changed in its document only)")
def _(out):
    _parts_copy(out)
    _patch(out, _set(model__sha256="0" * 64), node="parts/b")


@case("parts-timestep-differs-from-root", rule="parts", match="part 'b'.*created by part 'a'.*timestep",
      note="part b: timestep 2**-8, the root 2**-7")
def _(out):
    _parts_copy(out)
    _patch(out, _set(timestep=0.00390625), node="parts/b")


@case("parts-tracks-disagree", rule="parts", match="parts 'a' and 'b'.*tracks",
      note="part a records the track reward, part b no track; each part alone is valid")
def _(out):
    _assembled(out, {"a": {**PARTS_BASE["a"], "tracks": {"reward": ((), "float32")}}, "b": PARTS_BASE["b"]})


@case("parts-storage-dtype-disagree", rule="parts", match="parts 'a' and 'b'.*dtype",
      note="part a stores float32, part b float64; each part alone is valid")
def _(out):
    _assembled(out, {"a": PARTS_BASE["a"], "b": {**PARTS_BASE["b"], "dtype": "float64"}})


@case("parts-part-lists-parts", rule="parts", match="part 'b'.*nest",
      note="a part's document requires the feature \"parts\": a part is never itself split")
def _(out):
    _parts_copy(out)
    _patch(out, _set(required_features=["parts"], format_version="1.2"), node="parts/b")


@case("parts-part-format-1.1", rule="parts", match="part 'b'.*format 1.1; parts are format 1.2",
      note="a part is a format 1.2 concept: a part document of an earlier version is refused")
def _(out):
    _parts_copy(out)
    _patch(out, _set(format_version="1.1"), node="parts/b")


@case("parts-part-document-not-a-group", rule="parts", match="part 'b'.*not a Zarr v3 group document",
      note="where a part's Zarr v3 group document belongs there is a Zarr v2 one: an error, not a pending part")
def _(out):
    _parts_copy(out)
    path = out / "parts" / "b" / "zarr.json"
    doc = json.loads(path.read_text())
    doc["zarr_format"] = 2
    path.write_text(json.dumps(doc, indent=2))


@case("parts-root-without-created-by", rule="parts", match="created_by", schema="invalid")
def _(out):
    _parts_copy(out)
    _patch(out, _set(parts={}))


@case("parts-root-with-world-ids", rule="parts", match="world_ids", schema="invalid",
      note="world IDs are per part: a parts root that carries them says two things about one archive")
def _(out):
    _parts_copy(out)
    _patch(out, _set(world_ids=[0, 1, 2]))


@case("parts-root-format-1.1", rule="parts", match="1\\.2", schema="valid",
      note="the feature \"parts\" is 1.2's: a root that lists it with format_version 1.1 is refused")
def _(out):
    _parts_copy(out)
    _patch(out, _set(format_version="1.1"))


# -- the episode index (1.3) -----------------------------------------------------------------------------
def _indexed(out: Path, n_frames: int = 3) -> dict:
    """Worlds 0 and 1 in chunks of 2 frames: reset markers at frame 0 and at frame n_frames // 2 of world 0."""
    return _write(out, HINGE, [0, 1], n_frames, chunk_frames=2)


def _edit_index(out: Path, rows: dict[int, list[int]]) -> None:
    import zarr

    arr = zarr.open_array(out / "reset_count", mode="r+").with_config({"write_empty_chunks": True})
    for k, row in rows.items():
        arr[k] = row


def _edit_index_meta(out: Path, change: Callable[[dict], Any]) -> None:
    path = out / "reset_count" / "zarr.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


@case("valid-episode-index-partial-row", expect="valid",
      note="3 frames in chunks of 2: row 0 of reset_count is trusted; row 1 counts the partial last chunk and "
           "carries no meaning (here it claims a reset of world 1 that reset does not hold)")
def _(out):
    expected = _indexed(out)
    _edit_index(out, {1: [1, 1]})
    return expected


@case("episode-index-disagrees", rule="episode-index", match="reset markers",
      note="row 0 passes every check on its own (counts 0..1) but differs from reset: a full read refuses it")
def _(out):
    _indexed(out)
    _edit_index(out, {0: [0, 0]})


@case("episode-index-beyond-frames", rule="episode-index", match="exceed the frames",
      note="row 0 counts frames 1..1 of each world: at most 1 marker")
def _(out):
    _indexed(out)
    _edit_index(out, {0: [2, 0]})


@case("episode-index-falls", rule="episode-index", match="fall",
      note="5 frames in chunks of 2: rows 0 and 1 trusted; a count may not fall from one row to the next")
def _(out):
    _indexed(out, 5)
    _edit_index(out, {0: [1, 0], 1: [0, 0]})


@case("episode-index-missing", rule="episode-index", match="reset_count",
      note="a format 1.3 archive without its episode index")
def _(out):
    _indexed(out)
    shutil.rmtree(out / "reset_count")


@case("episode-index-chunk-missing", rule="episode-index", match="missing|damaged",
      note="the stored chunk holding trusted row 0 is gone: damage, never counts of 0")
def _(out):
    _indexed(out)
    (out / "reset_count" / "c" / "0" / "0").unlink()


@case("episode-index-chunk-shape", rule="episode-index", match="chunked",
      note="chunks of 1 row instead of 64 (the bytes stored are unchanged)")
def _(out):
    _indexed(out)
    _edit_index_meta(out, lambda d: d["chunk_grid"]["configuration"].update(chunk_shape=[1, 2]))


@case("episode-index-too-long", rule="episode-index", match="far beyond",
      note="10,000 rows declared for 2 chunks of frames")
def _(out):
    _indexed(out)
    _edit_index_meta(out, lambda d: d.update(shape=[10_000, 2]))


@case("episode-index-int32", rule="episode-index", match="dtype",
      note="the index is int64")
def _(out):
    _indexed(out)
    _edit_index_meta(out, lambda d: d.update(data_type="int32"))


@case("episode-index-transposed", rule="episode-index", match="codecs",
      note="a transpose codec before bytes: the counts would be read in another order")
def _(out):
    _indexed(out)
    _edit_index_meta(out, lambda d: d["codecs"].insert(0, {"name": "transpose", "configuration": {"order": [1, 0]}}))


@case("valid-1.2-track-named-reset-count", expect="valid",
      note="before 1.3 the name is an ordinary track's: a 1.2 archive's track reset_count is read as a track")
def _(out):
    expected = _write(out, HINGE, [0, 1], 3, chunk_frames=2, tracks={"rcx": ((), "int64")})
    shutil.rmtree(out / "reset_count")
    (out / "rcx").rename(out / "reset_count")

    def to_1_2(attrs: dict) -> None:
        attrs["format_version"] = "1.2"
        attrs["tracks"] = {"reset_count": attrs["tracks"].pop("rcx")}

    _patch(out, to_1_2)
    expected["arrays"]["reset_count"] = expected["arrays"].pop("rcx")
    return expected


# -- writing and comparing -------------------------------------------------------------------------------
def _with_index(expected: dict, out: Path, node: str = "") -> dict:
    """`expected` plus, for an archive (or part) of format 1.3, the trusted rows of `reset_count` as the
    spec derives them from `reset` (the markers after frame 0 up to the end of each whole chunk)."""
    if "parts" in expected:
        return {**expected, "parts": {name: _with_index(part, out, f"parts/{name}")
                                      for name, part in expected["parts"].items()}}
    attrs = _root_doc(out, node)["attributes"]["mjarchive"]
    if tuple(int(v) for v in attrs["format_version"].split(".")) < (1, 3) or "reset" not in expected["arrays"]:
        return expected
    cf, reset = attrs["storage"]["chunk_frames"], expected["arrays"]["reset"].copy()
    whole = expected["n_frames"] // cf
    reset[:1] = False
    per_chunk = reset[:whole * cf].reshape(whole, cf, -1).sum(axis=1) if whole else np.zeros((0, reset.shape[1]))
    counts = np.cumsum(per_chunk, axis=0).astype(np.int64).reshape(whole, reset.shape[1])
    return {**expected, "arrays": {**expected["arrays"], "reset_count": counts}}


def _to_json(expected: dict) -> dict:
    if "parts" in expected:
        return {**expected, "parts": {name: _to_json(part) for name, part in expected["parts"].items()}}
    arrays = {name: {"dtype": str(a.dtype), "shape": list(a.shape), "data": _json_values(a)}
              for name, a in expected["arrays"].items()}
    return {**{k: v for k, v in expected.items() if k != "arrays"}, "arrays": arrays}


def _json_values(a: np.ndarray) -> Any:
    """Nested lists; NaN (label anchors) as the string "NaN", since JSON has no NaN."""
    return _nan_strings(a.tolist()) if a.dtype.kind == "f" and np.isnan(a).any() else a.tolist()


def _nan_strings(values: Any) -> Any:
    if isinstance(values, list):
        return [_nan_strings(v) for v in values]
    return "NaN" if values != values else values


def write_cases(directory: Path, *, runtime: bool = False) -> dict[str, dict]:
    """Write every committed case (or, with `runtime`, every runtime case) under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    scratch = directory / ".scratch"
    _BASES.clear()
    index = {}
    try:
        for name, entry in CASES.items():
            if bool(entry.get("runtime")) != runtime:
                continue
            out = directory / name
            if out.exists():
                shutil.rmtree(out)
            expected = _WRITERS[name](out)
            if not name.startswith("valid-writer-lease"):  # the lease (1.2) names a host and pid: pinned there only
                for lease in [out / "_writer", *(out / "parts").glob("*/_writer")]:
                    if lease.is_dir() and not lease.is_symlink():
                        shutil.rmtree(lease)
            index[name] = dict(entry)
            if entry["expect"] == "valid":
                index[name]["expected"] = _to_json(_with_index(expected, out))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return index


def snapshot(directory: Path) -> dict[str, Any]:
    """What a case holds, independent of compressor versions: every JSON document parsed, every
    array decoded (raw bytes of its files where it does not decode), and the list of files."""
    import zarr

    out: dict[str, Any] = {"files": sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())}
    for meta in sorted(directory.rglob("zarr.json")):
        key = str(meta.parent.relative_to(directory))
        try:
            doc = json.loads(meta.read_bytes())  # (bytes: also a case's UTF-16 document)
        except ValueError:  # a garbage document (the writer lease's), compared as bytes
            out[key + "/zarr.json"], doc = meta.read_bytes(), {}
        else:
            out[key + "/zarr.json"] = doc
        if doc.get("node_type") == "array":
            try:
                value = zarr.open_array(meta.parent, mode="r")[...]
                out[key] = (str(value.dtype), value.shape, value.tobytes())
            except Exception:
                out[key] = sorted((str(p.relative_to(directory)), p.read_bytes()) for p in meta.parent.rglob("*")
                                  if p.is_file())
    return out


def main(argv: list[str]) -> None:
    runtime = "--runtime" in argv
    args = [a for a in argv if a != "--runtime"]
    directory = Path(args[0]) if args else CASES_DIR
    if directory == CASES_DIR and not runtime:
        shutil.rmtree(CASES_DIR, ignore_errors=True)
    index = write_cases(directory, runtime=runtime)
    if directory == CASES_DIR and not runtime:
        everything = {n: index.get(n, CASES[n]) for n in CASES}
        INDEX.write_text(json.dumps(everything, indent=1, ensure_ascii=True) + "\n")
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    print(f"wrote {len(index)} cases to {directory} ({size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
