"""Recorded debug overlays (format 1.1): points, arrows and text labels per frame and world.

Each overlay is stored as per-frame arrays under `overlays/<name>/`: `count` (frame, world) int32,
`data` (frame, world, max_count, 3 or 6) float32 (xyz, or start and end of an arrow; for text the
anchor, NaN meaning the world's first body), and for text `text` (frame, world, max_count,
max_bytes) uint8, UTF-8 padded with zero bytes. Slots at or past `count` are zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

import numpy as np

from .._errors import AppendError, FormatError, MjArchiveError
from .format import MAX_TRACK_ELEMENTS, check_track_name

__all__ = ["Overlay", "OverlayFrames", "MAX_OVERLAYS", "MAX_OVERLAY_COUNT", "MAX_TEXT_BYTES",
           "overlay_specs", "pack_frames", "OverlayRows", "check_counts", "read_rows"]

MAX_OVERLAYS = 64
MAX_OVERLAY_COUNT = 4096  # primitives per frame and world
MAX_TEXT_BYTES = 1024
MAX_PRIMITIVE_SIZE = 1e3  # radius or width, metres
_WIDTH = {"points": 3, "arrows": 6, "text": 3}
_SIZE_KEY = {"points": "radius", "arrows": "width"}
# Characters a label must not contain (the same rule as names in the manifest).
_UNSAFE = {*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


@dataclasses.dataclass(frozen=True)
class Overlay:
    """A declared overlay track: `Overlay.points(...)`, `Overlay.arrows(...)` or `Overlay.text(...)`.

    Per frame and world it holds up to `max_count` primitives: points (n, 3) xyz in metres,
    arrows (n, 6) start xyz then end xyz, or text labels (strings, anchored at the world's first
    body, or `(xyz, string)` pairs), in world coordinates of the world they belong to.
    """

    kind: str
    max_count: int = 64
    size: float = 0.0  # radius of points, width of arrows; unused for text
    rgba: tuple[float, float, float, float] = (1.0, 0.0, 0.0, 1.0)
    max_bytes: int = 0  # text only: UTF-8 bytes per label

    @classmethod
    def points(cls, radius: float = 0.02, rgba: Any = (1.0, 0.0, 0.0, 1.0), max_count: int = 64) -> Overlay:
        return cls._make("points", max_count, radius, rgba, 0)

    @classmethod
    def arrows(cls, width: float = 0.01, rgba: Any = (0.0, 1.0, 0.0, 1.0), max_count: int = 64) -> Overlay:
        return cls._make("arrows", max_count, width, rgba, 0)

    @classmethod
    def text(cls, rgba: Any = (1.0, 1.0, 1.0, 1.0), max_count: int = 8, max_chars: int = 64) -> Overlay:
        return cls._make("text", max_count, 0.0, rgba, max_chars)

    @classmethod
    def _make(cls, kind, max_count, size, rgba, max_bytes) -> Overlay:
        try:
            d = {"kind": kind, "max_count": int(max_count), "rgba": [float(c) for c in rgba]}
            if kind in _SIZE_KEY:
                d[_SIZE_KEY[kind]] = float(size)
            else:
                d["max_bytes"] = int(max_bytes)
        except (TypeError, ValueError) as exc:
            raise AppendError(f"bad {kind} overlay settings: {exc}") from None
        try:
            return cls.from_dict(d)
        except FormatError as exc:
            raise AppendError(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "max_count": self.max_count}
        if self.kind in _SIZE_KEY:
            d[_SIZE_KEY[self.kind]] = self.size
        else:
            d["max_bytes"] = self.max_bytes
        d["rgba"] = list(self.rgba)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "overlay") -> Overlay:
        """Parse and validate an overlay entry (untrusted when read from an archive)."""
        if type(d) is not dict or type(d.get("kind")) is not str or d["kind"] not in _WIDTH:
            _fail(where, f"must be an object whose kind is one of {sorted(_WIDTH)}")
        kind = d["kind"]
        keys = {"kind", "max_count", "rgba", _SIZE_KEY.get(kind, "max_bytes")}
        if set(d) != keys:
            _fail(where, f"a {kind} overlay has exactly the keys {sorted(keys)}, found {sorted(map(str, d))[:8]}")
        n = d["max_count"]
        if type(n) is not int or not 1 <= n <= MAX_OVERLAY_COUNT:
            _fail(f"{where}.max_count", f"must be an integer in [1, {MAX_OVERLAY_COUNT}]")
        rgba = d["rgba"]
        if type(rgba) is not list or len(rgba) != 4 or not all(
                type(c) in (int, float) and 0 <= c <= 1 for c in rgba):
            _fail(f"{where}.rgba", "must be 4 numbers in [0, 1]")
        size, max_bytes = 0.0, 0
        if kind in _SIZE_KEY:
            size = d[_SIZE_KEY[kind]]
            if type(size) not in (int, float) or not 0 < size <= MAX_PRIMITIVE_SIZE:
                _fail(f"{where}.{_SIZE_KEY[kind]}", f"must be a number in (0, {MAX_PRIMITIVE_SIZE:g}] m")
        else:
            max_bytes = d["max_bytes"]
            if type(max_bytes) is not int or not 1 <= max_bytes <= MAX_TEXT_BYTES or n * max_bytes > MAX_TRACK_ELEMENTS:
                _fail(f"{where}.max_bytes", f"must be an integer in [1, {MAX_TEXT_BYTES}] with max_count × max_bytes "
                                            f"≤ {MAX_TRACK_ELEMENTS}")
        return cls(kind, n, float(size), tuple(float(c) for c in rgba), max_bytes)

    @property
    def width(self) -> int:
        """Numbers per primitive in `data`: 3 (xyz) or 6 (arrow start and end)."""
        return _WIDTH[self.kind]

    def arrays(self, name: str) -> dict[str, tuple[tuple[int, ...], str]]:
        """Store key → (shape after (frame, world), dtype) of this overlay's per-frame arrays."""
        out = {f"overlays/{name}/count": ((), "int32"),
               f"overlays/{name}/data": ((self.max_count, self.width), "float32")}
        if self.kind == "text":
            out[f"overlays/{name}/text"] = ((self.max_count, self.max_bytes), "uint8")
        return out

    # -- writing -------------------------------------------------------------------------------------
    def pack(self, name: str, value: Any, n_worlds: int, frame: int) -> dict[str, np.ndarray]:
        """One frame's value (see the class docstring) as this overlay's arrays for W worlds."""
        count = np.zeros((n_worlds,), np.int32)
        data = np.zeros((n_worlds, self.max_count, self.width), np.float32)
        text = np.zeros((n_worlds, self.max_count, self.max_bytes), np.uint8) if self.kind == "text" else None
        where = f"overlay {name!r} at frame {frame}"
        if value is None:
            per_world: Any = [None] * n_worlds
        elif self.kind != "text" and hasattr(value, "__array__"):
            per_world = np.asarray(value, dtype=np.float64)
            if per_world.ndim != 3 or per_world.shape[0] != n_worlds or per_world.shape[2] != self.width:
                raise AppendError(f"{where} has shape {per_world.shape}; expected ({n_worlds}, n, {self.width}) or a "
                                  f"list of {n_worlds} per-world (n, {self.width}) arrays")
        else:
            per_world = list(value)
            if len(per_world) != n_worlds:
                raise AppendError(f"{where} has {len(per_world)} entries; give one per world ({n_worlds})")
        for w, item in enumerate(per_world):
            if item is None:
                continue
            if self.kind == "text":
                self._pack_labels(item, data[w], text[w], f"{where}, world position {w}")
                count[w] = len(item)
                continue
            rows = np.asarray(item, dtype=np.float64)
            if rows.size == 0:
                continue
            if rows.ndim != 2 or rows.shape[1] != self.width:
                raise AppendError(f"{where}, world position {w}: expected (n, {self.width}) numbers, got {rows.shape}")
            if len(rows) > self.max_count:
                raise AppendError(f"{where}, world position {w}: {len(rows)} {self.kind} exceed max_count="
                                  f"{self.max_count}; declare a larger max_count")
            if not np.isfinite(rows).all() or (np.abs(rows) > 1e6).any():
                raise AppendError(f"{where}, world position {w}: coordinates must be finite and within ±1e6 m")
            data[w, :len(rows)] = rows
            count[w] = len(rows)
        out = {f"overlays/{name}/count": count, f"overlays/{name}/data": data}
        if text is not None:
            out[f"overlays/{name}/text"] = text
        return out

    def _pack_labels(self, labels: Any, data: np.ndarray, text: np.ndarray, where: str) -> None:
        if isinstance(labels, str):
            raise AppendError(f"{where}: give a list of labels (strings or (xyz, string) pairs), not one string")
        labels = list(labels)
        if len(labels) > self.max_count:
            raise AppendError(f"{where}: {len(labels)} labels exceed max_count={self.max_count}")
        for i, label in enumerate(labels):
            pos = None
            if not isinstance(label, str):
                try:
                    pos, label = label
                except (TypeError, ValueError):
                    raise AppendError(f"{where}: a label is a string or an (xyz, string) pair, got {label!r:.60}") from None
            if not isinstance(label, str):
                raise AppendError(f"{where}: label {i} is not a string")
            unsafe = any(ord(c) in _UNSAFE or 0xD800 <= ord(c) <= 0xDFFF for c in label)
            raw = b"" if unsafe else label.encode("utf-8")
            if unsafe or len(raw) > self.max_bytes:
                raise AppendError(f"{where}: label {label!r:.60} must be at most {self.max_bytes} UTF-8 bytes "
                                  "without control characters")
            text[i, :len(raw)] = np.frombuffer(raw, np.uint8)
            if pos is None:
                data[i] = np.nan
            else:
                p = np.asarray(pos, dtype=np.float64)
                if p.shape != (3,) or not np.isfinite(p).all() or (np.abs(p) > 1e6).any():
                    raise AppendError(f"{where}: label {i}'s position must be 3 finite numbers within ±1e6 m")
                data[i] = p


