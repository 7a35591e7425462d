"""CPU replay backend: one MjData and one mujoco.Renderer, position-only kinematics.

Replay never steps physics: set qpos (and mocap), run the position stages the renderer reads
(kinematics, subtree centres of mass for `trackcom` cameras and lights, tendons/flexes when drawn,
cameras and lights, position sensors when rangefinder rays are drawn), then render.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable

import mujoco
import numpy as np

from ..._errors import BackendError, ClosedError
from ...archive.variants import VARIANT_FIELDS, apply_variant, default_values
from .. import worker
from ..views.camera import View
from .base import QUALITIES, Backend, UnitStates, needs_sensor_stage, needs_tendon_stage

__all__ = ["BACKEND", "CpuBackend", "CpuRenderer", "FREE_CAMERA", "gl_renderer_name"]
#: Camera id of MuJoCo's default free camera.
FREE_CAMERA = -1


def prepare_model(model: mujoco.MjModel, size: tuple[int, int], quality: str) -> mujoco.MjModel:
    """A private copy whose offscreen buffer is exactly `size` (H, W) and, for "fast", has no multisampling."""
    model = copy.copy(model)
    height, width = size
    # Not the model's own size if larger: MuJoCo's per-frame work grows with the offscreen buffer, not
    # the viewport (flygym's 2048x2048 costs ~30% more CPU per 240x320 frame in Mesa), for the same pixels.
    model.vis.global_.offwidth = int(width)
    model.vis.global_.offheight = int(height)
    if quality == "fast":
        model.vis.quality.offsamples = 0
    return model


class CpuRenderer:
    """Renders archived states of one model at one size and quality.

    `set_state` then `render(camera)`; a fresh renderer and every camera switch render one frame
    that is discarded, because MuJoCo's first frame after a switch differs from steady state
    (measured up to 10/255 per pixel) and output must not depend on how work is split.
    `set_variant` sets per-world model values (domain randomization) on the renderer's own copy
    of the model; `variant_defaults` are that model's own values, `variant_layouts` where each
    world's values go in it (`variant_map.layout_for`, kept as long as the renderer).
    """

    def __init__(self, model: mujoco.MjModel, size: tuple[int, int], quality: str = "full", options=None):
        if quality not in QUALITIES:
            raise BackendError(f"quality must be one of {QUALITIES}, got {quality!r}")
        self.size = (int(size[0]), int(size[1]))
        self.quality = quality
        self.model = prepare_model(model, self.size, quality)
        self.data = mujoco.MjData(self.model)
        self.variant_defaults = default_values(self.model, VARIANT_FIELDS)
        self.variant_layouts: dict = {}
        self._varied: set[str] = set()
        try:
            self.renderer = mujoco.Renderer(self.model, height=self.size[0], width=self.size[1])
        except Exception as exc:
            raise BackendError(
                f"cannot create a MuJoCo renderer ({exc}); on a headless machine set MUJOCO_GL=egl "
                "(GPU or Mesa) or MUJOCO_GL=osmesa"
            ) from None
        if quality == "fast":
            flags = self.renderer.scene.flags
            for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                         mujoco.mjtRndFlag.mjRND_SKYBOX):
                flags[flag] = 0
        self._option = mujoco.MjvOption()
        if options is not None:
            from ..views.options import apply_cpu

            apply_cpu(options, self._option, self.renderer.scene)
        self._fovy = float(self.model.vis.global_.fovy)
        self._free = mujoco.MjvCamera()
        self._free.type = mujoco.mjtCamera.mjCAMERA_FREE
        self._tendon = needs_tendon_stage(self.model)
        self._sensor = needs_sensor_stage(self.model, self._option)
        self._last_camera: int | None = None
        self._closed = False

    @property
    def overlay_capacity(self) -> int:
        """Scene geoms left for overlay primitives once the model's own geoms are in: the scene's
        maxgeom less the model's ngeom, at least 0 (what `OverlayPainter` reads at most per frame)."""
        return max(0, int(self.renderer.scene.maxgeom) - int(self.model.ngeom))

    def set_state(self, qpos: np.ndarray, mocap_pos: np.ndarray | None = None,
                  mocap_quat: np.ndarray | None = None) -> None:
        """Pose the model: qpos (nq,), mocap_pos (nmocap, 3) m, mocap_quat (nmocap, 4) wxyz."""
        m, d = self.model, self.data
        d.qpos[:] = qpos
        if m.nmocap and mocap_pos is not None:
            d.mocap_pos[:] = mocap_pos
            d.mocap_quat[:] = mocap_quat
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        if self._tendon:
            mujoco.mj_tendon(m, d)
        if m.nflex:
            mujoco.mj_flex(m, d)
        mujoco.mj_camlight(m, d)
        if self._sensor:
            mujoco.mj_sensorPos(m, d)  # after mj_camlight: camera-projection sensors read the cameras

    def set_variant(self, values: dict[str, np.ndarray]) -> None:
        """Set model fields to `values` (name -> array shaped like this model's field, see
        `archive.variants`); fields an earlier call set and `values` leaves out get the model's
        own values back. Kinematic fields (body_pos, ...) take effect at the next `set_state`."""
        restore = {name: self.variant_defaults[name] for name in self._varied - set(values)}
        apply_variant(self.model, {**restore, **values})
        self._varied = set(values)

    def render(self, camera: int | View = FREE_CAMERA, pose: np.ndarray | None = None,
               decorate: Callable[[mujoco.MjvScene, mujoco.MjData], None] | None = None) -> np.ndarray:
        """RGB of the current state, (H, W, 3) uint8, from a model camera id (-1: MuJoCo's default
        free camera) or a `camera.View` rendered as a free MjvCamera (`pose`: this frame's
        (lookat x, y, z, azimuth) of a tracking view). `decorate(scene, data)` may add geoms to
        the MjvScene after MuJoCo filled it (overlays), before it is drawn."""
        if self._closed:
            raise ClosedError("this renderer is closed")
        if isinstance(camera, View):
            target = self._free
            target.lookat[:] = camera.lookat if pose is None else pose[:3]
            target.azimuth = camera.azimuth if pose is None else pose[3]
            target.distance, target.elevation = camera.distance, camera.elevation
            self.model.vis.global_.fovy = camera.fovy  # a free camera's field of view is the model's
        else:
            target = int(camera)
            self.model.vis.global_.fovy = self._fovy  # MuJoCo's default free camera (-1) reads it
        self._update(target, decorate)
        if camera != self._last_camera:
            self.renderer.render()
            self._last_camera = camera
            self._update(target, decorate)
        return self.renderer.render()

    def _update(self, target, decorate) -> None:
        self.renderer.update_scene(self.data, camera=target, scene_option=self._option)
        if decorate is not None:
            decorate(self.renderer.scene, self.data)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.renderer.close()

    def __enter__(self) -> CpuRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def gl_renderer_name() -> str:
    """The OpenGL renderer string of the current context ('' when unknown); call after a render."""
    if os.environ.get("MUJOCO_GL", "").lower() not in ("egl", "osmesa", "glfw", ""):
        return ""
    try:
        from OpenGL import GL

        name = GL.glGetString(GL.GL_RENDERER)
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name or "")
    except Exception:
        return ""


