"""Resumable rendering: a small ledger of finished videos in the output directory.

`render` writes each video under a temporary name and renames it when the encoder has closed
it, then records it in `.mjarchive-render.json` (rewritten atomically: temp file + os.replace).
A render run again with the same request skips the videos the ledger lists, as long as the file
on disk is still the one recorded (same size and modification time). A partially written video
never carries its final name, so it is never counted as finished.

The ledger is keyed by a hash of the request: the archive's identity (model sha256, committed
frame count, world IDs, creation time), and exactly which frames of which world and camera go
into which file, with size, quality, backend, replay model, fps and encoder settings. Another
request into the same directory gets another key and reuses nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LEDGER_NAME", "RenderLedger", "request_key", "partial_path"]

LEDGER_NAME = ".mjarchive-render.json"
_FORMAT = "mjarchive-render"
_VERSION = 1
#: Requests remembered per directory; older ones are dropped (their videos are just not reused).
_MAX_REQUESTS = 32
#: Seconds between ledger rewrites while videos finish (a kill forgets at most this much work;
#: without a limit, thousands of short videos would rewrite a growing file thousands of times).
_WRITE_INTERVAL = 1.0


def partial_path(path: Path) -> Path:
    """Where a video is written until it is complete: `.world-0007_cam-back.partial.mp4`."""
    return path.with_name(f".{path.stem}.partial{path.suffix}")


def request_key(archive: Any, outputs: list[Any], *, fps: float, encoder: dict[str, Any]) -> str:
    """sha256 hex digest identifying a render request (see the module docstring).

    archive: the open Archive; outputs: the planned outputs (`render._Output`) with their units.
    """
    man = archive.manifest
    h = hashlib.sha256()
    head = {
        "format": _FORMAT, "version": _VERSION,
        "archive": {"model_sha256": man.model_sha256, "n_frames": int(archive.n_frames),
                    "world_ids": [int(w) for w in archive.world_ids], "created": man.created},
        "fps": float(fps), "encoder": encoder,
    }
    h.update(json.dumps(head, sort_keys=True).encode())
    for o in outputs:
        first = o.units[0]
        h.update(json.dumps({
            "name": o.path.name, "camera": int(o.camera), "world_ids": [int(w) for w in o.world_ids],
            "n_frames": int(o.n_frames), "grid_block": int(o.grid_block), "size": list(first.size),
            "quality": first.quality, "backend": first.backend,
            "model": None if first.model_mjb is None else hashlib.sha256(first.model_mjb).hexdigest(),
        }, sort_keys=True).encode())
        for u in o.units:
            h.update(np.asarray([u.world_id, u.camera, len(u.frames)], np.int64).tobytes())
            h.update(np.asarray(u.frames, np.int64).tobytes())
    return h.hexdigest()


class RenderLedger:
    """The finished-videos ledger of one output directory, for one request key."""

    def __init__(self, out_dir: Path, key: str, request: dict[str, Any] | None = None):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LEDGER_NAME
        self.key = key
        self._request = request or {}
        self._data = self._load()
        self._written = float("-inf")
        self._dirty = False

    def _load(self) -> dict[str, Any]:
        empty = {"format": _FORMAT, "version": _VERSION, "renders": {}}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):  # missing or damaged: nothing counts as finished
            return empty
        if not (isinstance(data, dict) and data.get("format") == _FORMAT and data.get("version") == _VERSION
                and isinstance(data.get("renders"), dict)):
            return empty
        return data

    def _entry(self) -> dict[str, Any]:
        entry = self._data["renders"].get(self.key)
        return entry.get("outputs", {}) if isinstance(entry, dict) and isinstance(entry.get("outputs"), dict) else {}

    def is_done(self, path: Path) -> bool:
        """True if `path` was finished by this request and the file is still the one recorded."""
        rec = self._entry().get(Path(path).name)
        if not isinstance(rec, dict):
            return False
        try:
            st = (self.out_dir / Path(path).name).stat()
        except OSError:
            return False
        return rec.get("bytes") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns

    def mark_done(self, path: Path, n_frames: int) -> None:
        """Record a finished (renamed) video; the ledger is rewritten at most every _WRITE_INTERVAL
        seconds, and by `flush()`."""
        name = Path(path).name
        st = (self.out_dir / name).stat()
        renders = self._data["renders"]
        for key, entry in list(renders.items()):  # a file of another request was just overwritten
            if key != self.key and isinstance(entry, dict) and isinstance(entry.get("outputs"), dict):
                entry["outputs"].pop(name, None)
                if not entry["outputs"]:
                    del renders[key]
        entry = renders.pop(self.key, None)
        if not isinstance(entry, dict) or not isinstance(entry.get("outputs"), dict):
            entry = {"request": self._request, "outputs": {}}
        entry["outputs"][name] = {"frames": int(n_frames), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        renders[self.key] = entry  # most recent last
        while len(renders) > _MAX_REQUESTS:
            del renders[next(iter(renders))]
        self._dirty = True
        if time.monotonic() - self._written >= _WRITE_INTERVAL:
            self.flush()

    def flush(self) -> None:
        """Write what `mark_done` recorded (atomically: temp file, then os.replace)."""
        if self._dirty:
            self._write()
            self._dirty = False
            self._written = time.monotonic()

    def _write(self) -> None:
        tmp = self.out_dir / f"{LEDGER_NAME}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "x") as f:  # default permissions, like the videos
                json.dump(self._data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
