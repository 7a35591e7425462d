"""`open()`: the one door to an archive, above the reader and the writer so neither imports the
other. Reading never loads the writer: it is imported only when mode 'a' asks for it."""

from __future__ import annotations

from typing import Any

from .._errors import MjArchiveError
from .reader import Archive

__all__ = ["open"]


def open(location: Any, mode: str = "r", *, storage_options: dict | None = None, **writer_options: Any):
    """Open an archive: mode 'r' → Archive (read-only), mode 'a' → ArchiveWriter that resumes appending."""
    if mode == "r":
        if writer_options:
            raise MjArchiveError(f"unexpected options for reading: {sorted(writer_options)}")
        return Archive(location, storage_options=storage_options)
    if mode == "a":
        from .writer import open_writer

        return open_writer(location, storage_options=storage_options, **writer_options)
    raise MjArchiveError(f"mode must be 'r' (read) or 'a' (append), got {mode!r}")
