"""Conformance of written archives and of spec/example/ with the normative spec in spec/.

The expectations are taken from spec/README.md's tables and spec/root-attributes.schema.json, and
checked against the raw `zarr.json` documents of real archives, so the spec and the writer
cannot drift apart unnoticed. The bundle hash is recomputed here from the stored bytes with
hashlib, independently of ModelBundle.sha256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
import shutil
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import zarr

import mjarchive
from mjarchive import FormatError, FormatVersionError
from mjarchive.archive.format import ALLOWED_CODECS, RESERVED_ARRAYS, TRACK_DTYPES

SPEC = Path(__file__).resolve().parents[2] / "spec"
README = (SPEC / "README.md").read_text()
SCHEMA = json.loads((SPEC / "root-attributes.schema.json").read_text())
BUNDLE_SCHEMA = json.loads((SPEC / "bundle-attributes.schema.json").read_text())
PARTS_SCHEMA = json.loads((SPEC / "parts-root-attributes.schema.json").read_text())
PART_NAME_RE = r"^[a-z0-9][a-z0-9_-]{0,63}$"
ASSET_NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$"
TRACK_NAME_RE = r"^[a-z][a-z0-9_]{0,63}$"
LIMIT_CHUNK_BYTES = 256 * 2**20


def _make_example():
    spec = importlib.util.spec_from_file_location("mjarchive_spec_make_example", SPEC / "make_example.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_example = _make_example()


# -- reading the spec's tables ---------------------------------------------------------------------
def _section(heading: str) -> str:
    start = README.index(heading + "\n")
    level = heading.split(" ")[0]
    rest = README[start + len(heading) + 1:]
    ends = [m.start() for m in re.finditer(r"^#{1,%d} " % len(level), rest, flags=re.M)]
    return rest[: ends[0]] if ends else rest


def _table(heading: str) -> list[dict[str, str]]:
    """The first Markdown table in a section, as rows of {column: cell without backticks}."""
    lines = [ln for ln in _section(heading).splitlines() if ln.startswith("|")]
    split = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    header, rows = split[0], split[2:]
    return [{h: c.replace("`", "") for h, c in zip(header, row)} for row in rows]


ARRAY_TABLE = {row["Key"]: row for row in _table("### Per-array requirements")}
CODECS = {row["Codec"] for row in _table("### Codecs")}
DTYPE_TABLE = {row["Use"]: row["Allowed data types"] for row in _table("### Data types")}


def _schema_paths(node: dict, prefix: str = "") -> set[str]:
    paths = set()
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.add(path)
        for branch in [sub, *sub.get("oneOf", [])]:
            paths |= _schema_paths(branch, path + ".")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("type") == "object" and prefix:
        paths.add(prefix + "<name>")
        paths |= _schema_paths(extra, prefix + "<name>.")
    return paths


# -- an independent conformance checker for raw archives --------------------------------------------
def _zarr_json(root: Path, key: str) -> dict:
    return json.loads((root / key / "zarr.json").read_text())


def _codec_names(codecs: list) -> list[str]:
    names = []
    for codec in codecs:
        names.append(codec["name"])
        config = codec.get("configuration") or {}
        names += _codec_names(config.get("codecs", [])) + _codec_names(config.get("index_codecs", []))
    return names


def _expected_dims(key: str, ndim_tail: int) -> list[str] | None:
    cell = ARRAY_TABLE["<name>" if key not in ARRAY_TABLE else key]["dimension_names"]
    if cell == "absent":
        return None
    if key not in ARRAY_TABLE:  # a track: the spec gives the pattern "<name>_0", "<name>_1", …
        assert cell.startswith('["frame", "world", "<name>_0"')
        return ["frame", "world", *(f"{key}_{i}" for i in range(ndim_tail))]
    return json.loads(cell)


def _expected_dtype(key: str, attrs: dict) -> str:
    cell = ARRAY_TABLE["<name>" if key not in ARRAY_TABLE else key]["Data type"]
    if cell == "storage.dtype":
        return attrs["storage"]["dtype"]
    if cell == "tracks.<name>.dtype":
        return attrs["tracks"][key]["dtype"]
    return cell


def check_conforms(root: Path, bundle_root: Path | None = None) -> dict:
    """Check a local archive against the spec from its raw JSON documents; returns root attributes.
    A part of a multi-part archive is checked as one, with the bundle of its archive's root."""
    group = json.loads((root / "zarr.json").read_text())
    assert group["zarr_format"] == 3 and group["node_type"] == "group"
    attrs = group["attributes"]["mjarchive"]
    jsonschema.Draft202012Validator(SCHEMA).validate(attrs)
    bundle_attrs = _zarr_json(bundle_root or root, "model")["attributes"]["mjarchive_bundle"]
    jsonschema.Draft202012Validator(BUNDLE_SCHEMA).validate(bundle_attrs)
    assert attrs["format"] == "mjarchive" and attrs["format_version"] == "1.3"
    commit = root / "_commit" / "zarr.json"
    if attrs["status"] == "finalized":
        if commit.exists():  # kept by finalizing, with the final counts (the reader rule ignores it)
            record = json.loads(commit.read_bytes())["attributes"]["mjarchive_commit"]
            assert record["n_frames"] == attrs["n_frames"]
    elif commit.exists():  # the reader rule: a live root's counts are overridden by the commit document
        doc = json.loads(commit.read_bytes())
        assert len(commit.read_bytes()) <= 64 * 1024 and doc["zarr_format"] == 3 and doc["node_type"] == "group"
        record = doc["attributes"]["mjarchive_commit"]
        assert set(record) == {"n_frames", "n_events"} and set(record["n_events"]) == set(attrs.get("variants", {}))
        assert record["n_frames"] >= attrs["n_frames"]
        attrs = {**attrs, "n_frames": record["n_frames"]}
    assert len(set(attrs["world_ids"])) == len(attrs["world_ids"])
    assert attrs["cameras"] == attrs["model"]["layout"]["cameras"]
    assert "consolidated_metadata" not in group or group["consolidated_metadata"] is None

    lay, storage, F = attrs["model"]["layout"], attrs["storage"], attrs["n_frames"]
    W, C = len(attrs["world_ids"]), storage["chunk_frames"]
    tails = {"qpos": (lay["nq"],), "reset": ()}
    if lay["nmocap"]:
        tails |= {"mocap_pos": (lay["nmocap"], 3), "mocap_quat": (lay["nmocap"], 4)}
    tails |= {name: tuple(t["shape"]) for name, t in attrs["tracks"].items()}
    assert set(attrs["tracks"]).isdisjoint(ARRAY_TABLE)
    assert all(re.fullmatch(TRACK_NAME_RE, name) for name in attrs["tracks"])
    if not lay["nmocap"]:
        assert not (root / "mocap_pos").exists() and not (root / "mocap_quat").exists()

    for key in ["time", "world_id", *tails]:
        meta = _zarr_json(root, key)
        tail = tails.get(key, ())
        assert meta["node_type"] == "array" and meta["zarr_format"] == 3
        assert meta["data_type"] == _expected_dtype(key, attrs), key
        assert meta.get("dimension_names") == _expected_dims(key, len(tail)), key
        assert meta["chunk_grid"]["name"] == "regular" and meta["chunk_key_encoding"]["name"] == "default"
        names = _codec_names(meta["codecs"])
        assert set(names) <= CODECS, (key, names)
        assert "bytes" in names
        for codec in meta["codecs"]:
            if codec["name"] == "bytes" and np.dtype(meta["data_type"]).itemsize > 1:
                assert codec["configuration"]["endian"] == "little"
        outer = meta["chunk_grid"]["configuration"]["chunk_shape"]
        sharded = meta["codecs"][0]["name"] == "sharding_indexed"
        inner = meta["codecs"][0]["configuration"]["chunk_shape"] if sharded else outer
        itemsize = np.dtype(meta["data_type"]).itemsize
        assert max(math.prod(inner), math.prod(outer)) * itemsize <= LIMIT_CHUNK_BYTES
        if key == "world_id":
            assert meta["shape"] == [W] and not sharded
            stored = zarr.open_array(root / key, mode="r")[:]
            assert stored.tolist() == attrs["world_ids"]
        elif key == "time":
            assert meta["shape"][0] >= F and outer == [C] and not sharded
        else:
            assert meta["shape"][0] >= F and meta["shape"][1:] == [W, *tail], key
            # Never sharded along time: the shard's frame extent is the inner chunk's.
            assert sharded and outer[0] == inner[0] == C, key
            chunk_tail = [max(n, 1) for n in tail]  # "Zero-length axes"
            assert inner == [C, storage["chunk_worlds"], *chunk_tail] and storage["chunk_worlds"] == 1
            assert outer == [C, storage["shard_worlds"], *chunk_tail] and storage["shard_worlds"] <= W
        if attrs["status"] == "finalized" and key != "world_id":
            assert meta["shape"][0] == F, f"{key} not trimmed to n_frames on close"
        if key == "world_id":
            assert (root / key / "c" / "0").is_file(), "the world_id chunk is always stored"
        else:  # every chunk (shard) covering a committed frame is stored
            counts = [-(-F // C)] + [-(-s // c) for s, c in zip(meta["shape"][1:], outer[1:])]
            for coords in np.ndindex(*counts):
                chunk = root / key / "c" / "/".join(map(str, coords))
                assert chunk.is_file(), f"committed chunk {chunk} is missing"
    precision = storage["precision"]
    if precision is not None:
        e = precision["abs_error"]
        assert e == 2.0 ** round(math.log2(e)), "abs_error must be a power of two (half the step)"
    check_bundle(bundle_root or root, attrs)
    return attrs


def check_bundle(root: Path, attrs: dict) -> dict[str, bytes]:
    """Recompute the bundle hash as the spec defines it, with hashlib only; check safety rules."""
    meta = _zarr_json(root, "model")["attributes"]["mjarchive_bundle"]
    group = zarr.open_group(root / "model", mode="r")
    for key in ["xml", *(e["key"] for e in meta["assets"])]:
        arr_meta = _zarr_json(root / "model", key)
        assert arr_meta["data_type"] == "uint8" and arr_meta.get("dimension_names") is None
        assert set(_codec_names(arr_meta["codecs"])) <= CODECS
    xml = group["xml"][:].tobytes()
    assert len(xml) == meta["xml"]["size"] and hashlib.sha256(xml).hexdigest() == meta["xml"]["sha256"]
    assets = {}
    for i, entry in enumerate(meta["assets"]):
        name = entry["name"]
        assert entry["key"] == f"asset_{i:05d}"
        assert re.fullmatch(ASSET_NAME_RE, name) and ".." not in name and name not in assets
        data = group[entry["key"]][:].tobytes()
        assert len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
        assets[name] = data
    assert list(assets) == sorted(assets), "writers list assets in ascending name order"

    preimage = b"mjarchive-bundle-v1\x00" + hashlib.sha256(xml).hexdigest().encode("ascii") + b"\x00"
    for name in sorted(assets, key=lambda n: n.encode("ascii")):
        preimage += name.encode("ascii") + b"\x00" + hashlib.sha256(assets[name]).hexdigest().encode("ascii") + b"\x00"
    expected = hashlib.sha256(preimage).hexdigest()
    assert meta["sha256"] == expected == attrs["model"]["sha256"]

    # The Python rendering of the definition printed in the spec gives the same hash.
    snippet = re.search(r"### Bundle hash.*?```python\n(.*?)```", README, flags=re.S).group(1)
    scope = {"hashlib": hashlib, "xml_bytes": xml, "assets": assets}
    exec(snippet, scope)
    assert scope["bundle_sha256"] == expected

    # Safe-bundle rules: only bundle members are referenced, no include, no directories.
    for element in ET.fromstring(xml.decode("utf-8")).iter():
        assert element.tag != "include"
        for attr, value in element.attrib.items():
            assert not (attr in ("meshdir", "texturedir", "assetdir") and value)
            if attr.startswith("file") and value:
                assert value in assets, (element.tag, attr, value)
    return assets


# -- the spec's own consistency ----------------------------------------------------------------------
SCHEMA_FILES = ["root-attributes.schema.json", "bundle-attributes.schema.json", "parts-root-attributes.schema.json"]


@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_schema_copy_is_identical_to_package_schema(name):
    packaged = resources.files("mjarchive.archive").joinpath(name).read_bytes()
    assert (SPEC / name).read_bytes() == packaged
    jsonschema.Draft202012Validator.check_schema(json.loads(packaged))


def _patterns(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern":
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _patterns(value)


@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_schema_patterns_match_whole_strings(name):
    """`$` must mean end of string for Python's re.search too (it also matches before a final "\n")."""
    schema = json.loads((SPEC / name).read_text())
    patterns = list(_patterns(schema))
    assert patterns
    for pattern in patterns:
        assert pattern.startswith("^") and pattern.endswith("$(?!\\n)"), pattern
    validator = jsonschema.Draft202012Validator(SCHEMA)
    example = json.loads((SPEC / "example" / "zarr.json").read_text())["attributes"]["mjarchive"]
    assert not list(validator.iter_errors(example))
    for key, value in [("format_version", "1.0\n"), ("created", "2026\n"), ("mujoco_version", "4.0.0\n")]:
        assert list(validator.iter_errors({**example, key: value})), key


def test_integers_written_as_floats_are_refused_although_the_schema_allows_them():
    example = json.loads((SPEC / "example" / "zarr.json").read_text())["attributes"]["mjarchive"]
    from mjarchive.archive.manifest import Manifest, check_schema

    for key, value in [("n_frames", 5.0), ("world_ids", [3.0, 11])]:
        check_schema({**example, key: value})  # JSON Schema's "integer" accepts 5.0 ...
        with pytest.raises(FormatError, match=key):
            Manifest.from_dict({**example, key: value})  # ... the spec does not


def test_spec_tables_match_schema_and_constants():
    table_keys = {row["Key"] for row in _table("## Root attributes")}
    assert table_keys == _schema_paths(SCHEMA)
    assert set(SCHEMA["required"]) <= table_keys
    assert CODECS == ALLOWED_CODECS
    track_dtypes = set(DTYPE_TABLE["track dtypes"].replace(" ", "").split(","))
    assert track_dtypes == TRACK_DTYPES == set(SCHEMA["properties"]["tracks"]["additionalProperties"]
                                               ["properties"]["dtype"]["enum"])
    storage = set(DTYPE_TABLE["storage dtype (qpos, mocap_pos, mocap_quat)"].replace(" ", "").split(","))
    assert storage == set(SCHEMA["properties"]["storage"]["properties"]["dtype"]["enum"])
    assert f"`{ASSET_NAME_RE}`" in README and f"`{TRACK_NAME_RE}`" in README
    assert SCHEMA["properties"]["tracks"]["propertyNames"]["pattern"] == TRACK_NAME_RE + r"(?!\n)"
    assert set(SCHEMA["properties"]["tracks"]["propertyNames"]["not"]["enum"]) == RESERVED_ARRAYS
    bundle_name = BUNDLE_SCHEMA["properties"]["assets"]["items"]["properties"]["name"]["pattern"]
    assert bundle_name == "^(?!.*\\.\\.)" + ASSET_NAME_RE[1:] + r"(?!\n)"


# -- multi-part archives (1.2, "Parts") --------------------------------------------------------------
PER_PART_KEYS = {"world_ids", "storage", "tracks", "variants", "overlays", "status", "n_frames"}


def _parts_root_example() -> dict:
    example = json.loads((SPEC / "example" / "zarr.json").read_text())["attributes"]["mjarchive"]
    return {**{k: v for k, v in example.items() if k not in PER_PART_KEYS},
            "required_features": ["parts"], "parts": {"created_by": "rank0"}}


def test_parts_schema_shares_the_single_roots_definitions_and_the_spec_table():
    """Shared keys are defined exactly as for a single archive; the table lists the others."""
    from mjarchive.archive.parts import MAX_PARTS, PART_NAME_RE as CODE_PART_NAME_RE

    own = {"required_features", "parts"}
    shared = set(PARTS_SCHEMA["properties"]) - own
    assert shared == set(SCHEMA["properties"]) - own - PER_PART_KEYS
    for key in shared:
        assert PARTS_SCHEMA["properties"][key] == SCHEMA["properties"][key], key
    assert PARTS_SCHEMA["$defs"] == SCHEMA["$defs"]
    assert set(PARTS_SCHEMA["required"]) == shared | own
    table = {row["Key"] for row in _table("### Parts root attributes")}
    assert table == _schema_paths({"properties": {k: PARTS_SCHEMA["properties"][k] for k in own}})
    assert all(f"`{key}`" in _section("### Parts root attributes") for key in shared)
    pattern = PARTS_SCHEMA["properties"]["parts"]["properties"]["created_by"]["pattern"]
    assert pattern == PART_NAME_RE + r"(?!\n)" and f"`{PART_NAME_RE}`" in README
    assert "^" + CODE_PART_NAME_RE.pattern + "$" == PART_NAME_RE
    assert f"at most **{MAX_PARTS}** parts" in README and f"{MAX_PARTS + 1}" in README


@pytest.mark.parametrize("change", [
    {"world_ids": [0]}, {"n_frames": 0}, {"status": "live"}, {"tracks": {}},
    {"parts": {}}, {"parts": {"created_by": "Rank0"}}, {"parts": {"created_by": "rank0\n"}},
    {"parts": {"created_by": "rank0", "other": 1}}, {"required_features": ["variants"]}, {"required_features": []},
])
def test_parts_schema_refuses_what_a_parts_root_must_not_hold(change):
    validator = jsonschema.Draft202012Validator(PARTS_SCHEMA)
    assert not list(validator.iter_errors(_parts_root_example()))
    assert list(validator.iter_errors({**_parts_root_example(), **change}))
    assert not list(validator.iter_errors({**_parts_root_example(), "a_later_minor_key": 1}))


def test_written_multi_part_archive_conforms(tmp_path):
    """Two writers of one archive: the root holds what they share, each part is laid out as a single
    archive (checked by the same independent checker) with the root's bundle."""
    path = tmp_path / "run.mjarchive"
    with mjarchive.open(SPEC / "example") as example:  # its model: a mocap body and a mesh asset in the bundle
        bundle = example.bundle
    qpos = np.arange(4 * 2 * 2, dtype=np.float64).reshape(4, 2, 2) / 8
    mocap = {"mocap_pos": np.zeros((2, 1, 3)), "mocap_quat": np.tile([1.0, 0, 0, 0], (2, 1, 1))}
    first = mjarchive.create(path, bundle, part="rank0", world_ids=[5, 6], chunk_frames=2, output_fps=32.0,
                             tracks={"reward": ()})
    second = mjarchive.create(path, bundle, part="rank-1", world_ids=[2], chunk_frames=2, output_fps=32.0,
                              tracks={"reward": ()})
    try:
        for f in range(4):
            first.append((f + 1) / 32, qpos[f], reward=np.zeros(2, np.float32), **mocap)
        for f in range(3):
            second.append((f + 1) / 32, qpos[f, :1], reward=np.ones(1, np.float32),
                          **{k: v[:1] for k, v in mocap.items()})
        first.close()
        second.flush()
        group = json.loads((path / "zarr.json").read_text())
        root = group["attributes"]["mjarchive"]
        jsonschema.Draft202012Validator(PARTS_SCHEMA).validate(root)
        assert set(root) == set(PARTS_SCHEMA["required"]) and root["parts"] == {"created_by": "rank0"}
        assert root["required_features"] == ["parts"] and root["format_version"] == "1.3"
        assert _zarr_json(path, "parts")["node_type"] == "group"
        parts = {}
        for name in ("rank0", "rank-1"):
            assert not (path / "parts" / name / "model").exists(), "parts share the root's bundle"
            parts[name] = check_conforms(path / "parts" / name, bundle_root=path)
            assert "parts" not in parts[name].get("required_features", [])
            for key in ("model", "cameras", "timestep", "output_fps", "playback_speed"):
                assert parts[name][key] == root[key], key
        assert (parts["rank0"]["status"], parts["rank0"]["n_frames"]) == ("finalized", 4)
        assert (parts["rank-1"]["status"], parts["rank-1"]["n_frames"]) == ("live", 3)
        with mjarchive.open(path) as archive:
            assert archive.parts == ("rank-1", "rank0")  # ascending names (byte order: '-' < '0')
            assert archive.world_ids == (2, 5, 6) and archive.n_frames == 3 and archive.status == "live"
    finally:
        second.close()


# -- archives written by the real writer ------------------------------------------------------------
@pytest.mark.parametrize("dtype, precision", [("float32", None), ("float64", None), ("float32", 1e-3)])
def test_written_humanoid_archive_conforms(tmp_path, humanoid_xml, dtype, precision):
    import mujoco

    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    world_ids = [7, 42, 100]
    tracks = {"qvel": (model.nv,), "reward": (), "flags": ((2,), "int8"), "contact": ((), "bool")}
    rng = np.random.default_rng(0)
    qpos = model.qpos0 + 0.1 * rng.standard_normal((6, len(world_ids), model.nq))
    path = tmp_path / "run.zarr"
    writer = mjarchive.create(path, humanoid_xml, world_ids=world_ids, dtype=dtype, precision=precision,
                              tracks=tracks, chunk_frames=4, shard_worlds=2, backend="cpu")
    try:
        for f in range(6):
            writer.append(0.02 * (f + 1), qpos[f], reward=np.full(3, f, np.float32),
                          qvel=np.zeros((3, model.nv)), flags=np.ones((3, 2), np.int8),
                          contact=np.array([True, False, f % 2 == 0]), reset=np.array([f == 0] * 3))
        writer.flush()
        live = check_conforms(path)
        assert live["status"] == "live" and live["n_frames"] == 6
        # Arrays may be longer than the commit record; the reader trusts n_frames only.
        assert _zarr_json(path, "qpos")["shape"][0] >= 6
        assert mjarchive.open(path).n_frames == 6
    finally:
        writer.close()
    final = check_conforms(path)
    assert final["status"] == "finalized" and final["n_frames"] == 6
    assert final["world_ids"] == world_ids and final["producer"]["backend"] == "cpu"
    assert final["model"]["layout"]["nq"] == model.nq and final["model"]["layout"]["joints"][0][1] == "free"
    assert final["storage"]["shard_worlds"] == 2 and final["storage"]["dtype"] == dtype
    stored = zarr.open_array(path / "qpos", mode="r")[:]
    if precision is None:
        assert final["storage"]["precision"] is None
        np.testing.assert_array_equal(stored, qpos.astype(dtype))
    else:
        e = final["storage"]["precision"]["abs_error"]
        step = 2.0 ** math.floor(math.log2(2 * precision))
        assert final["storage"]["precision"]["mode"] == "quantize" and e == step / 2 <= precision
        assert np.abs(stored.astype(np.float64) - qpos).max() <= e
        np.testing.assert_array_equal(np.round(stored / step) * step, stored)


def test_written_archive_with_mesh_and_texture_assets_conforms(tmp_path, mug_xml):
    path = tmp_path / "mug.zarr"
    bundle = mjarchive.ModelBundle.from_file(mug_xml)
    nq = bundle.layout.nq
    with mjarchive.create(path, bundle, world_ids=[5], chunk_frames=2) as writer:
        writer.append(np.array([0.1, 0.2]), np.tile(bundle.compile().qpos0, (2, 1, 1)))
    attrs = check_conforms(path)
    assets = check_bundle(path, attrs)
    assert {Path(n).suffix.lower() for n in assets} >= {".obj", ".png"}
    assert attrs["model"]["layout"]["nq"] == nq and attrs["n_frames"] == 2


# -- the checked-in example --------------------------------------------------------------------------
def test_example_conforms_and_is_tiny():
    root = SPEC / "example"
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 64 * 1024
    attrs = check_conforms(root)
    assert attrs["world_ids"] == list(make_example.WORLD_IDS) == [3, 11]
    assert attrs["n_frames"] == make_example.N_FRAMES == 5 and attrs["status"] == "finalized"
    assert attrs["storage"] == {"dtype": "float64", "precision": None, "chunk_frames": 4,
                                "chunk_worlds": 1, "shard_worlds": 2}
    assert attrs["tracks"] == {"reward": {"shape": [], "dtype": "float64"}}
    assert check_bundle(root, attrs) == make_example.ASSETS


def _json_block_after(marker: str) -> dict:
    start = README.index(marker)
    block = re.search(r"```json\n(.*?)```", README[start:], flags=re.S).group(1)
    return json.loads(block)


def test_spec_text_shows_the_example_as_stored():
    root = SPEC / "example"
    stored = json.loads((root / "zarr.json").read_text())["attributes"]["mjarchive"]
    shown = _json_block_after("Root attributes of the example:")
    for volatile in ("created", "producer", "mujoco_version"):
        shown.pop(volatile), stored.pop(volatile)
    assert shown == stored, "spec/README.md shows stale example attributes; update it from spec/example/zarr.json"
    bundle = json.loads((root / "model" / "zarr.json").read_text())["attributes"]
    assert _json_block_after("The group `model` MUST carry the attribute") == bundle


def test_example_reads_back_exactly():
    expected = make_example.expected()
    with mjarchive.open(SPEC / "example") as archive:
        assert archive.world_ids == (3, 11) and archive.n_frames == 5 and archive.status == "finalized"
        assert archive.format_version == "1.3" and archive.nq == 2 and archive.nmocap == 1
        assert archive.output_fps == 32.0 and archive.playback_speed == 1.0 and archive.timestep == 2.0**-7
        assert set(archive.tracks) == {"reward"}
        sel = archive.select()
        for name in ("qpos", "mocap_pos", "mocap_quat", "reset"):
            value = getattr(sel, name)
            assert value.dtype == expected[name].dtype, name
            np.testing.assert_array_equal(value, expected[name])
        np.testing.assert_array_equal(archive.time, expected["time"])
        np.testing.assert_array_equal(sel.track("reward"), expected["reward"])
        np.testing.assert_array_equal(archive.select(worlds=[11], frames=slice(2, 5)).qpos, expected["qpos"][2:5, 1:])
        assert archive.episodes(3) == [range(0, 5)]
        assert archive.episodes(11) == [range(0, 3), range(3, 5)]
        model = archive.model()
        assert (model.nq, model.nmocap, model.nmesh) == (2, 1, 1)
        assert [model.joint(j).name for j in range(model.njnt)] == ["shoulder", "elbow"]
        report = archive.verify()
        assert report.ok, str(report)


def test_example_matches_its_generator(tmp_path):
    fresh = make_example.write(tmp_path / "example")
    old, new = check_conforms(SPEC / "example"), check_conforms(fresh)
    volatile = {"created", "producer", "mujoco_version", "model"}
    assert {k: v for k, v in old.items() if k not in volatile} == {k: v for k, v in new.items() if k not in volatile}
    assert old["model"]["layout"] == new["model"]["layout"]
    if old["mujoco_version"] == new["mujoco_version"]:
        assert old["model"]["sha256"] == new["model"]["sha256"]
    for key in ("time", "qpos", "mocap_pos", "mocap_quat", "reset", "reward", "world_id"):
        np.testing.assert_array_equal(zarr.open_array(SPEC / "example" / key, mode="r")[:],
                                      zarr.open_array(fresh / key, mode="r")[:])


def test_example_opens_in_xarray_with_named_dimensions():
    xr = pytest.importorskip("xarray")
    expected = make_example.expected()
    ds = xr.open_zarr(SPEC / "example", consolidated=False)
    assert ds["qpos"].dims == ("frame", "world", "q")
    assert ds["mocap_quat"].dims == ("frame", "world", "mocap", "wxyz")
    assert ds["world_id"].dims == ("world",) and ds["world_id"].values.tolist() == [3, 11]
    np.testing.assert_array_equal(ds["reward"].values, expected["reward"])
    assert ds.attrs["mjarchive"]["n_frames"] == ds.sizes["frame"]


# -- normative reader rules, exercised on copies of the example --------------------------------------
def _tampered_example(tmp_path: Path, **changes) -> Path:
    root = tmp_path / "example"
    shutil.copytree(SPEC / "example", root)
    shutil.rmtree(root / "_commit", ignore_errors=True)  # the root attributes alone are the commit record
    doc = json.loads((root / "zarr.json").read_text())
    doc["attributes"]["mjarchive"].update(changes)
    (root / "zarr.json").write_text(json.dumps(doc))
    return root


def test_reader_rejects_newer_major_version(tmp_path):
    with pytest.raises(FormatVersionError, match="newer"):
        mjarchive.open(_tampered_example(tmp_path, format_version="2.0"))


def test_reader_ignores_unknown_keys_and_arrays_of_newer_minor_version(tmp_path):
    root = _tampered_example(tmp_path, format_version="1.7", future_key={"anything": [1, 2]},
                             producer={"name": "x", "version": "9", "backend": "cpu", "host": "h"})
    zarr.open_group(root, mode="r+").create_array("future_array", shape=(5,), dtype="float32")
    with mjarchive.open(root) as archive:
        assert archive.format_version == "1.7" and archive.n_frames == 5
        np.testing.assert_array_equal(archive.select().qpos, make_example.expected()["qpos"])


def test_reader_trusts_only_the_committed_count(tmp_path):
    with mjarchive.open(_tampered_example(tmp_path, n_frames=3, status="live")) as archive:
        assert archive.n_frames == 3 and archive.status == "live"
        np.testing.assert_array_equal(archive.select().qpos, make_example.expected()["qpos"][:3])
        assert archive.episodes(11) == [range(0, 3)]


@pytest.mark.parametrize("n_frames", [6, -1, 2.5, True, "5"])
def test_reader_rejects_bad_committed_count(tmp_path, n_frames):
    with pytest.raises(FormatError):
        mjarchive.open(_tampered_example(tmp_path, n_frames=n_frames))


def test_mocap_only_model_with_nq_0_records_conforms_and_replays(tmp_path):
    import mujoco

    xml = """<mujoco><worldbody><camera name="cam" pos="0 -1 0" xyaxes="1 0 0 0 0 1"/>
      <body name="target" mocap="true"><geom size="0.05"/></body></worldbody></mujoco>"""
    path = tmp_path / "mocap.zarr"
    pos = np.arange(3 * 2 * 3, dtype=np.float32).reshape(3, 2, 1, 3) / 8
    quat = np.tile(np.float32([1, 0, 0, 0]), (3, 2, 1, 1))
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(xml), world_ids=[0, 1], chunk_frames=2) as writer:
        for f in range(3):
            writer.append(0.1 * (f + 1), np.zeros((2, 0)), mocap_pos=pos[f], mocap_quat=quat[f])
    attrs = check_conforms(path)
    assert attrs["model"]["layout"]["nq"] == 0 and attrs["cameras"] == ["cam"]
    with mjarchive.open(path) as archive:
        sel = archive.select()
        assert sel.qpos.shape == (3, 2, 0)
        np.testing.assert_array_equal(sel.mocap_pos, pos)
        assert archive.verify().ok
        model = archive.model()
        data = mujoco.MjData(model)
        data.mocap_pos[:] = sel.mocap_pos[2, 1]
        mujoco.mj_kinematics(model, data)
        np.testing.assert_array_equal(data.xpos[1], pos[2, 1, 0])
