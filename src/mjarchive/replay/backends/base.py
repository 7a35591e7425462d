"""The contract every replay backend keeps, and the position stages backends share.

Planning (`plan.py`), orchestration (`render.py`) and a work unit (`unit.py`) ask a backend what it
can draw, how large its work units may be, how many states it renders per launch and how its units
are run; they never branch on a backend's name. A new backend subclasses `Backend` in one module of
this sub-wing and is named in `registry.BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import mujoco
import numpy as np

from ..._errors import BackendError

__all__ = ["Backend", "QUALITIES", "UnitStates", "needs_tendon_stage", "needs_sensor_stage"]

QUALITIES = ("full", "fast")

#: One work unit's archived states in unit frame order: qpos (n, nq), mocap_pos (n, nmocap, 3) and
#: mocap_quat (n, nmocap, 4) or None (no mocap bodies).
UnitStates = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]


class Backend:
    """A renderer of archived states, as the rest of replay sees it.

    Class attributes say what the backend is and can do; methods check a request before any work,
    size its work and render one unit. `spec` strings name a backend as users write it: its `name`,
    or `name:DEVICE` for a backend that `takes_device`.
    """

    #: As users write it (`backend='cpu'`).
    name: str = ""
    #: Whether `name:DEVICE` picks a device (`warp:cuda:0`).
    takes_device: bool = False
    #: Whether recorded overlays can be drawn into the frames.
    draws_overlays: bool = False
    #: Whether a `views.camera.View` needs a camera added to the replay model (a model-derivation
    #: recipe); otherwise the backend places the view itself.
    views_as_model_cameras: bool = False
    #: Pixel bytes one work unit returns at most (bounds the parent's reorder buffer: window × this).
    unit_bytes: int = 32 * 2**20
    #: Frames one work unit holds at most (None: bounded by `unit_bytes` only).
    unit_frames: int | None = None
    #: Renders in a pool of worker processes by default, one archive session per render call; its
    #: first unit is cut short so encoding starts early (render.py).
    pooled: bool = False
    #: Renders the units of consecutive videos of one camera together: outputs are ordered by camera.
    packs_videos: bool = False

    def check_options(self, options: Any) -> None:
        """Refuse, before any work, scene options (`views.options.SceneOptions`) this backend
        cannot draw (BackendError)."""

    def check_overlays(self, overlays: tuple[str, ...]) -> None:
        """Refuse selected overlay tracks if this backend cannot draw them (BackendError)."""
        if overlays and not self.draws_overlays:
            raise BackendError(f"backend {self.name!r} cannot draw overlays ({list(overlays)[:8]} selected); use "
                               "backend='cpu' to draw them, or overlays=() to render without them")

    def states_per_launch(self, spec: str, model: mujoco.MjModel, size: tuple[int, int], *, requested: Any,
                          copies: int, n_states: int, budget: int) -> int | None:
        """States rendered per launch (the units' `warp_batch`), or None for a backend that renders
        state by state. requested: the caller's choice (None: decide); copies: of the model in each
        state (a scene's worlds); n_states: how many the selection holds; budget: unit bytes."""
        return None

    def renderer_for(self, unit: Any, archive: Any, model: mujoco.MjModel) -> Any:
        """This thread's cached renderer for a work unit (`worker.renderer_for`)."""
        raise NotImplementedError

    def render_states(self, unit: Any, archive: Any, renderer: Any, model: mujoco.MjModel, sel: Any,
                      states: UnitStates, spans: Any, labels: Callable[..., Any] | None) -> tuple[np.ndarray, str]:
        """Render one unit's states with `renderer` (from `renderer_for`): (rgb (n, H, W, 3) uint8 in
        unit frame order, the OpenGL renderer's name, for the software-GL hint, or ''). sel: the unit's Selection; spans: its
        `views.variant_map.VariantSpans` or None; labels(model, spans=None): the scene's per-world
        `views.labels.SceneLabels` placed with `model` (None: no labels)."""
        raise NotImplementedError

    def unit_results(self, units: list, run: Callable[..., Iterator[Any]], in_process: bool) -> Iterator[Any]:
        """`worker.UnitResult`s of `units`, in order. run(tasks, fn=unit.render_unit) runs tasks in order
        with a bounded window (on an executor unless `in_process`)."""
        return run(units)


def needs_tendon_stage(model: mujoco.MjModel) -> bool:
    """Spatial tendons are drawn from wrap points computed by mj_tendon."""
    if not model.ntendon:
        return False
    return bool(np.any(model.wrap_type != mujoco.mjtWrap.mjWRAP_JOINT)) if model.nwrap else False


def needs_sensor_stage(model: mujoco.MjModel, option: mujoco.MjvOption) -> bool:
    """Rangefinder rays are drawn from sensordata, which mj_sensorPos computes: only for models
    that have rangefinders, with their visualization on and sensors enabled."""
    if not model.nsensor or not option.flags[mujoco.mjtVisFlag.mjVIS_RANGEFINDER]:
        return False
    if model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_SENSOR:
        return False
    return bool(np.any(model.sensor_type == mujoco.mjtSensor.mjSENS_RANGEFINDER))
