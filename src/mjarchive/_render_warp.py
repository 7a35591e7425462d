"""MuJoCo Warp replay backend: batches of archived states rendered by the Warp ray tracer.

Imported only when `backend="warp"` is chosen, so CPU-only code never imports Warp. Each batch
puts up to `nworld` archived (world, frame) states into the Warp data's world axis, runs the
position stages (kinematics, subtree COM, tendons/flexes when drawn, cameras and lights), refits
the scene BVH and renders only the one requested camera.
"""

from __future__ import annotations

import mujoco
import numpy as np

from ._errors import BackendError, ClosedError

__all__ = ["WarpRenderer", "default_device", "batch_size"]

#: Memory the renderer may use for per-world buffers, by device kind (overridable per call).
DEFAULT_MEMORY_BUDGET = {"cpu": 256 * 2**20, "cuda": 2 * 2**30}
MAX_BATCH = 4096


def _import():
    try:
        import mujoco_warp as mjw
        import warp as wp
    except ImportError as exc:
        raise BackendError(f"backend 'warp' needs mujoco-warp and warp-lang ({exc}); install `mjarchive[warp]`") from None
    return wp, mjw


def default_device() -> str:
    """'cuda' when Warp sees a GPU, else Warp's 'cpu' device."""
    wp, _ = _import()
    return "cuda" if wp.get_cuda_device_count() > 0 else "cpu"


def batch_size(model: mujoco.MjModel, size: tuple[int, int], device: str,
               memory_budget: int | None = None) -> int:
    """Worlds per batch that fit `memory_budget` bytes: packed RGB plus a rough per-world state."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    budget = memory_budget if memory_budget is not None else DEFAULT_MEMORY_BUDGET[kind]
    h, w = size
    per_world = h * w * (4 + 4 + 8)  # packed rgb, depth, segmentation buffers the context allocates
    per_world += 8 * (model.nbody * 40 + model.ngeom * 12 + model.nq + model.nv * 20 + model.ncam * 12)
    return int(max(1, min(MAX_BATCH, budget // per_world)))


class WarpRenderer:
    """Renders batches of archived states of one model, one camera at a time.

    `render_batch(qpos (n, nq), mocap_pos (n, nmocap, 3), mocap_quat (n, nmocap, 4), camera)`
    returns (n, H, W, 3) uint8 for n <= nworld.
    """

    def __init__(self, model: mujoco.MjModel, size: tuple[int, int], *, quality: str = "full",
                 device: str | None = None, nworld: int | None = None, memory_budget: int | None = None):
        wp, mjw = _import()
        self._wp, self._mjw = wp, mjw
        self.model = model
        self.size = (int(size[0]), int(size[1]))
        self.quality = quality
        self.device = device or default_device()
        self.nworld = int(nworld or batch_size(model, self.size, self.device, memory_budget))
        self._tendon = bool(model.ntendon and model.nwrap and np.any(model.wrap_type != mujoco.mjtWrap.mjWRAP_JOINT))
        try:
            with wp.ScopedDevice(self.device):
                data = mujoco.MjData(model)  # not forwarded: no contacts or constraints to carry
                self.m = mjw.put_model(model)
                self.d = mjw.put_data(model, data, nworld=self.nworld, nconmax=1, njmax=1)
        except Exception as exc:
            raise BackendError(f"MuJoCo Warp could not load the model on device {self.device!r}: {exc}") from None
        self._contexts: dict[int, object] = {}
        self._closed = False

    def _context(self, camera: int):
        rc = self._contexts.get(camera)
        if rc is None:
            if camera < 0:
                names = [self.model.camera(i).name for i in range(self.model.ncam)]
                raise BackendError(
                    f"backend 'warp' renders model cameras only; this model has {names or 'none'}. "
                    "Use backend='cpu' for the free camera, or add a <camera> to the model"
                )
            has_skybox = bool(np.any(self.model.tex_type == mujoco.mjtTexture.mjTEXTURE_SKYBOX))
            full = self.quality == "full"
            with self._wp.ScopedDevice(self.device):
                rc = self._mjw.create_render_context(
                    self.model, nworld=self.nworld, cam_res=(self.size[1], self.size[0]), render_rgb=True,
                    render_depth=False, render_seg=False, cam_active=[int(camera)], use_shadows=full,
                    render_skybox=full and has_skybox,
                )
            self._contexts[camera] = rc
        return rc

    def render_batch(self, qpos: np.ndarray, mocap_pos: np.ndarray | None, mocap_quat: np.ndarray | None,
                     camera: int) -> np.ndarray:
        """Render n <= nworld states from model camera `camera`; returns (n, H, W, 3) uint8."""
        if self._closed:
            raise ClosedError("this Warp renderer is closed")
        wp, mjw = self._wp, self._mjw
        n = len(qpos)
        if not 0 < n <= self.nworld:
            raise BackendError(f"a batch holds 1..{self.nworld} states, got {n}")
        rc = self._context(camera)

        def fill(dst, src):
            full = np.empty(dst.shape, dtype=np.float32)
            full[:n] = src
            full[n:] = src[-1]  # pad the batch with copies of the last state; their pixels are dropped
            dst.assign(full)

        with wp.ScopedDevice(self.device):
            fill(self.d.qpos, qpos)
            if self.model.nmocap and mocap_pos is not None:
                fill(self.d.mocap_pos, mocap_pos)
                fill(self.d.mocap_quat, mocap_quat)
            mjw.kinematics(self.m, self.d)
            mjw.com_pos(self.m, self.d)
            if self._tendon:
                mjw.tendon(self.m, self.d)
            if self.model.nflex:
                mjw.flex(self.m, self.d)
            mjw.camlight(self.m, self.d)
            mjw.refit_bvh(self.m, self.d, rc)
            mjw.render(self.m, self.d, rc)
            packed = rc.rgb_data.numpy()[:n]
        h, w = self.size
        # Each pixel is packed as 0xAARRGGBB: little-endian bytes B, G, R, A.
        return np.ascontiguousarray(packed.view(np.uint8)[:, : h * w * 4].reshape(n, h, w, 4)[..., 2::-1])

    def close(self) -> None:
        self._closed = True
        self._contexts.clear()

    def __enter__(self) -> WarpRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
