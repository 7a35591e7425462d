"""Hostile model bundles inside real archives: parser differentials, sub-models, compile and render
bombs, and caches that trust claims. Each case runs every entry point that touches the model in a
child process with time and memory limits (tests/hostile.py), asserting the error class and that
nothing outside the archive was opened, read or written."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zlib
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr

import hostile
import mjarchive
from mjarchive.archive.bundle import sandbox
from mjarchive.archive.bundle.compile_child import Refused, check_spec_files
from mjarchive.testing import OpenWatcher

pytestmark = pytest.mark.skipif(not OpenWatcher.available(), reason="needs Linux inotify")

MODEL_ENTRIES = ("model", "verify", "render", "cli_info", "cli_export_model", "cli_render")

_BASE = """<mujoco>{head}<asset><mesh name="tet" file="tet.stl"/>{asset}</asset>
<worldbody><light pos="0 0 3"/><camera name="cam" pos="0 -1 0.3" xyaxes="1 0 0 0 0.3 1"/>
<body name="b"><joint name="hinge"/><geom type="mesh" mesh="tet"/>{body}</body></worldbody></mujoco>"""


def _xml(head: str = "", asset: str = "", body: str = "", prolog: str = "") -> str:
    return prolog + _BASE.format(head=head, asset=asset, body=body)


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares width x height (followed by a tiny, truncated image)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + b"\0" * 32


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def forge_bundle(archive: Path, xml: str | bytes, assets: dict[str, bytes], *, manifest_hash: str | None = None) -> None:
    """Replace an archive's bundle the way an attacker would: every hash recomputed (the bundle's,
    each member's, and the manifest's model.sha256), so only the safety checks can refuse it."""
    xml_bytes = xml.encode() if isinstance(xml, str) else xml
    root = zarr.open_group(archive, mode="r+")
    del root["model"]
    group = root.create_group("model")
    entries = []
    for i, (key, data) in enumerate([("xml", xml_bytes)] + [(f"asset_{i:05d}", d) for i, d in enumerate(assets.values())]):
        arr = group.create_array(key, shape=(len(data),), dtype="uint8", chunks=(max(1, len(data)),))
        if data:
            arr[:] = np.frombuffer(data, np.uint8)
    for i, (name, data) in enumerate(assets.items()):
        entries.append({"name": name, "key": f"asset_{i:05d}", "size": len(data), "sha256": _sha(data)})
    h = hashlib.sha256(b"mjarchive-bundle-v1\0")
    h.update(_sha(xml_bytes).encode() + b"\0")
    for name in sorted(assets):
        h.update(name.encode() + b"\0" + _sha(assets[name]).encode() + b"\0")
    group.attrs.put({"mjarchive_bundle": {"sha256": h.hexdigest(), "xml": {"size": len(xml_bytes),
                                          "sha256": _sha(xml_bytes)}, "assets": entries}})
    attrs = root.attrs.asdict()
    attrs["mjarchive"]["model"]["sha256"] = manifest_hash or h.hexdigest()
    root.attrs.put(attrs)


@pytest.fixture(scope="module")
def tet(test_data) -> bytes:
    return (test_data / "meshes" / "tetrahedron.stl").read_bytes()


@pytest.fixture(scope="module")
def base_archive(tmp_path_factory, tet) -> Path:
    path = tmp_path_factory.mktemp("base") / "base.mjarchive"
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(_xml(), {"tet.stl": tet}), n_worlds=2,
                          chunk_frames=4) as w:
        w.append(np.arange(1, 4) / 10, np.zeros((3, 2, 1)))
    return path


@pytest.fixture
def outside(tmp_path, tet) -> Path:
    """Files an attacker would like read: the watched directory, also the working directory."""
    out = tmp_path / "outside"
    out.mkdir()
    for name in ("sentinel.stl", "tet.stl"):
        (out / name).write_bytes(tet)
    (out / "sub.xml").write_text(_xml().replace('file="tet.stl"', 'file="sentinel.stl"'))
    (out / "entity.txt").write_text("sentinel.stl")
    return out


def _case_archive(tmp_path: Path, base: Path, xml: str, assets: dict[str, bytes]) -> Path:
    path = tmp_path / "hostile.mjarchive"
    shutil.copytree(base, path)
    forge_bundle(path, xml, assets)
    return path


def _run_all(archive: Path, tmp_path: Path, outside: Path, entries=MODEL_ENTRIES) -> dict[str, hostile.Outcome]:
    return {e: hostile.run(e, archive, tmp_path / "out" / e, watch=[outside], cwd=outside) for e in entries}


def _assert_refused(outcomes: dict[str, hostile.Outcome], error: str, match: str) -> None:
    for entry, o in outcomes.items():
        assert o.touched_outside == (), (entry, o)
        if entry == "verify" and o.status == "ok":
            assert o.verify_ok is False and match in o.message, (entry, o)
            continue
        if entry == "cli_info" and o.status == "ok":  # info reports an unreadable model and goes on
            continue
        assert o.status == "error", (entry, o)
        if entry.startswith("cli_"):
            assert match in o.message, (entry, o)
        else:
            assert error in o.classes and match in o.message, (entry, o)


# -- the harness and the threats are real -------------------------------------------------------------

def test_undamaged_archive_works_everywhere(base_archive, tmp_path, outside):
    for entry, o in _run_all(base_archive, tmp_path, outside).items():
        assert o.status == "ok" and o.clean, (entry, o)


def test_bundle_xml_that_is_not_utf8_is_a_format_error_everywhere(base_archive, tmp_path, outside, tet):
    """Hashes recomputed over bytes that are not UTF-8: a FormatError at every entry point, never a
    UnicodeDecodeError traceback."""
    xml = _xml().encode() + b"<!-- \xff\xfe -->"
    outcomes = _run_all(_case_archive(tmp_path, base_archive, xml, {"tet.stl": tet}), tmp_path, outside)
    _assert_refused(outcomes, "FormatError", "not valid UTF-8")


def test_mujoco_reads_submodels_from_the_host_disk(outside, tet):
    """Positive control: MuJoCo opens <model file=...> from the working directory, ignoring the
    assets dict, so a bundle member of that name cannot make it safe."""
    import os

    main = _xml(asset='<model name="sub" file="sub.xml"/>', body='<attach model="sub" prefix="s_"/>')
    cwd = os.getcwd()
    os.chdir(outside)
    try:
        with OpenWatcher([outside]) as watcher:
            try:
                mujoco.MjSpec.from_string(main, assets={"tet.stl": tet, "sub.xml": b"<mujoco/>"})
            except ValueError:
                pass
            assert any(e.endswith("sub.xml") for e in watcher.events())
    finally:
        os.chdir(cwd)


# -- class 1: the XML the checker reads is the XML MuJoCo compiles -------------------------------------

XML_CASES = {
    "doctype_internal_entity": (_xml(prolog='<!DOCTYPE mujoco [<!ENTITY f "sentinel.stl">]>\n').replace(
        'file="tet.stl"', 'file="&f;"'), "DOCTYPE"),
    "doctype_external_id": (_xml(prolog='<!DOCTYPE mujoco SYSTEM "../outside/entity.txt">\n'), "DOCTYPE"),
    "processing_instruction": (_xml(prolog='<?xml-stylesheet href="../outside/sub.xml"?>\n'), "processing"),
    "second_xml_declaration": (_xml(head='<?xml version="1.0"?>'), "processing"),
    "character_reference": (_xml().replace('file="tet.stl"', 'file="&#116;et.stl"'), "character reference"),
    "cdata": (_xml(body="<![CDATA[ <include file='../outside/sub.xml'/> ]]>"), "CDATA"),
    "namespaced_attribute": (_xml(head='<compiler xmlns:x="urn:x" x:meshdir="../outside"/>'), "namespaced"),
    "nul_character": (_xml(body="<!-- \x00 -->"), "control character"),
    "submodel": (_xml(asset='<model name="sub" file="sub.xml"/>', body='<attach model="sub" prefix="s_"/>'),
                 "sub-model"),
    "deep_nesting": (_xml(body="<frame>" * 600 + "</frame>" * 600), "nests"),
    "very_deep_nesting": (_xml(body="<frame>" * 1_000_000 + "</frame>" * 1_000_000), "nests"),
    "too_many_elements": (_xml(body="<frame/>" * 300_000), "elements"),
}


@pytest.mark.parametrize("case", sorted(XML_CASES))
def test_parser_differentials_are_refused_before_mujoco_parses(case, base_archive, tmp_path, outside, tet):
    xml, match = XML_CASES[case]
    assets = {"tet.stl": tet, **({"sub.xml": b"<mujoco/>"} if case == "submodel" else {})}
    archive = _case_archive(tmp_path, base_archive, xml, assets)
    _assert_refused(_run_all(archive, tmp_path, outside), "UnsafeBundleError", match)


def test_parsed_spec_is_checked_again_before_compiling(tet):
    """Second line of defence: file references in the parsed MjSpec itself."""
    spec = mujoco.MjSpec.from_string(_xml(), assets={"tet.stl": tet})
    check_spec_files(spec, {"tet.stl": tet})
    spec.meshes[0].file = "../outside/sentinel.stl"
    with pytest.raises(Refused, match="not a bundle member"):
        check_spec_files(spec, {"tet.stl": tet})
    spec.meshes[0].file = "tet.stl"
    spec.texturedir = "/etc"
    with pytest.raises(Refused, match="texturedir"):
        check_spec_files(spec, {"tet.stl": tet})


# -- class 4: compile and render bombs ---------------------------------------------------------------

BOMBS = {
    "replicate": (_xml(body='<replicate count="1000" euler="0 0 1"><replicate count="1000" euler="0 0 1">'
                            '<geom size="0.01"/></replicate></replicate>'), "UnsafeBundleError", "replicate"),
    "builtin_texture": (_xml(asset='<texture name="t" type="2d" builtin="checker" width="100000" height="100000"/>'),
                        "UnsafeBundleError", "pixels"),
    "png_header": (_xml(asset='<texture name="t" type="2d" file="big.png"/>'), "UnsafeBundleError", "decodes to"),
    "composite_count": (_xml(body='<flexcomp name="f" type="grid" count="1000 1000 1" spacing=".1 .1 .1"/>'),
                        "UnsafeBundleError", "generates"),
    "shadow_size": (_xml(head='<visual><quality shadowsize="200000"/></visual>'), "BundleError", "shadowsize"),
    "offscreen_size": (_xml(head='<visual><global offwidth="100000" offheight="100"/></visual>'), "BundleError",
                       "offwidth"),
    "many_textures": (_xml(asset="".join(f'<texture name="t{i}" type="2d" builtin="flat" width="8192" height="8192"/>'
                                         for i in range(64))), "BundleError", "compiled safely"),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_compile_and_render_bombs_are_errors_not_dead_machines(case, base_archive, tmp_path, outside, tet):
    xml, error, match = BOMBS[case]
    assets = {"tet.stl": tet, **({"big.png": _png_header(60000, 60000)} if case == "png_header" else {})}
    archive = _case_archive(tmp_path, base_archive, xml, assets)
    entries = ("model", "verify", "render") if error == "BundleError" else MODEL_ENTRIES
    _assert_refused(_run_all(archive, tmp_path, outside, entries), error, match)


# MuJoCo's parser takes minutes for these (superlinear in the generated elements and expansions).
REPLICATE_BOMBS = {
    "one_count": _xml(body='<replicate count="100000" offset=".01 0 0"><geom size=".01"/></replicate>'),
    "many_siblings": _xml(body='<replicate count="10" offset=".01 0 0"><geom size=".01"/></replicate>' * 1000),
    "many_count_one": _xml(body='<replicate count="1"><geom size=".01"/></replicate>' * 3000),
    "plain_elements": _xml(body='<geom size=".01"/>' * 100_001),  # no replicate: parsing alone takes ~30 s
}


@pytest.mark.parametrize("case", sorted(REPLICATE_BOMBS))
def test_replicate_bombs_are_refused_from_the_xml_before_parsing(case, base_archive, tmp_path, outside, tet):
    archive = _case_archive(tmp_path, base_archive, REPLICATE_BOMBS[case], {"tet.stl": tet})
    outcomes = {e: hostile.run(e, archive, tmp_path / "out" / e, watch=[outside], cwd=outside, timeout=10)
                for e in ("model", "render")}
    _assert_refused(outcomes, "UnsafeBundleError", "elements" if case == "plain_elements" else "replicate")


# Simulation arenas a model declares; replay sizes its own (dm_control's rodent and fruitfly declare
# the legacy njmax/nconmax below: 3.4 GB, more than the compile sandbox's address space).
DECLARED_ARENAS = {"memory": '<size memory="64G"/>', "legacy": '<size njmax="8000" nconmax="4000"/>',
                   "nstack": '<size nstack="1000000000"/>'}


@pytest.mark.parametrize("case", sorted(DECLARED_ARENAS))
def test_declared_arenas_are_not_allocated_by_replay(case, base_archive, tmp_path, outside, tet):
    archive = _case_archive(tmp_path, base_archive, _xml(head=DECLARED_ARENAS[case]), {"tet.stl": tet})
    for entry, o in _run_all(archive, tmp_path, outside, ("model", "render", "cli_render")).items():
        assert o.status == "ok" and o.clean, (entry, o)


def _scene(n: int) -> dict:
    return {"copies": [[2.0 * k, 0.0, 0.0] for k in range(n)]}


def test_scene_copies_leave_user_arrays_out(humanoid_xml):
    """64 copies of a humanoid with 7 MiB of user arrays composed a 422 MiB scene (2.4 GiB to build):
    they show in no picture, so the scene costs what 64 plain humanoids do."""
    xml = humanoid_xml.read_text().replace('<mujoco model="Humanoid">',
                                           '<mujoco model="Humanoid"><size nuser_geom="45000"/>', 1)
    heavy, plain = mjarchive.ModelBundle.from_xml(xml), mjarchive.ModelBundle.from_file(humanoid_xml)
    assert mujoco.mj_sizeModel(heavy.compile()) > 5 * 2**20
    scene, benign = (sandbox.compile_untrusted(bundle, _scene(64)) for bundle in (heavy, plain))
    assert mujoco.mj_sizeModel(scene) <= 2 * mujoco.mj_sizeModel(benign)


_BODIES = "".join(f'<body pos="0 0 {k / 100}"><geom size=".01"/></body>' for k in range(5000))
_AXES = [f'type="{kind}" axis="{axis}"' for kind in ("hinge", "slide") for axis in ("1 0 0", "0 1 0", "0 0 1")]
_ARMS = "".join("<body>" + "".join(f'<joint name="j{6 * b + k}" {_AXES[k]}/>' for k in range(6))
                + '<geom size=".1"/></body>' for b in range(50))  # 300 joints: MuJoCo allows 6 dofs a body
# One copy is cheap; 64 are too costly to compose, which each check finds before composing them.
COSTLY_SCENES = {
    "elements": (f"<mujoco><worldbody>{_BODIES}</worldbody></mujoco>", "640064 elements"),  # took > 60 s
    "arena": (f"<mujoco><worldbody>{_ARMS}</worldbody><actuator>"
              + "".join(f'<motor joint="j{k}"/>' for k in range(300)) + "</actuator></mujoco>", "MiB of arena"),
    "size": ('<mujoco><custom><numeric name="n" size="1000000"/></custom><worldbody><geom size=".1"/></worldbody>'
             "</mujoco>", "MiB a copy"),
}


@pytest.mark.parametrize("case", sorted(COSTLY_SCENES))
def test_costly_scenes_are_refused_before_composing(case):
    xml, match = COSTLY_SCENES[case]
    try:
        mujoco.MjSpec.from_string(xml)
    except Exception as exc:  # MuJoCo 3.11 caps a numeric's size at 500
        pytest.skip(f"plain MuJoCo {mujoco.__version__} does not parse this model either: {exc}")
    bundle = mjarchive.ModelBundle.from_xml(xml)
    with pytest.raises(mjarchive.BundleError, match=f"scene of 64 copies.*{match}.*render fewer worlds"):
        sandbox.compile_untrusted(bundle, _scene(64))
    sandbox.compile_untrusted(bundle, _scene(2))


def test_compile_time_limit_stops_a_slow_compile(base_archive, monkeypatch):
    monkeypatch.setattr(sandbox, "COMPILE_TIMEOUT_S", 0.01)
    bundle = mjarchive.open(base_archive).bundle
    with pytest.raises(mjarchive.BundleError, match="longer than"):
        sandbox._compile_in_child(bundle)


def test_sandboxed_model_equals_in_process_compile(humanoid_xml, tmp_path):
    with mjarchive.create(tmp_path / "h.mjarchive", humanoid_xml, n_worlds=1) as w:
        w.append(0.1, np.zeros((1, 28)))
    archive = mjarchive.open(tmp_path / "h.mjarchive")
    sandboxed, direct = archive.model(), mjarchive.ModelBundle.from_file(humanoid_xml).compile()
    a, b = mujoco.MjData(sandboxed), mujoco.MjData(direct)
    a.qpos[:] = b.qpos[:] = np.linspace(-0.5, 0.5, 28)
    mujoco.mj_kinematics(sandboxed, a)
    mujoco.mj_kinematics(direct, b)
    np.testing.assert_array_equal(a.geom_xpos, b.geom_xpos)
    np.testing.assert_array_equal(a.geom_xmat, b.geom_xmat)


# -- class 6: caches trust content, not claims --------------------------------------------------------

def test_archive_claiming_another_bundle_hash_is_refused(base_archive, tmp_path, tet):
    real = mjarchive.open(base_archive)
    real.model()  # now cached in this process under the real bundle's hash
    claimed = real.manifest.model_sha256
    # No bundle at all, only the claim.
    bare = tmp_path / "bare.mjarchive"
    shutil.copytree(base_archive, bare)
    shutil.rmtree(bare / "model")
    with pytest.raises(mjarchive.FormatError, match="bundle"):
        mjarchive.open(bare).model()
    # Another bundle, whose manifest claims the real one's hash.
    other = tmp_path / "other.mjarchive"
    shutil.copytree(base_archive, other)
    forge_bundle(other, _xml().replace('name="b"', 'name="other"'), {"tet.stl": tet}, manifest_hash=claimed)
    with pytest.raises(mjarchive.MjArchiveError, match="hash"):
        mjarchive.open(other).model()
    from mjarchive.replay.worker import bundle_model

    with pytest.raises(mjarchive.MjArchiveError, match="hash"):
        bundle_model(mjarchive.open(other))


def test_cached_model_is_checked_against_each_archives_layout(base_archive, tmp_path):
    from mjarchive.replay.worker import bundle_model

    bundle_model(mjarchive.open(base_archive))  # cached
    renamed = tmp_path / "renamed.mjarchive"
    shutil.copytree(base_archive, renamed)
    attrs = json.loads((renamed / "zarr.json").read_text())
    attrs["attributes"]["mjarchive"]["model"]["layout"]["joints"][0][0] = "not_hinge"
    (renamed / "zarr.json").write_text(json.dumps(attrs))
    with pytest.raises(mjarchive.LayoutMismatchError, match="not_hinge"):
        bundle_model(mjarchive.open(renamed))


def test_append_refuses_a_damaged_bundle(base_archive, tmp_path):
    damaged = tmp_path / "damaged.mjarchive"
    shutil.copytree(base_archive, damaged)
    (damaged / "model" / "xml" / "c" / "0").unlink()
    with pytest.raises(mjarchive.MjArchiveError, match="missing|hash"):
        mjarchive.open(damaged, mode="a")
    intact = tmp_path / "intact.mjarchive"
    shutil.copytree(base_archive, intact)
    with mjarchive.open(intact, mode="a") as writer:  # the undamaged copy still appends
        writer.append(0.9, np.zeros((2, 1)))
    assert mjarchive.open(intact).n_frames == 4


def test_the_compiling_child_finds_mujoco_where_the_parent_did(base_archive, tmp_path):
    """An interpreter that finds MuJoCo only through PYTHONPATH (a `pip install --target`, a cluster's
    module system): the isolated compiling child ignores PYTHONPATH, so it is given this import path."""
    import os
    import subprocess
    import sys
    import venv

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # an interpreter with no packages of its own
    packages = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    path = os.pathsep.join([str(Path(mjarchive.__file__).parents[1]), *packages])
    code = "import sys, mjarchive; print(mjarchive.open(sys.argv[1]).model().nq)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([str(bare / "bin" / "python"), "-c", code, str(base_archive)], capture_output=True,
                          text=True, timeout=120, env={**env, "PYTHONPATH": path}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) == mjarchive.open(base_archive).model().nq


def test_a_child_that_cannot_start_says_so(base_archive, monkeypatch):
    monkeypatch.setattr(sandbox, "_BOOTSTRAP", "import no_such_module_here")
    with pytest.raises(mjarchive.BundleError, match="cannot start MuJoCo.*No module named 'no_such_module_here'"):
        sandbox._compile_in_child(mjarchive.open(base_archive).bundle)
