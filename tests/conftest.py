"""Shared fixtures: real MuJoCo models shipped inside the installed mujoco_warp package."""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
# Resumable renders keep a per-user key in the config directory: the tests' own, not the user's.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="mjarchive-test-config-")


def _test_data() -> Path:
    root = importlib.resources.files("mujoco_warp") / "test_data"
    path = Path(str(root))
    if not path.is_dir():
        pytest.skip("mujoco_warp test data not installed (pip install 'mjarchive[test]')")
    return path


@pytest.fixture(scope="session")
def test_data() -> Path:
    return _test_data()


@pytest.fixture(scope="session")
def humanoid_xml(test_data) -> Path:
    """28-dof humanoid with a free joint and trackcom cameras."""
    return test_data / "humanoid" / "humanoid.xml"


@pytest.fixture(scope="session")
def aloha_xml(test_data) -> Path:
    """Two ALOHA arms and a pot: ~150 STL/OBJ meshes in the model directory."""
    return test_data / "aloha_pot" / "scene.xml"


@pytest.fixture(scope="session")
def mug_xml(test_data) -> Path:
    """A mug: one OBJ mesh and one PNG texture."""
    return test_data / "mug" / "mug.xml"


@pytest.fixture(params=["humanoid", "aloha", "mug"])
def real_model_xml(request, humanoid_xml, aloha_xml, mug_xml) -> Path:
    return {"humanoid": humanoid_xml, "aloha": aloha_xml, "mug": mug_xml}[request.param]


# Modules whose tests load multithreaded array runtimes (JAX, torch) into the test process; they run
# last, so no later test forks a process (render workers, the hostile-input harness) while those
# runtimes' threads may hold locks.
RUN_LAST = ("test_recorder_arrays.py", "test_rollout.py", "test_playground.py")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name in RUN_LAST)  # stable: the order is kept otherwise


def warp_devices() -> list[str]:
    """The Warp devices the Warp tests run on: "cpu" always, and "cuda:0" where Warp finds CUDA (the
    pinned rings, streams, events and gather kernels that only CUDA uses; those test ids say "cuda",
    so `-k cuda` selects them on a GPU machine). Initializes Warp where it is installed."""
    if importlib.util.find_spec("warp") is None:
        return ["cpu"]  # the tests skip, saying Warp is missing
    import warp as wp

    wp.config.quiet = True
    cpu = ["cpu"] if wp.is_cpu_available() else []  # not without warp-clang (the GPU payload leaves it out)
    return cpu + (["cuda:0"] if wp.get_cuda_device_count() else [])


def requires_warp_replay():
    """Skip unless backend 'warp' can render here (mujoco-warp and warp-lang installed, mujoco-warp
    new enough: `replay.backends.warp.unavailable`); returns the mujoco_warp module."""
    mjw = pytest.importorskip("mujoco_warp")
    from mjarchive.replay.backends.warp import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    return mjw