def _fail(where: str, problem: str) -> NoReturn:
    raise FormatError(f"invalid overlay declaration at {where}: {problem} (see spec/README.md, Overlays)")


def overlay_specs(overlays: dict[str, Any] | None) -> dict[str, Overlay]:
    """The declarations of `create(overlays=...)`: Overlay values (or their dicts) by name."""
    if overlays is not None and len(overlays) > MAX_OVERLAYS:
        raise MjArchiveError(f"{len(overlays)} overlays declared; the format allows {MAX_OVERLAYS}")
    specs = {}
    for name, overlay in (overlays or {}).items():
        check_track_name(name, frozenset(), what="overlay")  # keys under overlays/: nothing to collide with
        if isinstance(overlay, dict):
            overlay = Overlay.from_dict(overlay)
        if not isinstance(overlay, Overlay):
            raise MjArchiveError(f"overlay {name!r} must be an mjarchive.Overlay (Overlay.points(...), "
                                 f".arrows(...) or .text(...)), got {type(overlay).__name__}")
        specs[name] = overlay
    return specs


def pack_frames(declared: dict[str, Overlay], overlays: dict[str, Any] | None, n_worlds: int, k: int, single: bool,
                first_frame: int) -> dict[str, np.ndarray]:
    """An append's overlays (one frame's values, or a sequence of k for a block) as the stored arrays
    with a leading frame axis; a declared overlay not given draws nothing."""
    if not declared:
        if overlays:
            raise AppendError("this archive declares no overlays; create it with "
                              "mjarchive.create(..., overlays={'name': mjarchive.Overlay.points(...)})")
        return {}
    overlays = dict(overlays or {})
    unknown = sorted(set(overlays) - set(declared))
    if unknown:
        raise AppendError(f"unknown overlay(s) {unknown}; declared: {sorted(declared)}")
    out: dict[str, np.ndarray] = {}
    for name, overlay in declared.items():
        value = overlays.get(name)
        per_frame = [value] if single else ([None] * k if value is None else list(value))
        if len(per_frame) != k:
            raise AppendError(f"overlay {name!r} has {len(per_frame)} frames for a block of {k}")
        packed = [overlay.pack(name, v, n_worlds, first_frame + i) for i, v in enumerate(per_frame)]
        for key in packed[0]:
            out[key] = np.stack([p[key] for p in packed])
    return out


