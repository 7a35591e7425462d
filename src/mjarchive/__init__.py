"""mjarchive: chunked Zarr v3 archives of MuJoCo trajectories, with lazy replay.

Record `qpos` (and mocap, optional tracks) of many parallel worlds at the render cadence into one
archive that also carries the model; later select worlds and frames and render videos.
"""

import os as _os
import sys as _sys

# MuJoCo picks its OpenGL platform when first imported. On a headless Linux machine (no display),
# GLFW cannot work, so default to EGL (GPU or Mesa) unless the user chose otherwise.
if _sys.platform.startswith("linux") and not (_os.environ.get("DISPLAY") or _os.environ.get("WAYLAND_DISPLAY")):
    _os.environ.setdefault("MUJOCO_GL", "egl")

from .archive.bundle.model_bundle import ModelBundle, QposLayout  # noqa: E402
from ._errors import (
    AppendError,
    ArchiveExistsError,
    ArchiveNotFoundError,
    BackendError,
    BundleError,
    ClosedError,
    FormatError,
    FormatVersionError,
    LayoutMismatchError,
    MjArchiveError,
    SelectionError,
    StorageError,
    UnsafeBundleError,
    UnenforcedWriterWarning,
    WriterLockedError,
)
from .archive.format import FORMAT_VERSION
from .archive.manifest import Manifest, TrackSpec
from .archive.overlays import Overlay, OverlayFrames
from .archive.opening import open
from .archive.reader import Archive, Selection, VerifyReport

__version__ = "0.1.0"


def _mujoco_warning(message: str) -> None:
    """MuJoCo's warnings as Python warnings (RuntimeWarning, "MuJoCo: ..."), instead of MuJoCo's
    default of printing them and appending them to MUJOCO_LOG.TXT in the current directory: a
    library must not litter the caller's working directory."""
    try:
        import warnings

        warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)
    except Exception:  # e.g. warnings made errors: an exception must not unwind through MuJoCo's C code
        import logging

        logging.getLogger("mjarchive").warning("MuJoCo: %s", message)


def _route_mujoco_warnings() -> None:
    """Install `_mujoco_warning` as MuJoCo's warning handler, unless the program installed its own
    (which is kept: whoever set a handler first decides where MuJoCo's warnings go)."""
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


_route_mujoco_warnings()

# Heavier parts (the writer, recorders, replay, video, Warp) load on first use, so `import mjarchive`
# stays light, a process that only reads never loads the writer, and CPU-only code never imports Warp.
_LAZY = {
    "ArchiveWriter": ".archive.writer",
    "create": ".archive.writer",
    "compact": ".archive.compact",
    "import_flygym": ".record.flygym",
    "Camera": ".replay.views.camera",
    "Recorder": ".record.recorder",
    "render": ".replay.render",
    "iter_frames": ".replay.render",
    "close_pool": ".replay.render",
    "view": ".viewer.app",
}


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mjarchive' has no attribute {name!r}")

__all__ = [
    "FORMAT_VERSION",
    "AppendError",
    "Archive",
    "ArchiveExistsError",
    "ArchiveNotFoundError",
    "ArchiveWriter",
    "BackendError",
    "BundleError",
    "Camera",
    "ClosedError",
    "FormatError",
    "FormatVersionError",
    "LayoutMismatchError",
    "Manifest",
    "MjArchiveError",
    "ModelBundle",
    "Overlay",
    "OverlayFrames",
    "QposLayout",
    "Recorder",
    "Selection",
    "SelectionError",
    "StorageError",
    "TrackSpec",
    "UnsafeBundleError",
    "VerifyReport",
    "UnenforcedWriterWarning",
    "WriterLockedError",
    "close_pool",
    "compact",
    "create",
    "import_flygym",
    "iter_frames",
    "open",
    "render",
    "view",
]
