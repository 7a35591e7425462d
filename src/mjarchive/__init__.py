"""mjarchive: chunked Zarr v3 archives of MuJoCo trajectories, with lazy replay.

Record `qpos` (and mocap, optional tracks) of many parallel worlds at the render cadence into one
archive that also carries the model; later select worlds and frames and render videos.
"""

from ._bundle import ModelBundle, QposLayout
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
    UnsafeBundleError,
)
from ._format import FORMAT_VERSION
from ._manifest import Manifest, TrackSpec
from ._reader import Archive, Selection, VerifyReport, open
from ._writer import ArchiveWriter, create

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "AppendError",
    "Archive",
    "ArchiveExistsError",
    "ArchiveNotFoundError",
    "ArchiveWriter",
    "BackendError",
    "BundleError",
    "ClosedError",
    "FormatError",
    "FormatVersionError",
    "LayoutMismatchError",
    "Manifest",
    "MjArchiveError",
    "ModelBundle",
    "QposLayout",
    "Selection",
    "SelectionError",
    "TrackSpec",
    "UnsafeBundleError",
    "VerifyReport",
    "create",
    "open",
]
