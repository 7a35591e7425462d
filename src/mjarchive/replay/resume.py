"""Resumable rendering: a small ledger of finished videos in the output directory.

`render` writes each video to a fresh temporary file (`.world-0007_cam-back.partial-<random>.mp4`)
and renames it over its final name when the encoder has closed it, then records it in
`.mjarchive-render.json` with its size and sha256 (rewritten atomically: temp file + rename). A
render run again with the same request skips a video only if the file at its name is a regular
file whose *content* hashes to what the ledger recorded; a partially written video never carries
its final name, so it is never counted as finished.

The ledger is keyed by a hash of the request: the archive's identity (model sha256, committed
frame count, world IDs, creation time), and exactly which frames of which world and camera go
into which file, with size, quality, backend, replay model, fps and encoder settings, and for an
archive with model variants or overlays (format 1.1) its committed variant events and the overlays
drawn (left out otherwise, so a format 1.0 archive keeps the key it had). Another request into
the same directory gets another key and reuses nothing.

The output folder may be shared, so the ledger is untrusted input: it is read only if it is a
regular file (never through a link, never blocking on a FIFO) owned by the user, of at most
MAX_LEDGER_BYTES, nested at most MAX_DEPTH deep, and schema-checked. The sha256 check alone would
not stop someone who can write the folder: they can hash what they plant and forge the record (the
request key is computable), even get mjarchive itself to write files of their choosing there
(`export-model` of their archive). So the record carries an HMAC under a per-user secret kept
outside every output folder (`$XDG_CONFIG_HOME/mjarchive/resume.key`, default `~/.config`, mode
0600, made on first use); a record whose code does not verify is ignored. A video also counts as
finished only if it is owned by this user and has a single link: files we render are. A ledger that
fails these checks is ignored with a one-line note on stderr (every video is rendered again, and
the ledger is rewritten) rather than refused: it holds nothing the user needs, and refusing would
let anyone who can write the folder stop every later render. Names in the ledger are only looked
up, never turned into paths.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import MjArchiveError
from .._fs import MAX_NAME_BYTES, OutputDir
from ..archive.format import json_depth

__all__ = ["LEDGER_NAME", "RenderLedger", "request_key", "partial_prefix", "is_partial_of", "user_key", "ledger_mac"]

LEDGER_NAME = ".mjarchive-render.json"
_FORMAT = "mjarchive-render"
_VERSION = 3  # 2: outputs carry sha256 (1's size + mtime were not trusted); 3: an HMAC (see above)
#: Requests remembered per directory; older ones are dropped (their videos are just not reused).
_MAX_REQUESTS = 32
#: Largest ledger read (and written: older requests, then older outputs, are dropped to fit).
MAX_LEDGER_BYTES = 8 * 2**20
#: Deepest nesting of arrays and objects read (the schema needs 5).
MAX_DEPTH = 16
_MAX_STRING = 4096
#: Seconds between ledger rewrites while videos finish (a kill forgets at most this much work;
#: without a limit, thousands of short videos would rewrite a growing file thousands of times).
_WRITE_INTERVAL = 1.0
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
def partial_prefix(path: Path) -> str:
    """Prefix of the temporary names a video is written under until complete:
    `.world-0007_cam-back.partial` (+ `-<random>.mp4`, see `_fs.OutputDir.create_temp`)."""
    return f".{Path(path).stem}.partial"


def is_partial_of(name: str, path: Path) -> bool:
    """True if `name` is a temporary name of the video `path` (also the fixed `.stem.partial.mp4`
    of older versions), e.g. one a killed render left behind."""
    p = Path(path)
    return re.fullmatch(re.escape(partial_prefix(p)) + r"(?:-[0-9a-f]{16})?" + re.escape(p.suffix), name) is not None


def request_key(archive: Any, outputs: list[Any], *, fps: float, encoder: dict[str, Any],
                extra: dict[str, Any] | None = None) -> str:
    """sha256 hex digest identifying a render request (see the module docstring).

    archive: the open Archive; outputs: the planned outputs (`plan.Output`) with their units;
    extra: JSON-able settings that change pixels beyond the units (HUD, draw options, ...).
    """
    h = hashlib.sha256()
    h.update(json.dumps(request_head(archive, fps=fps, encoder=encoder, extra=extra), sort_keys=True).encode())
    has_overlays = bool(archive.overlays)
    for o in outputs:
        h.update(json.dumps(output_entry(o, has_overlays), sort_keys=True).encode())
        for u in o.units:
            h.update(np.asarray([u.world_id, len(u.frames)], np.int64).tobytes())
            h.update(np.asarray(u.frames, np.int64).tobytes())
    return h.hexdigest()


def request_head(archive: Any, *, fps: float, encoder: dict[str, Any], extra: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The request's settings and the archive's identity, as `request_key` hashes them first."""
    man = archive.manifest
    identity = {"model_sha256": man.model_sha256, "n_frames": int(archive.n_frames),
                "world_ids": [int(w) for w in archive.world_ids], "created": man.created}
    if archive.variant_fields:
        # committed model-variant events (format 1.1): other values, other pixels
        identity["variants"] = {k: int(v) for k, v in sorted(archive.variant_event_counts.items())}
    return {"format": _FORMAT, "version": _VERSION, "archive": identity, "fps": float(fps), "encoder": encoder,
            "extra": extra or {}}


