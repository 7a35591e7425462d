"""Contact sheets: a labelled PNG grid of frames (columns) by worlds (rows), rendered on demand."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import MjArchiveError, SelectionError
from .._fs import OutputDir

__all__ = ["contact_sheet", "DEFAULT_ROWS", "DEFAULT_COLUMNS", "MAX_TILES"]

DEFAULT_ROWS = 4
DEFAULT_COLUMNS = 6
MAX_TILES = 2048  # a sheet larger than this is a mistyped selection, not a preview

_BACKGROUND = (24, 24, 28)
_TEXT = (235, 235, 235)
_PAD = 4


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has a single bitmap size
        return ImageFont.load_default()


def sheet_geometry(n_rows: int, n_cols: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """(sheet height, sheet width, label column width, header height) in pixels for a grid of
    `n_rows` × `n_cols` tiles of `size` = (height, width)."""
    h, w = size
    label_w, header_h = 84, 34
    return header_h + n_rows * (h + _PAD) + _PAD, label_w + n_cols * (w + _PAD) + _PAD, label_w, header_h


def contact_sheet(archive: Any, out: str | os.PathLike, *, worlds: Any = None, frames: Any = None,
                  camera: Any = None, size: tuple[int, int] = (120, 160), backend: str = "cpu",
                  quality: str = "fast", model: Any = None, overlays: Any = None) -> Path:
    """Render a grid of frames (columns) × worlds (rows) and write it as a PNG; returns its path.

    archive: an open `Archive`. worlds: original world IDs (int, list or slice over IDs; default
    the first 4 worlds). frames: int, slice or index list over committed frames (default 6 evenly
    spaced frames). camera: a model camera's name or id, a Camera or its CLI form (default: the first
    named camera, else Camera.auto()). overlays: as in `render` (None: all, `()`: none).
    size: (height, width) of one tile in pixels. Each column is labelled with its frame index and
    simulation time, each row with its world ID, and each tile with its episode number.
    """
    from PIL import Image, ImageDraw

    import mjarchive

    with OutputDir(Path(out).parent) as folder:  # refuse a directory at the name before rendering
        folder.check_writable(Path(out).name)
    n = archive.n_frames
    if n == 0:
        raise MjArchiveError("the archive has no committed frames yet; nothing to preview")
    if worlds is None:
        world_ids = list(archive.world_ids[:DEFAULT_ROWS])
    else:
        world_ids = list(archive.select(worlds=worlds, frames=slice(0, 0)).world_ids)
    if frames is None:
        frame_idx = np.unique(np.linspace(0, n - 1, min(DEFAULT_COLUMNS, n)).round().astype(np.int64))
    else:
        frame_idx = np.asarray(archive.select(worlds=world_ids[:1], frames=frames).frame_indices, dtype=np.int64)
    if not len(world_ids) or not len(frame_idx):
        raise SelectionError("the selection is empty; choose at least one world and one frame")
    if len(world_ids) * len(frame_idx) > MAX_TILES:
        raise SelectionError(
            f"{len(world_ids)} worlds × {len(frame_idx)} frames is more than {MAX_TILES} tiles; select fewer, "
            "e.g. --frames ::100 --worlds 0:8"
        )
    h, w = int(size[0]), int(size[1])
    times = archive.select(frames=frame_idx).time
    episode = {int(wid): archive.episode_numbers(int(wid), frame_idx) for wid in world_ids}  # 0-based, per column

    sheet_h, sheet_w, label_w, header_h = sheet_geometry(len(world_ids), len(frame_idx), (h, w))
    sheet = Image.new("RGB", (sheet_w, sheet_h), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font, small = _font(13), _font(11)
    col = {int(f): c for c, f in enumerate(frame_idx)}
    row = {int(wid): r for r, wid in enumerate(world_ids)}
    for c, (f, t) in enumerate(zip(frame_idx, times)):
        x = label_w + _PAD + c * (w + _PAD)
        draw.text((x, 3), f"frame {int(f)}", fill=_TEXT, font=font)
        draw.text((x, 18), f"t = {float(t):.2f} s", fill=_TEXT, font=small)
    for r, wid in enumerate(world_ids):
        y = header_h + _PAD + r * (h + _PAD)
        draw.text((6, y + h // 2 - 8), f"world {wid}", fill=_TEXT, font=font)

    seen = 0
    for wid, f, rgb in mjarchive.iter_frames(archive, worlds=world_ids, frames=frame_idx, camera=camera,
                                             size=(h, w), backend=backend, quality=quality, model=model,
                                             overlays=overlays):
        r, c = row[int(wid)], col[int(f)]
        x, y = label_w + _PAD + c * (w + _PAD), header_h + _PAD + r * (h + _PAD)
        sheet.paste(Image.fromarray(np.asarray(rgb, dtype=np.uint8)), (x, y))
        label = f"ep {int(episode[int(wid)][c])}"
        box = draw.textbbox((x + 3, y + 2), label, font=small)
        draw.rectangle((box[0] - 2, box[1] - 1, box[2] + 2, box[3] + 1), fill=(0, 0, 0))
        draw.text((x + 3, y + 2), label, fill=_TEXT, font=small)
        seen += 1
    if seen != len(world_ids) * len(frame_idx):
        raise MjArchiveError(f"rendered {seen} tiles, expected {len(world_ids) * len(frame_idx)}")
    out = Path(out)
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    # The sheet replaces whatever is at its name (a planted link is replaced, never written
    # through: the user asked for a PNG file there); a directory there is refused.
    with OutputDir(out.parent) as folder:
        folder.write_bytes(out.name, buf.getvalue())
    return out