def check_overlays(value: Any, where: str = "overlays") -> dict[str, Overlay]:
    """Parse the `overlays` object of the root attributes (names become store keys)."""
    if type(value) is not dict or not 1 <= len(value) <= MAX_OVERLAYS:
        _fail(where, f"must be an object of 1 to {MAX_OVERLAYS} overlays")
    out = {}
    for name, entry in value.items():
        check_track_name(name, frozenset(), what="overlay")  # keys under overlays/: nothing to collide with
        out[name] = Overlay.from_dict(entry, f"{where}.{name}")
    return out


@dataclasses.dataclass
class OverlayFrames:
    """One overlay over a selection: `count` (F, Wsel) int32, `data` (F, Wsel, max_count, 3|6)
    float32, and for text `text`: labels as nested lists, `text[frame][world]`, of strings."""

    overlay: Overlay
    count: np.ndarray
    data: np.ndarray
    text: list | None = None
    text_bytes: np.ndarray | None = None  # (F, Wsel, max_count, max_bytes) uint8 as stored

    @classmethod
    def decode(cls, overlay: Overlay, name: str, count: np.ndarray, data: np.ndarray,
               raw_text: np.ndarray | None) -> OverlayFrames:
        """Validate stored values (hostile) and decode labels."""
        if ((count < 0) | (count > overlay.max_count)).any():
            raise FormatError(f"overlay {name!r} stores a count outside [0, {overlay.max_count}]")
        used = np.arange(overlay.max_count) < count[..., None]
        values = data[used]
        if overlay.kind == "text":
            values = values[~np.isnan(values).all(axis=-1)]
        if not np.isfinite(values).all() or (np.abs(values) > 1e6).any():
            raise FormatError(f"overlay {name!r} stores non-finite or huge coordinates")
        text = None
        if raw_text is not None:
            text = [[[_decode_label(raw_text[f, w, i], name) for i in range(int(count[f, w]))]
                     for w in range(count.shape[1])] for f in range(count.shape[0])]
        return cls(overlay, count, data, text, raw_text)

    def items(self, f: int, w: int) -> Any:
        """Frame f's (selection-relative) primitives of world w: (n, 3|6) float32, or for text a list
        of (xyz or None, label)."""
        n = int(self.count[f, w])
        if self.text is None:
            return self.data[f, w, :n]
        return [(None if np.isnan(self.data[f, w, i]).all() else self.data[f, w, i], self.text[f][w][i])
                for i in range(n)]