class CpuBackend(Backend):
    """MuJoCo's OpenGL renderer, state by state, in a pool of worker processes by default."""

    name = "cpu"
    draws_overlays = True
    unit_bytes = 32 * 2**20
    #: Small units balance workers; each costs one chunk read.
    unit_frames = 32
    pooled = True

    def renderer_for(self, unit: worker.RenderUnit, archive, model: mujoco.MjModel) -> CpuRenderer:
        return worker.renderer_for(unit, archive, lambda: CpuRenderer(model, unit.size, unit.quality,
                                                                      getattr(unit, "options", None)))

    def render_states(self, unit, archive, renderer: CpuRenderer, model, sel, states: UnitStates, spans,
                      labels) -> tuple[np.ndarray, str]:
        qpos, mocap_pos, mocap_quat = states
        frames = unit.frames
        poses = unit.poses
        h, w = unit.size
        rgb = np.empty((len(frames), h, w, 3), np.uint8)
        span = None
        if spans is None:
            renderer.set_variant({})  # puts back what an earlier unit of another archive set
        # The labels are placed with the renderer's model, which holds the values in force.
        labels = None if labels is None else labels(renderer.model)
        painter = None
        if unit.overlays:
            from ..views.overlay_draw import OverlayPainter

            painter = OverlayPainter(archive, unit.overlays, sel, unit.scene, renderer.model,
                                     max_primitives=renderer.overlay_capacity)
        for i in range(len(frames)):
            pose = None if poses is None else poses[i]
            if spans is not None and (key := spans.key(frames[i])) != span:
                span = key
                renderer.set_variant(spans.values(frames[i]))
            renderer.set_state(qpos[i], None if mocap_pos is None else mocap_pos[i],
                               None if mocap_quat is None else mocap_quat[i])
            decorate = None if painter is None else (lambda scn, data, i=i: painter.draw(i, scn, data))
            rgb[i] = renderer.render(unit.camera, pose, decorate)
            if labels is not None:
                labels.draw(rgb[i], i, qpos[i], labels.camera_pose(unit.camera, pose, qpos, mocap_pos, mocap_quat, i))
        return rgb, gl_renderer_name()


BACKEND = CpuBackend()
