"""Heads-up display: text burned into rendered frames (world, episode, frame, time, archived tracks).

`Hud.parse` turns the user's `hud=` choice (True, a CLI string "world,time,reward,bottom-right" or a
sequence of names) into a validated, hashable record; `format_lines` turns one frame's values into
lines of text; `draw_text` burns those lines into a corner of an RGB frame in place, and
`draw_label` puts a short label over a pixel (world ids over robots). Drawing touches only the
pixels of the box it covers, because it runs once per frame per video.

Example:
    hud = Hud.parse("world,time,reward", track_names=archive.track_names)
    lines = format_lines(hud, world=3, time=1.25, tracks={"reward": 0.53})
    draw_text(rgb, lines, hud.corner)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..._errors import MjArchiveError

__all__ = ["HUD_FIELDS", "CORNERS", "Hud", "HudText", "format_lines", "draw_text", "draw_label", "font_size",
           "sanitize"]

#: Fields every archive has; an archive's track names are valid fields too.
HUD_FIELDS = ("world", "episode", "frame", "time")
CORNERS = ("top-left", "top-right", "bottom-left", "bottom-right")
#: Longest track name shown; names come from someone else's archive.
MAX_NAME = 32
#: Components of a vector track shown before "…".
MAX_COMPONENTS = 4
ELLIPSIS = "\u2026"


def sanitize(text: object, limit: int = MAX_NAME) -> str:
    """`text` as printable ASCII (other characters dropped), at most `limit` characters."""
    clean = "".join(ch for ch in str(text) if " " <= ch <= "~")
    return clean[:limit]


def _shown(names: Iterable[str]) -> str:
    return ", ".join(repr(sanitize(n)) for n in names)


@dataclasses.dataclass(frozen=True)
class Hud:
    """What the HUD shows: `fields` (built-in names or track names, in order) in one `corner`."""

    fields: tuple[str, ...]
    corner: str = "top-left"

    def __post_init__(self):
        object.__setattr__(self, "fields", tuple(self.fields))
        if not self.fields or not all(isinstance(f, str) and f for f in self.fields):
            raise MjArchiveError(f"a HUD needs at least one field name; valid built-in fields: {', '.join(HUD_FIELDS)}")
        if self.corner not in CORNERS:
            raise MjArchiveError(f"HUD corner must be one of {', '.join(CORNERS)}, got {sanitize(self.corner)!r}")

    @classmethod
    def parse(cls, value, track_names: Sequence[str] = ()) -> Hud | None:
        """A Hud from the user's choice, or None for no HUD.

        value: None, False, "" or () (no HUD); True (the world id, top-left); a Hud or its
        `to_dict()`; a comma-separated string "world,episode,time,reward,bottom-right"; or a sequence
        of names. Each name is a field (one of HUD_FIELDS or of `track_names`, the archive's tracks)
        or at most one of CORNERS. Duplicate fields are dropped, the order is kept.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls(("world",))
        if isinstance(value, Hud):
            items: list = [*value.fields, value.corner]
        elif isinstance(value, Mapping):
            unknown_keys = set(value) - {"fields", "corner"}
            if unknown_keys:
                raise MjArchiveError(
                    f"a HUD dict has the keys 'fields' and 'corner', got {_shown(map(str, unknown_keys))}")
            items = [*_as_items(value.get("fields", ())), value.get("corner", "top-left")]
        else:
            items = _as_items(value)
        if not items:
            return None
        tracks = tuple(str(t) for t in track_names)
        valid = set(HUD_FIELDS) | set(tracks)
        fields: list[str] = []
        corners: list[str] = []
        unknown: list[str] = []
        for item in items:
            if not isinstance(item, str):
                unknown.append(repr(item))
            elif item in CORNERS:
                corners.append(item)
            elif item in valid:
                if item not in fields:
                    fields.append(item)
            else:
                unknown.append(item)
        problems = []
        if unknown:
            fields_text = ", ".join([*HUD_FIELDS, *(repr(sanitize(t)) for t in tracks if t not in HUD_FIELDS)])
            problems.append(f"unknown HUD field(s) {_shown(unknown)}; valid fields: {fields_text}; "
                            f"valid corners: {', '.join(CORNERS)}")
        if len(set(corners)) > 1:
            problems.append(f"choose one HUD corner, got {', '.join(dict.fromkeys(corners))}")
        if problems:
            raise MjArchiveError("; ".join(problems))
        return cls(tuple(fields) or ("world",), corners[0] if corners else "top-left")

    def to_dict(self) -> dict:
        return {"fields": list(self.fields), "corner": self.corner}

    @classmethod
    def from_dict(cls, data: Mapping) -> Hud:
        return cls(tuple(data["fields"]), data.get("corner", "top-left"))

    def key(self) -> str:
        """A stable JSON string identifying this HUD (part of a render's resume key)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def _as_items(value) -> list:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise MjArchiveError(
            f"hud must be True, a comma-separated string like 'world,time,bottom-right' or a list of names, "
            f"got {type(value).__name__}; valid fields: {', '.join(HUD_FIELDS)} and the archive's track names; "
            f"valid corners: {', '.join(CORNERS)}")
    return [item.strip() if isinstance(item, str) else item for item in value]


def _number(x) -> str:
    """World, episode and frame numbers in full (frame 1234567, never 1.235e+06)."""
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    return str(int(x)) if math.isfinite(x) and x == int(x) else f"{x:.4g}"


def _value_text(value) -> str:
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        return sanitize(value)
    flat = arr.reshape(-1)
    if flat.size == 1:
        return f"{float(flat[0]):.4g}"
    shown = " ".join(f"{float(v):.4g}" for v in flat[:MAX_COMPONENTS])
    return f"[{shown}{' ' + ELLIPSIS if flat.size > MAX_COMPONENTS else ''}]"


def format_lines(hud: Hud, *, world: int | None = None, episode: int | None = None, frame: int | None = None,
                 time: float | None = None, tracks: Mapping[str, object] | None = None) -> list[str]:
    """The HUD's lines for one frame, in `hud.fields` order; fields whose value is None are skipped.

    time: seconds. tracks: track name -> this frame's value (a scalar shows 4 significant digits, a
    vector its first 4 components then "…"). Track names are shown as printable ASCII, at most 32
    characters.
    Example: ["world 42", "episode 3", "frame 1200", "t 12.340 s", "reward 0.5321"].
    """
    tracks = tracks or {}
    builtin = {"world": world, "episode": episode, "frame": frame, "time": time}
    lines = []
    for field in hud.fields:
        if field in builtin:
            value = builtin[field]
            if value is None:
                continue
            t = float(value) if field == "time" else 0.0
            lines.append((f"t {t:.3f} s" if abs(t) < 1e6 else f"t {t:.4g} s") if field == "time"
                         else f"{field} {_number(value)}")
        else:
            value = tracks.get(field)
            if value is None:
                continue
            lines.append(f"{sanitize(field) or '?'} {_value_text(value)}")
    return lines


# --- drawing --------------------------------------------------------------------------------------

def font_size(height: int) -> int:
    """The HUD's font size in pixels for a frame `height` pixels tall."""
    return int(min(96, max(8, round(height / 22))))


