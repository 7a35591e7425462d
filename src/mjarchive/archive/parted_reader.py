"""Reading a multi-part archive as one (spec/README.md, "Parts"): each joined part is read by its own
`Archive` over its folder, and the union answers the same questions an Archive does. A world's
frames, times, episodes, tracks, variants and overlays come from its own part; frame indices are
per part, so a selection spanning parts reaches only as far as the shortest of them."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any

import numpy as np

from .._errors import ArchiveNotFoundError, FormatError, MjArchiveError, SelectionError
from .format import ROOT_ATTR
from .parts import (PartsBudget, PartsRoot, check_part_name, check_parts_schema, in_part, is_parts_root, list_parts,
                    part_differences, part_document)
from .episode_index import check_episode_range
from .reader import Archive, Selection, VerifyReport
from .storage.locations import open_root_document

__all__ = ["PartedArchive", "PartedSelection", "open_part"]


class PartedArchive(Archive):
    """A multi-part archive read as one: worlds of every joined part (ascending part name, each part's
    worlds in its storage order). `parts`, `part(name)`, `part_of(world_id)` and `frames_of(world_id)`
    tell the parts apart; `n_frames` is what every part has committed."""

    _only: str | None = None  # `open_part`: this part alone

    def _load(self, found: tuple | None = None) -> None:
        store, raw, doc = found or open_root_document(self.location, storage_options=self._storage_options)
        attrs = doc.get("attributes")
        if not is_parts_root(attrs):
            raise FormatError(f"{self.location!s} is no longer a multi-part archive; open it again")
        root = PartsRoot.parse(attrs[ROOT_ATTR])
        names = list_parts(store) if self._only is None else [check_name(self._only)]
        budget = PartsBudget()
        if store._remote is not None and len(names) > 1:  # object storage: round trips, overlapped
            with concurrent.futures.ThreadPoolExecutor(min(16, len(names)), "mjarchive-parts") as pool:
                opened = list(pool.map(lambda name: _open_part(store, name, self, budget), names))
        else:
            opened = [_open_part(store, name, self, budget) for name in names]
        readers = {name: reader for name, reader in zip(names, opened) if reader is not None}
        pending = [name for name, reader in zip(names, opened) if reader is None]
        if not readers and self._only is not None:
            raise ArchiveNotFoundError(f"the multi-part archive at {self.location!s} has no part {self._only!r} with "
                                       "committed frames")
        if not readers:
            raise MjArchiveError(f"the multi-part archive at {self.location!s} has no part with committed frames yet"
                                 f"{f' (pending: {pending[:8]})' if pending else ''}; open it again once a writer "
                                 "has committed frames")
        owner: dict[int, str] = {}
        first_name, first = next(iter(readers.items()))
        for name, reader in readers.items():
            root.check_part(name, reader.manifest)
            if reader.cameras != tuple(root.doc["cameras"]):
                raise FormatError(f"part {name!r} lists other cameras than the archive created by part "
                                  f"{root.created_by!r}")
            diff = part_differences(first.manifest, reader.manifest)
            if diff:
                raise FormatError(f"parts {first_name!r} and {name!r} record differently: {'; '.join(diff)}; a "
                                  "multi-part archive's parts must agree")
            for w in reader.world_ids:
                other = owner.setdefault(w, name)
                if other != name:
                    raise FormatError(f"world {w} is claimed by both part {other!r} and part {name!r}; each world "
                                      "belongs to one part (the archive is damaged)")
        ids = [w for reader in readers.values() for w in reader.world_ids]
        self._store, self._root_attrs, self._root_raw = store, attrs, raw
        self.__dict__.pop("_root", None)
        self._parts_root, self._part_readers, self._pending = root, readers, tuple(pending)
        self._part_names = tuple(readers)
        self._pos_part = np.concatenate([np.full(r.n_worlds, i, np.int64) for i, r in enumerate(readers.values())])
        self._pos_local = np.concatenate([np.arange(r.n_worlds) for r in readers.values()])
        self._offsets = np.cumsum([0] + [r.n_worlds for r in readers.values()])
        self.manifest = dataclasses.replace(first.manifest, world_ids=tuple(ids), format_version=root.format_version,
                                            created=root.doc["created"], producer=dict(root.doc["producer"]),
                                            mujoco_version=root.doc["mujoco_version"], shard_worlds=1)
        self._n_frames = min(r.n_frames for r in readers.values())
        # Live while any part may still append, a pending one included (it will join).
        self._status = "live" if pending or any(r.status == "live" for r in readers.values()) else "finalized"
        self._n_events = {f: sum(r._n_events[f] for r in readers.values()) for f in first.manifest.variants}
        self._commit_source = "parts"
        self._arrays = first._arrays
        self._world_index = {w: i for i, w in enumerate(ids)}

    # -- the parts ----------------------------------------------------------------------------------------
    @property
    def parts(self) -> tuple[str, ...]:
        """Names of the joined parts (those with committed frames), ascending."""
        return self._part_names

    @property
    def pending_parts(self) -> tuple[str, ...]:
        """Parts that exist but have committed no frame yet (not part of the archive's worlds)."""
        return self._pending

    def part(self, name: str) -> Archive:
        """Part `name` as its own read-only Archive (its worlds, frames, time and commit record), as of
        this archive's opening or last `refresh()`: refresh and close the archive, not the part."""
        try:
            return self._part_readers[name]
        except (KeyError, TypeError):
            raise SelectionError(f"no part {name!r}; this archive's parts: {list(self._part_names)[:16]}") from None

    def part_of(self, world_id: int) -> str:
        return self._part_names[int(self._pos_part[self.world_index(world_id)])]

    def frames_of(self, world_ids: Any) -> int:
        groups = self._groups(self._world_positions(world_ids))
        return min(g.reader.n_frames for g in groups) if groups else self._n_frames

    def _part_of_world(self, world_id: int) -> Archive:
        return self._part_readers[self.part_of(world_id)]

    def _groups(self, positions: np.ndarray) -> list[_Group]:
        """The parts holding `positions`, each with the columns of `positions` it holds and their
        positions within the part, in part order."""
        out = []
        owners = self._pos_part[positions]
        for i in np.unique(owners).tolist():
            cols = np.nonzero(owners == i)[0]
            name = self._part_names[i]
            out.append(_Group(name, self._part_readers[name], cols, self._pos_local[positions[cols]]))
        return out

    # -- selection ------------------------------------------------------------------------------------------
    def select(self, worlds: Any = None, frames: Any = None, *, time: Any = None) -> Selection:
        self._check_open()
        positions = self._world_positions(worlds)
        groups = self._groups(positions)
        if not groups:  # no world: an empty selection of the frames every part has
            if time is not None and frames is not None:
                raise SelectionError("pass frames= or time=, not both")
            return Selection(self, positions, self._frame_index(frames if time is None else self._time_frames(time)))
        if time is not None:
            if frames is not None:
                raise SelectionError("pass frames= or time=, not both")
            for g in groups:
                g.frames = g.reader._frame_index(g.reader._time_frames(time))
            counts = {g.name: _count(g.frames) for g in groups}
            if len(set(counts.values())) > 1:
                raise SelectionError(f"the time range {time!r} holds different numbers of frames in the selected parts "
                                     f"({counts}); select those parts' worlds separately")
        else:
            shared = self._frame_index(frames, min(g.reader.n_frames for g in groups))
            for g in groups:
                g.frames = shared
        return PartedSelection(self, positions, groups)

    def _read(self, name: str, frames: Any, worlds: np.ndarray | None) -> np.ndarray:
        self._check_open()
        first = self._part_names[0]
        if worlds is None or not len(worlds):  # `time` (the first part's), or no world at all
            try:
                return self._part_readers[first]._read(name, frames, worlds)
            except MjArchiveError as exc:
                raise in_part(exc, first) from exc
        groups = self._groups(np.asarray(worlds, np.int64))
        for g in groups:
            g.frames = frames
        return _gather(groups, name, len(worlds))

    @property
    def time(self) -> np.ndarray:
        """Simulation time of the frames every part has committed, as the first part records it."""
        return self._read("time", slice(0, self._n_frames), None)

    # -- per-world questions, answered by the world's part -----------------------------------------------------
    def _ask(self, world_id: int, question: str, *args: Any) -> Any:
        """`question` (a method name) asked of the part holding `world_id`; its errors name the part."""
        name = self.part_of(world_id)
        try:
            return getattr(self._part_readers[name], question)(*args)
        except MjArchiveError as exc:
            raise in_part(exc, name) from exc

    def episodes(self, world_id: int) -> list[range]:
        return self._ask(world_id, "episodes", world_id)

    def episode_starts(self, worlds: Any, start: int = 0, stop: int | None = None, *,
                       limit: int | None = None, reverse: bool = False) -> list[int]:
        """As `Archive.episode_starts`, each world over the frames of its own part."""
        self._check_open()
        check_episode_range(start, stop, limit)
        found: set[int] = set()
        for g in self._groups(self._world_positions(worlds)):
            try:
                ids = [g.reader.world_ids[i] for i in g.local.tolist()]
                found.update(g.reader.episode_starts(ids, start, stop, limit=limit, reverse=reverse))
            except MjArchiveError as exc:
                raise in_part(exc, g.name) from exc
        return sorted(found, reverse=reverse)[:limit]

    def episode_numbers(self, world_id: int, frames: Any) -> np.ndarray:
        return self._ask(world_id, "episode_numbers", world_id, frames)

    def episode_counts(self, worlds: Any = None) -> np.ndarray:
        """Episodes of each selected world in the frames its own part has committed."""
        self._check_open()
        positions = self._world_positions(worlds)
        out = np.zeros(len(positions), np.int64)
        for g in self._groups(positions):
            try:
                out[g.cols] = g.reader._episode_index.counts(g.local)
            except MjArchiveError as exc:
                raise in_part(exc, g.name) from exc
        return out

    def variant_changes(self, world_id: int) -> np.ndarray:
        return self._ask(world_id, "variant_changes", world_id)

    def _variant_values(self, model: Any, world_id: int, frame: int) -> dict[str, np.ndarray]:
        return self._ask(world_id, "_variant_values", model, world_id, frame)

    def variant_events(self, field: str) -> dict[str, np.ndarray]:
        """The committed events of one variant field of every part, `world` as positions in this archive's
        world axis, ordered by frame (events of one frame in part order)."""
        found = []
        for offset, name in zip(self._offsets, self._part_names):
            try:
                found.append((offset, self._part_readers[name].variant_events(field)))
            except MjArchiveError as exc:
                raise in_part(exc, name) from exc
        frame = np.concatenate([e["frame"] for _, e in found])
        order = np.argsort(frame, kind="stable")
        return {"frame": frame[order],
                "world": np.concatenate([e["world"].astype(np.int64) + off for off, e in found])[order].astype(np.int32),
                "value": np.concatenate([e["value"] for _, e in found])[order]}

    def variant_window(self, worlds: Any, frames: Any) -> PartedVariantWindow:
        positions = np.unique(np.asarray([self.world_index(w) for w in np.atleast_1d(np.asarray(worlds)).tolist()],
                                         np.int64))
        windows = {}
        for g in self._groups(positions):
            ids = [g.reader.world_ids[p] for p in g.local.tolist()]
            try:
                window = g.reader.variant_window(ids, frames)
            except MjArchiveError as exc:
                raise in_part(exc, g.name) from exc
            windows.update({w: window for w in ids})
        return PartedVariantWindow(windows)

    # -- checks and lifecycle --------------------------------------------------------------------------------
    def verify(self, progress: Any = None) -> VerifyReport:
        """Every part's checks (lines prefixed with the part's name) and the shared model bundle's;
        `progress(done, total)` counts chunks of frames over the parts verified so far."""
        problems: list[str] = []
        checked: list[str] = [f"{len(self._part_names)} parts agree on model, cadence and layout; world IDs disjoint"]
        try:
            check_parts_schema(self._parts_root.doc)
            checked.append("parts root attributes valid against the parts schema")
        except MjArchiveError as exc:
            problems.append(str(exc))
        try:
            self.bundle
            checked.append("model bundle: hashes")
        except MjArchiveError as exc:
            problems.append(f"model bundle: {exc}")
        offset = [0, 0]  # chunks done in earlier parts; this part's total

        def part_progress(done: int, total: int) -> None:
            offset[1] = total
            if progress is not None:
                progress(offset[0] + done, offset[0] + total)

        for name, reader in self._part_readers.items():
            report = reader.verify(part_progress)
            offset[0], offset[1] = offset[0] + offset[1], 0
            problems += [f"part {name}: {p}" for p in report.problems]
            checked += [f"part {name}: {c}" for c in report.checked]
        return VerifyReport(problems, checked)

    def close(self) -> None:
        for reader in self.__dict__.get("_part_readers", {}).values():
            reader._closed = True
        super().close()

    def __repr__(self) -> str:
        return (f"<mjarchive.Archive {self.location!s} format={self.format_version} parts={len(self._part_names)} "
                f"worlds={self.n_worlds} frames={self.n_frames} nq={self.nq} {self.status}>")


Archive._parted = PartedArchive


@dataclasses.dataclass
class _Group:
    """The worlds of a selection that one part holds: the part's name and reader (as when selected),
    their columns in the selection, their positions in the part, and the part's frames."""

    name: str
    reader: Archive
    cols: np.ndarray
    local: np.ndarray
    frames: Any = None


def _gather(groups: list[_Group], key: str, n_worlds: int) -> np.ndarray:
    """Array `key` of every group's worlds at its frames, assembled in selection order."""
    out = None
    for g in groups:
        try:
            got = g.reader._read(key, g.frames, g.local)
        except MjArchiveError as exc:
            raise in_part(exc, g.name) from exc
        if out is None:
            out = np.empty((got.shape[0], n_worlds, *got.shape[2:]), got.dtype)
        out[:, g.cols] = got
    return out


class PartedSelection(Selection):
    """A Selection of a multi-part archive, holding the parts as they were when selected (a later
    `refresh()` does not move it onto other worlds). With `time=`, each part may contribute other
    frame indices: `frame_indices` and `time` are then the first selected world's part's."""

    def __init__(self, archive: PartedArchive, worlds: np.ndarray, groups: list[_Group]):
        first = min(groups, key=lambda g: int(g.cols.min()))
        super().__init__(archive, worlds, first.frames)
        self._parts, self._first = groups, first
        self._ids = tuple(archive.world_ids[i] for i in worlds)

    @property
    def world_ids(self) -> tuple[int, ...]:
        return self._ids

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_") or name not in self.archive._arrays:
            raise AttributeError(name)
        if name == "time":
            try:
                return self._first.reader._read("time", self._first.frames, None)
            except MjArchiveError as exc:
                raise in_part(exc, self._first.name) from exc
        return self._read(name)

    def _read(self, key: str) -> np.ndarray:
        self.archive._check_open()
        return _gather(self._parts, key, len(self._worlds))

    def track(self, name: str) -> np.ndarray:
        if name not in self.archive.tracks:
            raise SelectionError(f"no track {name!r}; this archive has {sorted(self.archive.tracks)}")
        return self._read(name)

    def overlay(self, name: str) -> Any:
        from .overlays import OverlayFrames

        spec = self._overlay_spec(name)
        read = {key.rsplit("/", 1)[1]: self._read(key) for key in spec.arrays(name)}
        return OverlayFrames.decode(spec, name, read["count"], read["data"], read.get("text"))

    def _overlay_array(self, name: str, part: str) -> np.ndarray:
        key = f"overlays/{name}/{part}"
        if key not in self._overlay_spec(name).arrays(name):
            raise SelectionError(f"overlay {name!r} has no {part!r} array")
        return self._read(key)

    def overlay_rows(self, name: str, take: np.ndarray) -> list:
        from .overlays import read_rows

        frames = self.frame_indices
        take = np.asarray(take)
        if take.shape != (len(frames), len(self._worlds)):
            raise SelectionError(f"overlay {name!r}: take must have the selection's shape "
                                 f"({len(frames)}, {len(self._worlds)}), got {take.shape}")
        column = {int(c): (g, j) for g in self._parts for j, c in enumerate(g.cols.tolist())}

        def read(key: str, rows: Any, w: int) -> np.ndarray:
            g, j = column[w]
            f = g.frames
            f = np.arange(f.start, f.stop, f.step or 1) if isinstance(f, slice) else f
            try:
                return g.reader._read(key, f[rows], g.local[j:j + 1])
            except MjArchiveError as exc:
                raise in_part(exc, g.name) from exc

        return read_rows(self._overlay_spec(name), name, take, frames, self.archive.manifest.chunk_frames, read)


class PartedVariantWindow:
    """`VariantWindow`s of several parts, answering for each world from its part's window."""

    def __init__(self, windows: dict[int, Any]):
        self._windows = windows
        self.frames = next(iter(windows.values())).frames if windows else np.zeros(0, np.int64)

    def _window(self, world_id: int) -> Any:
        try:
            return self._windows[int(world_id)]
        except (KeyError, TypeError, ValueError):
            raise SelectionError(f"world {world_id!r} is not in this variant window") from None

    def changes(self, world_id: int) -> np.ndarray:
        return self._window(world_id).changes(world_id)

    def values(self, world_id: int, frame: int) -> dict[str, np.ndarray]:
        return self._window(world_id).values(world_id, frame)


def check_name(name: Any) -> str:
    try:
        return check_part_name(name)
    except MjArchiveError as exc:
        raise SelectionError(str(exc)) from None


def _count(frames: Any) -> int:
    return len(range(frames.start, frames.stop, frames.step or 1)) if isinstance(frames, slice) else len(frames)


def _open_part(store: Any, name: str, owner: PartedArchive, budget: PartsBudget) -> Archive | None:
    """Part `name` read as an archive of its own, sharing `owner`'s model bundle; None while it is
    pending (no document yet, or no committed frame)."""
    try:
        found = part_document(store, name, budget)
        if found is None:
            return None  # its writer is still creating it
        reader = Archive.__new__(Archive)
        reader._bundle_owner, reader._check_arrays_at_open = owner, False
        reader.location = f"{owner.location!s} (part {name})"
        reader._storage_options = None
        reader._closed = False
        reader._load(found)
        if tuple(int(v) for v in reader.format_version.split(".")) < (1, 2):
            raise FormatError(f"it is format {reader.format_version}; parts are format 1.2 or later")
        if not reader.n_frames:
            return None
        budget.worlds(name, reader.n_worlds)
        return reader
    except MjArchiveError as exc:
        raise in_part(exc, name) from exc


def open_part(location: Any, name: str, *, storage_options: dict | None = None) -> PartedArchive:
    """Only part `name` of the multi-part archive at `location`, read as a PartedArchive of one part
    (its root and the part's own documents; no listing, no other part): for a worker that renders
    worlds of that part."""
    archive = PartedArchive.__new__(PartedArchive)
    archive.location, archive._storage_options, archive._closed, archive._only = location, storage_options, False, name
    archive._load()
    return archive
