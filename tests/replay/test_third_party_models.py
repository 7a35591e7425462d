"""Models from other packages replay: every model found in the installed packages that plain MuJoCo
compiles is recorded for two frames, compiled in the sandbox (posing exactly like plain MuJoCo) and
rendered. Packages that are not installed skip with the reason: the Gymnasium assets and
mujoco_warp's test models are in the test extra; dm_control (the suite and the locomotion walkers'
files: its rodent declares `<size njmax="8000" nconmax="4000">`, a 3.4 GB arena, and its fruitfly
24 multisamples), flygym and Menagerie are checked where installed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import mujoco
import numpy as np
import pytest

import mjarchive


def _package_dir(name: str) -> Path | None:
    found = importlib.util.find_spec(name)  # its model files only: the package itself is not imported
    locations = found.submodule_search_locations if found else None
    return Path(next(iter(locations))) if locations else None


def _xml_files(root: Path | None, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if re.search(rb"<mujoco[\s>]", p.read_bytes()[:4096])) if root else []


def _cases() -> list:
    """pytest params: (package, name, model file), or a skip per missing package."""
    found: dict[str, list] = {}
    gym = _package_dir("gymnasium")
    found["gymnasium"] = [(p.stem, p) for p in _xml_files(gym and gym / "envs" / "mujoco" / "assets", "*.xml")]
    warp = _package_dir("mujoco_warp")
    found["mujoco_warp"] = [(str(p.relative_to(warp / "test_data")), p) for p in _xml_files(warp, "test_data/**/*.xml")]
    dmc = _package_dir("dm_control")  # its walkers' files: building the walker classes needs a matching MuJoCo
    found["dm_control"] = [(str(p.relative_to(dmc)), p) for p in
                           _xml_files(dmc, "suite/*.xml") + _xml_files(dmc, "locomotion/walkers/assets/**/*.xml")]
    fly = _package_dir("flygym")
    found["flygym"] = [(str(p.relative_to(fly)), p) for p in _xml_files(fly, "**/*.xml")]
    menagerie = _package_dir("mujoco_menagerie")
    found["mujoco_menagerie"] = [(str(p.parent.name), p) for p in _xml_files(menagerie, "**/scene.xml")]
    params = []
    for package, models in found.items():
        if not models:
            params.append(pytest.param(package, None, None, id=package,
                                       marks=pytest.mark.skip(reason=f"{package} is not installed (or ships no models)")))
        params += [pytest.param(package, name, source, id=f"{package}:{name}") for name, source in models]
    return params


def _bundle(source: Path) -> mjarchive.ModelBundle:
    """The bundle of a model file; skips what plain MuJoCo cannot compile."""
    try:
        mujoco.MjModel.from_xml_path(str(source))
    except Exception as exc:  # not a whole model (an include), or a file it names is missing
        pytest.skip(f"plain MuJoCo does not compile it either: {exc}")
    return mjarchive.ModelBundle.from_file(source)


@pytest.mark.parametrize(("package", "name", "source"), _cases())
def test_third_party_model_records_and_renders(package, name, source, tmp_path):
    bundle = _bundle(source)
    plain = bundle.compile()
    moved = plain.qpos0.copy()
    bent = np.isin(plain.jnt_type, (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE))
    moved[plain.jnt_qposadr[bent]] += 0.05
    qpos = np.stack([plain.qpos0, moved])
    path = tmp_path / "m.mjarchive"
    with mjarchive.create(path, bundle, n_worlds=1, chunk_frames=4) as writer:
        mocap = {}
        if plain.nmocap:
            bodies = np.flatnonzero(plain.body_mocapid >= 0)[np.argsort(plain.body_mocapid[plain.body_mocapid >= 0])]
            mocap = {"mocap_pos": plain.body_pos[bodies][None], "mocap_quat": plain.body_quat[bodies][None]}
        for t, q in enumerate(qpos):
            writer.append(0.1 * t, q[None], **mocap)
    archive = mjarchive.open(path)
    sandboxed = archive.model()
    # What the sandbox serves poses exactly like plain MuJoCo, with an arena sized for replay.
    a, b = mujoco.MjData(sandboxed), mujoco.MjData(plain)
    a.qpos[:] = b.qpos[:] = moved
    mujoco.mj_kinematics(sandboxed, a)
    mujoco.mj_kinematics(plain, b)
    np.testing.assert_array_equal(a.geom_xpos, b.geom_xpos)
    assert sandboxed.narena <= 64 * 2**20
    frames = list(mjarchive.iter_frames(archive, size=(16, 16), quality="fast", camera="free"))
    assert [(w, f) for w, f, _ in frames] == [(0, 0), (0, 1)]
    assert all(rgb.shape == (16, 16, 3) and rgb.dtype == np.uint8 for _, _, rgb in frames)


def test_legacy_simulation_sizes_replay(humanoid_xml, tmp_path):
    """dm_control's rodent, where dm_control is not installed: a model declaring the legacy
    `<size njmax="8000" nconmax="4000">` (a 3.4 GB arena, above the compile sandbox's 3 GiB) replays,
    alone and as a scene, with an arena sized for posing."""
    spec = mujoco.MjSpec.from_file(str(humanoid_xml))
    spec.njmax, spec.nconmax = 8000, 4000
    bundle = mjarchive.ModelBundle.from_spec(spec)
    assert bundle.compile().narena > 3 * 2**30
    path = tmp_path / "legacy.mjarchive"
    with mjarchive.create(path, bundle, n_worlds=2, chunk_frames=4) as writer:
        writer.append(0.0, np.tile(bundle.compile().qpos0, (2, 1)))
    archive = mjarchive.open(path)
    assert archive.model().narena <= 64 * 2**20
    frames = list(mjarchive.iter_frames(archive, size=(16, 16), quality="fast"))
    assert len(frames) == 2 and frames[0][2].shape == (16, 16, 3)
    videos = mjarchive.render(archive, tmp_path / "out", layout="scene", size=(16, 16), quality="fast", workers=1,
                              progress=False)
    assert [v.name for v in videos] == ["scene_cam-auto.mp4"] and videos[0].stat().st_size > 0