@functools.lru_cache(maxsize=32)
def _font(size: int):
    """(font, scale): Pillow's scalable default font at `size`, else its bitmap font and an upscale factor."""
    from PIL import ImageFont

    try:
        font = ImageFont.load_default(size=size)
        if isinstance(font, ImageFont.FreeTypeFont):
            return font, 1
    except (TypeError, OSError, ImportError):  # Pillow < 10.1 or no FreeType
        pass
    font = ImageFont.load_default()
    return font, max(1, round(size / 11))


class _Glyphs:
    """One FreeType font's glyphs rendered once each: (alpha (h, w) uint8, dx, dy, advance) per character.

    Composing lines from cached glyphs costs a fifth of Pillow laying out and rasterising every line
    of every frame; kerning is ignored, which short HUD lines do not show.
    """

    def __init__(self, font):
        self.font = font
        ascent, descent = font.getmetrics()
        self.line_h = ascent + descent
        self.cache: dict[str, tuple[np.ndarray | None, int, int, float]] = {}
        self._lock = threading.Lock()  # render threads share the font; FreeType faces are not thread-safe

    def glyph(self, ch: str) -> tuple[np.ndarray | None, int, int, float]:
        found = self.cache.get(ch)
        if found is None:
            with self._lock:
                found = self.cache.get(ch) or self._render(ch)
        return found

    def _render(self, ch: str) -> tuple[np.ndarray | None, int, int, float]:
        from PIL import Image, ImageDraw

        left, top, right, bottom = self.font.getbbox(ch, anchor="la")
        alpha = None
        if right > left and bottom > top:
            im = Image.new("L", (right - left, bottom - top), 0)
            ImageDraw.Draw(im).text((-left, -top), ch, fill=255, font=self.font, anchor="la")
            alpha = np.asarray(im, dtype=np.uint8)
        self.cache[ch] = found = (alpha, int(left), int(top), float(self.font.getlength(ch)))
        return found

    def width(self, line: str) -> float:
        return sum(self.glyph(ch)[3] for ch in line)