def output_entry(output: Any, has_overlays: bool) -> dict[str, Any]:
    """One planned output's settings, as `request_key` hashes them (its units follow);
    `has_overlays`: the archive holds overlay tracks (then which are drawn is part of it)."""
    first = output.units[0]
    entry = {
        "name": output.path.name, "camera": _camera_key(output.camera),
        "world_ids": [int(w) for w in output.world_ids], "n_frames": int(output.n_frames),
        "grid_block": int(output.grid_block), "size": list(first.size), "quality": first.quality,
        "backend": first.backend,
        "model": None if first.model_mjb is None else hashlib.sha256(first.model_mjb).hexdigest(),
        "recipe": first.recipe,
    }
    if has_overlays:
        entry["overlays"] = list(first.overlays)
    return entry


def _camera_key(camera: Any) -> Any:
    """A model camera's id, or a View's parameters (what decides its pixels)."""
    return int(camera) if isinstance(camera, (int, np.integer)) else camera.key()


def user_key() -> bytes | None:
    """This user's secret for authenticating resume records (64 hex characters), made on first use
    as a 0600 file in the user's config directory; None if it cannot be made or read safely."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    path = Path(base) / "mjarchive" / "resume.key"
    nofollow = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_hex(32).encode())
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | nofollow)
        try:
            st = os.fstat(fd)
            private = stat.S_ISREG(st.st_mode) and not st.st_mode & 0o077
            if not private or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
                return None
            key = os.read(fd, 65)
        finally:
            os.close(fd)
    except OSError:
        return None
    return key if len(key) == 64 else None


def ledger_mac(key: bytes, renders: Any) -> str:
    """The HMAC-SHA256 (hex) of a ledger's `renders`, over their canonical JSON."""
    return hmac.new(key, json.dumps(renders, sort_keys=True, separators=(",", ":")).encode(), "sha256").hexdigest()


def _is_int(v: Any, low: int = 0, high: int = 2**63 - 1) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _clean_output(name: Any, rec: Any) -> dict[str, Any] | None:
    if not (isinstance(name, str) and 0 < len(name.encode("utf-8", "surrogateescape")) <= MAX_NAME_BYTES
            and isinstance(rec, dict)):
        return None
    if not (_is_int(rec.get("frames")) and _is_int(rec.get("bytes")) and isinstance(rec.get("sha256"), str)
            and _HEX64.fullmatch(rec["sha256"])):
        return None
    return {"frames": rec["frames"], "bytes": rec["bytes"], "sha256": rec["sha256"]}


def _clean_request(req: Any) -> dict[str, Any]:
    """The informational request summary: kept only as flat, short scalars or lists of them."""
    if not isinstance(req, dict):
        return {}
    ok = (str, int, float, bool, type(None))
    out = {}
    for k, v in list(req.items())[:64]:
        if isinstance(k, str) and len(k) <= 64 and (
                (isinstance(v, ok) and len(str(v)) <= _MAX_STRING)
                or (isinstance(v, list) and len(v) <= 1024 and all(isinstance(x, ok) and len(str(x)) <= _MAX_STRING
                                                                   for x in v))):
            out[k] = v
    return out


def parse_ledger(data: bytes, key: bytes | None = None) -> tuple[dict[str, Any], str | None]:
    """(ledger, problem): the validated ledger read from `data`, or an empty one and a one-line
    description of what was wrong. Malformed entries are dropped (and reported). With `key`, a
    record whose HMAC does not verify is refused whole."""
    empty: dict[str, Any] = {"format": _FORMAT, "version": _VERSION, "renders": {}}
    if json_depth(data) > MAX_DEPTH:
        return empty, f"nested deeper than {MAX_DEPTH} levels"
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return empty, f"not valid JSON ({type(exc).__name__})"
    if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
        return empty, "not an mjarchive render record"
    if raw.get("version") != _VERSION:
        return empty, f"record version {raw.get('version')!r}, this mjarchive reads version {_VERSION}"
    renders = raw.get("renders")
    if not isinstance(renders, dict):
        return empty, "'renders' is not an object"
    if key is not None and not (isinstance(raw.get("mac"), str)
                                and hmac.compare_digest(raw["mac"], ledger_mac(key, renders))):
        return empty, "an authentication code that does not verify (it was not written by your mjarchive)"
    problem = None
    if len(renders) > _MAX_REQUESTS:
        problem = f"{len(renders)} requests (limit {_MAX_REQUESTS}); the oldest are dropped"
    clean: dict[str, Any] = {}
    for key, entry in list(renders.items())[-_MAX_REQUESTS:]:
        if not (isinstance(key, str) and _HEX64.fullmatch(key) and isinstance(entry, dict)
                and isinstance(entry.get("outputs"), dict)):
            problem = problem or "a malformed request entry (dropped)"
            continue
        outputs = {}
        for name, rec in entry["outputs"].items():
            rec = _clean_output(name, rec)
            if rec is None:
                problem = problem or "a malformed output entry (dropped)"
                continue
            outputs[name] = rec
        if outputs:
            clean[key] = {"request": _clean_request(entry.get("request")), "outputs": outputs}
    return {"format": _FORMAT, "version": _VERSION, "renders": clean}, problem


