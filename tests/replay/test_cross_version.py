"""Archives written under either end of the supported MuJoCo range (3.11 and 4.x, made by
cross_version/make_archives.py) replay under the installed one: the bundle compiles, and the poses
of every recorded state equal those the writer's MuJoCo computed (stored as the track `geom_xpos`)."""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest

import mjarchive

ARCHIVES = sorted((Path(__file__).parent / "cross_version").glob("written-by-mujoco-*.mjarchive"))


def test_both_ends_of_the_range_are_here():
    versions = {p.name.removeprefix("written-by-mujoco-").removesuffix(".mjarchive") for p in ARCHIVES}
    assert any(v.startswith("3.11.") for v in versions) and any(v.startswith("4.") for v in versions), versions


@pytest.mark.parametrize("path", ARCHIVES, ids=lambda p: p.name)
def test_archive_replays_with_the_writers_poses(path):
    with mjarchive.open(path) as archive:
        assert archive.verify().ok
        exact = archive.manifest.producer["model_xml"] == "spec"
        assert exact == (not archive.manifest.mujoco_version.startswith("3.11."))
        model = archive.model()  # compiled by this MuJoCo from the bundle, in the sandbox
        sel = archive.select()
        data = mujoco.MjData(model)
        worst = 0.0
        for f in range(archive.n_frames):
            for w in range(len(archive.world_ids)):
                data.qpos[:] = sel.qpos[f, w]
                data.mocap_pos[:], data.mocap_quat[:] = sel.mocap_pos[f, w], sel.mocap_quat[f, w]
                mujoco.mj_kinematics(model, data)
                worst = max(worst, float(np.abs(data.geom_xpos - sel.track("geom_xpos")[f, w]).max()))
        # Exact bundles pose as the writer did up to the two MuJoCo versions' own arithmetic; compiled
        # values (6 significant digits) within a few micrometres.
        assert worst <= (1e-9 if exact else 1e-5), worst
    frames = list(mjarchive.iter_frames(path, worlds=[8], size=(32, 40), quality="fast", camera="free"))
    assert len(frames) == 4 and all(rgb.std() > 1 for _, _, rgb in frames)  # something was drawn
