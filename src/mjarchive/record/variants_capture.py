"""Model variants on their way from a running simulation to the archive writer.

The recorder numbers the frames it records with `seq` (0: its first frame). Device frames reach the
writer in blocks, after later frames were already gathered, so variant events wait in a
`VariantLog` until the frame they start at is handed over; each is then given to
`writer.set_variant` just before that frame is appended (the recorder splits a block at the frames
that carry events), at the archive frame that frame gets. Captured values (read from the
simulator's models) equal to the last values recorded for that world are dropped: a reset that
changed nothing costs no event. `RecorderVariants` is the recorder's side: `set_variant`'s checks
and the capture from per-world MjModel.

Host-side only (NumPy): the Warp capture lives in `mjarchive.record.warp`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from .._errors import AppendError, BackendError, FormatError, MjArchiveError
from ..archive.variants import VARIANT_FIELDS, default_values, field_shape, needs_model, variant_rows

__all__ = ["RecorderVariants", "VariantLog", "sim_model_kind"]


class VariantLog:
    """Variant events waiting for their frames, and each world's last recorded values.

    Worlds are always positions in the recorded selection (`writer.world_ids` order). `baseline`:
    per field, the per-world values in force before any event (the archive model's own, rounded
    through the simulator's precision), or None when unknown (appending to an archive that may hold
    events already): then the first captured values of every world are written.
    """

    def __init__(self, baseline: dict[str, np.ndarray] | None):
        self.baseline = baseline
        self._last: dict[str, np.ndarray] = {}  # field -> (W, *shape) in the stored dtype
        self._known: dict[str, np.ndarray] = {}  # field -> (W,) bool
        self._pending: list[tuple[int, bool, np.ndarray, dict[str, np.ndarray]]] = []

    def add(self, seq: int, pos: np.ndarray, values: dict[str, np.ndarray], *, captured: bool) -> None:
        """Queue an event at recorder frame `seq` for selection positions `pos`; `values` are
        (len(pos), *shape) arrays the log may keep. `captured` values (read from the simulator) are
        dropped where they equal the world's last recorded ones; set_variant's are always written."""
        self._pending.append((seq, captured, pos, values))

    def cuts(self, s0: int, n: int) -> list[int]:
        """Where a block of recorder frames s0 .. s0+n-1 must be split so that each part carries
        events at its first frame only: 0, the offsets of frames with events, and n."""
        inner = {e[0] - s0 for e in self._pending if s0 < e[0] < s0 + n}
        return [0, *sorted(inner), n]

    def emit(self, writer: Any, s0: int, s1: int | None) -> None:
        """Hand the events of frames before `s1` (None: all) to the writer; `s0` is the seq of the
        writer's next frame. A refused event does not stop the others; the first refusal is raised."""
        due = [e for e in self._pending if s1 is None or e[0] < s1]
        if not due:
            return
        self._pending = [e for e in self._pending if not (s1 is None or e[0] < s1)]
        # Storage order decides between events of one frame: the user's own set_variant wins.
        due.sort(key=lambda e: (e[0], not e[1]))
        ids = np.asarray(writer.world_ids, np.int64)
        first: AppendError | None = None
        for seq, captured, pos, values in due:
            frame = writer.n_frames + max(seq - s0, 0)
            try:
                if pos.size and pos.max() >= len(ids):  # set before the batch size was known
                    raise AppendError(f"worlds {sorted(set(pos[pos >= len(ids)].tolist()))} are not recorded "
                                      f"(recorded world IDs: {ids.tolist()})")
                for name, v in values.items():
                    self._emit_one(writer, frame, ids, pos, name, v, captured)
            except AppendError as exc:
                first = first or exc
        if first is not None:
            raise first

    def _emit_one(self, writer: Any, frame: int, ids: np.ndarray, pos: np.ndarray, name: str, v: np.ndarray,
                  captured: bool) -> None:
        last, known = self._state(writer, name)
        v = np.asarray(v, dtype=last.dtype)
        if captured:
            same = known[pos] & (v == last[pos]).reshape(len(pos), -1).all(axis=1)
            if same.all():
                return
            pos, v = pos[~same], v[~same]
        writer.set_variant(ids[pos], frame, **{name: v})
        last[pos] = v
        known[pos] = True

    def _state(self, writer: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self._last:
            spec = writer.manifest.variants[name]
            W = len(writer.world_ids)
            base = None if self.baseline is None else self.baseline.get(name)
            if base is None:
                self._last[name] = np.zeros((W, *spec.shape), spec.dtype)
                self._known[name] = np.zeros(W, bool)
            else:
                self._last[name] = np.repeat(np.asarray(base, spec.dtype)[None], W, axis=0)
                self._known[name] = np.ones(W, bool)
        return self._last[name], self._known[name]


def sim_model_kind(sim_model: Any) -> str | None:
    """None, "warp" (a mujoco_warp Model) or "models" (one MjModel per simulated world)."""
    if sim_model is None:
        return None
    if type(sim_model).__module__.startswith("mujoco_warp"):
        return "warp"
    if isinstance(sim_model, Sequence) and sim_model and all(isinstance(m, mujoco.MjModel) for m in sim_model):
        return "models"
    raise MjArchiveError(f"sim_model must be a mujoco_warp Model or a list of mujoco.MjModel, one per simulated world "
                         f"([m] * nworld where they share one), got {type(sim_model).__name__}")


class RecorderVariants:
    """A Recorder's model variants: the declared fields, `set_variant`, captures from per-world
    MjModel (the MjData path) and the `VariantLog` every path hands its events through.

    `model`: the archive's compiled model (None when appending through an open writer: then the
    writer's is used where values need one). `names`: the declared fields while no writer exists.
    """

    def __init__(self, sim_model: Any, kind: str | None, model: mujoco.MjModel | None, names: Any = None):
        self.sim_model = sim_model
        self.kind = kind
        self.model = model
        self._names = (names,) if isinstance(names, str) else names
        self.log = VariantLog(None)
        self._models_checked = False
        self._shapes: dict[str, tuple[int, ...]] | None = None

    def shapes(self, writer: Any) -> dict[str, tuple[int, ...]]:
        """Each declared field's per-world shape."""
        if self._shapes is None:
            if writer is not None:
                self._shapes = {name: tuple(spec.shape) for name, spec in writer.manifest.variants.items()}
            else:
                try:
                    self._shapes = {name: field_shape(self.model, name) for name in self._names}
                except FormatError as exc:
                    raise MjArchiveError(str(exc)) from None
        return self._shapes

    def created(self, writer: Any) -> None:
        """The recorder created the archive: nothing is recorded yet, so its model's own values are in force."""
        base = default_values(self.model, writer.manifest.variants)
        if self.kind == "warp":  # the simulator holds them in float32: compare at its precision
            base = {n: v.astype(np.float32).astype(v.dtype) if v.dtype.kind == "f" else v for n, v in base.items()}
        self.log.baseline = base

    def set_variant(self, writer: Any, known: tuple[int, ...] | None, world_ids: Any, frame: Any,
                    fields: dict[str, Any], *, appended: int, recorded: int) -> None:
        """`Recorder.set_variant`: checked now (the call that gave them hears of bad values), queued
        until the frame it starts at reaches the writer. `known`: the recorded world IDs in
        selection order, or None while every batch world will be (IDs are then positions);
        `appended`: recorder frames handed to the writer; `recorded`: recorder frames so far."""
        shapes = self.shapes(writer)
        unknown = sorted(set(fields) - set(shapes))
        if unknown or not fields:
            raise AppendError(f"set_variant() takes values of the declared variant fields {sorted(shapes)}; "
                              f"got {sorted(fields)} (declare more with variant_fields=(...))")
        pos = _positions(world_ids, known)
        start = 0 if writer is None else writer.n_frames - appended  # archive frame of seq 0
        if frame is None:
            seq = recorded
        elif isinstance(frame, (int, np.integer)) and not isinstance(frame, bool) and frame - start >= appended:
            seq = int(frame) - start
        else:
            raise AppendError(f"frame={frame!r}: a variant starts at the next frame not yet written "
                              f"({start + appended}) or later")
        ids = pos if known is None else np.asarray(known, np.int64)[pos]
        values = {name: self._checked(writer, name, value, shapes[name], ids) for name, value in fields.items()}
        self.log.add(seq, pos, values, captured=False)

    def _checked(self, writer: Any, name: str, value: Any, shape: tuple[int, ...], ids: np.ndarray) -> np.ndarray:
        """One field's values as (len(ids), *shape) in the stored dtype (a copy), refused as the writer would."""
        model = self.model
        if model is None and needs_model(name) and writer is not None:
            model = writer.variant_model()  # ids are checked against the archive's model
        return variant_rows(name, value, shape, ids, model)

    def frame_events(self, writer: Any, batch: Sequence[mujoco.MjData], sel: np.ndarray, reset_sel: np.ndarray,
                     seq: int) -> AppendError | None:
        """MjData path, before frame `seq` is appended: capture from the per-world models, then hand
        this frame's events to the writer. A refused event is returned (raised after the frame)."""
        if self.kind == "models":
            shapes = self.shapes(writer)
            if not self._models_checked:
                _check_models(self.sim_model, len(batch), shapes)
                self._models_checked = True
            pos = np.arange(len(sel)) if seq == 0 else np.flatnonzero(reset_sel)
            if pos.size:
                self.log.add(seq, pos, _capture_models(self.sim_model, sel[pos], shapes), captured=True)
        elif self.kind == "warp":
            raise BackendError("sim_model is a mujoco_warp Model, but record() got MjData; pass sim_model=[MjModel, "
                               "...] (one per simulated world) to capture variants on the CPU")
        try:
            self.log.emit(writer, seq, seq + 1)
        except AppendError as exc:
            return exc
        return None


def _positions(world_ids: Any, known: tuple[int, ...] | None) -> np.ndarray:
    """set_variant's world IDs as selection positions (the IDs themselves while `known` is None)."""
    ids = np.atleast_1d(np.asarray(world_ids))
    if ids.ndim != 1 or not ids.size or ids.dtype.kind not in "iu":
        raise AppendError(f"world_ids must be a world ID or a non-empty sequence of them, got {world_ids!r:.80}")
    if known is None:
        if ids.min() < 0:
            raise AppendError(f"world IDs are batch indices (>= 0), got {ids.tolist()}")
        return ids.astype(np.intp)
    where = {w: i for i, w in enumerate(known)}
    missing = sorted(set(ids.tolist()) - where.keys())
    if missing:
        raise AppendError(f"worlds {missing} are not recorded (recorded world IDs: {list(known)})")
    return np.array([where[w] for w in ids.tolist()], np.intp)


def _check_models(models: Sequence[mujoco.MjModel], nworld: int, shapes: dict[str, tuple[int, ...]]) -> None:
    """A list of per-world MjModel must have one model per simulated world, each of the archive's shapes."""
    if len(models) != nworld:
        raise MjArchiveError(f"sim_model has {len(models)} MjModel, but the batch has {nworld} worlds; pass one "
                             "MjModel per simulated world (the same object repeated where worlds share one)")
    for i, m in enumerate(models):
        for name, shape in shapes.items():
            if field_shape(m, name) != tuple(shape):
                raise MjArchiveError(f"sim_model[{i}].{name} has shape {field_shape(m, name)}, the archive's model "
                                     f"{tuple(shape)}: every world's model must be a variant of the recorded one")


def _capture_models(models: Sequence[mujoco.MjModel], rows: np.ndarray,
                    shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Each field's values in the models of batch worlds `rows`: (len(rows), *shape), copies."""
    return {name: np.stack([np.array(getattr(models[r], name), dtype=VARIANT_FIELDS[name].dtype).reshape(shape)
                            for r in rows.tolist()])
            for name, shape in shapes.items()}