class RenderLedger:
    """The finished-videos ledger of one output directory, for one request key.

    out_dir: the folder (an `OutputDir`, or a path that is opened as one)."""

    def __init__(self, out_dir: OutputDir | Path, key: str, request: dict[str, Any] | None = None):
        self.dir = out_dir if isinstance(out_dir, OutputDir) else OutputDir(out_dir)
        self.out_dir = self.dir.path
        self.path = self.out_dir / LEDGER_NAME
        self.key = key
        self._request = _clean_request(request or {})
        self.dir.check_writable(LEDGER_NAME)  # a directory there: say so now, not after rendering
        self._key = user_key()
        if self._key is None:
            self._note("resume is off: no private key could be kept in the config directory "
                       "($XDG_CONFIG_HOME/mjarchive/resume.key); every video is rendered")
        self._data = self._load()
        self._written = float("-inf")
        self._dirty = False

    def _load(self) -> dict[str, Any]:
        if self._key is None:
            return parse_ledger(b"{}")[0]
        try:
            data = self.dir.read_regular(LEDGER_NAME, MAX_LEDGER_BYTES, mine=True)
        except MjArchiveError as exc:  # a link, FIFO, another user's file, too large
            problem = str(exc)
        else:
            if data is None:  # no record yet
                return parse_ledger(b"{}")[0]
            ledger, problem = parse_ledger(data, self._key)
            if problem is None:
                return ledger
            problem = f"{str(self.path)!r} has {problem}"
            if ledger["renders"]:  # some entries survived: keep them
                self._note(f"the resume record {problem}")
                return ledger
        self._note(f"ignoring the resume record: {problem}; its videos are rendered again and the record is replaced")
        return parse_ledger(b"{}")[0]

    @staticmethod
    def _note(message: str) -> None:
        print(f"mjarchive: {' '.join(message.split())}", file=sys.stderr)

    def _entry(self) -> dict[str, Any]:
        entry = self._data["renders"].get(self.key)
        return entry["outputs"] if entry is not None else {}

    def is_done(self, path: Path) -> bool:
        """True if `path` was finished by this request and the regular file at its name still has
        the recorded size and sha256 (re-hashed, streaming). `path` comes from the request: only
        its name is used, inside this ledger's folder."""
        name = Path(path).name
        rec = self._entry().get(name)
        if rec is None:
            return False
        return self.dir.digest(name, rec["bytes"]) == rec["sha256"]

    def mark_done(self, path: Path, n_frames: int, sha256: str, size: int) -> None:
        """Record a finished (renamed) video with the sha256 and size of what was written; the
        ledger is rewritten at most every _WRITE_INTERVAL seconds, and by `flush()`."""
        name = Path(path).name
        renders = self._data["renders"]
        for key, entry in list(renders.items()):  # a file of another request was just overwritten
            if key != self.key:
                entry["outputs"].pop(name, None)
                if not entry["outputs"]:
                    del renders[key]
        entry = renders.pop(self.key, None) or {"request": self._request, "outputs": {}}
        entry["outputs"][name] = {"frames": int(n_frames), "bytes": int(size), "sha256": str(sha256)}
        renders[self.key] = entry  # most recent last
        while len(renders) > _MAX_REQUESTS:
            del renders[next(iter(renders))]
        self._dirty = True
        if time.monotonic() - self._written >= _WRITE_INTERVAL:
            self.flush()

    def flush(self) -> None:
        """Write what `mark_done` recorded (atomically: temp file, then rename over the name)."""
        if self._dirty:
            self._write()
            self._dirty = False
            self._written = time.monotonic()

    def _serialize(self) -> bytes:
        """The ledger as compact JSON of at most MAX_LEDGER_BYTES: older requests, then the
        current request's oldest outputs are dropped until it fits (so it can always be read back)."""
        renders = self._data["renders"]
        while True:
            self._data["mac"] = ledger_mac(self._key, renders)
            text = json.dumps(self._data, separators=(",", ":")).encode()  # keeps oldest-first order
            if len(text) <= MAX_LEDGER_BYTES:
                return text
            if len(renders) > 1:
                del renders[next(iter(renders))]
                continue
            outputs = next(iter(renders.values()))["outputs"]
            drop = max(1, len(outputs) - int(len(outputs) * MAX_LEDGER_BYTES / len(text) * 0.95))
            for name in list(outputs)[:drop]:
                del outputs[name]

    def _write(self) -> None:
        if self._key is not None:
            self.dir.write_bytes(LEDGER_NAME, self._serialize())