@functools.lru_cache(maxsize=32)
def _glyphs(size: int) -> _Glyphs | None:
    font, scale = _font(size)
    return _Glyphs(font) if scale == 1 and hasattr(font, "getmetrics") else None


class _Layout:
    """Metrics of `lines` in one font: line height, padding, box size (in output pixels)."""

    def __init__(self, lines: Sequence[str], size: int):
        self.glyphs = _glyphs(size)
        if self.glyphs is not None:
            self.font, self.scale = self.glyphs.font, 1
            # Printable ASCII and "…" only: what HUD lines hold, and a bound on the glyph cache.
            self.lines = ["".join(ch for ch in str(line) if " " <= ch <= "~" or ch == ELLIPSIS) for line in lines]
            self.line_h = self.glyphs.line_h
            widths = [self.glyphs.width(line) for line in self.lines]
        else:  # the bitmap font, drawn by Pillow and scaled up; it has no "…"
            self.font, self.scale = _font(size)
            self.lines = [sanitize(str(line).replace(ELLIPSIS, "..."), 10_000) for line in lines]
            self.line_h = self.font.getbbox("Ag")[3] + 1
            widths = [self.font.getbbox(line)[2] if line else 0 for line in self.lines]
        self.pad = max(1, round(self.line_h / 5))
        self.width = (math.ceil(max(widths, default=0)) + 2 * self.pad) * self.scale
        self.height = (len(self.lines) * self.line_h + 2 * self.pad) * self.scale


def _glyph_alpha(layout: _Layout, shape: tuple[int, int], ox: int, oy: int) -> np.ndarray:
    """The text's coverage (h, w) uint8 over the visible box, whose origin is the box's (ox, oy) <= 0."""
    h, w = shape
    alpha = np.zeros((h, w), np.uint8)
    for i, line in enumerate(layout.lines):
        top = oy + layout.pad + i * layout.line_h
        if top >= h:
            break
        pen = float(ox + layout.pad)
        for ch in line:
            glyph, dx, dy, advance = layout.glyphs.glyph(ch)
            gx, gy = int(round(pen)) + dx, top + dy
            pen += advance
            if glyph is None:
                continue
            if gx >= w:
                break
            gh, gw = glyph.shape
            x1, y1 = max(gx, 0), max(gy, 0)
            x2, y2 = min(gx + gw, w), min(gy + gh, h)
            if x1 < x2 and y1 < y2:
                region = alpha[y1:y2, x1:x2]
                np.maximum(region, glyph[y1 - gy:y2 - gy, x1 - gx:x2 - gx], out=region)
    return alpha


