"""`open()`: the one door to an archive, above the reader and the writer so neither imports the
other. Reading never loads the writer: it is imported only when mode 'a' asks for it."""

from __future__ import annotations

from typing import Any

from .._errors import MjArchiveError
from .reader import Archive
from . import parted_reader  # noqa: F401  (registers how a multi-part archive is read)

__all__ = ["open"]


def open(location: Any, mode: str = "r", *, storage_options: dict | None = None, **writer_options: Any):
    """Open an archive: mode 'r' → Archive (read-only), mode 'a' → ArchiveWriter that resumes appending.

    One writer per archive: mode 'a' takes the archive's writer lease and raises WriterLockedError
    (naming the holder's host, pid and start time) while another writer holds it; readers are never
    blocked. Writer options: `check_finite`, `max_pending_bytes`; `lease_ttl` (seconds, default 60:
    how long an object-store lease lives between renewals) and `take_over=True` (object storage and
    memory: take the lease of a writer known to be gone without waiting for it to expire; a writer
    that still runs may still finish the write cycle it has begun, its chunks and their commit, and
    then fails at its next one, so use it only for a writer that has stopped). On a local disk the
    lease is an OS lock that ends with its process, so a crashed writer never blocks a resume there.
    """
    if mode == "r":
        if writer_options:
            raise MjArchiveError(f"unexpected options for reading: {sorted(writer_options)}")
        return Archive(location, storage_options=storage_options)
    if mode == "a":
        from .writer import open_writer

        return open_writer(location, storage_options=storage_options, **writer_options)
    raise MjArchiveError(f"mode must be 'r' (read) or 'a' (append), got {mode!r}")
