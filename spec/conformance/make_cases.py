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
           tracks: dict | None = None, **kwargs: Any) -> dict:
    """Write an archive with the reference writer; returns the expected contents."""
    import mjarchive

    bundle = mjarchive.ModelBundle.from_xml(xml)
    model = bundle.compile()
    W, dtype = len(world_ids), kwargs.get("dtype", "float32")
    arrays: dict[str, np.ndarray] = {
        "time": (np.arange(n_frames, dtype=np.float64) + 1) / 32.0,
        "qpos": _data(n_frames, W, (model.nq,), dtype, 1),
        "reset": np.zeros((n_frames, W), bool),
    }
    if n_frames:
        arrays["reset"][0] = True
        arrays["reset"][n_frames // 2, 0] = True
    if model.nmocap:
        arrays["mocap_pos"] = _data(n_frames, W, (model.nmocap, 3), dtype, 2)
        arrays["mocap_quat"] = _data(n_frames, W, (model.nmocap, 4), dtype, 3)
    for i, (name, (shape, tdtype)) in enumerate((tracks or {}).items()):
        if tdtype == "bool":
            arrays[name] = (np.arange(n_frames * W * int(np.prod(shape))) % 3 == 0).reshape(n_frames, W, *shape)
        elif tdtype.startswith(("int", "uint")):  # the extremes of the type, then small values
            info, n = np.iinfo(tdtype), n_frames * W * int(np.prod(shape))
            values = [int(info.min), int(info.max)] + [i - 3 if info.min else i for i in range(max(0, n - 2))]
            arrays[name] = np.array(values[:n], dtype=tdtype).reshape(n_frames, W, *shape)
        else:
            arrays[name] = _data(n_frames, W, shape, tdtype, 10 + i)
    writer = mjarchive.create(out, bundle, world_ids=world_ids, output_fps=32.0, tracks=tracks, **kwargs)
    for f in range(n_frames):
        extra = {k: v[f] for k, v in arrays.items() if k not in ("time", "qpos")}
        writer.append(arrays["time"][f], arrays["qpos"][f], **extra)
    if close:
        writer.close()
    else:
        writer.flush()  # the writer stays open, as if it crashed: status "live"
    _patch(out, lambda a: a.update(PINNED))
    return {"n_frames": n_frames, "world_ids": list(world_ids), "status": "finalized" if close else "live",
            "arrays": arrays}


def _root_doc(out: Path) -> dict:
    return json.loads((out / "zarr.json").read_text())


def _patch(out: Path, change: Callable[[dict], Any], *, allow_nan: bool = False) -> None:
    """Apply `change` to the root attribute `mjarchive` in place (the writer's own formatting)."""
    doc = _root_doc(out)
    change(doc["attributes"]["mjarchive"])
    (out / "zarr.json").write_text(json.dumps(doc, indent=2, allow_nan=allow_nan))


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
    _patch(out, _set(n_frames=2))
    expected["n_frames"] = 2
    expected["arrays"] = {k: v[:2] for k, v in expected["arrays"].items()}
    return expected


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


# -- writing and comparing -------------------------------------------------------------------------------
def _to_json(expected: dict) -> dict:
    arrays = {name: {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.tolist()}
              for name, a in expected["arrays"].items()}
    return {**{k: v for k, v in expected.items() if k != "arrays"}, "arrays": arrays}


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
            index[name] = dict(entry)
            if entry["expect"] == "valid":
                index[name]["expected"] = _to_json(expected)
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
        doc = json.loads(meta.read_text())
        out[key + "/zarr.json"] = doc
        if doc.get("node_type") == "array":
            try:
                value = zarr.open_array(meta.parent, mode="r")[...]
                out[key] = (str(value.dtype), value.shape, value.tobytes())
            except Exception:
                out[key] = sorted((str(p), p.read_bytes()) for p in meta.parent.rglob("*") if p.is_file())
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
