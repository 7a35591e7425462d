"""Hostile bundles and archives: each gets a specific mjarchive error, opens no outside file and
never unpickles.

How "no file outside the bundle was opened" is detected: `mjarchive.testing.OpenWatcher` puts a
Linux inotify watch on the directory holding the sentinel files. The kernel reports every open or
read of a file in that directory by any code (MuJoCo's C loader included), independent of atime
and `noatime` mounts. `test_sentinel_detects_mujoco_opening_outside_files` is the positive
control: the same hostile XML compiled directly by MuJoCo does open the sentinel and is detected.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr

import mjarchive
from mjarchive import (
    FormatError,
    FormatVersionError,
    MjArchiveError,
    ModelBundle,
    SelectionError,
    UnsafeBundleError,
)
from mjarchive.testing import OpenWatcher

pytestmark = pytest.mark.skipif(not OpenWatcher.available(), reason="the sentinel check needs Linux inotify")

_XML = """<mujoco><compiler{compiler}/><asset><mesh name="tet" file="{file}"/>{extra_asset}</asset>{include}
<worldbody><body name="b"><joint name="hinge"/><geom type="mesh" mesh="tet"/></body></worldbody></mujoco>"""


def _xml(file: str = "tet.stl", compiler: str = "", include: str = "", extra_asset: str = "") -> str:
    return _XML.format(file=file, compiler=compiler, include=include, extra_asset=extra_asset)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bundle_hash(xml: bytes, assets: dict[str, bytes]) -> str:
    """The bundle hash as the spec defines it, computed independently (so an attacker can forge it)."""
    h = hashlib.sha256(b"mjarchive-bundle-v1\0")
    h.update(_sha(xml).encode() + b"\0")
    for name in sorted(assets):
        h.update(name.encode() + b"\0" + _sha(assets[name]).encode() + b"\0")
    return h.hexdigest()


@pytest.fixture
def tet(test_data) -> bytes:
    return (test_data / "meshes" / "tetrahedron.stl").read_bytes()


@pytest.fixture
def outside(tmp_path, tet, monkeypatch) -> Path:
    """A directory outside every bundle holding sentinels; the working directory is a child of it,
    so relative '../x' references resolve into it."""
    out = tmp_path / "outside"
    (out / "cwd").mkdir(parents=True)
    for name in ("sentinel.stl", "tet.stl"):
        (out / name).write_bytes(tet)
    shutil.copy(Path(mujoco.__file__).parent / "__init__.py", out / "not_a_texture.png")
    (out / "inc.xml").write_text('<mujoco><worldbody><geom size="1"/></worldbody></mujoco>')
    monkeypatch.chdir(out / "cwd")
    return out


def _good_bundle_group(tmp_path: Path, tet: bytes) -> Path:
    path = tmp_path / "bundle.zarr"
    ModelBundle.from_xml(_xml(), {"tet.stl": tet}).to_zarr(zarr.open_group(path, mode="w"))
    return path


def _forge(path: Path, *, xml: str | None = None, rename: str | None = None) -> None:
    """Rewrite a stored bundle the way an attacker would: new XML and/or asset name, all hashes
    recomputed so that only the safety checks can catch it."""
    group = zarr.open_group(path, mode="r+")["model"]
    meta = group.attrs.asdict()["mjarchive_bundle"]
    xml_bytes = group["xml"][:].tobytes()
    if xml is not None:
        xml_bytes = xml.encode()
        del group["xml"]
        arr = group.create_array("xml", shape=(len(xml_bytes),), dtype="uint8", chunks=(len(xml_bytes),))
        arr[:] = np.frombuffer(xml_bytes, np.uint8)
        meta["xml"] = {"size": len(xml_bytes), "sha256": _sha(xml_bytes)}
    if rename is not None:
        meta["assets"][0]["name"] = rename
    assets = {e["name"]: group[e["key"]][:].tobytes() for e in meta["assets"]}
    meta["sha256"] = _bundle_hash(xml_bytes, assets)
    group.attrs.put({"mjarchive_bundle": meta})


def _load(path: Path) -> ModelBundle:
    return ModelBundle.from_zarr(zarr.open_group(path, mode="r"))


# -- the detector works, and the threat is real ---------------------------------------------------

@pytest.mark.parametrize("case", ["absolute_file", "relative_parent", "absolute_meshdir", "include"])
def test_sentinel_detects_mujoco_opening_outside_files(case, outside, tet):
    xml = {
        "absolute_file": _xml(file=str(outside / "sentinel.stl")),
        "relative_parent": _xml(file="../sentinel.stl"),
        "absolute_meshdir": _xml(file="sentinel.stl", compiler=f' meshdir="{outside}"'),
        "include": _xml(include=f'<include file="{outside / "inc.xml"}"/>'),
    }[case]
    with OpenWatcher([outside]) as watcher:
        try:
            mujoco.MjModel.from_xml_string(xml, {"tet.stl": tet})
        except ValueError:
            pass
        assert watcher.events(), "MuJoCo was expected to open a file outside the bundle"


# -- hostile bundles --------------------------------------------------------------------------------

def test_good_bundle_loads(tmp_path, tet, outside):
    path = _good_bundle_group(tmp_path, tet)
    with OpenWatcher([outside]) as watcher:
        assert _load(path).compile().nmesh == 1
        assert watcher.events() == []


@pytest.mark.parametrize("name", [
    "/abs/sentinel.stl", "OUTSIDE/sentinel.stl", "../sentinel.stl", "..", "a..b.stl", "sub/tet.stl",
    "sub\\tet.stl", "tet\n.stl", "tet\x00.stl", "tet\x1b.stl", "", ".hidden",
])
def test_hostile_asset_names(name, tmp_path, tet, outside):
    name = name.replace("OUTSIDE", str(outside)).replace("/abs", str(outside))
    path = _good_bundle_group(tmp_path, tet)
    _forge(path, xml=_xml(file=name), rename=name)
    with OpenWatcher([outside]) as watcher:
        with pytest.raises(UnsafeBundleError, match="not a flat file name"):
            _load(path)
        with pytest.raises(UnsafeBundleError):
            ModelBundle(_xml(file=name), {name: tet})
        assert watcher.events() == []


@pytest.mark.parametrize("case", [
    "absolute_file", "relative_parent", "meshdir", "texturedir", "assetdir", "include_absolute",
    "include_member", "texture_cube_face",
])
def test_hostile_xml_references(case, tmp_path, tet, outside):
    xml, match = {
        "absolute_file": (_xml(file=str(outside / "sentinel.stl")), "not a bundle member"),
        "relative_parent": (_xml(file="../sentinel.stl"), "not a bundle member"),
        "meshdir": (_xml(file="sentinel.stl", compiler=f' meshdir="{outside}"'), "meshdir"),
        "texturedir": (_xml(compiler=' texturedir="../"',
                            extra_asset='<texture name="t" type="2d" file="not_a_texture.png"/>'), "texturedir"),
        "assetdir": (_xml(file="sentinel.stl", compiler=' assetdir=".."'), "assetdir"),
        "include_absolute": (_xml(include=f'<include file="{outside / "inc.xml"}"/>'), "include"),
        "include_member": (_xml(include='<include file="tet.stl"/>'), "include"),
        "texture_cube_face": (_xml(extra_asset=f'<texture name="c" type="cube" fileright="tet.stl" '
                                              f'fileleft="{outside / "sentinel.stl"}"/>'), "fileleft"),
    }[case]
    path = _good_bundle_group(tmp_path, tet)
    _forge(path, xml=xml)
    with OpenWatcher([outside]) as watcher:
        with pytest.raises(UnsafeBundleError, match=match):
            _load(path)
        forged = ModelBundle(xml, {"tet.stl": tet})  # constructed directly, it still refuses to compile
        with pytest.raises(UnsafeBundleError, match=match):
            forged.compile()
        with pytest.raises(UnsafeBundleError, match=match):
            forged.spec()
        assert watcher.events() == []


def test_tampered_asset_bytes(tmp_path, tet, outside):
    path = _good_bundle_group(tmp_path, tet)
    arr = zarr.open_group(path, mode="r+")["model"]["asset_00000"]
    data = arr[:]
    data[10] ^= 0xFF
    arr[:] = data
    with OpenWatcher([outside]) as watcher:
        with pytest.raises(UnsafeBundleError, match="sha256"):
            _load(path)
        assert watcher.events() == []


@pytest.mark.parametrize("stored", ["0" * 64, None, 42])
def test_tampered_bundle_hash(stored, tmp_path, tet, outside):
    path = _good_bundle_group(tmp_path, tet)
    group = zarr.open_group(path, mode="r+")["model"]
    meta = group.attrs.asdict()["mjarchive_bundle"]
    meta["sha256"] = stored
    group.attrs.put({"mjarchive_bundle": meta})
    with OpenWatcher([outside]) as watcher:
        with pytest.raises(UnsafeBundleError, match="hash mismatch"):
            _load(path)
        assert watcher.events() == []


@pytest.mark.parametrize("edit", ["key_traversal", "duplicate_name", "size_lie", "too_large", "no_attrs"])
def test_malformed_bundle_metadata(edit, tmp_path, tet, outside):
    path = _good_bundle_group(tmp_path, tet)
    group = zarr.open_group(path, mode="r+")["model"]
    meta = group.attrs.asdict()["mjarchive_bundle"]
    if edit == "key_traversal":
        meta["assets"][0]["key"] = "../../outside/sentinel"
    elif edit == "duplicate_name":
        meta["assets"].append(dict(meta["assets"][0], key="asset_00001"))
    elif edit == "size_lie":
        meta["assets"][0]["size"] += 1
    elif edit == "too_large":
        meta["assets"][0]["size"] = 2**60
    else:
        meta = "nothing here"
    group.attrs.put({"mjarchive_bundle": meta})
    with OpenWatcher([outside]) as watcher:
        with pytest.raises(MjArchiveError) as info:
            _load(path)
        assert isinstance(info.value, (UnsafeBundleError, FormatError))
        assert watcher.events() == []


# -- hostile archives -----------------------------------------------------------------------------

W, NQ, T, CF = 3, 1, 10, 4


@pytest.fixture(scope="module")
def _pristine_archive(tmp_path_factory, test_data) -> Path:
    tet = (test_data / "meshes" / "tetrahedron.stl").read_bytes()
    path = tmp_path_factory.mktemp("pristine") / "a.zarr"
    with mjarchive.create(path, ModelBundle.from_xml(_xml(), {"tet.stl": tet}), world_ids=[5, 9, 11],
                          chunk_frames=CF, tracks={"reward": ()}) as writer:
        for i in range(T):
            writer.append(0.1 * (i + 1), np.full((W, NQ), i + 1.0), reward=np.full(W, 2.0 * i))
    return path


@pytest.fixture
def archive(_pristine_archive, tmp_path) -> Path:
    """A fresh copy of a small finalized archive (worlds 5, 9, 11; 10 frames; track 'reward')."""
    return Path(shutil.copytree(_pristine_archive, tmp_path / "a.zarr"))


def _edit_json(path: Path, fn) -> None:
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


def _edit_manifest(archive: Path, fn) -> None:
    _edit_json(archive / "zarr.json", lambda meta: fn(meta["attributes"]["mjarchive"]))


def _set(key, value):
    def fn(m):
        m[key] = value
    return fn


def _fails_cleanly(archive: Path, error=MjArchiveError, match=None) -> MjArchiveError:
    """Opening (and, if that succeeds, reading and verifying) fails with an mjarchive error."""
    with pytest.raises(error, match=match) as info:
        with mjarchive.open(archive) as a:
            report = a.verify()
            if not report.ok:
                raise FormatError("; ".join(report.problems))
            a.select().qpos
    return info.value


def test_untampered_archive_is_fine(archive):
    with mjarchive.open(archive) as a:
        assert a.verify().ok and a.n_frames == T


@pytest.mark.parametrize("value", [-1, 2.5, 3.0, "5", None, True, [3], T + 1, 2**45, 2**70])
def test_tampered_committed_count(archive, value):
    _edit_manifest(archive, _set("n_frames", value))
    _fails_cleanly(archive, FormatError, "n_frames|frame count")


def test_committed_count_beyond_written_data_in_live_archive(archive):
    # The arrays may be longer than the commit (pre-grown); a count beyond the array is refused.
    _edit_json(archive / "qpos" / "zarr.json", lambda m: m.__setitem__("shape", [T - 1, W, NQ]))
    _fails_cleanly(archive, FormatError, "n_frames")


@pytest.mark.parametrize("edit", ["huge_frames", "huge_chunk", "wrong_worlds", "wrong_nq", "huge_world_list"])
def test_huge_or_inconsistent_declared_shapes(archive, edit):
    qpos_json = archive / "qpos" / "zarr.json"
    if edit == "huge_frames":
        _edit_json(qpos_json, lambda m: m.__setitem__("shape", [2**50, W, NQ]))
        _edit_manifest(archive, _set("n_frames", 2**50))
    elif edit == "huge_chunk":
        def fn(m):
            m["chunk_grid"]["configuration"]["chunk_shape"] = [2**30, W, NQ]
            m["codecs"][0]["configuration"]["chunk_shape"] = [2**30, 1, NQ]
        _edit_json(qpos_json, fn)
    elif edit == "wrong_worlds":
        _edit_json(qpos_json, lambda m: m.__setitem__("shape", [T, 2**40, NQ]))
    elif edit == "wrong_nq":
        _edit_json(qpos_json, lambda m: m.__setitem__("shape", [T, W, 10**6]))
    else:
        _edit_manifest(archive, _set("world_ids", list(range(2**21))))
    _fails_cleanly(archive, FormatError)


@pytest.mark.parametrize("edit", ["inner_chunk_frames", "inner_chunk_worlds", "shard_spans_frames"])
def test_chunking_differs_from_manifest(archive, edit):
    def fn(m):
        inner = m["codecs"][0]["configuration"]["chunk_shape"]
        outer = m["chunk_grid"]["configuration"]["chunk_shape"]
        if edit == "inner_chunk_frames":
            inner[0], outer[0] = CF + 1, CF + 1
        elif edit == "inner_chunk_worlds":
            inner[1] = W
        else:
            outer[0] = 2 * CF
    _edit_json(archive / "qpos" / "zarr.json", fn)
    _fails_cleanly(archive, FormatError, "chunked")


def test_pickle_codec_is_refused_and_never_unpickled(archive, tmp_path):
    marker = tmp_path / "UNPICKLED"

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (marker,))

    payload = pickle.dumps(Exploit())
    for chunk in (archive / "qpos" / "c").rglob("*"):
        if chunk.is_file():
            chunk.write_bytes(payload)

    def add_pickle(m):
        m["codecs"] = [{"name": "numcodecs.pickle", "configuration": {"protocol": 5}}]
        m["chunk_grid"]["configuration"]["chunk_shape"] = [CF, W, NQ]
    _edit_json(archive / "qpos" / "zarr.json", add_pickle)
    error = _fails_cleanly(archive, FormatError)
    assert "pickle" in str(error) or "codec" in str(error) or "unreadable" in str(error)
    assert not marker.exists()

    # A pickle codec nested inside the sharding codec is found too.
    def nested(m):
        m["codecs"] = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [CF, 1, NQ], "codecs": [{"name": "numcodecs.pickle"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]
    _edit_json(archive / "qpos" / "zarr.json", nested)
    _fails_cleanly(archive, FormatError)
    assert not marker.exists()


@pytest.mark.parametrize("array", ["qpos", "time"])
def test_truncated_chunk(archive, array):
    chunk = archive / array / "c" / "0" / ("0/0" if array == "qpos" else "")
    chunk = chunk if chunk.is_file() else archive / array / "c" / "0"
    data = chunk.read_bytes()
    chunk.write_bytes(data[: len(data) // 2])
    with mjarchive.open(archive) as a:
        report = a.verify()
        assert not report.ok
        assert any(array in p for p in report.problems)
        with pytest.raises(FormatError, match=array):
            getattr(a.select(frames=slice(0, CF)), array)


def test_tampered_bundle_hash_in_archive(archive):
    group = zarr.open_group(archive, mode="r+")["model"]
    meta = group.attrs.asdict()["mjarchive_bundle"]
    meta["sha256"] = "f" * 64
    group.attrs.put({"mjarchive_bundle": meta})
    with mjarchive.open(archive) as a:
        report = a.verify()
        assert not report.ok and any("hash" in p for p in report.problems)
        with pytest.raises(UnsafeBundleError):
            a.model()


def test_manifest_model_hash_differs_from_bundle(archive):
    _edit_manifest(archive, lambda m: m["model"].__setitem__("sha256", "0" * 64))
    with mjarchive.open(archive) as a:
        assert not a.verify().ok
        with pytest.raises(FormatError, match="hash"):
            a.bundle


@pytest.mark.parametrize("name", ["../outside/x", "/abs", "qpos", "model", "Reward", "a/b", "x" * 65, "r\x00"])
def test_traversal_key_or_hostile_track_name(archive, name, tmp_path):
    watched = tmp_path / "outside_archive"
    watched.mkdir()
    (watched / "zarr.json").write_text(
        (archive / "reset" / "zarr.json").read_text())  # a plausible target for a '../' key
    _edit_manifest(archive, lambda m: m["tracks"].__setitem__(name, {"shape": [], "dtype": "float32"}))
    with OpenWatcher([watched]) as watcher:
        _fails_cleanly(archive, FormatError, "track name|tracks")
        assert watcher.events() == []


@pytest.mark.parametrize("track", [{"shape": [], "dtype": "object"}, {"shape": [2**17], "dtype": "float32"},
                                   {"shape": [1, 1, 1, 1, 1], "dtype": "int8"}, {"shape": [-1]}])
def test_hostile_track_declaration(archive, track):
    _edit_manifest(archive, lambda m: m["tracks"].__setitem__("reward", track))
    _fails_cleanly(archive, FormatError)


@pytest.mark.parametrize("dtype", ["float16", "|O", "complex128"])
def test_unlisted_array_dtype(archive, dtype):
    _edit_json(archive / "qpos" / "zarr.json", lambda m: m.__setitem__("data_type", dtype))
    _fails_cleanly(archive, FormatError)


@pytest.mark.parametrize("version", ["2.0", "10.3"])
def test_newer_major_version(archive, version):
    _edit_manifest(archive, _set("format_version", version))
    error = _fails_cleanly(archive, FormatVersionError, "newer")
    assert "upgrade" in str(error)


@pytest.mark.parametrize("version", ["1", "v1.0", 1.0, "1.0.0", "0.9"])
def test_malformed_or_older_version(archive, version):
    _edit_manifest(archive, _set("format_version", version))
    _fails_cleanly(archive, FormatError)


def test_newer_minor_version_still_opens(archive):
    _edit_manifest(archive, _set("format_version", "1.9"))
    with mjarchive.open(archive) as a:
        assert a.format_version == "1.9" and a.verify().ok


@pytest.mark.parametrize("edit", [
    _set("world_ids", [5, 5, 11]), _set("world_ids", [5, -9, 11]), _set("world_ids", [5, 9]),
    _set("status", "exploded"), _set("timestep", -1.0), _set("format", "other"), _set("cameras", ["ghost"]),
    lambda m: m.pop("storage"), lambda m: m["storage"].__setitem__("dtype", "float16"),
    lambda m: m["model"]["layout"].__setitem__("nq", "1"),
])
def test_malformed_manifest(archive, edit):
    _edit_manifest(archive, edit)
    _fails_cleanly(archive, FormatError)


def test_garbage_root_metadata(archive):
    (archive / "zarr.json").write_text("{not json")
    _fails_cleanly(archive, MjArchiveError)


def test_world_id_array_tampered(archive):
    arr = zarr.open_array(archive / "world_id", mode="r+")
    arr[:] = [5, 9, 12]
    with mjarchive.open(archive) as a:
        report = a.verify()
        assert not report.ok and any("world_id" in p for p in report.problems)


def test_non_finite_values_are_reported(archive):
    arr = zarr.open_array(archive / "qpos", mode="r+")
    arr[2, 1, 0] = np.nan
    with mjarchive.open(archive) as a:
        report = a.verify()
        assert not report.ok and any("non-finite" in p for p in report.problems)
        with pytest.raises(SelectionError):
            a.select(worlds=[6])
