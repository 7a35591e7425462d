"""Archive.verify(): every check a reader can make, collected into one report."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import FormatError, MjArchiveError, StorageError
from .episode_index import INDEX_ROWS, checked_rows, has_index
from .format import RESET_COUNT, ROOT_ATTR
from .manifest import check_schema, root_schema
from .variants import check_values

@dataclasses.dataclass
class VerifyReport:
    """Outcome of `Archive.verify()`: `ok` is True when `problems` is empty."""

    problems: list[str]
    checked: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        lines = [f"OK   {c}" for c in self.checked] + [f"FAIL {p}" for p in self.problems]
        return "\n".join(lines)


def verify_archive(archive: Any, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Every check a reader can make on an open `Archive`, collected into one report; `progress(done,
    total)` is called after each chunk of frames read (of all arrays: total = chunks x arrays)."""
    with np.errstate(all="ignore"):  # hostile values (1e308 - -1e308) are reported, never warned about
        return _verify(archive, progress or (lambda done, total: None))


def _damage(exc: MjArchiveError) -> str:
    """What a failed check says about the archive; a StorageError says nothing about it and is raised."""
    if isinstance(exc, StorageError):
        raise exc
    return str(exc)


def _verify(archive: Any, progress: Callable[[int, int], None]) -> VerifyReport:
    problems: list[str] = []
    checked: list[str] = []
    n = archive.n_frames
    try:  # open() ran the hand-written checks; verify also runs the JSON Schema itself
        check_schema(archive._root_attrs[ROOT_ATTR])
        checked.append(f"metadata valid against the format {archive.format_version} schema "
                       f"({root_schema()['title']}); {n} committed frames (commit record: {archive._commit_source})")
    except MjArchiveError as exc:
        problems.append(_damage(exc))
    try:
        bundle = archive.bundle
        archive.model()
        checked.append(f"model bundle: {len(bundle.assets)} assets, sha256 {bundle.sha256[:16]}…, layout matches")
    except MjArchiveError as exc:
        problems.append(f"model bundle: {_damage(exc)}")
    try:
        stored_ids = archive._wid_array[:]
    except MjArchiveError as exc:
        problems.append(f"world_id: {_damage(exc)}")
    except Exception as exc:  # a corrupt chunk fails inside zarr or numcodecs
        problems.append(f"world_id: its chunk does not decode; the archive may be corrupt: {exc!r}")
    else:
        if tuple(int(w) for w in stored_ids) != archive.world_ids:
            problems.append("world_id array differs from the manifest's world_ids")
        else:
            checked.append(f"world_id array matches the manifest ({archive.n_worlds} worlds)")
    cf = archive.manifest.chunk_frames
    abs_error = archive.manifest.abs_error
    streamed = [name for name in archive._arrays if not name.startswith("overlays/")] + list(archive.manifest.overlays)
    total, done = -(-n // cf) * len(streamed), 0
    index, index_problem = (_IndexCheck(archive) if has_index(archive.manifest) else None), None
    # One chunk of frames at a time: a huge declared archive streams and stops at its first damage. A
    # missing chunk, shard or inner chunk of committed frames fails the read itself (the archive's
    # CheckedStore refuses it rather than returning fill values), so every read also checks presence.
    # The episode index is checked against each chunk of `reset` as it is read here (not read twice).
    for name in archive._arrays:
        if name.startswith("overlays/"):
            continue  # checked per overlay below: NaN anchors of labels are data
        try:
            bad_finite, off_grid, previous_time = 0, False, None
            for start in range(0, n, cf):
                block = archive._read(name, slice(start, min(n, start + cf)), None)
                if name == "reset" and index is not None and index_problem is None:
                    try:
                        index.feed(start // cf, block)
                    except MjArchiveError as exc:
                        index_problem = _damage(exc)
                if block.dtype.kind == "f":
                    bad_finite += int((~np.isfinite(block)).sum())
                if name == "time" and block.size and np.any(np.diff(block) <= 0):
                    problems.append(f"time is not strictly increasing in frames {start}..{start + block.size}")
                if name == "time" and block.size:
                    if previous_time is not None and block[0] <= previous_time:
                        problems.append(f"time is not strictly increasing at frame {start}")
                    previous_time = block[-1]
                if abs_error is not None and name in ("qpos", "mocap_pos", "mocap_quat") and block.size:
                    step = 2 * abs_error
                    if not np.allclose(np.round(block / step) * step, block, rtol=0, atol=1e-7 * np.abs(block).max()):
                        off_grid = True
                done += 1
                progress(done, total)
            if off_grid:
                problems.append(f"{name} values are not on the declared quantization grid ({abs_error})")
            if bad_finite:
                problems.append(f"{name}: {bad_finite} non-finite values in committed frames")
            else:
                checked.append(f"{name}: every committed chunk present and decodes"
                               + ("" if name in ("reset",) else ", values finite"))
        except MjArchiveError as exc:
            problems.append(f"{name}: {_damage(exc)}")
    for name in archive.manifest.overlays:
        try:
            for start in range(0, n, cf):
                archive.select(frames=slice(start, min(n, start + cf))).overlay(name)
                done += 1
                progress(done, total)
            checked.append(f"overlay {name!r}: every committed chunk present and decodes, counts within max_count, "
                           "coordinates finite, labels UTF-8")
        except MjArchiveError as exc:
            problems.append(f"overlay {name!r}: {_damage(exc)}")
    if index is not None:
        try:
            if index_problem is None:
                for k in range(index.next, n // cf):  # `reset` above stopped short: read on, to say why
                    index.feed(k, archive._read("reset", slice(k * cf, (k + 1) * cf), None))
                checked.append(f"{RESET_COUNT}: the episode index agrees with every committed reset marker")
        except MjArchiveError as exc:
            index_problem = _damage(exc)
        if index_problem is not None:
            problems.append(f"{RESET_COUNT}: {index_problem}")
    problems += _verify_variants(archive, checked)
    return VerifyReport(problems=problems, checked=checked)


class _IndexCheck:
    """Every trusted row of the episode index against the reset markers it counts, fed the whole chunks
    of `reset` in order, its rows read a stored chunk at a time (also checked: counts never fall, never
    exceed their frames). `next` is the chunk it expects."""

    def __init__(self, archive: Any) -> None:
        self.archive, self.next, self.rows = archive, 0, np.zeros((0, archive.n_worlds), np.int64)
        self.running = np.zeros(archive.n_worlds, np.int64)

    def feed(self, k: int, marks: np.ndarray) -> None:
        archive, cf = self.archive, self.archive.manifest.chunk_frames
        if k != self.next or k >= archive.n_frames // cf:
            return
        if k % INDEX_ROWS == 0:
            hi = min(archive.n_frames // cf, k + INDEX_ROWS)
            self.rows = checked_rows(archive._index_docs[RESET_COUNT], k, hi, None, cf)
        row = self.rows[k % INDEX_ROWS]
        self.running += np.count_nonzero(marks[1:] if k == 0 else marks, axis=0)
        if not np.array_equal(row, self.running):
            w = int(np.flatnonzero(row != self.running)[0])
            raise FormatError(f"row {k} says world {archive.world_ids[w]} has {int(row[w])} reset markers "
                              f"in frames 1..{(k + 1) * cf - 1}, but `reset` holds {int(self.running[w])} there; "
                              "episode counts would be wrong (the archive is damaged)")
        self.next += 1


def _verify_variants(archive: Any, checked: list[str]) -> list[str]:
    """Every committed variant event: frames in order and committed, worlds recorded, values safe."""
    problems = []
    for field, spec in archive.manifest.variants.items():
        try:
            archive._events(field)
            model = archive._base_model
            n = archive.variant_event_counts[field]
            values = archive._event_arrays[f"variants/{field}/value"]
            for lo in range(0, n, spec.chunk_events):
                try:
                    block = np.asarray(values[lo:min(n, lo + spec.chunk_events)])
                except MjArchiveError:
                    raise
                except Exception as exc:
                    raise MjArchiveError(f"events {lo}.. do not decode: {exc!r}") from None
                check_values(field, block, model, what=f" (events {lo}..{lo + len(block) - 1})")
            checked.append(f"variant {field}: {n} events in frame order, of recorded worlds, values within bounds")
        except MjArchiveError as exc:
            problems.append(f"variant {field}: {_damage(exc)}")
    return problems
