"""ModelBundle: self-contained real models across processes, hashing, layout checks, constructors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr

from mjarchive import BundleError, LayoutMismatchError, ModelBundle, QposLayout
from mjarchive.testing import hinge_chain_xml

# Runs in a fresh interpreter: load the bundle from Zarr, compile, pose it with the given qpos and
# save everything the parent compares. Results travel as .npz (no pickle).
_CHILD = textwrap.dedent(
    """
    import sys, numpy as np, mujoco, zarr
    from mjarchive import ModelBundle
    store, inputs, out = sys.argv[1:4]
    bundle = ModelBundle.from_zarr(zarr.open_group(store, mode="r"))
    m = bundle.compile()
    d = mujoco.MjData(m)
    qpos = np.load(inputs)["qpos"]
    xpos, xmat = [], []
    for q in qpos:
        d.qpos[:] = q
        mujoco.mj_kinematics(m, d)
        xpos.append(d.geom_xpos.copy())
        xmat.append(d.geom_xmat.copy())
    np.savez(out, sizes=np.array([m.nq, m.nv, m.ngeom, m.nmesh, m.ntex]), mesh_vert=m.mesh_vert,
             tex_data=m.tex_data, geom_xpos=np.array(xpos), geom_xmat=np.array(xmat),
             sha256=np.array(bundle.sha256))
    """
)


def _random_qpos(model: mujoco.MjModel, n: int, seed: int) -> np.ndarray:
    """Random configurations within joint ranges, with unit quaternions for free/ball joints."""
    rng = np.random.default_rng(seed)
    out = np.tile(model.qpos0, (n, 1))
    for j in range(model.njnt):
        a, t = model.jnt_qposadr[j], model.jnt_type[j]
        if t == mujoco.mjtJoint.mjJNT_FREE:
            out[:, a:a + 3] = rng.uniform(-1, 1, (n, 3))
            q = rng.normal(size=(n, 4))
            out[:, a + 3:a + 7] = q / np.linalg.norm(q, axis=1, keepdims=True)
        elif t == mujoco.mjtJoint.mjJNT_BALL:
            q = rng.normal(size=(n, 4))
            out[:, a:a + 4] = q / np.linalg.norm(q, axis=1, keepdims=True)
        else:
            lo, hi = model.jnt_range[j] if model.jnt_limited[j] else (-1.0, 1.0)
            out[:, a] = rng.uniform(lo, hi, n)
    return out


def _run_child(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_real_model_survives_zarr_in_another_process(real_model_xml, tmp_path):
    # Bundle from a copy of the model directory, then delete the copy: the child cannot reach it.
    copy_dir = tmp_path / "model_copy"
    shutil.copytree(real_model_xml.parent, copy_dir)
    bundle = ModelBundle.from_file(copy_dir / real_model_xml.name)
    bundle.to_zarr(zarr.open_group(tmp_path / "bundle.zarr", mode="w"))
    shutil.rmtree(copy_dir)

    original = mujoco.MjModel.from_xml_path(str(real_model_xml))
    qpos = _random_qpos(original, 5, seed=len(real_model_xml.name))
    np.savez(tmp_path / "in.npz", qpos=qpos)
    _run_child(str(tmp_path / "bundle.zarr"), str(tmp_path / "in.npz"), str(tmp_path / "out.npz"))
    got = np.load(tmp_path / "out.npz")

    sizes = [original.nq, original.nv, original.ngeom, original.nmesh, original.ntex]
    assert got["sizes"].tolist() == sizes
    if real_model_xml.parent.name in ("aloha_pot", "mug"):
        assert original.nmesh > 0
    np.testing.assert_array_equal(got["mesh_vert"], original.mesh_vert)
    np.testing.assert_array_equal(got["tex_data"], original.tex_data)
    assert str(got["sha256"]) == bundle.sha256

    d = mujoco.MjData(original)
    for i, q in enumerate(qpos):
        d.qpos[:] = q
        mujoco.mj_kinematics(original, d)
        np.testing.assert_array_equal(got["geom_xpos"][i], d.geom_xpos)
        np.testing.assert_array_equal(got["geom_xmat"][i], d.geom_xmat)


def test_bundle_collects_every_mesh_and_texture(mug_xml):
    bundle = ModelBundle.from_file(mug_xml)
    assert set(bundle.assets) == {"mug.obj", "mug.png"}
    assert bundle.assets["mug.png"] == (mug_xml.parent / "mug.png").read_bytes()
    assert str(mug_xml.parent) not in bundle.xml


def test_sha256_stable_across_processes(mug_xml):
    code = "import sys; from mjarchive import ModelBundle; print(ModelBundle.from_file(sys.argv[1]).sha256)"
    hashes = [
        subprocess.run([sys.executable, "-c", code, str(mug_xml)], capture_output=True, text=True,
                       check=True, timeout=60).stdout.strip()
        for _ in range(2)
    ]
    assert hashes[0] == hashes[1] == ModelBundle.from_file(mug_xml).sha256
    assert len(hashes[0]) == 64


def test_sha256_changes_with_one_asset_byte(mug_xml, tmp_path):
    bundle = ModelBundle.from_file(mug_xml)
    flipped = bytearray(bundle.assets["mug.png"])
    flipped[len(flipped) // 2] ^= 1
    other = ModelBundle(bundle.xml, {**bundle.assets, "mug.png": bytes(flipped)})
    assert other.sha256 != bundle.sha256 and other != bundle
    assert ModelBundle(bundle.xml, dict(bundle.assets)) == bundle

    # The same through files: one extra byte in the OBJ file (a trailing newline) changes the hash.
    copy_dir = tmp_path / "mug"
    shutil.copytree(mug_xml.parent, copy_dir)
    with open(copy_dir / "mug.obj", "ab") as f:
        f.write(b"\n")
    assert ModelBundle.from_file(copy_dir / "mug.xml").sha256 != bundle.sha256


def test_sha256_survives_zarr_roundtrip(mug_xml, tmp_path):
    bundle = ModelBundle.from_file(mug_xml)
    group = zarr.open_group(tmp_path / "b.zarr", mode="w")
    bundle.to_zarr(group)
    loaded = ModelBundle.from_zarr(zarr.open_group(tmp_path / "b.zarr", mode="r"))
    assert loaded.sha256 == bundle.sha256
    assert loaded.xml == bundle.xml and loaded.assets == bundle.assets


def test_layout_names_renamed_joint(humanoid_xml):
    layout = ModelBundle.from_file(humanoid_xml).layout
    spec = mujoco.MjSpec.from_file(str(humanoid_xml))
    joint = spec.joints[3]
    old = joint.name
    joint.name = "renamed_joint"
    for actuator in spec.actuators:  # keep the edited model compilable
        if actuator.target == old:
            actuator.target = "renamed_joint"
    with pytest.raises(LayoutMismatchError, match="renamed_joint") as info:
        layout.check_compatible(spec.compile())
    assert old in str(info.value)
    layout.check_compatible(mujoco.MjModel.from_xml_path(str(humanoid_xml)))


@pytest.mark.parametrize("where", ["middle", "last"])
def test_layout_names_added_joint(humanoid_xml, where):
    bundle = ModelBundle.from_file(humanoid_xml)
    spec = mujoco.MjSpec.from_file(str(humanoid_xml))
    body = spec.bodies[2] if where == "middle" else spec.bodies[-1]
    body.add_joint(name="extra_hinge", type=mujoco.mjtJoint.mjJNT_HINGE, axis=[1, 0, 0], range=[-1, 1])
    edited = ModelBundle.from_spec(spec)
    assert edited.sha256 != bundle.sha256
    with pytest.raises(LayoutMismatchError, match="extra_hinge"):
        bundle.layout.check_compatible(edited.compile())
    with pytest.raises(LayoutMismatchError, match="extra_hinge"):
        bundle.layout.check_compatible(edited.layout)


def test_layout_dict_roundtrip(aloha_xml):
    layout = ModelBundle.from_file(aloha_xml).layout
    assert QposLayout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    assert layout.nq == mujoco.MjModel.from_xml_path(str(aloha_xml)).nq


def _tet(test_data: Path) -> bytes:
    return (test_data / "meshes" / "tetrahedron.stl").read_bytes()


_MESH_MODEL = """<mujoco><asset><mesh name="tet" file="{file}"/></asset>
<worldbody><body><freejoint/><geom type="mesh" mesh="tet"/></body></worldbody></mujoco>"""


def test_from_spec_uses_in_memory_assets(test_data):
    spec = mujoco.MjSpec.from_string(_MESH_MODEL.format(file="tet.stl"), assets={"tet.stl": _tet(test_data)})
    spec.assets = {"tet.stl": _tet(test_data)}
    bundle = ModelBundle.from_spec(spec)
    assert list(bundle.assets.values()) == [_tet(test_data)]
    model = bundle.compile()
    assert model.nmesh == 1 and model.nq == 7


def test_from_xml_with_assets(test_data):
    bundle = ModelBundle.from_xml(_MESH_MODEL.format(file="tet.stl"), {"tet.stl": _tet(test_data)})
    reference = mujoco.MjModel.from_xml_string(_MESH_MODEL.format(file="tet.stl"), {"tet.stl": _tet(test_data)})
    np.testing.assert_array_equal(bundle.compile().mesh_vert, reference.mesh_vert)
    with pytest.raises(BundleError):
        ModelBundle.from_xml(_MESH_MODEL.format(file="missing.stl"), {})


def _write_include_model(root: Path, test_data: Path, compiler: str) -> Path:
    (root / "parts").mkdir(parents=True)
    (root / "parts" / "arm.xml").write_text(
        '<mujoco><worldbody><body name="arm"><joint name="shoulder"/><geom type="mesh" mesh="tet"/>'
        '<geom type="box" size=".1 .1 .1" material="checker"/></body></worldbody></mujoco>'
    )
    (root / "main.xml").write_text(
        f'<mujoco><compiler {compiler}/><asset><mesh name="tet" file="tet.stl"/>'
        '<mesh name="tet_sub" file="sub/tet.stl" scale="2 2 2"/>'
        '<texture name="checker" type="2d" file="mug.png"/><material name="checker" texture="checker"/>'
        '</asset><include file="parts/arm.xml"/>'
        '<worldbody><geom type="mesh" mesh="tet_sub"/></worldbody></mujoco>'
    )
    return root / "main.xml"


@pytest.mark.parametrize("layout", ["meshdir_texturedir", "assetdir", "absolute_meshdir"])
def test_from_file_follows_dirs_and_includes(layout, tmp_path, test_data):
    root = tmp_path / "model"
    png = (test_data / "mug" / "mug.png").read_bytes()
    if layout == "meshdir_texturedir":
        mesh_dir, tex_dir, compiler = root / "meshes", root / "textures", 'meshdir="meshes" texturedir="textures"'
    elif layout == "assetdir":
        mesh_dir = tex_dir = root / "assets"
        compiler = 'assetdir="assets"'
    else:
        mesh_dir, tex_dir = tmp_path / "elsewhere", root
        compiler = f'meshdir="{mesh_dir}"'
    (mesh_dir / "sub").mkdir(parents=True, exist_ok=True)
    tex_dir.mkdir(parents=True, exist_ok=True)
    (mesh_dir / "tet.stl").write_bytes(_tet(test_data))
    # A second file with the same base name in a subdirectory, different bytes: names must not clash.
    (mesh_dir / "sub" / "tet.stl").write_bytes((test_data / "meshes" / "dodecahedron.stl").read_bytes())
    (tex_dir / "mug.png").write_bytes(png)
    path = _write_include_model(root, test_data, compiler)

    bundle = ModelBundle.from_file(path)
    reference = mujoco.MjModel.from_xml_path(str(path))
    assert len(bundle.assets) == 3
    assert png in bundle.assets.values() and _tet(test_data) in bundle.assets.values()
    assert all("/" not in name for name in bundle.assets)
    assert "<include" not in bundle.xml and "meshdir" not in bundle.xml and "assetdir" not in bundle.xml
    shutil.rmtree(root)
    if mesh_dir.exists():
        shutil.rmtree(mesh_dir)
    model = bundle.compile()
    assert model.nmesh == reference.nmesh == 2 and model.ntex == 1
    assert model.joint("shoulder").id >= 0
    np.testing.assert_array_equal(model.mesh_vert, reference.mesh_vert)
    np.testing.assert_array_equal(model.tex_data, reference.tex_data)
    # Deterministic names and hash: bundling the same content elsewhere gives the same bundle.
    assert ModelBundle(bundle.xml, bundle.assets).sha256 == bundle.sha256


def test_from_file_missing_asset_is_a_bundle_error(tmp_path):
    (tmp_path / "m.xml").write_text(_MESH_MODEL.format(file="nowhere.stl"))
    with pytest.raises(BundleError):
        ModelBundle.from_file(tmp_path / "m.xml")
    with pytest.raises(BundleError, match="does not exist"):
        ModelBundle.from_file(tmp_path / "absent.xml")


def test_export_opens_in_mujoco(mug_xml, tmp_path):
    bundle = ModelBundle.from_file(mug_xml)
    xml_path = bundle.export(tmp_path / "exported")
    model = mujoco.MjModel.from_xml_path(str(xml_path))
    np.testing.assert_array_equal(model.tex_data, bundle.compile().tex_data)


def test_spec_roundtrip():
    bundle = ModelBundle.from_xml(hinge_chain_xml(3, n_mocap=1))
    spec = bundle.spec()
    assert isinstance(spec, mujoco.MjSpec)
    model = spec.compile()
    assert (model.nq, model.nmocap) == (3, 1)
    assert bundle.layout.mocap_bodies == ("m0",)
    assert [j[0] for j in bundle.layout.joints] == ["j0", "j1", "j2"]


# -- compiled once; from_spec bit-exact ---------------------------------------------------------

def _model_arrays(model: mujoco.MjModel) -> dict[str, np.ndarray]:
    # File paths differ by design: the bundle renames files to its flat member names.
    return {name: getattr(model, name) for name in dir(model) if not name.startswith("_") and "path" not in name
            and isinstance(getattr(model, name), np.ndarray)}


def _assert_bit_identical(got: mujoco.MjModel, want: mujoco.MjModel) -> None:
    """Every array of the compiled models, and the poses at qpos0 and at random configurations."""
    mine, theirs = _model_arrays(got), _model_arrays(want)
    assert mine.keys() == theirs.keys()
    differ = [n for n in theirs if not np.array_equal(mine[n], theirs[n], equal_nan=mine[n].dtype.kind == "f")]
    assert not differ, f"fields differ: {differ}"
    d_got, d_want = mujoco.MjData(got), mujoco.MjData(want)
    for q in [want.qpos0, *_random_qpos(want, 2, seed=want.ngeom)]:
        for m, d in ((got, d_got), (want, d_want)):
            d.qpos[:] = q
            mujoco.mj_kinematics(m, d)
        for field in ("xpos", "xquat", "geom_xpos", "geom_xmat", "site_xpos"):
            np.testing.assert_array_equal(getattr(d_got, field), getattr(d_want, field), err_msg=field)


def _assert_replays_as_compiled(bundle: ModelBundle, reference: mujoco.MjModel) -> None:
    """Bit-exact where this MuJoCo writes an MjSpec as written (3.16+); before, MuJoCo's compiled
    values (6 significant digits): the same structure, poses within a few micrometres."""
    from mjarchive.archive.bundle import model_bundle

    got = ModelBundle(bundle.xml, bundle.assets).compile()
    if model_bundle._WRITES_SPEC_AS_WRITTEN:
        assert bundle.written_as == "spec"
        _assert_bit_identical(got, reference)
        return
    assert bundle.written_as == "compiled"
    assert (got.nq, got.nbody, got.ngeom, got.nkey) == (reference.nq, reference.nbody, reference.ngeom, reference.nkey)
    d_got, d_want = mujoco.MjData(got), mujoco.MjData(reference)
    for q in [reference.qpos0, *_random_qpos(reference, 2, seed=reference.ngeom)]:
        for m, d in ((got, d_got), (reference, d_want)):
            d.qpos[:] = q
            mujoco.mj_kinematics(m, d)
        np.testing.assert_allclose(d_got.geom_xpos, d_want.geom_xpos, rtol=0, atol=1e-5)
        np.testing.assert_allclose(d_got.geom_xmat, d_want.geom_xmat, rtol=0, atol=1e-5)


def _gymnasium_ant() -> Path:
    gym = pytest.importorskip("gymnasium")
    path = Path(gym.__file__).parent / "envs" / "mujoco" / "assets" / "ant.xml"  # angles in degrees
    if not path.is_file():
        pytest.skip("gymnasium's MuJoCo assets are not installed")
    return path


def _humanoid_cmu() -> Path:
    import importlib.util

    found = importlib.util.find_spec("dm_control")  # its model files only: no need to import it
    for root in found.submodule_search_locations if found else ():
        if (Path(root) / "suite" / "humanoid_CMU.xml").is_file():
            return Path(root) / "suite" / "humanoid_CMU.xml"
    pytest.skip("dm_control is not installed")


@pytest.mark.parametrize("name", ["humanoid", "aloha", "ant", "humanoid_CMU"])
def test_from_spec_compiles_bit_exactly(name, humanoid_xml, aloha_xml):
    path = {"humanoid": lambda: humanoid_xml, "aloha": lambda: aloha_xml, "ant": _gymnasium_ant,
            "humanoid_CMU": _humanoid_cmu}[name]()
    spec = mujoco.MjSpec.from_file(str(path))
    # Edited in Python with numbers 6 significant digits cannot hold, so the file is no help.
    body = spec.worldbody.add_body(name="added", pos=[0.1234567891234, 1 / 3, 1 / 7])
    body.alt.type = mujoco.mjtOrientation.mjORIENTATION_EULER
    body.alt.euler = [0.3, 0.7, 1 / 3]
    body.add_joint(name="added_hinge", axis=[1 / 3, 2 / 3, 0.7071067811865476], range=[-1 / 3, 2 / 7])
    body.add_geom(size=[0.0123456789, 0.1 / 3, 0], rgba=[0.1, 0.2, 0.3, 1], pos=[1e-7 / 3, 0, 2 / 3])
    spec.geoms[0].size = np.asarray(spec.geoms[0].size) * (1 + 1 / 3e5)
    spec.bodies[1].pos = np.asarray(spec.bodies[1].pos) + [1 / 3e6, -1 / 7e6, 1 / 9e6]
    reference = spec.compile()
    bundle = ModelBundle.from_spec(spec)
    assert "savecompiled" not in bundle.xml and "meshdir" not in bundle.xml
    # A bundle made only of its bytes (nothing cached), compiled as a replay would.
    _assert_replays_as_compiled(bundle, reference)


@pytest.mark.filterwarnings("ignore:.*Attach conflict")
def test_from_spec_keeps_keyframes_of_an_edited_tree(humanoid_xml):
    parent = mujoco.MjSpec.from_string(hinge_chain_xml(2))
    parent.add_key(name="bent", qpos=[1 / 3, 2 / 7])
    child = mujoco.MjSpec.from_file(str(humanoid_xml))
    frame = parent.worldbody.add_frame(pos=[1.123456789, 0.2, 1 / 3])
    parent.attach(child, frame=frame, prefix="h/")  # keyframes await a compile to be assembled
    bundle = ModelBundle.from_spec(parent)
    reference = parent.compile()
    assert reference.nkey > 1
    _assert_replays_as_compiled(bundle, reference)


def test_bundle_compiles_once_for_create_and_recorder(humanoid_xml, tmp_path, monkeypatch):
    import mjarchive
    from mjarchive.archive.bundle import model_bundle as bundle_module

    calls = []
    real = bundle_module._compile_bytes
    monkeypatch.setattr(bundle_module, "_compile_bytes", lambda *a: calls.append(1) or real(*a))
    with mjarchive.Recorder(tmp_path / "r.zarr", str(humanoid_xml), n_worlds=2):
        pass
    assert len(calls) == 1
    bundle = ModelBundle.from_file(humanoid_xml)
    mjarchive.create(tmp_path / "c.zarr", bundle, n_worlds=2).close()
    first, second = bundle.compile(), bundle.compile()
    assert len(calls) == 2
    # Each call hands out a model of its own: editing one leaves the bundle's untouched.
    first.geom_rgba[:] = 0.5
    assert first is not second and not np.array_equal(second.geom_rgba, first.geom_rgba)
    np.testing.assert_array_equal(second.geom_rgba, bundle.compile().geom_rgba)


def test_to_zarr_writes_what_zarr_writes(mug_xml, tmp_path):
    from mjarchive.archive.bundle.model_bundle import _write_member

    bundle = ModelBundle.from_file(mug_xml)
    bundle.to_zarr(zarr.open_group(tmp_path / "batched.zarr", mode="w"))
    plain = zarr.open_group(tmp_path / "plain.zarr", mode="w").create_group("model")
    members = {"xml": bundle.xml.encode(), **{f"asset_{i:05d}": d for i, d in enumerate(bundle.assets.values())}}
    for key, data in members.items():
        _write_member(plain, key, data)
    for key in members:
        for file in ("zarr.json", "c/0"):
            got = tmp_path / "batched.zarr" / "model" / key / file
            assert got.read_bytes() == (tmp_path / "plain.zarr" / "model" / key / file).read_bytes()


def test_batched_members_are_the_files_zarr_writes(tmp_path):
    # Batched: single-chunk members; through zarr: empty ones and those of more than one chunk (8 MiB). The
    # same files either way, but for the chunk of a member of only zero bytes: the batch stores it, zarr
    # leaves it out (equal to the fill value), and a missing chunk would look like damage.
    from mjarchive.archive.bundle.model_bundle import _MEMBER_CHUNK, _write_member, _write_members

    rng = np.random.default_rng(4)
    blobs = [("xml", b"<mujoco/>"), ("asset_00000", rng.bytes(_MEMBER_CHUNK)), ("asset_00001", bytes(100)),
             ("asset_00002", b""), ("asset_00003", rng.bytes(_MEMBER_CHUNK + 5)), ("asset_00004", b"\x01")]
    _write_members(zarr.open_group(tmp_path / "batched.zarr", mode="w").create_group("model"), blobs)
    plain = zarr.open_group(tmp_path / "plain.zarr", mode="w").create_group("model")
    for key, data in blobs:
        _write_member(plain, key, data)

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in (root / "model").rglob("*") if p.is_file()}

    got, want = files(tmp_path / "batched.zarr"), files(tmp_path / "plain.zarr")
    zero_chunk = Path("model/asset_00001/c/0")
    assert zero_chunk not in want and zero_chunk in got
    assert {k: v for k, v in got.items() if k != zero_chunk} == want
    group = zarr.open_group(tmp_path / "batched.zarr", mode="r")["model"]
    assert group["asset_00001"][:].tobytes() == bytes(100)
