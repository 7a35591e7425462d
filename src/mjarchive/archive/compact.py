"""`compact()`: one single-part archive from a multi-part archive, or from several archives of one
model (seeds), streamed block by block through the ordinary writer and verified when written.

Above `opening.py` and `writer.py`: it reads through `open()` and writes through `create()`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np

from .._errors import MjArchiveError, SelectionError
from .bundle.model_bundle import ModelBundle
from .opening import open as open_archive
from .storage.locations import local_path
from .writer import DEFAULT_SHARD_WORLDS, create

__all__ = ["compact", "CompactResult", "WorldMapping"]

#: Decoded bytes of one block of frames of every world (the writer buffers one chunk besides).
BLOCK_BYTES = 256 * 2**20


@dataclasses.dataclass(frozen=True)
class WorldMapping:
    """Where a world of the compacted archive came from: `source` (as given), `part` (None for a
    single-part source), its ID there and its ID in the output."""

    source: str
    part: str | None
    old_id: int
    new_id: int


@dataclasses.dataclass(frozen=True)
class CompactResult:
    """What `compact` wrote: the output location, its world and frame counts, and each world's origin
    in output order."""

    location: Any
    n_worlds: int
    n_frames: int
    worlds: tuple[WorldMapping, ...]


@dataclasses.dataclass
class _Piece:
    """One single-part input: a single archive, or one joined part of a multi-part archive."""

    source: str
    part: str | None
    archive: Any

    @property
    def name(self) -> str:
        return self.source if self.part is None else f"{self.source} (part {self.part!r})"


def compact(sources: Any, dest: Any, *, renumber: bool = False, frames: slice | None = None,
            progress: Callable[[int, int], None] | None = None, overwrite: bool = False,
            storage_options: dict | None = None, verify: bool = True) -> CompactResult:
    """Rewrite one multi-part archive, or several archives of the same model (e.g. one per seed),
    into one single-part archive at `dest`, reading and writing one chunk of frames at a time.

    `sources`: a path or URL, or a sequence of them. Their worlds are joined in the order given
    (the parts of a multi-part archive in name order), with qpos, mocap, resets, time, tracks,
    overlays and variant events as stored, in the same storage dtype, precision, chunk length,
    cadence and model bundle. Every input must have the same model and settings (MjArchiveError
    naming both and what differs) and the same committed frames at equal times; `frames`
    (a slice `A:B`, step 1) takes the same range of every input instead, never dropping frames
    silently. World IDs must be distinct across inputs; `renumber=True` numbers the worlds
    0..N-1 in output order instead. `progress(frames_done, frames_total)` is called after each
    block. With `verify` (default), the written archive is read back and verified.

    Returns a CompactResult whose `worlds` maps (source, part, old ID) to the new ID. A failure
    while writing leaves `dest` with the frames written so far: pass `overwrite=True` to redo it.
    """
    locations = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not locations:
        raise MjArchiveError("compact needs at least one source archive")
    _refuse_overwriting_a_source(locations, dest)
    opened: list[Any] = []
    try:
        pieces = []
        for location in locations:
            archive = open_archive(location, storage_options=storage_options)
            opened.append(archive)
            pieces += _pieces(str(location), archive)
        for piece in pieces[1:]:
            _check_same_kind(pieces[0], piece)
        start, stop = _common_frames(pieces, frames)
        mapping = _mapping(pieces, renumber)
        writer = _create(pieces, dest, [m.new_id for m in mapping], overwrite, storage_options)
        try:
            with writer:
                _copy(pieces, writer, start, stop, progress)
        except Exception as exc:  # what was copied stays readable; say that it is not all
            kind = type(exc) if isinstance(exc, MjArchiveError) else MjArchiveError
            raise kind(f"compacting into {str(dest)!r} failed after {writer.n_committed} of {stop - start} "
                                 f"frames ({exc}); it holds only those frames: run compact again with "
                                 "overwrite=True") from exc
    finally:
        for archive in opened:
            archive.close()
    if verify:
        with open_archive(dest, storage_options=storage_options) as out:
            report = out.verify()
        if not report.ok:
            raise MjArchiveError(f"the compacted archive {str(dest)!r} does not verify: {report}")
    return CompactResult(dest, len(mapping), stop - start, tuple(mapping))


def _refuse_overwriting_a_source(locations: list[Any], dest: Any) -> None:
    def key(location: Any) -> str:
        path = local_path(location)
        return str(path.resolve()) if path is not None else str(location).rstrip("/")

    if key(dest) in {key(loc) for loc in locations}:
        raise MjArchiveError(f"the destination {str(dest)!r} is one of the sources; write to a new location")


def _pieces(source: str, archive: Any) -> list[_Piece]:
    """The single-part inputs of one opened source: its joined parts in name order, or itself."""
    parts = tuple(getattr(archive, "parts", ()))
    pieces = [_Piece(source, p, archive.part(p)) for p in parts] if parts else [_Piece(source, None, archive)]
    if not pieces or not all(p.archive.n_worlds for p in pieces):
        raise MjArchiveError(f"{source!r} has no committed worlds to compact")
    return pieces


def _check_same_kind(a: _Piece, b: _Piece) -> None:
    """Refuse inputs that cannot share one archive, naming both and what differs."""
    ma, mb = a.archive.manifest, b.archive.manifest
    checks = {
        "model bundle (sha256)": (ma.model_sha256, mb.model_sha256),
        "qpos layout": (ma.layout, mb.layout),
        "timestep": (ma.timestep, mb.timestep),
        "output_fps": (ma.output_fps, mb.output_fps),
        "playback_speed": (ma.playback_speed, mb.playback_speed),
        "storage dtype": (ma.dtype, mb.dtype),
        "precision (abs_error)": (ma.abs_error, mb.abs_error),
        "tracks": (ma.tracks, mb.tracks),
        # (each field's chunk_events is its writer's own choice: a multi-part archive's parts may differ)
        "variant fields": ({k: (v.shape, v.dtype) for k, v in ma.variants.items()},
                           {k: (v.shape, v.dtype) for k, v in mb.variants.items()}),
        "overlays": (ma.overlays, mb.overlays),
    }
    for what, (va, vb) in checks.items():
        if va != vb:
            shown = ("differ" if what == "qpos layout" else f"{_short(va)} vs {_short(vb)}")
            raise MjArchiveError(f"{a.name} and {b.name} differ in {what} ({shown}); compact joins archives of "
                                 "one model recorded with the same settings only")


def _short(value: Any) -> str:
    if isinstance(value, dict):
        value = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in value.items()}
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _common_frames(pieces: list[_Piece], frames: slice | None) -> tuple[int, int]:
    """The frame range [start, stop) taken from every input; equal times there, or refused."""
    counts = [p.archive.n_frames for p in pieces]
    listed = ", ".join(f"{p.name}: {n}" for p, n in zip(pieces, counts))
    if frames is None:
        if len(set(counts)) > 1:
            raise SelectionError(
                f"the inputs have different committed frame counts ({listed}); compact never drops frames "
                f"silently: take the first {min(counts)} of each with frames=slice(0, {min(counts)}) "
                f"(command line: --frames :{min(counts)})")
        start, stop = 0, counts[0]
    else:
        if not isinstance(frames, slice) or frames.step not in (None, 1):
            raise SelectionError(f"frames must be a range START:STOP of consecutive frames, got {frames!r}")
        ranges = set()
        for p, n in zip(pieces, counts):
            if frames.stop is not None and frames.stop > n or frames.start is not None and frames.start > n:
                raise SelectionError(f"frames {frames.start or ''}:{frames.stop or ''} reach past the {n} committed "
                                     f"frames of {p.name} ({listed})")
            ranges.add(frames.indices(n)[:2])
        if len(ranges) > 1:
            raise SelectionError(f"frames {frames.start or ''}:{frames.stop or ''} means different frames in inputs "
                                 f"of different lengths ({listed}); give both ends, e.g. --frames 0:{min(counts)}")
        start, stop = ranges.pop()
    if stop <= start:
        raise SelectionError(f"no frames to compact ({listed}; frames {start}:{stop})")
    times = pieces[0].archive.select(frames=slice(start, stop)).time
    for p in pieces[1:]:
        other = p.archive.select(frames=slice(start, stop)).time
        if not np.array_equal(times, other):
            f = int(np.flatnonzero(times != other)[0])
            raise SelectionError(
                f"{pieces[0].name} and {p.name} differ in time at frame {start + f} ({times[f]!r} vs {other[f]!r}); "
                "the worlds of one archive share one time axis")
    return start, stop


def _mapping(pieces: list[_Piece], renumber: bool) -> list[WorldMapping]:
    old = [(p, int(w)) for p in pieces for w in p.archive.world_ids]
    if not renumber:
        seen: dict[int, _Piece] = {}
        for p, w in old:
            if w in seen:
                where = f"both {seen[w].name} and {p.name}" if seen[w] is not p else p.name
                raise MjArchiveError(f"world ID {w} is in {where}; pass renumber=True (command line: --renumber) "
                                     "to number the worlds 0..N-1 in order")
            seen[w] = p
    return [WorldMapping(p.source, p.part, w, i if renumber else w) for i, (p, w) in enumerate(old)]


def _create(pieces: list[_Piece], dest: Any, world_ids: list[int], overwrite: bool, storage_options: dict | None):
    first = pieces[0].archive
    m = first.manifest
    stored = first.bundle  # hash-verified against the manifest
    # The bundle is someone else's: its model comes from the sandboxed compile (`Archive.model`), so
    # `create` never compiles it in this process.
    bundle = ModelBundle._compiled(stored.xml, stored.assets, first.model(), stored.written_as)
    backends = {p.archive.manifest.producer.get("backend", "unknown") for p in pieces}
    return create(dest, bundle, world_ids=world_ids, timestep=m.timestep, output_fps=m.output_fps,
                  playback_speed=m.playback_speed, dtype=m.dtype, precision=m.abs_error, tracks=dict(m.tracks),
                  chunk_frames=m.chunk_frames, shard_worlds=DEFAULT_SHARD_WORLDS, overwrite=overwrite,
                  check_finite=False,  # copies what was stored, also values a source allowed to be NaN
                  backend=backends.pop() if len(backends) == 1 else "unknown", storage_options=storage_options,
                  variant_fields=tuple(m.variants), overlays=dict(m.overlays))


def _block_frames(pieces: list[_Piece]) -> int:
    """Frames per block: a chunk, or fewer so one block of every world stays within BLOCK_BYTES."""
    m = pieces[0].archive.manifest
    n_worlds = sum(p.archive.n_worlds for p in pieces)
    per_frame = n_worlds * sum(int(np.prod(tail)) * np.dtype(dt).itemsize for tail, dt in m.per_frame_arrays().values())
    return max(1, min(m.chunk_frames, BLOCK_BYTES // max(1, per_frame)))


def _copy(pieces: list[_Piece], writer: Any, start: int, stop: int,
          progress: Callable[[int, int], None] | None) -> None:
    m = pieces[0].archive.manifest
    # qpos, reset, mocap: Selection attributes; tracks through track() (a track may be named "shape")
    names = [n for n in m.per_frame_arrays() if not n.startswith("overlays/") and n not in m.tracks]
    events = _variant_events(pieces, writer.world_ids, start, stop)
    done_events = 0
    block = _block_frames(pieces)
    for lo in range(start, stop, block):
        hi = min(stop, lo + block)
        while done_events < len(events) and events[done_events][0] < hi - start:
            frame, ids, field, values = events[done_events]
            writer.set_variant(ids, frame=frame, **{field: values})
            done_events += 1
        selections = [p.archive.select(frames=slice(lo, hi)) for p in pieces]
        arrays = {n: np.concatenate([getattr(s, n) for s in selections], axis=1) for n in names}
        arrays.update({n: np.concatenate([s.track(n) for s in selections], axis=1) for n in m.tracks})
        overlays = {name: _overlay_frames(selections, name, hi - lo) for name in m.overlays}
        writer.append(selections[0].time, **arrays, overlays=overlays or None)
        if progress is not None:
            progress(hi - start, stop - start)


def _overlay_frames(selections: list[Any], name: str, k: int) -> list[list[Any]]:
    """One overlay over a block, as `append` takes it: per frame, one list of primitives per world."""
    read = [s.overlay(name) for s in selections]
    return [[o.items(f, w) for o in read for w in range(o.count.shape[1])] for f in range(k)]


def _variant_events(pieces: list[_Piece], new_ids: tuple[int, ...], start: int,
                    stop: int) -> list[tuple[int, np.ndarray, str, np.ndarray]]:
    """The variant events of frames [start, stop) as `set_variant` calls (output frame, new world IDs,
    field, values) in frame order; the values a world was given before `start` become events at 0."""
    calls = []
    offset = 0
    for p in pieces:
        ids = np.asarray(new_ids[offset:offset + p.archive.n_worlds], np.int64)
        offset += p.archive.n_worlds
        for field in p.archive.manifest.variants:
            ev = p.archive.variant_events(field)
            before = np.flatnonzero(ev["frame"] < start)
            last = {}  # world position -> its last event before start (a later one wins)
            for i in before.tolist():
                last[int(ev["world"][i])] = i
            rows = np.array([*last.values(), *np.flatnonzero((ev["frame"] >= start) & (ev["frame"] < stop))], np.int64)
            frames = np.where(ev["frame"][rows] < start, 0, ev["frame"][rows] - start)
            bounds = np.flatnonzero(np.diff(frames)) + 1
            for group in np.split(np.arange(len(rows)), bounds) if len(rows) else ():
                r = rows[group]
                calls.append((int(frames[group[0]]), ids[ev["world"][r]], field, ev["value"][r]))
    calls.sort(key=lambda call: call[0])  # stable: within a frame, inputs and their events keep their order
    return calls
