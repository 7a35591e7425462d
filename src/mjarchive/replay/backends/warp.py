"""MuJoCo Warp replay backend: batches of archived states rendered by the Warp ray tracer.

Imported only when `backend="warp"` is chosen, and Warp itself only when a renderer is built, so
CPU-only code never imports Warp. Each batch puts up to `nworld` archived (world, frame) states
into the Warp data's world axis, runs the position stages (kinematics, subtree COM,
tendons/flexes when drawn, cameras and lights), refits the scene BVH and renders only the one
requested camera.

Packing: the parent turns its ordered stream of per-video work units (`worker.RenderUnit`: one
world, one camera, frames of one stored chunk) into `PackedUnit`s that fill every batch slot with
(world, frame) states of consecutive videos, so few frames per world or many worlds do not leave
most of a launch empty; `unpack` splits the packed pixels back into per-video pieces, in order.

Model variants (domain randomization): slots of one launch may hold worlds drawn with different
model values. Each variant field the archive declares becomes a per-world array of the Warp
model (mujoco_warp's batched `Model` fields, leading dimension nworld), one row per batch slot;
the ray tracer and the BVH refit read them per world. A varied `cam_fovy` renders model cameras
with rays computed per world (`use_precomputed_rays=False`). Sites are not drawn by the Warp ray
tracer, so `site_rgba` and `site_size` change nothing there (site_pos/site_quat are set, for
consistency). A geom switched to a height field the model's own geoms do not use cannot be drawn
(Warp builds BVHs for those only): BackendError, render it with backend='cpu'.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from collections.abc import Iterable, Iterator

import mujoco
import numpy as np

from ..._errors import BackendError, ClosedError, MjArchiveError
from ...archive.variants import VARIANT_FIELDS, default_values
from .. import worker
from ..views.camera import View
from ..views.scene import replay_elements
from ..views.variant_map import VariantSpans
from .base import Backend, UnitStates, needs_tendon_stage

__all__ = ["BACKEND", "WarpBackend", "WarpRenderer", "unavailable", "default_device", "batch_size", "PackedUnit", "PackedResult",
           "pack", "render_packed", "unpack"]

#: Memory the renderer may use for per-world buffers, by device kind (overridable per call).
DEFAULT_MEMORY_BUDGET = {"cpu": 256 * 2**20, "cuda": 2 * 2**30}
MAX_BATCH = 4096
#: Variant fields the Warp ray tracer never reads (it draws no sites): accepted, and ignored.
UNDRAWN_FIELDS = frozenset({"site_rgba", "site_size"})


#: The oldest mujoco-warp whose ray tracer draws what replay asks of it (per-world model values,
#: scene layouts, geom groups, one camera of many); recording with MuJoCo Warp needs no such minimum.
MIN_MUJOCO_WARP = (3, 16)


@functools.cache
def unavailable() -> str | None:
    """Why backend 'warp' cannot render in this environment, or None when it can."""
    try:
        import mujoco_warp
        import warp
    except ImportError as exc:
        return f"backend 'warp' needs mujoco-warp and warp-lang ({exc}); install `mjarchive[warp]`"
    del warp  # only whether it imports matters here
    version = getattr(mujoco_warp, "__version__", "0")
    parts = tuple(int(p) for p in re.findall(r"[0-9]+", version)[:2])
    if parts < MIN_MUJOCO_WARP:
        return (f"backend 'warp' renders with mujoco-warp {'.'.join(map(str, MIN_MUJOCO_WARP))} or later (installed: "
                f"{version[:32]}), whose ray tracer draws per-world model values, scenes and geom groups as replay "
                "needs; render with backend='cpu', or where a newer mujoco-warp is installed (mjlab 1.6 pins 3.11: "
                "record there, render elsewhere)")
    return None


def _import():
    reason = unavailable()
    if reason is not None:
        raise BackendError(reason)
    import mujoco_warp as mjw
    import warp as wp

    return wp, mjw


_UNPACK_KERNEL = None


def _unpack_rgb_kernel(wp):
    """A Warp kernel turning packed 0xAARRGGBB pixels (the first camera's) into uint8 RGB."""
    global _UNPACK_KERNEL
    if _UNPACK_KERNEL is None:
        @wp.kernel
        def unpack_rgb(packed: wp.array2d(dtype=wp.uint32), rgb: wp.array3d(dtype=wp.uint8)):
            i, j = wp.tid()
            p = packed[i, j]
            rgb[i, j, 0] = wp.uint8((p >> wp.uint32(16)) & wp.uint32(255))
            rgb[i, j, 1] = wp.uint8((p >> wp.uint32(8)) & wp.uint32(255))
            rgb[i, j, 2] = wp.uint8(p & wp.uint32(255))

        _UNPACK_KERNEL = unpack_rgb
    return _UNPACK_KERNEL


_WARP_CALLS = threading.Lock()  # held by a renderer while it sets up or renders (see render_batch)


def default_device() -> str:
    """'cuda' when Warp sees a GPU, else Warp's 'cpu' device."""
    wp, _ = _import()
    return "cuda" if wp.get_cuda_device_count() > 0 else "cpu"


def batch_size(model: mujoco.MjModel, size: tuple[int, int], device: str,
               memory_budget: int | None = None, copies: int = 1) -> int:
    """Worlds per batch that fit `memory_budget` bytes: packed RGB plus a rough per-world state
    (`copies`: of the model in each state, for a scene of several worlds)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    budget = memory_budget if memory_budget is not None else DEFAULT_MEMORY_BUDGET[kind]
    h, w = size
    per_world = h * w * (4 + 4 + 8)  # packed rgb, depth, segmentation buffers the context allocates
    per_world += 8 * copies * (model.nbody * 40 + model.ngeom * 12 + model.nq + model.nv * 20 + model.ncam * 12)
    return int(max(1, min(MAX_BATCH, budget // per_world)))


class WarpRenderer:
    """Renders batches of archived states of one model, one camera at a time.

    `render_batch(qpos (n, nq), mocap_pos (n, nmocap, 3), mocap_quat (n, nmocap, 4), camera)`
    returns (n, H, W, 3) uint8 for n <= nworld. `variant_defaults`: the model's own values of every
    variant field; `variant_layouts`: where each world's values go in it (`variant_map.layout_for`).
    """

    def __init__(self, model: mujoco.MjModel, size: tuple[int, int], *, quality: str = "full",
                 device: str | None = None, nworld: int | None = None, memory_budget: int | None = None,
                 options=None):
        wp, mjw = _import()
        if options is not None:
            import inspect

            from ..views.options import warp_render_kwargs

            # BackendError for what this Warp version cannot draw
            self._options = warp_render_kwargs(options, inspect.signature(mjw.create_render_context).parameters)
        else:
            self._options = {}
        self._wp, self._mjw = wp, mjw
        self.model = model
        self.size = (int(size[0]), int(size[1]))
        self.quality = quality
        try:  # "cuda" names the context current now: kept as "cuda:N", not looked up again at each call
            self.device = str(wp.get_device(device or default_device()))
        except Exception as exc:
            raise BackendError(f"MuJoCo Warp cannot use device {device!r} here ({exc}); its devices: "
                               f"{', '.join(str(d) for d in wp.get_devices())}") from None
        self.nworld = int(nworld or batch_size(model, self.size, self.device, memory_budget))
        self._tendon = needs_tendon_stage(model)
        try:
            with _WARP_CALLS, wp.ScopedDevice(self.device):
                data = mujoco.MjData(model)  # not forwarded: no contacts or constraints to carry
                self.m = mjw.put_model(model)
                self.d = mjw.put_data(model, data, nworld=self.nworld, nconmax=1, njmax=1)
            # Flex normals summed in a fixed order: a cloth's pixels do not depend on the batch (mujoco-warp 4.0 on).
            determinism = getattr(mjw, "DeterminismType", None)
            if determinism is not None and hasattr(self.m.opt, "deterministic"):
                self.m.opt.deterministic = int(self.m.opt.deterministic) | int(determinism.ATOMICS)
        except Exception as exc:
            raise BackendError(f"MuJoCo Warp could not load the model on device {self.device!r}: {exc}") from None
        self._contexts: dict[tuple[int, bool], object] = {}
        self._rgb = None  # (nworld, H*W, 3) uint8 on the device, allocated on first use
        self.variant_defaults = default_values(model, VARIANT_FIELDS)
        self.variant_layouts: dict = {}
        self._per_world: dict[str, tuple[object, np.ndarray | None]] = {}  # field -> (device array, rows last set)
        self._closed = False

    def camera_id(self, camera: int | View) -> int:
        """The model camera that renders `camera`: its own id, or the one added for a View."""
        if not isinstance(camera, View):
            if camera < 0:
                raise BackendError("backend 'warp' renders model cameras and mjarchive Cameras; -1 is not a camera")
            return int(camera)
        # By place, not name: the replay's cameras are the last ones (a model may name its own like them).
        added = replay_elements(self.model, "cam")
        cid = self.model.ncam - added + camera.slot if 0 <= camera.slot < added else -1
        if cid < 0:
            raise BackendError(f"the Warp replay model has no camera for {camera.label!r}: it was built without "
                               "its replay cameras (a bug: please report it)")
        return cid

    def _context(self, cid: int, dynamic_rays: bool = False):
        rc = self._contexts.get((cid, dynamic_rays))
        if rc is None:
            has_skybox = bool(np.any(self.model.tex_type == mujoco.mjtTexture.mjTEXTURE_SKYBOX))
            full = self.quality == "full"
            kwargs = {"use_shadows": full, "render_skybox": full and has_skybox, **self._options}
            kwargs["render_skybox"] = kwargs["render_skybox"] and has_skybox
            if dynamic_rays:  # a per-world cam_fovy: precomputed rays would hold the model's own
                kwargs["use_precomputed_rays"] = False
            self._contexts.clear()  # outputs come camera by camera: keep one context's buffers, not one per camera
            with self._wp.ScopedDevice(self.device):
                rc = self._mjw.create_render_context(
                    self.model, nworld=self.nworld, cam_res=(self.size[1], self.size[0]), render_rgb=True,
                    render_depth=False, render_seg=False,
                    # a mask over the model's cameras: mujoco-warp 3.x reads only masks, 4.x also ids
                    cam_active=[i == cid for i in range(self.model.ncam)], **kwargs,
                )
            self._contexts[cid, dynamic_rays] = rc
        return rc

    def _set_variants(self, rows: dict[str, np.ndarray] | None, n: int) -> None:
        """Give batch slot i the model values rows[name][i] (shaped like this model's field; slots
        past n repeat the last); fields made per-world earlier and absent now get the model's own."""
        rows = rows or {}
        wp = self._wp
        for name in sorted(set(rows) | set(self._per_world)):
            if name in UNDRAWN_FIELDS:
                continue
            own = self.variant_defaults[name]
            full = np.empty((self.nworld, *own.shape), own.dtype)
            if name in rows:
                src = np.asarray(rows[name])
                if src.shape != (n, *own.shape):
                    raise BackendError(f"variant rows of {name} have shape {src.shape}, expected {(n, *own.shape)}")
                full[:n] = src
                full[n:] = src[-1]
            else:
                full[:] = own
            if name == "geom_dataid":
                self._check_hfields(full)
            entry = self._per_world.get(name)
            if entry is not None and entry[1] is not None and np.array_equal(entry[1], full):
                continue
            dtype = getattr(self.m, name).dtype
            values = full.astype(np.int32 if own.dtype.kind == "i" else np.float32)
            if entry is None:
                with wp.ScopedDevice(self.device):
                    array = wp.array(values, dtype=dtype)
                setattr(self.m, name, array)  # a (nworld, n) array: mujoco_warp reads row worldid % nworld
            else:
                array = entry[0]
                array.assign(values)
            self._per_world[name] = (array, full)

    def _check_hfields(self, dataid: np.ndarray) -> None:
        hfield = np.asarray(self.model.geom_type) == mujoco.mjtGeom.mjGEOM_HFIELD
        if not hfield.any():
            return
        used = set(np.asarray(self.model.geom_dataid)[hfield].tolist())
        bad = ~np.isin(dataid[:, hfield], list(used))
        if bad.any():
            geom = int(np.flatnonzero(hfield)[np.flatnonzero(bad.any(axis=0))[0]])
            raise BackendError(f"backend 'warp' builds height-field BVHs for the height fields the model's own geoms "
                               f"use ({sorted(used)}); a world switches geom {geom} to another one: render it with "
                               "backend='cpu'")

    def _set_view(self, cid: int, view: View, poses: np.ndarray | None, n: int) -> None:
        """Place camera `cid` of every batch slot where `view` looks from (per state with `poses`)."""
        pos, xmat = view.pose(None if poses is None else poses[:n])
        pos, xmat = pos.reshape(-1, 3), xmat.reshape(-1, 3, 3)
        cam_xpos = self.d.cam_xpos.numpy()
        cam_xmat = self.d.cam_xmat.numpy()
        cam_xpos[:, cid] = pos[-1]  # unused slots: a copy of the last state's pose
        cam_xmat[:, cid] = xmat[-1]
        cam_xpos[:len(pos), cid] = pos
        cam_xmat[:len(pos), cid] = xmat
        self.d.cam_xpos.assign(cam_xpos)
        self.d.cam_xmat.assign(cam_xmat)

    def render_batch(self, qpos: np.ndarray, mocap_pos: np.ndarray | None, mocap_quat: np.ndarray | None,
                     camera: int | View, poses: np.ndarray | None = None,
                     variants: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Render n <= nworld states from model camera `camera` or a `camera.View` (`poses`: its
        (lookat x, y, z, azimuth) per state when it tracks); returns (n, H, W, 3) uint8.
        variants: per-state model values, name -> (n, *field shape of this model) (see
        `variant_map`); fields left out render with the model's own values."""
        if self._closed:
            raise ClosedError("this Warp renderer is closed")
        wp, mjw = self._wp, self._mjw
        n = len(qpos)
        if not 0 < n <= self.nworld:
            raise BackendError(f"a batch holds 1..{self.nworld} states, got {n}")
        # Warp's current device and each device's current stream are process-wide: renderers in other
        # threads (an executor's) must not switch them between these launches and copies.
        with _WARP_CALLS:
            cid = self.camera_id(camera)
            self._set_variants(variants, n)
            per_world_fovy = bool(variants) and "cam_fovy" in variants and not isinstance(camera, View)
            rc = self._context(cid, dynamic_rays=per_world_fovy)

            def fill(dst, src):  # dst: (nworld, ...) of scalars or vectors; src: (n, ...) as numpy gives it
                full = np.empty((dst.shape[0], *np.shape(src)[1:]), dtype=np.float32)
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
                if isinstance(camera, View):
                    self._set_view(cid, camera, poses, n)
                mjw.refit_bvh(self.m, self.d, rc)
                mjw.render(self.m, self.d, rc)
                # Unpack on the device and copy only the n used states, 3 bytes a pixel: the host then
                # receives ready RGB instead of shuffling 4-byte packed pixels itself.
                h, w = self.size
                if self._rgb is None:
                    self._rgb = wp.empty((self.nworld, h * w, 3), dtype=wp.uint8)
                wp.launch(_unpack_rgb_kernel(wp), dim=(n, h * w), inputs=[rc.rgb_data], outputs=[self._rgb])
                return self._rgb[:n].numpy().reshape(n, h, w, 3)

    def close(self) -> None:
        self._closed = True
        self._contexts.clear()
        self._rgb = None

    def __enter__(self) -> WarpRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- packing (world, frame) states of several videos into batches ------------------------------------

@dataclasses.dataclass(frozen=True)
class PackedUnit:
    """One Warp task: (world_id, frames) segments of one camera, rendered `warp_batch` states per
    launch. Segments come from consecutive per-video units; each lies inside one stored chunk.
    The other fields mean what they mean on `worker.RenderUnit`."""

    location: str
    storage_options: dict | None
    camera: int | View
    segments: tuple[tuple[int, tuple[int, ...]], ...]
    size: tuple[int, int]
    quality: str
    backend: str
    model_mjb: bytes | None = None
    warp_batch: int | None = None
    poses: np.ndarray | None = dataclasses.field(default=None, compare=False)  # a tracking View's, per state
    options: object = None
    recipe: str | None = None

    @property
    def frames(self) -> tuple[int, ...]:
        """Every segment's frame indices, concatenated (for a live archive's refresh check)."""
        return tuple(f for _, fr in self.segments for f in fr)


@dataclasses.dataclass(frozen=True)
class PackedResult:
    """Pixels of a PackedUnit: rgb (n_states, H, W, 3) uint8, segment after segment."""

    camera: int | View
    segments: tuple[tuple[int, tuple[int, ...]], ...]
    rgb: np.ndarray


def pack(units: Iterable, capacity: int) -> Iterator[PackedUnit]:
    """Pack the frames of `worker.RenderUnit`s, in order, into PackedUnits of at most `capacity`
    states each (a unit may be split across two); a camera change starts a new PackedUnit."""
    segments: list[tuple[int, tuple[int, ...]]] = []
    poses: list[np.ndarray] = []
    count, first = 0, None

    def flush() -> PackedUnit:
        return PackedUnit(first.location, first.storage_options, first.camera, tuple(segments), first.size,
                          first.quality, first.backend, first.model_mjb, first.warp_batch,
                          np.concatenate(poses) if poses else None, first.options, first.recipe)

    def same(a, b) -> bool:
        return (a.camera, a.location, a.size, a.quality, a.backend, a.model_mjb, a.warp_batch, a.recipe) == (
            b.camera, b.location, b.size, b.quality, b.backend, b.model_mjb, b.warp_batch, b.recipe) and (
            a.options == b.options)

    for u in units:
        if first is not None and not same(u, first):
            yield flush()
            segments, poses, count, first = [], [], 0, None
        i = 0
        while i < len(u.frames):
            if first is None:
                first = u
            take = min(len(u.frames) - i, capacity - count)
            segments.append((int(u.world_id), tuple(u.frames[i:i + take])))
            if u.poses is not None:
                poses.append(u.poses[i:i + take])
            count, i = count + take, i + take
            if count == capacity:
                yield flush()
                segments, poses, count, first = [], [], 0, None
    if segments:
        yield flush()


def unpack(units: Iterable, packed: Iterator[PackedResult]) -> Iterator[tuple[object, np.ndarray]]:
    """(unit, rgb (len(unit.frames), H, W, 3)) for each unit that `pack(units, ...)` packed, in
    order, cut from the packed results (consumed lazily: at most one is held at a time)."""
    cur, pos = None, 0
    for u in units:
        need, parts = len(u.frames), []
        while need:
            if cur is None or pos == len(cur):
                cur, pos = next(packed).rgb, 0
            take = min(need, len(cur) - pos)
            parts.append(cur[pos:pos + take])
            pos, need = pos + take, need - take
        yield u, parts[0] if len(parts) == 1 else np.concatenate(parts)


def render_packed(unit: PackedUnit) -> PackedResult:
    """Render one PackedUnit (runs in any process): one archive read per (stored chunk, world set)
    it touches, then batches of `warp_batch` states; returns the pixels in segment order."""
    archive = worker.archive_for(unit)
    model = worker.model_for(unit, archive)
    cf = archive.manifest.chunk_frames
    n = sum(len(fr) for _, fr in unit.segments)
    qpos = np.empty((n, model.nq), np.float64)
    mocap_pos = np.empty((n, model.nmocap, 3), np.float64) if model.nmocap else None
    mocap_quat = np.empty((n, model.nmocap, 4), np.float64) if model.nmocap else None
    offsets = np.cumsum([0] + [len(fr) for _, fr in unit.segments])
    by_chunk: dict[int, list[int]] = {}
    for k, (_, fr) in enumerate(unit.segments):
        by_chunk.setdefault(fr[0] // cf, []).append(k)
    for ks in by_chunk.values():
        worlds = sorted({unit.segments[k][0] for k in ks}, key=archive.world_index)
        lo = min(unit.segments[k][1][0] for k in ks)
        hi = max(unit.segments[k][1][-1] for k in ks)
        col = {wid: i for i, wid in enumerate(worlds)}
        sel = archive.select(worlds=worlds, frames=slice(lo, hi + 1))
        q = sel.qpos
        mp, mq = (sel.mocap_pos, sel.mocap_quat) if model.nmocap else (None, None)
        for k in ks:
            wid, fr = unit.segments[k]
            rows, c, dst = np.asarray(fr) - lo, col[wid], slice(offsets[k], offsets[k + 1])
            qpos[dst] = q[rows, c]
            if mp is not None:
                mocap_pos[dst] = mp[rows, c]
                mocap_quat[dst] = mq[rows, c]
    renderer = BACKEND.renderer_for(unit, archive, model)
    variants = _state_variants(archive, unit, renderer)
    h, w = unit.size
    rgb = np.empty((n, h, w, 3), np.uint8)
    for s in range(0, n, renderer.nworld):
        e = min(n, s + renderer.nworld)
        rows = None if variants is None else variants(s, e)
        rgb[s:e] = renderer.render_batch(qpos[s:e], None if mocap_pos is None else mocap_pos[s:e],
                                         None if mocap_quat is None else mocap_quat[s:e], unit.camera,
                                         None if unit.poses is None else unit.poses[s:e], variants=rows)
    return PackedResult(unit.camera, unit.segments, rgb)


def _state_variants(archive, unit: PackedUnit, renderer: WarpRenderer):
    """A function (s, e) -> name -> (e - s, *field shape): the model values in force for the
    world and frame of states s..e-1 of the unit (segment after segment), placed on the
    renderer's model; None when the archive varies nothing. Values are read once per span."""
    if not archive.variant_fields:
        return None
    spans: dict[int, VariantSpans] = {}
    states = [(wid, f) for wid, fr in unit.segments for f in fr]
    drawn: dict[int, list[int]] = {}
    for wid, fr in unit.segments:
        drawn.setdefault(wid, []).extend(fr)
    for wid, fr in drawn.items():
        spans[wid] = VariantSpans(archive, [wid], renderer, frames=fr)

    def rows(s: int, e: int) -> dict[str, np.ndarray]:
        values = [spans[wid].values(f) for wid, f in states[s:e]]
        return {name: np.stack([v[name] for v in values]) for name in values[0]}

    return rows


class WarpBackend(Backend):
    """MuJoCo Warp's batch ray tracer: (world, frame) states of consecutive videos packed into full
    launches, in this process unless an executor is given."""

    name = "warp"
    takes_device = True
    views_as_model_cameras = True
    unit_bytes = 256 * 2**20
    packs_videos = True

    def check_options(self, options) -> None:
        from ..views.options import warp_render_kwargs

        warp_render_kwargs(options)  # BackendError for what Warp cannot draw

    def states_per_launch(self, spec: str, model: mujoco.MjModel, size: tuple[int, int], *, requested,
                          copies: int, n_states: int, budget: int) -> int:
        if requested is not None:
            if isinstance(requested, bool) or not isinstance(requested, (int, np.integer)) or requested < 1:
                raise MjArchiveError(f"warp_batch must be a positive number of states per launch, got {requested!r}")
            return int(requested)
        # All nworld slots render per launch, packed across worlds: no more than the selection holds.
        device = spec.partition(":")[2] or default_device()
        h, w = size
        return min(batch_size(model, size, device, copies=copies), max(1, budget // (h * w * 3)), max(1, n_states))

    def renderer_for(self, unit, archive, model: mujoco.MjModel) -> WarpRenderer:
        """This thread's cached WarpRenderer for a work unit (RenderUnit or PackedUnit)."""
        device = unit.backend.partition(":")[2] or None
        return worker.renderer_for(unit, archive, lambda: WarpRenderer(model, unit.size, quality=unit.quality,
                                                                       device=device, nworld=unit.warp_batch,
                                                                       options=getattr(unit, "options", None)))

    def render_states(self, unit, archive, renderer: WarpRenderer, model, sel, states: UnitStates, spans,
                      labels) -> tuple[np.ndarray, str]:
        qpos, mocap_pos, mocap_quat = states
        frames = np.asarray(unit.frames, dtype=np.int64)
        poses = unit.poses
        n = len(frames)
        h, w = unit.size
        rgb = np.empty((n, h, w, 3), np.uint8)
        labels = None if labels is None else labels(model, spans)
        for s in range(0, n, renderer.nworld):
            e = min(n, s + renderer.nworld)
            rows = None if spans is None else spans.rows(frames[s:e])
            rgb[s:e] = renderer.render_batch(qpos[s:e], None if mocap_pos is None else mocap_pos[s:e],
                                             None if mocap_quat is None else mocap_quat[s:e], unit.camera,
                                             None if poses is None else poses[s:e], variants=rows)
        if labels is not None:
            for i in range(n):
                pose = None if poses is None else poses[i]
                labels.set_frame(int(frames[i]))
                labels.draw(rgb[i], i, qpos[i], labels.camera_pose(unit.camera, pose, qpos, mocap_pos, mocap_quat, i))
        return rgb, ""

    def unit_results(self, units: list, run, in_process: bool) -> Iterator[worker.UnitResult]:
        """Per-world units' states packed into full batches across units (several worlds per launch),
        rendered as PackedUnits and cut back into per-unit results; scene units run as they are."""
        if not units or units[0].warp_batch is None or units[0].scene is not None:
            yield from run(units)
            return
        batch = units[0].warp_batch
        h, w = units[0].size
        # In this process: many launches per task (fewer, larger reads); on an executor: one launch per
        # task, so several workers share the work.
        per_task = batch * max(1, self.unit_bytes // (h * w * 3) // batch) if in_process else batch
        packed = run(pack(units, per_task), render_packed)
        try:
            for u, rgb in unpack(units, packed):
                yield worker.UnitResult(u.world_id, u.camera, u.frames, rgb)
        finally:
            packed.close()


BACKEND = WarpBackend()
