"""The mjarchive error family: one root, subclasses that also inherit the matching builtin."""

from __future__ import annotations

__all__ = [
    "MjArchiveError",
    "BundleError",
    "UnsafeBundleError",
    "LayoutMismatchError",
    "FormatError",
    "FormatVersionError",
    "ArchiveNotFoundError",
    "ArchiveExistsError",
    "SelectionError",
    "AppendError",
    "WriterLockedError",
    "UnenforcedWriterWarning",
    "ClosedError",
    "BackendError",
    "StorageError",
]


class MjArchiveError(ValueError):
    """Root of every error mjarchive raises on purpose."""


class BundleError(MjArchiveError):
    """A model bundle cannot be built, read or compiled."""


class UnsafeBundleError(BundleError):
    """A bundle read from storage references something outside itself, or fails its hashes."""


class LayoutMismatchError(MjArchiveError):
    """A model's qpos layout differs from the one the archive was recorded with."""


class FormatError(MjArchiveError):
    """Stored data does not follow the mjarchive spec (corrupt, truncated or hostile)."""


class FormatVersionError(FormatError):
    """The archive was written by a newer, incompatible major format version."""


class ArchiveNotFoundError(MjArchiveError, FileNotFoundError):
    """No mjarchive archive at the given location."""


class ArchiveExistsError(MjArchiveError, FileExistsError):
    """An archive already exists where a new one was to be created."""


class SelectionError(MjArchiveError, IndexError):
    """A world or frame selection names something the archive does not hold."""


class AppendError(MjArchiveError):
    """A frame handed to a writer or recorder is malformed (shape, dtype, time, finiteness)."""


class WriterLockedError(MjArchiveError, RuntimeError):
    """Another writer holds the archive's writer lease (one writer per archive), or took it over from
    this writer, which then refuses to write."""


class ClosedError(MjArchiveError, RuntimeError):
    """A writer, reader, recorder or renderer was used after close()."""


class BackendError(MjArchiveError, RuntimeError):
    """A replay or recording backend is unavailable or failed."""


class StorageError(MjArchiveError, OSError):
    """The archive's storage (an object store) kept failing or did not answer in time, after retries;
    nothing was read as data and no frame was committed past what its chunks back."""


class UnenforcedWriterWarning(UserWarning):
    """A writer on storage where one writer per archive cannot be enforced (no OS lock and no
    conditional writes: gs://, az://, unknown store objects): keeping to one writer is the caller's."""
