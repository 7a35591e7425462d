"""Rendering one work unit, in whatever process runs it: read its slice, pose, render.

`render_unit` is a top-level function, so any `concurrent.futures.Executor` can run it. A scene
unit holds every world of a `layout='scene'` video: their states are joined into one state of
the scene model (`views.scene.ScenePlan.combine`), and each world is labelled where it stands.

Model variants: the values in force for each frame's world(s) are set on the renderer's model
(CPU, again wherever they change within the unit) or on its per-world model arrays (Warp, one
row per state), always over the model's own values, so nothing of an earlier unit or world
stays. Per-world units never straddle a change (`plan.plan_units`); grid and scene units may,
as every world's units there cover the same frames. The unit's backend (`backends.registry`)
renders the states.
"""

from __future__ import annotations

import functools

import numpy as np

from .backends.registry import backend_for
from .views.labels import SceneLabels
from .views.variant_map import VariantSpans
from .worker import RenderUnit, UnitResult, archive_for, model_for

__all__ = ["render_unit"]


def render_unit(unit: RenderUnit) -> UnitResult:
    """Render one unit: rgb (n_frames, H, W, 3) uint8 in the unit's frame order."""
    archive = archive_for(unit)
    model = model_for(unit, archive)
    frames = np.asarray(unit.frames, dtype=np.int64)
    contiguous = bool(np.all(np.diff(frames) == 1))
    frame_sel = slice(int(frames[0]), int(frames[-1]) + 1) if contiguous else frames
    nmocap = archive.manifest.layout.nmocap
    if unit.scene is not None:
        sel = archive.select(worlds=list(unit.scene.world_ids), frames=frame_sel)
        qpos, mocap_pos, mocap_quat = unit.scene.combine(
            archive.manifest.layout, sel.qpos, sel.mocap_pos if nmocap else None, sel.mocap_quat if nmocap else None)
    else:
        sel = archive.select(worlds=[unit.world_id], frames=frame_sel)
        qpos = sel.qpos[:, 0]
        mocap_pos = sel.mocap_pos[:, 0] if nmocap else None
        mocap_quat = sel.mocap_quat[:, 0] if nmocap else None
    backend = backend_for(unit.backend)
    renderer = backend.renderer_for(unit, archive, model)
    worlds = unit.scene.world_ids if unit.scene is not None else (unit.world_id,)
    spans = VariantSpans(archive, worlds, renderer, unit.scene, frames=frames) if archive.variant_fields else None
    labels = None
    if unit.scene is not None and unit.labels is not None:
        labels = functools.partial(SceneLabels, unit, archive, sel)
    rgb, gl = backend.render_states(unit, archive, renderer, model, sel, (qpos, mocap_pos, mocap_quat), spans, labels)
    return UnitResult(unit.world_id, unit.camera, unit.frames, rgb, gl)