def check_counts(overlay: Overlay, name: str, count: np.ndarray) -> np.ndarray:
    """Stored counts (hostile) checked against the overlay's max_count; int64."""
    count = np.asarray(count).astype(np.int64)
    if ((count < 0) | (count > overlay.max_count)).any():
        raise FormatError(f"overlay {name!r} stores a count outside [0, {overlay.max_count}]")
    return count


@dataclasses.dataclass(frozen=True)
class OverlayRows:
    """What one frame of an overlay holds over a selection's worlds, only the primitives asked for
    (`read_rows`): `data` (N, 3 | 6) float64 as stored (world coordinates; a text anchor of NaN
    means the world's first body), `world` (N,) each one's world position in the selection's
    order, world by world, and for text `labels` (N strings)."""

    data: np.ndarray
    world: np.ndarray
    labels: tuple[str, ...] = ()


def read_rows(overlay: Overlay, name: str, take: np.ndarray, frames: np.ndarray, chunk_frames: int,
              read: Any) -> list[OverlayRows]:
    """The first `take[f, w]` primitives of each frame f and world w of a selection (F, W): a list
    of F OverlayRows. `frames` (F,): the stored frame indices; `read(key, rows, w)`: the stored
    values of array `key` at frames `frames[rows]` of world position w, (len(rows), 1, ...).

    Bounded by what is taken, not what is stored: only worlds that take something are read, one
    stored chunk of one world at a time (at most one decoded chunk is held), and only the taken
    primitives are kept and checked (hostile values: finite coordinates, labels in UTF-8)."""
    take = np.asarray(take, np.int64)
    frames = np.asarray(frames, np.int64)
    if take.ndim != 2 or len(take) != len(frames) or ((take < 0) | (take > overlay.max_count)).any():
        raise MjArchiveError(f"overlay {name!r}: take must be ({len(frames)}, worlds) counts in [0, {overlay.max_count}]")
    pieces: list[list[tuple[int, np.ndarray, list[str]]]] = [[] for _ in range(len(frames))]
    chunk = frames // max(1, int(chunk_frames))
    for w in np.flatnonzero(take.any(axis=0)).tolist():
        wanted = take[:, w] > 0
        for c in np.unique(chunk[wanted]).tolist():
            rows = np.flatnonzero(wanted & (chunk == c))
            k = int(take[rows, w].max())
            data = np.asarray(read(f"overlays/{name}/data", rows, w))[:, 0, :k]
            text = np.asarray(read(f"overlays/{name}/text", rows, w))[:, 0, :k] if overlay.kind == "text" else None
            for j, r in enumerate(rows.tolist()):
                n = int(take[r, w])
                values = np.array(data[j, :n], np.float64)
                checked = values[~np.isnan(values).all(axis=-1)] if overlay.kind == "text" else values
                if not np.isfinite(checked).all() or (np.abs(checked) > 1e6).any():
                    raise FormatError(f"overlay {name!r} stores non-finite or huge coordinates")
                labels = [] if text is None else [_decode_label(text[j, i], name) for i in range(n)]
                pieces[r].append((w, values, labels))
    width = overlay.width
    out = []
    for parts in pieces:
        if not parts:
            out.append(OverlayRows(np.zeros((0, width)), np.zeros(0, np.int64)))
            continue
        out.append(OverlayRows(np.concatenate([v for _, v, _ in parts]),
                               np.concatenate([np.full(len(v), w, np.int64) for w, v, _ in parts]),
                               tuple(label for _, _, labels in parts for label in labels)))
    return out


def _decode_label(raw: np.ndarray, name: str) -> str:
    data = raw.tobytes().rstrip(b"\0")
    try:
        label = data.decode("utf-8", "strict")
    except UnicodeDecodeError:
        raise FormatError(f"overlay {name!r} stores a label that is not UTF-8") from None
    if "\0" in label or any(ord(c) in _UNSAFE for c in label):
        raise FormatError(f"overlay {name!r} stores a label with control characters")
    return label