def _pillow_alpha(layout: _Layout, shape: tuple[int, int], ox: int, oy: int) -> np.ndarray:
    """Like _glyph_alpha, drawn by Pillow with the bitmap font at 1/scale and scaled up."""
    from PIL import Image, ImageDraw

    h, w = shape
    s = layout.scale
    mask = Image.new("L", (-(-w // s), -(-h // s)), 0)
    draw = ImageDraw.Draw(mask)
    for i, line in enumerate(layout.lines):
        if line:
            xy = (ox // s + layout.pad, oy // s + layout.pad + i * layout.line_h)
            draw.text(xy, line, fill=255, font=layout.font)
    if s > 1:
        mask = mask.resize((mask.width * s, mask.height * s), Image.NEAREST)
    return np.asarray(mask, dtype=np.uint8)[:h, :w]


def _burn(rgb: np.ndarray, layout: _Layout, x0: int, y0: int) -> None:
    """Darken the box at (x0, y0) (clipped to the image) and burn the layout's text into it, in place."""
    h, w = rgb.shape[:2]
    xa, ya = max(0, x0), max(0, y0)
    xb, yb = min(w, x0 + layout.width), min(h, y0 + layout.height)
    if xa >= xb or ya >= yb:
        return
    shape = (yb - ya, xb - xa)
    make = _glyph_alpha if layout.glyphs is not None else _pillow_alpha
    alpha = make(layout, shape, x0 - xa, y0 - ya).astype(np.uint16)[:, :, None]
    patch = rgb[ya:yb, xa:xb]
    dark = patch // 3  # a dark, see-through box: the scene stays visible behind the text
    patch[...] = dark + ((255 - dark) * alpha + 127) // 255


def _check(rgb) -> np.ndarray:
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise MjArchiveError(
            f"HUD text is drawn into a writable (H, W, 3) uint8 RGB array, got "
            f"{getattr(rgb, 'shape', type(rgb).__name__)} {getattr(rgb, 'dtype', '')}".rstrip())
    if not rgb.flags.writeable:
        raise MjArchiveError("HUD text is drawn in place: pass a writable array (np.array(frame) copies one)")
    return rgb


def draw_text(rgb: np.ndarray, lines: Sequence[str], corner: str = "top-left") -> None:
    """Burn `lines` in place into `rgb` (H, W, 3) uint8: white text on a dark box in `corner`.

    The font size scales with the frame height (`font_size`); text that does not fit is clipped.
    """
    rgb = _check(rgb)
    if corner not in CORNERS:
        raise MjArchiveError(f"HUD corner must be one of {', '.join(CORNERS)}, got {sanitize(corner)!r}")
    if not lines:
        return
    h, w = rgb.shape[:2]
    size = font_size(h)
    layout = _Layout(list(lines), size)
    margin = max(1, size // 4)
    # Anchored so the text's start stays visible: a box too large for the frame is cut right/bottom.
    x0 = margin if corner.endswith("left") else max(0, w - margin - layout.width)
    y0 = margin if corner.startswith("top") else max(0, h - margin - layout.height)
    _burn(rgb, layout, x0, y0)


def draw_label(rgb: np.ndarray, text: str, xy: tuple[float, float], limit: int = 3 * MAX_NAME) -> None:
    """Burn a small label `text` (at most `limit` characters shown) in place, centred horizontally on
    pixel xy=(x, y) and just above it. Points outside the image (or not finite) are skipped; a label
    crossing the border is clipped.
    """
    rgb = _check(rgb)
    h, w = rgb.shape[:2]
    x, y = float(xy[0]), float(xy[1])
    if not (math.isfinite(x) and math.isfinite(y)) or not (0 <= x < w and 0 <= y < h):
        return
    text = sanitize(text, limit)
    if not text:
        return
    layout = _Layout([text], max(8, round(font_size(h) * 0.8)))
    x0 = int(round(x - layout.width / 2))
    y0 = int(round(y)) - layout.height - max(1, layout.pad)
    _burn(rgb, layout, x0, y0)


class HudText:
    """The corner text of each frame, from values the archive holds (read per unit, in the encoder).

    archive: the open Archive; `draw(world_id, unit, rgb)` burns unit's frames (a RenderUnit's
    frames and episodes; world_id None in grid and scene videos) into rgb (n, H, W, 3) in place."""

    def __init__(self, archive, hud: Hud):
        self.archive, self.hud = archive, hud
        self.tracks = [f for f in hud.fields if f in archive.tracks]

    def draw(self, world_id: int | None, unit, rgb: np.ndarray) -> None:
        frames = np.asarray(unit.frames, np.int64)
        # The world's own times (in a multi-part archive, its part's; a scene: its first world's).
        timed = [unit.world_id if world_id is None else world_id]
        times = self.archive.select(worlds=timed, frames=frames).time if "time" in self.hud.fields else None
        tracks = {}
        if world_id is not None and self.tracks:
            sel = self.archive.select(worlds=[world_id], frames=frames)
            tracks = {name: sel.track(name)[:, 0] for name in self.tracks}
        eps = unit.episodes
        for i, f in enumerate(unit.frames):
            lines = format_lines(self.hud, world=world_id, frame=int(f),
                                 episode=None if eps is None or eps.ndim != 1 else int(eps[i]),
                                 time=None if times is None else float(times[i]),
                                 tracks={k: v[i] for k, v in tracks.items()})
            if lines:
                draw_text(rgb[i], lines, self.hud.corner)
